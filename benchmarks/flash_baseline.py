"""Baseline for the static kernel report: a plain causal FlashAttention-2 forward in Triton, built from the same
pieces as the TAPA / TAPE forward kernels (online base-2 softmax with the scale folded into the exponent's
FMA and lazy rescaling, unmasked loop over fully visible key blocks then a masked loop over the diagonal, fast exp2 on CUDA) and
planned with the TAPA forward's tiles (and, as a second spec, the TAPE forward's), so the per-score-element
instruction counts compare like with like.

`flash_attention_baseline(q, k, v)` runs it (CUDA, or the interpreter for the test); `lane_specs` lets the
compile lane and `kernels_static.py` compile it exactly like the package's kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_posenc.kernels._triton.blocks import block_range, load_tile, softmax_block, store_rows, visible
from hf_posenc.kernels._triton.fastmath import LOG2E, fp32
from hf_posenc.kernels._triton.launch import LaunchSpec, Target, jit_runtime_ints, launch_all, pow2
from hf_posenc.kernels._triton.layout import Tile, strides
from hf_posenc.kernels.tapa.triton_tapa import tiles as tapa_tiles
from hf_posenc.kernels.tape.triton_tape import tiles as tape_tiles


@triton.jit
def _block(acc, m_i, l_i, q, qi, start_n, k_base, v_base, k_off, v_off, skl, svl, Lk, rb, qk_scale,
           BLOCK_N: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr):
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < Lk
    n64 = tl.cast(start_n, tl.int64)
    k = load_tile(k_base + n64 * skl + k_off, col_ok, col_ok, MASKED, False)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(visible(qi[:, None], cols[None, :], col_ok[None, :], rb, -Lk - 1), s, float("-inf"))
    acc, l_i, m_i, p = softmax_block(acc, l_i, m_i, s, qk_scale, True, FAST)
    v = load_tile(v_base + n64 * svl + v_off, col_ok, col_ok, MASKED, False)
    acc = acc + tl.dot(p.to(v.dtype), v)
    return acc, m_i, l_i


@jit_runtime_ints("H", "Lq", "Lk")
def _flash_fwd_kernel(Q, K, V, O, sqb, sqh, sql, skb, skh, skl, svb, svh, svl, sob, soh, sol,
                      H, GROUP, Lq, Lk, qk_scale,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FAST: tl.constexpr):
    """Causal softmax(scale·q kᵀ)·v for one query tile of one head (D a power of two)."""
    qk_scale = fp32(qk_scale)  # fp32 loop state under torch.compile's fp64 float arguments too, as the kernels do
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b64 = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    h64 = h.to(tl.int64)
    kv64 = (h // GROUP).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < Lq
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    q = load_tile((Q + b64 * sqb + h64 * sqh + rows.to(tl.int64) * sql)[:, None] + offs_d[None, :], row_ok,
                  row_ok, True, False)
    k_base = K + b64 * skb + kv64 * skh
    v_base = V + b64 * svb + kv64 * svh
    k_off = offs_n[:, None] * skl + offs_d[None, :]
    v_off = offs_n[:, None] * svl + offs_d[None, :]
    off = Lk - Lq
    lo, u_lo, u_hi, n_left, n_masked = block_range(m0 * 0, Lk, m0, tl.minimum(m0 + BLOCK_M, Lq) - 1, off, off,
                                                   Lk + 1, 0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(u_lo, u_hi, BLOCK_N):
        acc, m_i, l_i = _block(acc, m_i, l_i, q, rows, start_n, k_base, v_base, k_off, v_off, skl, svl, Lk, off,
                               qk_scale, BLOCK_N, False, FAST)
    for it in range(0, n_masked):
        start_n = tl.where(it < n_left, lo + it * BLOCK_N, u_hi + (it - n_left) * BLOCK_N)
        acc, m_i, l_i = _block(acc, m_i, l_i, q, rows, start_n, k_base, v_base, k_off, v_off, skl, svl, Lk, off,
                               qk_scale, BLOCK_N, True, FAST)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    store_rows((O + b64 * sob + h64 * soh + rows.to(tl.int64) * sol)[:, None] + offs_d[None, :],
               out.to(O.dtype.element_ty), row_ok, row_ok, False)


def plan_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, target: Target, tile: Tile | None = None,
                 name: str = "flash_fwd") -> tuple[LaunchSpec, torch.Tensor]:
    """Launch plan with the TAPA forward's tiles for this head dim (or `tile`)."""
    B, H, Lq, D = q.shape
    if D != pow2(D):
        raise ValueError(f"the baseline kernel takes power-of-two head dims, got {D}")
    t = tile if tile is not None else tapa_tiles(target, D)["fwd"]
    o = torch.empty_like(q)
    spec = LaunchSpec(
        name, _flash_fwd_kernel, (triton.cdiv(Lq, t.block_m), B * H),
        dict(Q=q, K=k, V=v, O=o, **dict(zip(("sqb", "sqh", "sql"), strides(q))),
             **dict(zip(("skb", "skh", "skl"), strides(k))), **dict(zip(("svb", "svh", "svl"), strides(v))),
             **dict(zip(("sob", "soh", "sol"), strides(o))), H=H, GROUP=H // k.shape[1], Lq=Lq, Lk=k.shape[2],
             qk_scale=D ** -0.5 * LOG2E, D=D, BLOCK_M=t.block_m, BLOCK_N=t.block_n, FAST=target.fast_math),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    return spec, o


def flash_attention_baseline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention with the baseline kernel (queries at the end of the key sequence)."""
    spec, o = plan_forward(q, k, v, Target.of(q))
    launch_all([spec])
    return o


def lane_specs(target: Target, dtype: torch.dtype, head_dim: int) -> list[LaunchSpec]:
    """The baseline with the TAPA forward's tiles, and with the TAPE forward's tiles (E as wide as the head)."""
    q = torch.empty(2, 8, 1024, head_dim, device="meta", dtype=dtype)
    k = torch.empty(2, 2, 1024, head_dim, device="meta", dtype=dtype)
    tape_tile = tape_tiles(target, pow2(head_dim), pow2(head_dim))["fwd"]
    return [plan_forward(q, k, k, target)[0], plan_forward(q, k, k, target, tape_tile, "flash_fwd_tape_tiles")[0]]
