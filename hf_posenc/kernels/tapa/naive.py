"""Readable PyTorch reference for TAPA attention (the specification the Triton kernel is tested against).

Token-Aware Phase Attention, paper eq. (12): the head dimension D is split into an amplitude part
(first θD dims) and a phase part (remaining (1−θ)D dims), and

    s(m, n) = c_A·(q_A·k_A) · cos(2π·|m−n|^α·c_P·φ),   c_A = 1/√(θD),  c_P = 1/√((1−θ)D)

with the quadratic phase φ = q_P·k_P (eq. 10/12) or the linear phase of the §4.5 ablation, eq. (16),
φ = (q_P, k_P)·1 = Σ q_P + Σ k_P (the phase coordinates of query and key summed; c_P is the same
1/√((1−θ)D) factor). The scores then go through a (causal) softmax and multiply V. There is no RoPE
rotation and no extra 1/√D: c_A already scales the amplitude product.

Conventions shared with the kernel:
- q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D], Hq % Hkv == 0 (grouped-query attention, head h reads
  kv head h // (Hq // Hkv)).
- The queries are the LAST Lq entries of the key sequence, so causal means key index j <= i + (Lk − Lq).
- Distances d = |m − n| come from integer positions (default arange), so left padding, packing and
  cached decoding reproduce the scores of one unpadded pass.
- key_padding_mask [B, Lk] (True = attend) and segment ids (keys visible only inside their segment)
  remove keys; a query row with no visible key returns zeros.
- sliding_window W (Transformers' sliding-window causal mask, e.g. Mistral / Gemma local layers): with
  the absolute query index i_abs = i + (Lk − Lq), key j is visible only if i_abs − j < W, on top of
  causality, padding and segments. Like the causal mask it counts sequence indices, not positions.
  With causal=False only this left bound applies. W >= Lk removes nothing.
- The phase is evaluated in turns with range reduction, t = d^α·c_P·φ, r = t − round(t),
  cos(2π r), so fp16/bf16 runs keep long distances accurate; everything accumulates in fp32
  (float64 inputs stay float64).
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


def visibility_mask(args: TapaArgs, Lq: int, Lk: int, device: torch.device) -> torch.Tensor:
    """Bool [B, 1, Lq, Lk]: True where query i may attend to key j (causal, sliding window, padding,
    segments). Query i is key index i_abs = i + (Lk − Lq)."""
    B = args.q_positions.shape[0]
    mask = torch.ones(B, 1, Lq, Lk, dtype=torch.bool, device=device)
    i_abs = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    j = torch.arange(Lk, device=device)[None, :]
    if args.causal:
        mask = mask & (j <= i_abs)
    if args.sliding_window is not None:
        mask = mask & (i_abs - j < args.sliding_window)
    if args.key_padding_mask is not None:
        mask = mask & args.key_padding_mask[:, None, None, :]
    if args.q_segment_ids is not None:
        mask = mask & (args.q_segment_ids[:, None, :, None] == args.k_segment_ids[:, None, None, :])
    return mask


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


def tapa_scores(
    q: torch.Tensor, k: torch.Tensor, args: TapaArgs, compute_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Raw TAPA scores of eq. (12) (quadratic) or eq. (16) (linear), shape [B, Hq, Lq, Lk], no masking."""
    da = args.amp_dims
    c_a = 1.0 / math.sqrt(args.amp_dims)
    c_p = 1.0 / math.sqrt(args.phase_dims)
    qf, kf = q.to(compute_dtype), k.to(compute_dtype)
    if args.group > 1:  # the reference may materialise the repeated heads; the kernel never does
        kf = kf.repeat_interleave(args.group, dim=1)
    q_a, q_p = qf[..., :da], qf[..., da:]
    k_a, k_p = kf[..., :da], kf[..., da:]
    amp = q_a @ k_a.transpose(-1, -2)
    if args.linear:
        ph = q_p.sum(-1)[..., :, None] + k_p.sum(-1)[..., None, :]
    else:
        ph = q_p @ k_p.transpose(-1, -2)
    d = (args.q_positions[:, None, :, None] - args.k_positions[:, None, None, :]).abs().to(compute_dtype)
    d_pow = torch.where(d > 0, d.clamp_min(1.0) ** args.alpha, torch.zeros_like(d))
    turns = d_pow * c_p * ph
    r = turns - torch.round(turns)  # range reduction: cos(2π t) = cos(2π r); round has zero gradient
    return c_a * amp * torch.cos(2.0 * math.pi * r)


@tapa_op
def tapa_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs) -> torch.Tensor:
    """TAPA attention, eq. (12) (phase="quadratic") or eq. (16) (phase="linear"), in eager PyTorch.

    Materialises the [B, Hq, Lq, Lk] score matrix in fp32 (float64 for float64 inputs) and is
    differentiable in q, k, v. `sliding_window` (int >= 1 or None) restricts query i to keys j with
    i + (Lk − Lq) − j < sliding_window. Returns [B, Hq, Lq, D] in q's dtype; rows without any visible
    key are 0. Options: :func:`validate_tapa_args`.
    """
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    Lq, Lk = q.shape[2], k.shape[2]
    s = tapa_scores(q, k, args, compute)
    mask = visibility_mask(args, Lq, Lk, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(s - row_max)
    denom = e.sum(dim=-1, keepdim=True)
    w = e / torch.where(denom > 0, denom, torch.ones_like(denom))
    vf = v.to(compute)
    if args.group > 1:
        vf = vf.repeat_interleave(args.group, dim=1)
    return (w @ vf).to(q.dtype)
