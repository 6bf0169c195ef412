"""Readable PyTorch reference for TAPA attention (the specification the Triton kernel is tested against): the
equations only; the options, their checks and the op's signature are in ``args.py``.

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

import math

import torch

from .args import TapaArgs, tapa_op


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
