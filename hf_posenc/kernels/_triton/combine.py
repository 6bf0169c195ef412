"""The two small kernels both families launch beside their attention kernels: the split-K combine, which merges the
per-split partials of a decode forward (normalised outputs and base-2 log-sum-exps), and the backward's row dot
(Δ = rowsum(dO∘O), + rowsum(dẼ∘Ẽ) for TAPE), each with its launch plan.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import LaunchSpec, Target, padded_widths
from .layout import strides


@triton.heuristics(padded_widths(BW1="W1", BW2="W2"))
@triton.jit(do_not_specialize=["n_rows"])
def _row_dot_kernel(A, B, C, D, OUT, n_rows, W1: tl.constexpr, BW1: tl.constexpr, W2: tl.constexpr,
                    BW2: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[r] = Σ A[r]·B[r] (+ Σ C[r]·D[r] when W2 > 0) over contiguous rows of widths W1 / W2, in fp32.
    The backward's Δ = rowsum(dO∘O) (+ rowsum(dẼ∘Ẽ) for TAPE)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    r_ok = rows < n_rows
    c1 = tl.arange(0, BW1)
    m1 = r_ok[:, None] & (c1[None, :] < W1)
    a = tl.load(A + rows[:, None] * W1 + c1[None, :], mask=m1, other=0.0).to(tl.float32)
    b = tl.load(B + rows[:, None] * W1 + c1[None, :], mask=m1, other=0.0).to(tl.float32)
    acc = tl.sum(a * b, 1)
    if W2 > 0:
        c2 = tl.arange(0, BW2)
        m2 = r_ok[:, None] & (c2[None, :] < W2)
        c = tl.load(C + rows[:, None] * W2 + c2[None, :], mask=m2, other=0.0).to(tl.float32)
        d = tl.load(D + rows[:, None] * W2 + c2[None, :], mask=m2, other=0.0).to(tl.float32)
        acc += tl.sum(c * d, 1)
    tl.store(OUT + rows, acc, mask=r_ok)


def plan_row_dot(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, target: Target,
                 c: torch.Tensor | None = None, d: torch.Tensor | None = None) -> LaunchSpec:
    """Plan OUT = rowsum(a∘b) (+ rowsum(c∘d)) over the last dim; a..d contiguous, out contiguous fp32."""
    w1 = a.shape[-1]
    w2 = c.shape[-1] if c is not None else 0
    n_rows = out.numel()
    block = 16 if target.interpreter else 64
    return LaunchSpec(
        "row_dot", _row_dot_kernel, (triton.cdiv(n_rows, block),),
        dict(A=a, B=b, C=c if c is not None else a, D=d if d is not None else b, OUT=out, n_rows=n_rows,
             W1=w1, W2=w2, BLOCK=block),
        num_warps=4, num_stages=1,
    )


@triton.heuristics(padded_widths(BW="W"))
@triton.jit(do_not_specialize=["H", "Lq", "S"])
def _split_combine_kernel(OS, LSES, O, LSE, H, Lq, S,
                          stride_osb, stride_osh, stride_oss, stride_osm,
                          stride_lsb, stride_lsh, stride_lss, stride_ob, stride_oh, stride_om,
                          W: tl.constexpr, BW: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the S split-K partials of one (b, h, query): O_s normalised per split, lse_s their base-2
    log-sum-exp (−inf for an empty split). O = Σ_s 2^(lse_s − lse)·O_s, lse = log2 Σ_s 2^lse_s (O = 0 and
    lse = +inf, the backward's "no visible key", when every split is empty). Splits are read BLOCK_S at a
    time (one binary for any S). LSE is
    [B, H, Lq] contiguous."""
    pid = tl.program_id(0)
    i = pid % Lq
    bh = pid // Lq
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_w = tl.arange(0, BW)
    lse_b = LSES + b * stride_lsb + h * stride_lsh + i
    o_b = OS + b * stride_osb + h * stride_osh + i * stride_osm
    m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, S, BLOCK_S):
        m = tl.maximum(m, tl.load(lse_b + (s0 + offs_s) * stride_lss, mask=s0 + offs_s < S, other=float("-inf")))
    m_max = tl.max(m, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    tot = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BW], tl.float32)
    for s0 in range(0, S, BLOCK_S):
        s_ok = s0 + offs_s < S
        w = tl.exp2(tl.load(lse_b + (s0 + offs_s) * stride_lss, mask=s_ok, other=float("-inf")) - m_use)
        tot += w
        o_s = tl.load(o_b + (s0 + offs_s)[:, None] * stride_oss + offs_w[None, :],
                      mask=s_ok[:, None] & (offs_w[None, :] < W), other=0.0)
        acc += tl.sum(o_s * w[:, None], 0)
    total = tl.sum(tot, 0)
    has = total > 0.0
    tl.store(LSE + pid.to(tl.int64), tl.where(has, m_use + tl.log2(tl.where(has, total, 1.0)), float("inf")))
    tl.store(O + b * stride_ob + h * stride_oh + i * stride_om + offs_w,
             (acc / tl.where(has, total, 1.0)).to(O.dtype.element_ty), mask=offs_w < W)


def plan_split_combine(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor) -> LaunchSpec:
    """o_parts [B, H, S, Lq, W] (last dim contiguous), lse_parts [B, H, S, Lq] → out [B, H, Lq, W], lse [B, H, Lq]."""
    B, H, S, Lq, W = o_parts.shape
    (osb, osh, oss, osm), (lsb, lsh, lss), (ob, oh, om) = strides(o_parts, 4), strides(lse_parts), strides(out)
    return LaunchSpec(
        "split_combine", _split_combine_kernel, (B * H * Lq,),
        dict(OS=o_parts, LSES=lse_parts, O=out, LSE=lse, H=H, Lq=Lq, S=S,
             stride_osb=osb, stride_osh=osh, stride_oss=oss, stride_osm=osm, stride_lsb=lsb, stride_lsh=lsh,
             stride_lss=lss, stride_ob=ob, stride_oh=oh, stride_om=om, W=W, BLOCK_S=16),
        num_warps=4, num_stages=1,
    )
