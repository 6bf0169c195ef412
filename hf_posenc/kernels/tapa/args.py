"""TAPA's arguments: the one definition of the op's options and their defaults (:func:`validate_tapa_args`, which
checks them and fills in default positions), the validated :class:`TapaArgs` every implementation takes, and
:func:`tapa_op`, which gives an implementation the op's public signature.

The equations themselves are in ``naive.py`` (the readable reference); the fast paths (``chunked.py``,
``triton_tapa.py``) take the same :class:`TapaArgs`.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Callable

import torch

PHASES = ("quadratic", "linear")


def tapa_split(head_dim: int, theta: float) -> tuple[int, int]:
    """Return (amp_dims, phase_dims) = (θD, (1−θ)D) of paper eq. (11).

    Raises ValueError when θD is not a whole number of dimensions ("odd" split) or when either part
    would be empty.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta):
        raise TypeError(f"theta must be a float in (0, 1), got {theta!r}")
    if not 0.0 < theta < 1.0:
        raise ValueError(f"theta must lie strictly between 0 and 1 (eq. 11), got {theta}")
    amp_f = theta * head_dim
    amp = round(amp_f)
    if abs(amp_f - amp) > 1e-6:
        raise ValueError(
            f"theta*head_dim = {theta}*{head_dim} = {amp_f:g} is not a whole number of dimensions; "
            f"pick theta as a multiple of 1/{head_dim} (e.g. theta={max(1, round(amp_f)) / head_dim:g})"
        )
    if amp <= 0 or amp >= head_dim:
        raise ValueError(
            f"theta={theta} with head_dim={head_dim} leaves an empty part "
            f"(amp_dims={amp}, phase_dims={head_dim - amp}); both must be >= 1"
        )
    return amp, head_dim - amp


@dataclass(frozen=True)
class TapaArgs:
    """Validated, normalised arguments shared by the reference and the Triton kernel."""

    alpha: float
    linear: bool
    causal: bool
    amp_dims: int
    phase_dims: int
    group: int
    q_positions: torch.Tensor  # int64 [B, Lq]
    k_positions: torch.Tensor  # int64 [B, Lk]
    key_padding_mask: torch.Tensor | None  # bool [B, Lk]
    q_segment_ids: torch.Tensor | None  # int64 [B, Lq]
    k_segment_ids: torch.Tensor | None  # int64 [B, Lk]
    sliding_window: int | None = None  # keys with i_abs − j >= W are invisible


def _check_index_tensor(name: str, t: torch.Tensor, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integers with shape {list(shape)}, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers (e.g. torch.long), got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)} = [batch, length], got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; move it with .to(q.device)")
    return t.long()


def validate_tapa_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    alpha: float = 0.1,
    theta: float = 0.5,
    phase: str = "quadratic",
    causal: bool = True,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    q_segment_ids: torch.Tensor | None = None,
    k_segment_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> TapaArgs:
    """Check shapes, dtypes and options; fill in default positions. Raises TypeError / ValueError. The one
    definition of TAPA's options and their defaults: every implementation takes them through :func:`tapa_op`.

    sliding_window must be None or an int >= 1 (a bool or float raises TypeError, <= 0 ValueError)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, heads, length, head_dim], got shape {list(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them first")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, Hq, Lq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
    Bk, Hkv, Lk, Dk = k.shape
    if Bk != B:
        raise ValueError(f"batch size of q ({B}) and k/v ({Bk}) differ")
    if Dk != D:
        raise ValueError(f"head_dim of q ({D}) and k/v ({Dk}) differ")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}) for grouped-query attention")
    if Lq == 0 or Lk == 0:
        raise ValueError(f"sequence lengths must be >= 1, got Lq={Lq}, Lk={Lk}")
    if Lq > Lk:
        raise ValueError(
            f"Lq ({Lq}) > Lk ({Lk}): queries must be the last Lq positions of the key sequence; "
            "concatenate the KV cache with the new keys before calling"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a positive float, got {alpha!r}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite positive float (the |m−n|^α exponent of eq. 12), got {alpha}")
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES} (eq. 12 / eq. 16), got {phase!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    amp, ph = tapa_split(D, theta)
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, numbers.Integral):
            raise TypeError(
                f"sliding_window must be a positive int (number of keys a query sees, itself included) or None, "
                f"got {sliding_window!r} of type {type(sliding_window).__name__}"
            )
        if sliding_window <= 0:
            raise ValueError(
                f"sliding_window must be >= 1 (with causal=True, 1 = each query sees only its own key) "
                f"or None for no window, got {sliding_window}"
            )
        sliding_window = int(sliding_window)

    if q_positions is not None and k_positions is None:
        raise ValueError("q_positions given without k_positions; pass both (distances need key positions)")
    if k_positions is None:
        k_pos = torch.arange(Lk, device=q.device).expand(B, Lk)
    else:
        k_pos = _check_index_tensor("k_positions", k_positions, (B, Lk), q.device)
    if q_positions is None:
        q_pos = k_pos[:, Lk - Lq :]
    else:
        q_pos = _check_index_tensor("q_positions", q_positions, (B, Lq), q.device)

    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            raise TypeError("key_padding_mask must be a bool tensor [batch, Lk] with True = attend")
        if tuple(key_padding_mask.shape) != (B, Lk):
            raise ValueError(f"key_padding_mask must have shape {[B, Lk]}, got {list(key_padding_mask.shape)}")
        if key_padding_mask.device != q.device:
            raise ValueError("key_padding_mask must be on the device of q")
    if (q_segment_ids is None) != (k_segment_ids is None):
        raise ValueError("pass both q_segment_ids and k_segment_ids (packed sequences) or neither")
    qs = ks = None
    if q_segment_ids is not None:
        qs = _check_index_tensor("q_segment_ids", q_segment_ids, (B, Lq), q.device)
        ks = _check_index_tensor("k_segment_ids", k_segment_ids, (B, Lk), q.device)
    return TapaArgs(
        alpha=float(alpha),
        linear=phase == "linear",
        causal=causal,
        amp_dims=amp,
        phase_dims=ph,
        group=Hq // Hkv,
        q_positions=q_pos,
        k_positions=k_pos,
        key_padding_mask=key_padding_mask,
        q_segment_ids=qs,
        k_segment_ids=ks,
        sliding_window=sliding_window,
    )


TAPA_OPTIONS = tuple(inspect.signature(validate_tapa_args).parameters)[3:]


def tapa_op(impl: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Give a TAPA implementation ``impl(q, k, v, args, *, own...)`` the public signature ``(q, k, v, *,
    alpha=0.1, theta=0.5, phase="quadratic", causal=True, q_positions=None, k_positions=None,
    key_padding_mask=None, q_segment_ids=None, k_segment_ids=None, sliding_window=None, own...)``: the options are
    validated once into a :class:`TapaArgs` by :func:`validate_tapa_args` and the implementation's own keywords
    are passed on. ``op.with_args(q, k, v, args, ...)`` runs it on already validated options (the dispatcher)."""
    own = list(inspect.signature(impl).parameters.values())[4:]

    @functools.wraps(impl)
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        options = {name: kwargs.pop(name) for name in TAPA_OPTIONS if name in kwargs}
        return impl(q, k, v, validate_tapa_args(q, k, v, **options), **kwargs)

    op.__signature__ = inspect.signature(validate_tapa_args).replace(
        parameters=list(inspect.signature(validate_tapa_args).parameters.values()) + own,
        return_annotation="torch.Tensor")
    op.with_args = impl
    return op
