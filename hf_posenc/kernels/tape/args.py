"""TAPE's arguments: the one definition of the op's options and their defaults (:func:`validate_tape_args`, which
checks them), the validated shapes and options every implementation takes (:class:`TapeArgs`), and
:func:`tape_op`, which gives an implementation the op's public signature.

The equations themselves are in ``naive.py`` (the readable reference); the fast paths (``sdpa.py``,
``triton_tape.py``) take the same :class:`TapeArgs`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class TapeArgs:
    """Validated shapes and options shared by the reference, the SDPA fold and the Triton kernel."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    e_dim: int
    scale: float
    causal: bool
    key_padding_mask: torch.Tensor | None  # bool [B, Lk], True = attend

    @property
    def group(self) -> int:
        """Query heads per KV head (1 for multi-head attention)."""
        return self.q_heads // self.kv_heads


def validate_tape_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    e: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
) -> TapeArgs:
    """Check the arguments of `tape_attention` and return their shapes; raise TypeError/ValueError naming the fix.
    The one definition of TAPE's options and their defaults: every implementation takes them through
    :func:`tape_op`."""
    for name, t in (("q", q), ("k", k), ("v", v), ("e", e)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tape_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"tape_attention: {name} must be 4-D [batch, heads, length, channels], got shape {tuple(t.shape)}"
            )
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"tape_attention: {name} must be a floating tensor (fp16/bf16/fp32/fp64), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"tape_attention: {name} is on {t.device} but q is on {q.device}; move them together")
    if len({q.dtype, k.dtype, v.dtype, e.dtype}) != 1:
        raise TypeError(
            f"tape_attention: q, k, v, e must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}, {e.dtype}; "
            "cast them with .to(q.dtype)"
        )
    b, hq, lq, d = q.shape
    bk, hkv, lk, dk = k.shape
    if bk != b or v.shape[0] != b or e.shape[0] != b:
        raise ValueError(f"tape_attention: batch sizes differ: q {b}, k {bk}, v {v.shape[0]}, e {e.shape[0]}")
    if dk != d:
        raise ValueError(f"tape_attention: q and k must share the head width, got {d} and {dk}")
    if tuple(v.shape) != (b, hkv, lk, d):
        raise ValueError(f"tape_attention: v must have shape {(b, hkv, lk, d)} like k, got {tuple(v.shape)}")
    if tuple(e.shape[:3]) != (b, hkv, lk):
        raise ValueError(
            f"tape_attention: e must be [B, Hkv, Lk, De] = [{b}, {hkv}, {lk}, De] (one positional state per KV head "
            f"and key), got {tuple(e.shape)}"
        )
    if min(b, hq, hkv, lq, lk, d, e.shape[3]) == 0:
        raise ValueError(f"tape_attention: empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)}, e {tuple(e.shape)}")
    if hq % hkv != 0:
        raise ValueError(
            f"tape_attention: the number of query heads ({hq}) must be a multiple of the KV heads ({hkv}) for GQA"
        )
    if lq > lk:
        raise ValueError(
            f"tape_attention: Lq={lq} > Lk={lk}; queries must be the last Lq of the Lk key positions "
            "(pass the whole key/value/positional cache)"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"tape_attention: causal must be a bool, got {causal!r}")
    if scale is None:
        scale = d**-0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"tape_attention: scale must be a float or None (None = head_dim ** -0.5), got {scale!r}")
    scale = float(scale)
    if not (scale > 0.0 and scale < float("inf")):
        raise ValueError(f"tape_attention: scale must be a finite positive number, got {scale}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            raise TypeError("tape_attention: key_padding_mask must be a bool tensor [B, Lk] with True = attend")
        if tuple(key_padding_mask.shape) != (b, lk):
            raise ValueError(
                f"tape_attention: key_padding_mask must have shape [B, Lk] = {(b, lk)}, got {tuple(key_padding_mask.shape)}"
            )
        if key_padding_mask.device != q.device:
            raise ValueError(f"tape_attention: key_padding_mask is on {key_padding_mask.device}, q on {q.device}")
    return TapeArgs(b, hq, hkv, lq, lk, d, e.shape[3], scale, causal, key_padding_mask)


def tape_op(impl: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Give a TAPE implementation ``impl(q, k, v, e, args, *, own...)`` the public signature ``(q, k, v, e, *,
    scale=None, causal=True, key_padding_mask=None, own...)``: the options are validated once into a
    :class:`TapeArgs` by :func:`validate_tape_args` and the implementation's own keywords (the Triton kernel's
    ``deterministic``) are passed on. ``op.with_args(q, k, v, e, args, ...)`` runs it on already validated options
    (the dispatcher)."""
    own = list(inspect.signature(impl).parameters.values())[5:]
    own_names = {p.name for p in own}

    @functools.wraps(impl)
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, **options):
        mine = {name: options.pop(name) for name in own_names if name in options}
        return impl(q, k, v, e, validate_tape_args(q, k, v, e, **options), **mine)

    op.__signature__ = inspect.signature(validate_tape_args).replace(
        parameters=list(inspect.signature(validate_tape_args).parameters.values()) + own,
        return_annotation="tuple[torch.Tensor, torch.Tensor]")
    op.with_args = impl
    return op
