"""Flash-style Triton kernels for TAPA attention (paper eq. 12; linear phase eq. 16).

Score (eq. 12), with a = q_A·k_A, p = q_P·k_P (eq. 16: p = Σq_P + Σk_P), d = |m − n|:

    s = c_A·a·cos(2π·t),   t = c_P·d^α·p  (in turns),   c_A = 1/√(θD),  c_P = 1/√((1−θ)D)

Forward: one program per (query tile, query head) keeps its Q tile on chip and streams K/V with an online
softmax in base 2 (log2(e) is folded into c_A, the base-2 log-sum-exp is saved for the backward; prefill tiles
rescale lazily, only when a row maximum grows by more than 2^8: `hf_posenc.kernels._triton.blocks.lazy_max`). Both
half-width products a and p are tl.dot's over the split head dimension. The phase runs in fp32:
c_P·d^α = 2^(α·log2 d + log2 c_P) (0 at d = 0, where log2 d = −inf), t is range-reduced exactly to
r = t − rint(t) and cos(2π r) is evaluated, so long distances stay accurate when q/k are bf16. On CUDA the
transcendental steps are single special-function instructions (see `hf_posenc.kernels._triton.fastmath`); the
interpreter runs the accurate library functions. Positions enter as fp32 offsets from the batch row's
first key position (distances exact while positions span less than 2^24: `_Inputs.relative_positions`).

Masks are runtime arguments, so one binary serves every mask combination (the constexpr variants are the
phase mode LINEAR only): causality and the sliding window are integers; key padding and segment ids become
int32 "tags" (query i sees key j only if their tags are equal; padded keys carry a tag no query has).
Key blocks that every row of a tile sees in full run through an unmasked loop; the blocks at the causal
diagonal, at the window's left edge and at the ragged end run through one masked loop, and blocks outside
every row's window are never visited. With tags present every visible block takes the masked loop (the
tag compare costs about as much as the causal one), so calls without padding or packing pay nothing.

Decode (Lq ≤ 16) runs through the same forward kernel with another layout, planned in `decode.py`: the query
rows of a whole GQA group packed into one tile, the key axis split across programs (split-K), the partials
merged by the shared split-combine kernel.

Backward (FlashAttention-2 scheme): Δ = rowsum(dO∘O); dK/dV per key block looping over the group's query
heads and query blocks. Scores are recomputed with cos and sin from one range reduction, dS = P∘(dP − Δ),
and the chain rule runs through both products: ∂s/∂a = c_A cos φ, ∂s/∂p = −2π c_A c_P d^α a sin φ (the
constants c_A and −2π·c_A are applied once to the accumulated gradients, not per element). dQ either comes
from the same tiles, added atomically into an fp32 buffer (fused: the trigonometry runs once per score
element; the default where the tile table lists it), or from a second kernel per query block looping over key
blocks, which recomputes the scores (no atomics, bitwise reproducible: `deterministic=True`).

All host-side choices (tiles, warps, stages, split-K, constexprs) are made by `plan_forward` (`decode.plan_decode`
for decode) / `plan_backward` for a `Target`; the launcher runs those plans and the compile lane compiles them.
Constexprs that follow from other arguments (padded widths BDA / BDP / BDV, the dot precision IN_PREC of the
input dtype, LAZY) are declared on the kernels with `triton.heuristics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl

from .._triton.blocks import (
    add_rows,
    block_range,
    load_tile,
    load_vector,
    masked_block,
    next_pair,
    packed_rows,
    query_block_range,
    softmax_block,
    store_rows,
    visible,
)
from .._triton.combine import plan_row_dot
from .._triton.fastmath import LOG2E, cos_sin_turns, cos_turns, exp2, fp32, log2
from .._triton.launch import (
    SPILL_FREE_MAX_HEAD_DIM,
    LaunchSpec,
    Target,
    dot_precision,
    interpreting,
    jit_runtime_ints,
    launch_all,
    padded_widths,
    pow2,
)
from .._triton.layout import (
    DECODE_MAX_LQ,
    INTERPRETER_TILE,
    NO_WINDOW,
    ForwardLayout,
    Tile,
    strides,
    table_row,
    use_decode_path,
)
from .args import PHASES, TapaArgs, tapa_op, validate_tapa_args
from .decode import plan_decode

# shape, window and mask-presence arguments vary from call to call: one binary serves them all
_jit = jit_runtime_ints("H_PROG", "GP", "GROUP", "R", "H", "HKV", "Lq", "Lk", "split_len", "causal", "window",
                        "has_tags")
# constexprs every TAPA kernel derives from its other arguments: padded amplitude / phase widths and the dot
# precision of the inputs (with the padded value width, whose parameter name differs per kernel)
_WIDTHS = dict(padded_widths(BDA="DA", BDP="DP"), IN_PREC=lambda a: dot_precision(a["Q"]))


# ----------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _dpow(q_pos2, k_pos2, d_ref, alpha, log2_cp, FAST: tl.constexpr):
    """c_P·d^α with d = |q_pos − k_pos| (fp32 positions, 2-D broadcast); 0 at d = 0. Fast path:
    log2 d = e + lg2(d·2^-e), 2^e the largest power of two <= the tile's reference distance d_ref (exact
    integer and exact scaling), so the approximate lg2 sees arguments near 1 where distances, and phases, are
    large (its error there is absolute, 2^-22, instead of 2 ulp of log2 d)."""
    d = tl.abs(q_pos2 - k_pos2)
    if FAST:
        e = (tl.maximum(d_ref, 1.0).to(tl.int32, bitcast=True) >> 23) - 127
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
        base = alpha * e.to(tl.float32) + log2_cp
        return exp2(alpha * log2(d * inv, FAST) + base, FAST)  # log2(0) = -inf -> 2^-inf = 0
    else:
        return tl.where(d > 0.0, tl.exp2(alpha * tl.log2(tl.maximum(d, 1.0)) + log2_cp), 0.0)


@triton.jit
def _row_block(start, base, off_a, off_p, off_v, stride_a, stride_v, POS, L,
               DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
               DV: tl.constexpr, BDV: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr,
               LINEAR: tl.constexpr):
    """Rows [start, start + BLOCK) of a q|k-like tensor (split into its θD amplitude and (1−θ)D phase
    columns) and of the matching v|dO-like tensor, plus their positions; `base` = (q|k rows, v|dO rows, phase
    row sums). With the linear phase (eq. 16) only the phase columns' row sums enter, so the fp32 sums the host
    computed are loaded instead of the columns. The 64-bit part of every address is the scalar row offset;
    `off_*` are the tile's int32 offsets. Row masks only in MASKED blocks."""
    idx = start + tl.arange(0, BLOCK)
    ok = idx < L
    r64 = tl.cast(start, tl.int64)
    xb = base[0] + r64 * stride_a
    x_a = load_tile(xb + off_a, ok, tl.arange(0, BDA) < DA, MASKED, BDA != DA)
    if LINEAR:
        x_p = load_vector(base[2] + idx, ok, 0.0, MASKED)
    else:
        x_p = load_tile(xb + DA + off_p, ok, tl.arange(0, BDP) < DP, MASKED, BDP != DP)
    y = load_tile(base[1] + r64 * stride_v + off_v, ok, tl.arange(0, BDV) < DV, MASKED, BDV != DV)
    pos = load_vector(POS + idx, ok, 0.0, MASKED)
    return idx, ok, x_a, x_p, y, pos


@triton.jit
def _tile_offsets(stride_x, stride_y, BLOCK: tl.constexpr, BDA: tl.constexpr, BDP: tl.constexpr,
                  BDV: tl.constexpr):
    """The int32 offsets `_row_block` takes for a BLOCK-row tile: amplitude and phase columns of a q|k-like
    tensor (row stride stride_x), columns of the matching v|dO-like tensor (row stride stride_y)."""
    rows = tl.arange(0, BLOCK)[:, None]
    return (rows * stride_x + tl.arange(0, BDA)[None, :], rows * stride_x + tl.arange(0, BDP)[None, :],
            rows * stride_y + tl.arange(0, BDV)[None, :])


@triton.jit
def _products(x_a, x_p, y_a, y_p, LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    """(a, p) of rows x against rows y, [rows(x), rows(y)]: a = x_A·y_Aᵀ and p = x_P·y_Pᵀ (eq. 12) or
    Σx_P + Σy_P (eq. 16; x_p and y_p are then the row sums)."""
    amp = tl.dot(x_a, tl.trans(y_a), input_precision=IN_PREC)
    if LINEAR:
        ph = x_p[:, None] + y_p[None, :]
    else:
        ph = tl.dot(x_p, tl.trans(y_p), input_precision=IN_PREC)
    return amp, ph


@triton.jit
def _key_block(qa, qp, q_ref, start_n, kv_base, k_off_a, k_off_p, v_off, stride_kn, stride_vn, KPOS, Lk,
               DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
               DV: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    """Key block [start_n, start_n + BLOCK_N) of a query tile: its K/V rows and positions, the products a and p
    ([M, N]) and the tile's reference distance (query tile middle to key block middle)."""
    offs_n, n_ok, ka, kp, v, k_pos = _row_block(start_n, kv_base, k_off_a, k_off_p, v_off, stride_kn, stride_vn,
                                                KPOS, Lk, DA, BDA, DP, BDP, DV, BDV, BLOCK_N, MASKED, LINEAR)
    amp, ph = _products(qa, qp, ka, kp, LINEAR, IN_PREC)
    d_ref = tl.abs(q_ref - tl.load(KPOS + tl.minimum(start_n + BLOCK_N // 2, Lk - 1)))
    return offs_n, n_ok, ka, kp, v, k_pos, amp, ph, d_ref


@triton.jit
def _masked(s, q_idx2, k_idx2, k_ok2, q_tag2, k_tag2, rb, lb):
    """−inf where a key is invisible: causal / window / bounds, and different tags (padding, segments)."""
    return tl.where(visible(q_idx2, k_idx2, k_ok2, rb, lb) & (q_tag2 == k_tag2), s, float("-inf"))


@triton.jit
def _bwd_scores(amp, ph, q_pos2, k_pos2, d_ref, alpha, log2_cp, FAST: tl.constexpr):
    """(a·cos φ, cos φ, c_P·d^α·a·sin φ) of one tile: the score in units of c_A and the two chain-rule
    factors (without their constants c_A and −2π·c_A), from one range reduction."""
    dpow = _dpow(q_pos2, k_pos2, d_ref, alpha, log2_cp, FAST)
    cos_phi, sin_phi = cos_sin_turns(dpow * ph, FAST)
    return amp * cos_phi, cos_phi, dpow * amp * sin_phi


# ----------------------------------------------------------------------------------------------------
# Forward (prefill, chunked prefill and split-K decode)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_block(acc, l_i, m_i, qa, qp, q_pos, q_ref, q_tag, qi, start_n, kv_base, k_off_a, k_off_p, v_off,
               stride_kn, stride_vn, KPOS, KTAG, Lk, rb, lb, has_tags, alpha, log2_cp, c_a2,
               DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
               DV: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               LINEAR: tl.constexpr, IN_PREC: tl.constexpr, FAST: tl.constexpr, LAZY: tl.constexpr):
    """One key block [start_n, start_n + BLOCK_N) through the online softmax (scores in units of c_A)."""
    offs_n, n_ok, ka, kp, v, k_pos, amp, ph, d_ref = _key_block(
        qa, qp, q_ref, start_n, kv_base, k_off_a, k_off_p, v_off, stride_kn, stride_vn, KPOS, Lk,
        DA, BDA, DP, BDP, DV, BDV, BLOCK_N, MASKED, LINEAR, IN_PREC)
    s = amp * cos_turns(_dpow(q_pos[:, None], k_pos[None, :], d_ref, alpha, log2_cp, FAST) * ph, FAST)
    if MASKED:
        k_tag = tl.load(KTAG + offs_n, mask=offs_n < Lk * has_tags, other=0)
        s = _masked(s, qi[:, None], offs_n[None, :], n_ok[None, :], q_tag[:, None], k_tag[None, :], rb, lb)
    acc, l_i, m_i, p = softmax_block(acc, l_i, m_i, s, c_a2, LAZY, FAST)
    acc = acc + tl.dot(p.to(v.dtype), v, input_precision=IN_PREC)
    return acc, l_i, m_i


@triton.heuristics(dict(_WIDTHS, **padded_widths(BDV="DV"), LAZY=lambda a: not use_decode_path(a["Lq"])))
@_jit
def _tapa_fwd_kernel(Q, K, V, O, LSE, QPOS, KPOS, QTAG, KTAG, QSUM, KSUM,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_sqb, stride_sqh, stride_skb, stride_skh,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_os, stride_om,
                     stride_lb, stride_lh, stride_ls,
                     H_PROG, GP, GROUP, R, Lq, Lk, split_len, causal, window, has_tags, alpha, log2_cp, c_a2, lse_empty,
                     DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                     DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     LINEAR: tl.constexpr, IN_PREC: tl.constexpr, FAST: tl.constexpr, LAZY: tl.constexpr):
    """Program (row tile, (batch, head program), key split). A head program owns GP query heads whose R = GP·Lq
    rows are packed (row r: head hp·GP + r div Lq, query r mod Lq); GP = 1 for prefill. Writes O (normalised, in
    O's dtype) and the base-2 LSE of its split; rows without a visible key get O = 0 and LSE = lse_empty (−inf
    for split partials, which the combine weighs by 2^LSE; +inf in the final LSE, so the backward's P = 0).
    LAZY (lazy rescaling) is on for prefill, off for decode lengths."""
    # fp32 scalars whatever the caller typed them (torch.compile's Inductor passes Python floats as fp64)
    alpha, log2_cp, c_a2, lse_empty = fp32(alpha), fp32(log2_cp), fp32(c_a2), fp32(lse_empty)
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(2)
    b64, kvh64, row_ok, head64, qi, qi_lo, qi_hi = packed_rows(pid_m, tl.program_id(1), H_PROG, GP, GROUP, R, Lq,
                                                               BLOCK_M)
    qi64 = qi.to(tl.int64)
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    q_row = Q + b64 * stride_qb + head64 * stride_qh + qi64 * stride_qm
    qa = load_tile(q_row[:, None] + offs_da[None, :], row_ok, offs_da < DA, True, BDA != DA)
    if LINEAR:
        qp = tl.load(QSUM + b64 * stride_sqb + head64 * stride_sqh + qi, mask=row_ok, other=0.0)
    else:
        qp = load_tile(q_row[:, None] + DA + offs_dp[None, :], row_ok, offs_dp < DP, True, BDP != DP)
    q_pos = tl.load(QPOS + b64 * Lq + qi)
    q_ref = tl.load(QPOS + b64 * Lq + tl.minimum(pid_m * BLOCK_M + BLOCK_M // 2, R - 1) % Lq)
    q_tag = tl.load(QTAG + b64 * Lq + qi, mask=qi < Lq * has_tags, other=0)  # has_tags is 0 or 1
    offs_n = tl.arange(0, BLOCK_N)
    kv_base = (K + b64 * stride_kb + kvh64 * stride_kh, V + b64 * stride_vb + kvh64 * stride_vh,
               KSUM + b64 * stride_skb + kvh64 * stride_skh)
    # written out, not `_tile_offsets`: the shared column offsets keep this kernel 3 registers lower on sm_90
    k_off_a = offs_n[:, None] * stride_kn + offs_da[None, :]
    k_off_p = offs_n[:, None] * stride_kn + offs_dp[None, :]
    v_off = offs_n[:, None] * stride_vn + offs_dv[None, :]
    kpos_b = KPOS + b64 * Lk
    ktag_b = KTAG + b64 * Lk

    off = Lk - Lq
    rb = tl.where(causal != 0, off, Lk)  # key j visible to query i iff j − i <= rb ...
    lb = off - window  # ... and j − i > off − window
    lo_s = pid_s * split_len
    lo, u_lo, u_hi, n_left, n_masked = block_range(lo_s, tl.minimum(lo_s + split_len, Lk), qi_lo, qi_hi, off, rb,
                                                   window, has_tags, BLOCK_N)

    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for start_n in range(u_lo, u_hi, BLOCK_N):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, qa, qp, q_pos, q_ref, q_tag, qi, start_n, kv_base, k_off_a,
                                   k_off_p, v_off, stride_kn, stride_vn, kpos_b, ktag_b, Lk, rb, lb, has_tags,
                                   alpha, log2_cp, c_a2, DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                                   False, LINEAR, IN_PREC, FAST, LAZY)
    for it in range(0, n_masked):
        start_n = masked_block(it, n_left, lo, u_hi, BLOCK_N)
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, qa, qp, q_pos, q_ref, q_tag, qi, start_n, kv_base, k_off_a,
                                   k_off_p, v_off, stride_kn, stride_vn, kpos_b, ktag_b, Lk, rb, lb, has_tags,
                                   alpha, log2_cp, c_a2, DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                                   True, LINEAR, IN_PREC, FAST, LAZY)

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), lse_empty)
    tl.store(LSE + b64 * stride_lb + head64 * stride_lh + pid_s * stride_ls + qi64, lse, mask=row_ok)
    o_row = O + b64 * stride_ob + head64 * stride_oh + pid_s * stride_os + qi64 * stride_om
    store_rows(o_row[:, None] + offs_dv[None, :], out.to(O.dtype.element_ty), row_ok, offs_dv < DV, BDV != DV)


# ----------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_block(dk_a, dk_p, dk_psum, dv, ka, kp, v, k_pos, k_ref, k_tag, offs_n, n_ok, start_m,
                qdo_base, q_off_a, q_off_p, do_off, stride_qm, stride_dom, LSE, DELTA, QPOS, QTAG, DQ, stride_dqm,
                Lq, rb, lb, has_tags, alpha, log2_cp, c_a2,
                DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                LINEAR: tl.constexpr, IN_PREC: tl.constexpr, FAST: tl.constexpr, FUSE_DQ: tl.constexpr):
    """dK/dV contributions of query block [start_m, start_m + BLOCK_M) to one key block ([N, M] tiles); with
    FUSE_DQ also the block's dQ contribution, added atomically to the fp32 rows at DQ (constants not applied;
    for the linear phase the row sums go to column DA)."""
    offs_m, m_ok, qa, qp, do, q_pos = _row_block(start_m, qdo_base, q_off_a, q_off_p, do_off, stride_qm,
                                                 stride_dom, QPOS, Lq, DA, BDA, DP, BDP, DV, BDV, BLOCK_M, MASKED,
                                                 LINEAR)
    lse = load_vector(LSE + offs_m, m_ok, float("inf"), MASKED)  # +inf: P = 0
    delta = load_vector(DELTA + offs_m, m_ok, 0.0, MASKED)
    amp, ph = _products(ka, kp, qa, qp, LINEAR, IN_PREC)  # [N, M]
    d_ref = tl.abs(k_ref - tl.load(QPOS + tl.minimum(start_m + BLOCK_M // 2, Lq - 1)))
    s, g_a, g_p = _bwd_scores(amp, ph, q_pos[None, :], k_pos[:, None], d_ref, alpha, log2_cp, FAST)
    if MASKED:
        q_tag = tl.load(QTAG + offs_m, mask=offs_m < Lq * has_tags, other=0)
        s = _masked(s, offs_m[None, :], offs_n[:, None], n_ok[:, None], q_tag[None, :], k_tag[:, None], rb, lb)
    p = exp2(s * c_a2 - lse[None, :], FAST)
    dv += tl.dot(p.to(do.dtype), do, input_precision=IN_PREC)
    dp = tl.dot(v, tl.trans(do), input_precision=IN_PREC)
    ds = p * (dp - delta[None, :])
    ds_a = (ds * g_a).to(qa.dtype)
    dk_a += tl.dot(ds_a, qa, input_precision=IN_PREC)
    if LINEAR:
        ds_p = ds * g_p
        dk_psum += tl.sum(ds_p, 1)
    else:
        ds_p = (ds * g_p).to(qp.dtype)
        dk_p += tl.dot(ds_p, qp, input_precision=IN_PREC)
    if FUSE_DQ:
        dq_rows = DQ + offs_m[:, None] * stride_dqm
        add_rows(dq_rows + tl.arange(0, BDA)[None, :], tl.dot(tl.trans(ds_a), ka, input_precision=IN_PREC), m_ok,
                 tl.arange(0, BDA) < DA, MASKED, BDA != DA)
        if LINEAR:
            if MASKED:
                tl.atomic_add(DQ + offs_m * stride_dqm + DA, tl.sum(ds_p, 0), mask=m_ok, sem="relaxed")
            else:
                tl.atomic_add(DQ + offs_m * stride_dqm + DA, tl.sum(ds_p, 0), sem="relaxed")
        else:
            add_rows(dq_rows + DA + tl.arange(0, BDP)[None, :], tl.dot(tl.trans(ds_p), kp, input_precision=IN_PREC),
                     m_ok, tl.arange(0, BDP) < DP, MASKED, BDP != DP)
    return dk_a, dk_p, dk_psum, dv


@triton.heuristics(dict(_WIDTHS, **padded_widths(BDV="DV_")))
@_jit
def _tapa_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ, QPOS, KPOS, QTAG, KTAG, QSUM, KSUM,
                          stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                          stride_sqb, stride_sqh, stride_skb, stride_skh,
                          stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          stride_dqb, stride_dqh, stride_dqm,
                          H, HKV, GROUP, Lq, Lk, causal, window, has_tags, alpha, log2_cp, c_a, c_a2,
                          DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                          DV_: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          LINEAR: tl.constexpr, IN_PREC: tl.constexpr, FAST: tl.constexpr, FUSE_DQ: tl.constexpr):
    """dK, dV of one key block of one kv head, summed over the group's query heads and query blocks. With
    FUSE_DQ the same tiles also give dQ (atomic fp32 adds into DQ, which the host scales and casts), so the
    scores, cos and sin are computed once per score element for the whole backward."""
    # fp32 scalars whatever the caller typed them (torch.compile's Inductor passes Python floats as fp64)
    alpha, log2_cp, c_a, c_a2 = fp32(alpha), fp32(log2_cp), fp32(c_a), fp32(c_a2)
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    b64 = (pid_bkv // HKV).to(tl.int64)
    kvh64 = (pid_bkv % HKV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    k_off_a, k_off_p, v_off = _tile_offsets(stride_kn, stride_vn, BLOCK_N, BDA, BDP, BDV)
    offs_n, n_ok, ka, kp, v, k_pos = _row_block(
        start_n, (K + b64 * stride_kb + kvh64 * stride_kh, V + b64 * stride_vb + kvh64 * stride_vh,
                  KSUM + b64 * stride_skb + kvh64 * stride_skh),
        k_off_a, k_off_p, v_off, stride_kn, stride_vn, KPOS + b64 * Lk, Lk, DA, BDA, DP, BDP, DV_, BDV, BLOCK_N,
        True, LINEAR)
    k_ref = tl.load(KPOS + b64 * Lk + tl.minimum(start_n + BLOCK_N // 2, Lk - 1))
    k_tag = tl.load(KTAG + b64 * Lk + offs_n, mask=offs_n < Lk * has_tags, other=0)
    dk_a = tl.zeros([BLOCK_N, BDA], dtype=tl.float32)
    dk_p = tl.zeros([BLOCK_N, BDP], dtype=tl.float32)
    dk_psum = tl.zeros([BLOCK_N], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BDV], dtype=tl.float32)

    off = Lk - Lq
    rb = tl.where(causal != 0, off, Lk)
    lb = off - window
    m_lo, u_lo, u_hi, n_left, n_masked, n_full = query_block_range(start_n, Lq, Lk, rb, lb, has_tags, BLOCK_M,
                                                                   BLOCK_N)

    q_off_a, q_off_p, do_off = _tile_offsets(stride_qm, stride_dom, BLOCK_M, BDA, BDP, BDV)
    # (query head of the group, query block) pairs in flat loops (nested loops cost registers): first the
    # blocks every query row of which sees the whole key block, then the masked ones (diagonal band, window
    # edge, ragged ends). h64 / j count the pairs.
    h64 = kvh64 * GROUP
    j = start_n * 0
    for _ in range(0, GROUP * n_full):
        row0 = (b64 * H + h64) * Lq
        dk_a, dk_p, dk_psum, dv = _dkdv_block(
            dk_a, dk_p, dk_psum, dv, ka, kp, v, k_pos, k_ref, k_tag, offs_n, n_ok, u_lo + j * BLOCK_M,
            (Q + b64 * stride_qb + h64 * stride_qh, DO + b64 * stride_dob + h64 * stride_doh,
             QSUM + b64 * stride_sqb + h64 * stride_sqh),
            q_off_a, q_off_p, do_off, stride_qm, stride_dom, LSE + row0, DELTA + row0,
            QPOS + b64 * Lq, QTAG + b64 * Lq, DQ + b64 * stride_dqb + h64 * stride_dqh, stride_dqm, Lq, rb, lb,
            has_tags, alpha, log2_cp, c_a2, DA, BDA, DP, BDP, DV_, BDV, BLOCK_M, False, LINEAR, IN_PREC, FAST,
            FUSE_DQ)
        h64, j = next_pair(h64, j, n_full)
    h64 = kvh64 * GROUP
    j = start_n * 0
    for _ in range(0, GROUP * n_masked):
        row0 = (b64 * H + h64) * Lq
        dk_a, dk_p, dk_psum, dv = _dkdv_block(
            dk_a, dk_p, dk_psum, dv, ka, kp, v, k_pos, k_ref, k_tag, offs_n, n_ok,
            masked_block(j, n_left, m_lo, u_hi, BLOCK_M),
            (Q + b64 * stride_qb + h64 * stride_qh, DO + b64 * stride_dob + h64 * stride_doh,
             QSUM + b64 * stride_sqb + h64 * stride_sqh),
            q_off_a, q_off_p, do_off, stride_qm, stride_dom, LSE + row0, DELTA + row0,
            QPOS + b64 * Lq, QTAG + b64 * Lq, DQ + b64 * stride_dqb + h64 * stride_dqh, stride_dqm, Lq, rb, lb,
            has_tags, alpha, log2_cp, c_a2, DA, BDA, DP, BDP, DV_, BDV, BLOCK_M, True, LINEAR, IN_PREC, FAST,
            FUSE_DQ)
        h64, j = next_pair(h64, j, n_masked)

    dk_a = dk_a * c_a
    if LINEAR:
        dk_p = tl.zeros([BLOCK_N, BDP], dtype=tl.float32) + (dk_psum * (-6.283185307179586 * c_a))[:, None]
    else:
        dk_p = dk_p * (-6.283185307179586 * c_a)
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    dk_rows = DK + b64 * stride_dkb + kvh64 * stride_dkh + offs_n.to(tl.int64) * stride_dkn
    store_rows(dk_rows[:, None] + offs_da[None, :], dk_a.to(DK.dtype.element_ty), n_ok, offs_da < DA, BDA != DA)
    store_rows(dk_rows[:, None] + DA + offs_dp[None, :], dk_p.to(DK.dtype.element_ty), n_ok, offs_dp < DP,
               BDP != DP)
    dv_rows = DV + b64 * stride_dvb + kvh64 * stride_dvh + offs_n.to(tl.int64) * stride_dvn
    store_rows(dv_rows[:, None] + offs_dv[None, :], dv.to(DV.dtype.element_ty), n_ok, offs_dv < DV_, BDV != DV_)


@triton.jit
def _dq_block(dq_a, dq_p, dq_psum, qa, qp, do, lse, delta, q_pos, q_ref, q_tag, offs_m, start_n,
              kv_base, k_off_a, k_off_p, v_off, stride_kn, stride_vn, KPOS, KTAG,
              Lk, rb, lb, has_tags, alpha, log2_cp, c_a2,
              DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
              DV: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
              LINEAR: tl.constexpr, IN_PREC: tl.constexpr, FAST: tl.constexpr):
    """dQ contributions of key block [start_n, start_n + BLOCK_N) to one query block ([M, N] tiles)."""
    offs_n, n_ok, ka, kp, v, k_pos, amp, ph, d_ref = _key_block(
        qa, qp, q_ref, start_n, kv_base, k_off_a, k_off_p, v_off, stride_kn, stride_vn, KPOS, Lk,
        DA, BDA, DP, BDP, DV, BDV, BLOCK_N, MASKED, LINEAR, IN_PREC)
    s, g_a, g_p = _bwd_scores(amp, ph, q_pos[:, None], k_pos[None, :], d_ref, alpha, log2_cp, FAST)
    if MASKED:
        k_tag = tl.load(KTAG + offs_n, mask=offs_n < Lk * has_tags, other=0)
        s = _masked(s, offs_m[:, None], offs_n[None, :], n_ok[None, :], q_tag[:, None], k_tag[None, :], rb, lb)
    p = exp2(s * c_a2 - lse[:, None], FAST)
    dp = tl.dot(do, tl.trans(v), input_precision=IN_PREC)
    ds = p * (dp - delta[:, None])
    dq_a += tl.dot((ds * g_a).to(ka.dtype), ka, input_precision=IN_PREC)
    if LINEAR:
        dq_psum += tl.sum(ds * g_p, 1)
    else:
        dq_p += tl.dot((ds * g_p).to(kp.dtype), kp, input_precision=IN_PREC)
    return dq_a, dq_p, dq_psum


@triton.heuristics(dict(_WIDTHS, **padded_widths(BDV="DV")))
@_jit
def _tapa_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, QPOS, KPOS, QTAG, KTAG, QSUM, KSUM,
                        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                        stride_sqb, stride_sqh, stride_skb, stride_skh,
                        stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                        stride_dqb, stride_dqh, stride_dqm,
                        H, GROUP, Lq, Lk, causal, window, has_tags, alpha, log2_cp, c_a, c_a2,
                        DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                        DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        LINEAR: tl.constexpr, IN_PREC: tl.constexpr, FAST: tl.constexpr):
    """dQ of one query block of one query head, looping over the visible key blocks."""
    # fp32 scalars whatever the caller typed them (torch.compile's Inductor passes Python floats as fp64)
    alpha, log2_cp, c_a, c_a2 = fp32(alpha), fp32(log2_cp), fp32(c_a), fp32(c_a2)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b64 = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    h64 = h.to(tl.int64)
    kvh64 = (h // GROUP).to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_off_a, q_off_p, do_off = _tile_offsets(stride_qm, stride_dom, BLOCK_M, BDA, BDP, BDV)
    offs_m, m_ok, qa, qp, do, q_pos = _row_block(
        start_m, (Q + b64 * stride_qb + h64 * stride_qh, DO + b64 * stride_dob + h64 * stride_doh,
                  QSUM + b64 * stride_sqb + h64 * stride_sqh),
        q_off_a, q_off_p, do_off, stride_qm, stride_dom, QPOS + b64 * Lq, Lq, DA, BDA, DP, BDP, DV, BDV, BLOCK_M,
        True, LINEAR)
    row0 = (b64 * H + h64) * Lq
    lse = tl.load(LSE + row0 + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + offs_m, mask=m_ok, other=0.0)
    q_tag = tl.load(QTAG + b64 * Lq + offs_m, mask=offs_m < Lq * has_tags, other=0)
    q_ref = tl.load(QPOS + b64 * Lq + tl.minimum(start_m + BLOCK_M // 2, Lq - 1))
    kv_base = (K + b64 * stride_kb + kvh64 * stride_kh, V + b64 * stride_vb + kvh64 * stride_vh,
               KSUM + b64 * stride_skb + kvh64 * stride_skh)
    k_off_a, k_off_p, v_off = _tile_offsets(stride_kn, stride_vn, BLOCK_N, BDA, BDP, BDV)
    kpos_b = KPOS + b64 * Lk
    ktag_b = KTAG + b64 * Lk

    off = Lk - Lq
    rb = tl.where(causal != 0, off, Lk)
    lb = off - window
    lo, u_lo, u_hi, n_left, n_masked = block_range(start_m * 0, Lk, start_m, tl.minimum(start_m + BLOCK_M, Lq) - 1,
                                                   off, rb, window, has_tags, BLOCK_N)
    dq_a = tl.zeros([BLOCK_M, BDA], dtype=tl.float32)
    dq_p = tl.zeros([BLOCK_M, BDP], dtype=tl.float32)
    dq_psum = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(u_lo, u_hi, BLOCK_N):
        dq_a, dq_p, dq_psum = _dq_block(
            dq_a, dq_p, dq_psum, qa, qp, do, lse, delta, q_pos, q_ref, q_tag, offs_m, start_n, kv_base,
            k_off_a, k_off_p, v_off, stride_kn, stride_vn, kpos_b, ktag_b, Lk, rb, lb, has_tags, alpha, log2_cp,
            c_a2, DA, BDA, DP, BDP, DV, BDV, BLOCK_N, False, LINEAR, IN_PREC, FAST)
    for it in range(0, n_masked):
        dq_a, dq_p, dq_psum = _dq_block(
            dq_a, dq_p, dq_psum, qa, qp, do, lse, delta, q_pos, q_ref, q_tag, offs_m,
            masked_block(it, n_left, lo, u_hi, BLOCK_N), kv_base,
            k_off_a, k_off_p, v_off, stride_kn, stride_vn, kpos_b, ktag_b, Lk, rb, lb, has_tags, alpha, log2_cp,
            c_a2, DA, BDA, DP, BDP, DV, BDV, BLOCK_N, True, LINEAR, IN_PREC, FAST)

    dq_a = dq_a * c_a
    if LINEAR:
        dq_p = tl.zeros([BLOCK_M, BDP], dtype=tl.float32) + (dq_psum * (-6.283185307179586 * c_a))[:, None]
    else:
        dq_p = dq_p * (-6.283185307179586 * c_a)
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    dq_rows = DQ + b64 * stride_dqb + h64 * stride_dqh + offs_m.to(tl.int64) * stride_dqm
    store_rows(dq_rows[:, None] + offs_da[None, :], dq_a.to(DQ.dtype.element_ty), m_ok, offs_da < DA, BDA != DA)
    store_rows(dq_rows[:, None] + DA + offs_dp[None, :], dq_p.to(DQ.dtype.element_ty), m_ok, offs_dp < DP,
               BDP != DP)


# ----------------------------------------------------------------------------------------------------
# Host side: tiles per target, launch plans, autograd
# ----------------------------------------------------------------------------------------------------


# GPU tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per architecture and row-width bucket, chosen offline by
# benchmarks/tune_tiles.py: no register spills at head dims <= 128, shared memory within the limit, fewest issued
# instructions per score element (see benchmarks/results/kernels-static-sm*.json). "bwd" is the fused backward
# (dQ added atomically from the dK/dV tiles): listed where it issues fewer instructions than the two-kernel
# backward ("dkdv" + "dq"), which runs elsewhere and whenever a deterministic backward is asked for. Decode
# tiles: decode.py.
_TILES = {
    "sm90": {
        64: dict(fwd=(128, 64, 8, 2), bwd=(32, 64, 4, 1), dkdv=(32, 64, 4, 1), dq=(64, 32, 4, 1)),
        128: dict(fwd=(128, 64, 8, 2), bwd=(16, 128, 8, 1), dkdv=(16, 64, 4, 1), dq=(64, 32, 4, 1)),
        256: dict(fwd=(128, 32, 8, 2), dkdv=(32, 32, 8, 1), dq=(32, 32, 4, 1)),
    },
    "sm80": {
        64: dict(fwd=(128, 64, 8, 2), dkdv=(32, 64, 4, 1), dq=(128, 32, 8, 2)),
        128: dict(fwd=(128, 32, 8, 2), dkdv=(16, 64, 4, 1), dq=(128, 32, 8, 1)),
        256: dict(fwd=(64, 64, 8, 2), dkdv=(32, 32, 8, 1), dq=(32, 32, 4, 1)),
    },
    "fp32": {  # fp32 inputs ("ieee" dots on the FMA units): small tiles so shared memory fits; they spill
        64: dict(fwd=(64, 32, 4, 1), dkdv=(32, 32, 4, 1), dq=(32, 32, 4, 1)),
        128: dict(fwd=(64, 32, 8, 1), dkdv=(16, 32, 4, 1), dq=(32, 16, 4, 1)),
        256: dict(fwd=(32, 16, 4, 1), dkdv=(16, 16, 4, 1), dq=(16, 16, 4, 1)),
    },
}


def row_width(args: TapaArgs, head_dim: int) -> int:
    """The widest padded row a TAPA kernel holds per token: amplitude + phase columns (amplitude only with the
    linear phase, whose phase columns enter as host-computed row sums), or the value row."""
    return max(pow2(args.amp_dims) + (0 if args.linear else pow2(args.phase_dims)), pow2(head_dim))


def tiles(target: Target, width: int, itemsize: int = 2) -> dict[str, Tile]:
    """Tile / warp / stage choice per kernel ("fwd", fused "bwd" where it pays, two-kernel "dkdv" + "dq"; decode:
    `decode.tile`) for a target and padded row width (`row_width`: the head dim at θ = 0.5 for power-of-two head
    dims; larger when θ·D is not a power of two, since the register footprint follows the padded tiles).
    Interpreter: 16-wide tiles so small tests cross several blocks. GPUs: the sm_90 table for Hopper and newer,
    the sm_80 table otherwise, the fp32 table for fp32 inputs (`itemsize` 4, `table_row`); widths up to 64, up to
    128, and larger (GPU-legal everywhere: powers of two, dot extents >= 16)."""
    if target.interpreter:
        return dict.fromkeys(("fwd", "bwd", "dkdv", "dq"), INTERPRETER_TILE)
    return {k: Tile(*v) for k, v in table_row(_TILES, target, width, itemsize).items()}


@dataclass
class _Inputs:
    """Kernel-ready views of validated arguments: fp32 relative positions, int32 tags, the linear phase's fp32
    row sums of the phase columns (eq. 16), constants."""

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    q_tag: torch.Tensor | None
    k_tag: torch.Tensor | None
    q_psum: torch.Tensor | None
    k_psum: torch.Tensor | None
    c_a: float
    log2_cp: float
    window: int

    @classmethod
    def build(cls, q: torch.Tensor, k: torch.Tensor, args: TapaArgs) -> "_Inputs":
        Lk = k.shape[2]
        q_pos, k_pos = cls.relative_positions(args.q_positions, args.k_positions)
        q_tag = k_tag = None
        if args.q_segment_ids is None and args.key_padding_mask is not None:
            q_tag, k_tag = cls.padding_tags(args.key_padding_mask, args.q_positions.shape[1])
        elif args.q_segment_ids is not None:
            q_tag, k_tag = cls.tags_reference(args)
        q_psum = k_psum = None
        if args.linear:
            q_psum = q[..., args.amp_dims:].to(torch.float32).sum(-1).contiguous()
            k_psum = k[..., args.amp_dims:].to(torch.float32).sum(-1).contiguous()
        w = args.sliding_window
        return cls(q_pos, k_pos, q_tag, k_tag, q_psum, k_psum, 1.0 / math.sqrt(args.amp_dims),
                   math.log2(1.0 / math.sqrt(args.phase_dims)), w if w is not None and w < Lk else NO_WINDOW)

    @staticmethod
    def relative_positions(q_positions: torch.Tensor, k_positions: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous fp32 positions [B, Lq], [B, Lk] relative to each row's first key position: integers no larger
        than the row's span, so exact in fp32 (and the kernels' distances |q − k| with them) while it is below 2^24,
        at any absolute position. One ATen op per tensor (the int64 difference cast into the fp32 output; the base a
        view, not a reduction): a decode call is host-bound. `relative_positions_reference`: the readable form."""
        base = k_positions[:, :1]
        q_pos = torch.empty(q_positions.shape, dtype=torch.float32, device=q_positions.device)
        k_pos = torch.empty(k_positions.shape, dtype=torch.float32, device=k_positions.device)
        torch.sub(q_positions, base, out=q_pos)
        torch.sub(k_positions, base, out=k_pos)
        return q_pos, k_pos

    @staticmethod
    def relative_positions_reference(q_positions: torch.Tensor, k_positions: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """`relative_positions` written plainly: offsets from the row's smallest position, in fp32 (7 ops)."""
        base = torch.minimum(q_positions.amin(1, keepdim=True), k_positions.amin(1, keepdim=True))
        return ((q_positions - base).to(torch.float32).contiguous(),
                (k_positions - base).to(torch.float32).contiguous())

    @staticmethod
    def padding_tags(key_padding_mask: torch.Tensor, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 tags of key padding without segments (left-padded batches in ``generate``): every query 0,
        keys 0 where attended and −1 where padded, as `tags_reference` makes them, in 2 ATen ops (not 6)."""
        B, Lk = key_padding_mask.shape
        q_tag = torch.zeros((B, q_len), dtype=torch.int32, device=key_padding_mask.device)
        k_tag = torch.empty((B, Lk), dtype=torch.int32, device=key_padding_mask.device)
        torch.add(key_padding_mask, -1, out=k_tag)  # True (attend) -> 0, False (padding) -> -1
        return q_tag, k_tag

    @staticmethod
    def tags_reference(args: TapaArgs) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 tags (query i sees key j only if their tags are equal): segment ids shifted to >= 0, so −1 is free
        for padded keys; without segments every query and attended key 0."""
        if args.q_segment_ids is not None:
            qs, ks = args.q_segment_ids, args.k_segment_ids
            tbase = torch.minimum(qs.amin(1, keepdim=True), ks.amin(1, keepdim=True))
            qs, ks = qs - tbase, ks - tbase  # >= 0, so −1 is free for padded keys
        else:
            qs = torch.zeros_like(args.q_positions)
            ks = torch.zeros_like(args.k_positions)
        if args.key_padding_mask is not None:
            ks = torch.where(args.key_padding_mask, ks, torch.full_like(ks, -1))
        return qs.to(torch.int32).contiguous(), ks.to(torch.int32).contiguous()

    def common(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs, target: Target) -> dict:
        """Arguments every TAPA kernel takes (q, k, v and their strides, positions, tags, options), less those its
        heuristics derive (tag pointers are never read without tags: has_tags = 0, row-sum pointers never without
        the linear phase)."""
        if args.linear:
            (sqb, sqh), (skb, skh) = strides(self.q_psum, 2), strides(self.k_psum, 2)
            sums = dict(QSUM=self.q_psum, KSUM=self.k_psum, stride_sqb=sqb, stride_sqh=sqh, stride_skb=skb,
                        stride_skh=skh)
        else:  # never read without the linear phase
            sums = dict(QSUM=self.q_pos, KSUM=self.k_pos, stride_sqb=0, stride_sqh=0, stride_skb=0, stride_skh=0)
        (qb, qh, qm), (kb, kh, kn), (vb, vh, vn) = strides(q), strides(k), strides(v)
        if self.q_tag is not None:
            q_tag, k_tag = self.q_tag, self.k_tag
        else:  # never read (has_tags = 0): one int32 view of any buffer, for the binary's int32 tag pointers
            q_tag = k_tag = self.k_pos.view(torch.int32)
        return dict(Q=q, K=k, V=v, QPOS=self.q_pos, KPOS=self.k_pos,
                    stride_qb=qb, stride_qh=qh, stride_qm=qm, stride_kb=kb, stride_kh=kh, stride_kn=kn,
                    stride_vb=vb, stride_vh=vh, stride_vn=vn, QTAG=q_tag, KTAG=k_tag, **sums,
                    causal=int(args.causal), window=self.window, has_tags=int(self.q_tag is not None),
                    alpha=args.alpha, log2_cp=self.log2_cp, DA=args.amp_dims, DP=args.phase_dims,
                    LINEAR=args.linear, FAST=target.fast_math)


def _forward_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs, target: Target,
                  inputs: _Inputs, name: str, layout: ForwardLayout, tile: Tile, o_out: torch.Tensor,
                  lse_out: torch.Tensor) -> LaunchSpec:
    """The forward kernel's launch for a layout and tile, writing O to `o_out` and the base-2 LSE to `lse_out`
    (the results with one split, the partials with several: `ForwardLayout.write_strides`)."""
    return LaunchSpec(
        name, _tapa_fwd_kernel, layout.grid(q.shape[0]),
        dict(inputs.common(q, k, v, args, target), O=o_out, LSE=lse_out,
             **dict(zip(("stride_ob", "stride_oh", "stride_os", "stride_om"), layout.write_strides(o_out))),
             **dict(zip(("stride_lb", "stride_lh", "stride_ls"), layout.write_strides(lse_out))),
             **layout.kernel_args(args.group, q.shape[2], k.shape[2]), c_a2=inputs.c_a * LOG2E, DV=q.shape[3],
             BLOCK_M=tile.block_m, BLOCK_N=tile.block_n),
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )


def plan_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs, target: Target,
                 inputs: _Inputs | None = None) -> tuple[list[LaunchSpec], torch.Tensor, torch.Tensor]:
    """Launch plan of the forward: (specs, O [B, Hq, Lq, D], LSE [B, Hq, Lq] base 2, +inf for rows without a
    visible key). Prefill here; decode lengths (`use_decode_path`) by `decode.plan_decode`."""
    inputs = inputs if inputs is not None else _Inputs.build(q, k, args)
    B, H, Lq, D = q.shape
    forward = partial(_forward_spec, q, k, v, args, target, inputs)
    if use_decode_path(Lq):
        return plan_decode(q, k, args, target, row_width(args, D), forward)
    o = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    tile = tiles(target, row_width(args, D), q.element_size())["fwd"]
    return [forward("tapa_fwd", ForwardLayout.prefill(H, Lq, k.shape[2], tile), tile, o, lse)], o, lse


@dataclass
class BackwardPlan:
    """Launches of one backward and the gradients they write. Fused (the default where it pays, see `tiles`): one
    dK/dV kernel that also adds each tile's dQ into an fp32 accumulator (atomically, so the summation order varies
    from run to run); `finish` scales and casts it. Two-kernel: a separate dQ kernel that recomputes the scores
    (bitwise reproducible)."""

    specs: list[LaunchSpec]
    dk: torch.Tensor
    dv: torch.Tensor
    dq: torch.Tensor
    dq_scale: tuple[int, float, float, bool] | None = None  # (DA, c_A, −2π·c_A, linear) when dq is the accumulator
    dq_dtype: torch.dtype | None = None

    def finish(self) -> torch.Tensor:
        """dQ in q's dtype: dq_A = c_A·acc_A, dq_P = −2π·c_A·acc_P (eq. 16: every phase column = acc[DA])."""
        if self.dq_scale is None:
            return self.dq
        da, c_amp, c_phase, linear = self.dq_scale
        acc = self.dq  # the fp32 buffer this backward owns: scaled in place
        acc[..., :da] *= c_amp
        if linear:
            acc[..., da:] = acc[..., da:da + 1] * c_phase
        else:
            acc[..., da:] *= c_phase
        return acc.to(self.dq_dtype)


def plan_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, args: TapaArgs, target: Target, inputs: _Inputs | None = None,
                  deterministic: bool = False) -> BackwardPlan:
    """Launch plan of the backward: fused where the target's tile table has a fused tile and `deterministic` is
    False, the two-kernel backward otherwise. o, do and lse must be contiguous."""
    inputs = inputs if inputs is not None else _Inputs.build(q, k, args)
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    delta = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    cfg = tiles(target, row_width(args, D), q.element_size())
    deterministic = deterministic or "bwd" not in cfg
    if deterministic:
        dq = torch.empty_like(q)
    else:
        dq = torch.zeros((B, H, Lq, D), dtype=torch.float32, device=q.device)
    common = dict(inputs.common(q, k, v, args, target), DO=do, LSE=lse, DELTA=delta, DQ=dq,
                  **dict(zip(("stride_dob", "stride_doh", "stride_dom"), strides(do))),
                  **dict(zip(("stride_dqb", "stride_dqh", "stride_dqm"), strides(dq))),
                  H=H, GROUP=args.group, Lq=Lq, Lk=Lk, c_a=inputs.c_a, c_a2=inputs.c_a * LOG2E)
    t = cfg["dkdv"] if deterministic else cfg["bwd"]
    dkdv = LaunchSpec(
        "tapa_bwd_dkdv" if deterministic else "tapa_bwd", _tapa_bwd_dkdv_kernel, (triton.cdiv(Lk, t.block_n), B * HKV),
        dict(common, DK=dk, DV=dv, HKV=HKV, DV_=D, BLOCK_M=t.block_m, BLOCK_N=t.block_n, FUSE_DQ=not deterministic,
             **dict(zip(("stride_dkb", "stride_dkh", "stride_dkn"), strides(dk))),
             **dict(zip(("stride_dvb", "stride_dvh", "stride_dvn"), strides(dv)))),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    specs = [plan_row_dot(o, do, delta, target), dkdv]
    if not deterministic:
        return BackwardPlan(specs, dk, dv, dq, (args.amp_dims, inputs.c_a, -2.0 * math.pi * inputs.c_a, args.linear),
                            q.dtype)
    t = cfg["dq"]
    specs.append(LaunchSpec(
        "tapa_bwd_dq", _tapa_bwd_dq_kernel, (triton.cdiv(Lq, t.block_m), B * H),
        dict(common, DV=D, BLOCK_M=t.block_m, BLOCK_N=t.block_n),
        num_warps=t.num_warps, num_stages=t.num_stages,
    ))
    return BackwardPlan(specs, dk, dv, dq)


class _TapaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs,
                deterministic: bool) -> torch.Tensor:
        target = Target.of(q)
        inputs = _Inputs.build(q, k, args)
        specs, o, lse = plan_forward(q, k, v, args, target, inputs)
        launch_all(specs)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args, ctx.target, ctx.inputs, ctx.deterministic = args, target, inputs, deterministic
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        plan = plan_backward(q, k, v, o, lse, do.contiguous(), ctx.args, ctx.target, ctx.inputs, ctx.deterministic)
        launch_all(plan.specs)
        return plan.finish(), plan.dk, plan.dv, None, None


@tapa_op
def tapa_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs, *,
                          deterministic: bool | None = None) -> torch.Tensor:
    """TAPA attention (eq. 12 / eq. 16) with the fused Triton kernels; same contract as the reference.

    `sliding_window` (int >= 1 or None): query i sees key j only if i + (Lk − Lq) − j < sliding_window;
    key blocks outside every window are skipped.

    Differentiable in q, k, v (positions, masks and segment ids are not). Runs on CUDA tensors, or on
    CPU tensors under TRITON_INTERPRET=1. Returns [B, Hq, Lq, D] in q's dtype. bf16/fp16 run on the tensor
    cores; fp32 inputs use exact fp32 ("ieee") dots on the FMA units, which is much slower on GPUs.

    `deterministic` (default: `torch.are_deterministic_algorithms_enabled()`): where it pays (Hopper at head
    dims <= 128, see `tiles`) the backward computes every score's cos/sin once and adds dQ atomically in fp32,
    so gradients vary from run to run within fp32 rounding, as FlashAttention-2's do; True always runs the
    two-kernel backward (a separate dQ kernel recomputes the scores), which is bitwise reproducible.
    Options: :func:`~hf_posenc.kernels.tapa.args.validate_tapa_args`.
    """
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"the Triton TAPA kernel takes float16/bfloat16/float32 inputs, got {q.dtype}; "
                        "use tapa_attention_reference for float64")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError("tapa_attention_triton needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tests); "
                         "use tapa_attention_reference on CPU")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if deterministic is None:
            deterministic = torch.are_deterministic_algorithms_enabled()
        return _TapaFunction.apply(q, k, v, args, bool(deterministic))
    # no gradient to build (generate runs under no_grad): the forward's plan and launches as _TapaFunction.forward
    # runs them, without autograd.Function's bookkeeping (a decode call is host-bound)
    specs, o, _ = plan_forward(q, k, v, args, Target.of(q))
    launch_all(specs)
    return o


def lane_specs(target: Target, dtype: torch.dtype, head_dim: int) -> list[LaunchSpec]:
    """Every launch the host code plans for `target` at this dtype and head dim, on meta tensors: both phase
    modes × prefill forward + both backwards (fused and deterministic) and split-K decode + combine, each with
    plain causal masks, with padding + packed segments, and non-causal with a sliding window (runtime arguments:
    the compile lane finds them to be the same binaries); at θ = 0.5 and, for the plain causal case at head
    dims <= 128 (where spills fail the lane), at θ = 0.25 (unequal amplitude / phase widths, padded to powers
    of two where θ·D is not one)."""
    B, H, HKV, L = 2, 8, 2, 1024

    def meta(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    masks = (
        {},
        dict(key_padding_mask=meta(B, L, dt=torch.bool), k_segment_ids=meta(B, L, dt=torch.long)),
        dict(causal=False, sliding_window=256),
    )
    thetas = ((0.5, masks), (0.25, masks[:1])) if head_dim <= SPILL_FREE_MAX_HEAD_DIM else ((0.5, masks),)
    cases = [(theta, phase, extra) for phase in PHASES for theta, extras in thetas for extra in extras]
    specs: list[LaunchSpec] = []
    for theta, phase, extra in cases:
        for lq in (L, 1):
            q, k, v = meta(B, H, lq, head_dim), meta(B, HKV, L, head_dim), meta(B, HKV, L, head_dim)
            if "k_segment_ids" in extra:
                extra = dict(extra, q_segment_ids=meta(B, lq, dt=torch.long))
            args = validate_tapa_args(q, k, v, alpha=0.1, theta=theta, phase=phase, causal=extra.get("causal", True),
                                      q_positions=None, k_positions=None,
                                      key_padding_mask=extra.get("key_padding_mask"),
                                      q_segment_ids=extra.get("q_segment_ids"),
                                      k_segment_ids=extra.get("k_segment_ids"),
                                      sliding_window=extra.get("sliding_window"))
            fwd, o, lse = plan_forward(q, k, v, args, target)
            specs += fwd
            if not use_decode_path(lq):
                for deterministic in (False, True):
                    specs += plan_backward(q, k, v, o, lse, meta(B, H, lq, head_dim), args, target,
                                           deterministic=deterministic).specs
    return specs


__all__ = ["tapa_attention_triton", "plan_forward", "plan_backward", "BackwardPlan", "tiles", "row_width",
           "use_decode_path", "DECODE_MAX_LQ", "lane_specs"]
