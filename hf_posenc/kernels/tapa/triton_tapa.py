"""Flash-style Triton kernels for TAPA attention (paper eq. 12; linear phase eq. 16).

Score (eq. 12), with a = q_A·k_A, p = q_P·k_P (eq. 16: p = Σq_P + Σk_P), d = |m − n|:

    s = c_A·a·cos(2π·t),   t = d^α·c_P·p  (in turns),   c_A = 1/√(θD),  c_P = 1/√((1−θ)D)

Forward: one program per (query block, query head) keeps its Q tile on chip and streams K/V with an
online softmax in base 2 (log2(e) is folded into c_A, the base-2 log-sum-exp is saved for the
backward). Both half-width products a and p are tl.dot's over the split head dimension. The phase
runs in fp32: d^α = exp2(α·log2 d) (0 at d = 0), r = t − round(t), cos(2π r), so long distances stay
accurate when q/k are bf16. Causal attention visits only key blocks left of the diagonal, in two
stages: blocks that are entirely visible (no per-element causal/bounds mask) and the masked band.
GQA reads kv head h // group; repeated K/V are never materialised.

Sliding window W (WINDOW constexpr; query i is key index i_abs = i + Lk − Lq and sees key j only if
i_abs − j < W): key blocks entirely left of a tile's window are skipped, and the visible range splits
into three stages: a masked band at the window's left edge, the fully visible blocks, and the masked
causal diagonal / ragged end. Without a window (or with W >= Lk, which removes nothing) the kernels
compile to the plain two-stage causal form.

Decode (Lq ≤ 16): the query rows of a whole GQA group are packed into one tile (so each K/V block is
read once per kv head) and the key axis is split across programs (split-K); a combine kernel merges
the partial (acc, max, sum) triples and also writes the log-sum-exp.

Backward (FlashAttention-2 scheme, no atomics): Δ = rowsum(dO∘O); dK/dV per key block looping over
query blocks and over the group's query heads; dQ per query block looping over key blocks. Scores
are recomputed, dS = P∘(dP − Δ), and the chain rule runs through both products:
∂s/∂a = c_A cos φ,  ∂s/∂p = −2π d^α c_A c_P a sin φ.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from .naive import TapaArgs, validate_tapa_args

LOG2E = 1.4426950408889634
TWO_PI = 6.283185307179586
DECODE_MAX_LQ = 16
DECODE_MAX_ROWS = 128


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ----------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _phase_turns(q_pos2, k_pos2, ph, alpha, c_p):
    """d^α (fp32, 0 at d = 0) and the range-reduced phase r = t − round(t), t = d^α·c_P·p (eq. 12)."""
    d = tl.abs(q_pos2 - k_pos2).to(tl.float32)
    d_pow = tl.where(d > 0.0, tl.exp2(alpha * tl.log2(tl.maximum(d, 1.0))), 0.0)
    t = d_pow * c_p * ph
    r = t - tl.floor(t + 0.5)
    return d_pow, r


@triton.jit
def _apply_mask(s, q_idx2, k_idx2, q_ok2, k_ok2, off, window, q_seg2, k_seg2, k_pad2,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr):
    """Set invisible scores to -inf. Arguments are 2-D broadcastable (either orientation).
    Causal and sliding-window masks apply only in MASKED stages: the unmasked stage holds blocks that
    are inside every row's causal range and window."""
    if MASKED:
        vis = q_ok2 & k_ok2
        if CAUSAL:
            vis = vis & (k_idx2 <= q_idx2 + off)
        if WINDOW:
            vis = vis & (q_idx2 + off - k_idx2 < window)
        s = tl.where(vis, s, float("-inf"))
    if HAS_KPM:
        s = tl.where(k_pad2, s, float("-inf"))
    if HAS_SEG:
        s = tl.where(q_seg2 == k_seg2, s, float("-inf"))
    return s


@triton.jit
def _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, q_rows,
               k_base, v_base, stride_kn, stride_vn, kpos_base, kpm_base, kseg_base,
               lo, hi, Lk, off, window, alpha, c_a2, c_p,
               DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
               DV: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
               HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
               LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    """Stream key blocks [lo, hi) through the online softmax (base 2). q_rows: query index per row."""
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < Lk
        if MASKED:
            ld_n = n_ok
        else:
            ld_n = offs_n >= 0
        ka_t = tl.load(k_base + offs_n[None, :] * stride_kn + offs_da[:, None],
                       mask=ld_n[None, :] & (offs_da[:, None] < DA), other=0.0)
        kp = tl.load(k_base + offs_n[:, None] * stride_kn + DA + offs_dp[None, :],
                     mask=ld_n[:, None] & (offs_dp[None, :] < DP), other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :],
                    mask=ld_n[:, None] & (offs_dv[None, :] < DV), other=0.0)
        k_pos = tl.load(kpos_base + offs_n, mask=ld_n, other=0)
        amp = tl.dot(qa, ka_t, input_precision=IN_PREC)
        if LINEAR:
            k_sum = tl.sum(kp.to(tl.float32), 1)
            ph = q_sum[:, None] + k_sum[None, :]
        else:
            ph = tl.dot(qp, tl.trans(kp), input_precision=IN_PREC)
        d_pow, r = _phase_turns(q_pos[:, None], k_pos[None, :], ph, alpha, c_p)
        s = c_a2 * amp * tl.cos(TWO_PI * r)
        if HAS_KPM:
            k_pad = tl.load(kpm_base + offs_n, mask=ld_n, other=0) != 0
        else:
            k_pad = n_ok
        if HAS_SEG:
            k_seg = tl.load(kseg_base + offs_n, mask=ld_n, other=-1)
        else:
            k_seg = offs_n
        s = _apply_mask(s, q_rows[:, None], offs_n[None, :], q_rows[:, None] >= 0, n_ok[None, :], off, window,
                        q_seg[:, None], k_seg[None, :], k_pad[None, :], MASKED, CAUSAL, WINDOW, HAS_KPM, HAS_SEG)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        corr = tl.exp2(m_i - m_use)
        l_i = l_i * corr + tl.sum(p, 1)
        acc = acc * corr[:, None] + tl.dot(p.to(v.dtype), v, input_precision=IN_PREC)
        m_i = m_new
    return acc, l_i, m_i


# ----------------------------------------------------------------------------------------------------
# Forward (prefill / chunked prefill)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _tapa_fwd_kernel(Q, K, V, O, LSE, QPOS, KPOS, KPM, QSEG, KSEG,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                     H, GROUP, Lq, Lk, alpha, c_a2, c_p, window,
                     DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                     DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, WINDOW: tl.constexpr, HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
                     LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    m_ok = offs_m < Lq
    q_base = Q + b * stride_qb + h * stride_qh
    qa = tl.load(q_base + offs_m[:, None] * stride_qm + offs_da[None, :],
                 mask=m_ok[:, None] & (offs_da[None, :] < DA), other=0.0)
    qp = tl.load(q_base + offs_m[:, None] * stride_qm + DA + offs_dp[None, :],
                 mask=m_ok[:, None] & (offs_dp[None, :] < DP), other=0.0)
    q_sum = tl.sum(qp.to(tl.float32), 1)
    q_pos = tl.load(QPOS + b * Lq + offs_m, mask=m_ok, other=0)
    if HAS_SEG:
        q_seg = tl.load(QSEG + b * Lq + offs_m, mask=m_ok, other=-2)
    else:
        q_seg = offs_m
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh

    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    off = Lk - Lq
    if CAUSAL:
        hi = tl.minimum(Lk, start_m + BLOCK_M + off)
        full_hi = tl.minimum(Lk, start_m + off + 1)
    else:
        hi = Lk
        full_hi = Lk
    n_full = (full_hi // BLOCK_N) * BLOCK_N
    if WINDOW:
        # the tile's first row sees keys j >= start_m + off − W + 1 (earlier blocks are skipped); every
        # row sees keys j >= start_m + BLOCK_M + off − W; the band in between is masked (stage 0)
        lo = (tl.maximum(start_m + off - window + 1, 0) // BLOCK_N) * BLOCK_N
        win_full = tl.cdiv(tl.maximum(start_m + BLOCK_M + off - window, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(win_full, lo), n_full)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, offs_m,
                                   k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
                                   lo, full_lo, Lk, off, window, alpha, c_a2, c_p,
                                   DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                                   True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    else:
        full_lo = 0
    # stage 1: key blocks visible to every row of this tile (no causal / window / bounds mask)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, offs_m,
                               k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
                               full_lo, n_full, Lk, off, window, alpha, c_a2, c_p,
                               DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                               False, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    # stage 2: the diagonal band and the ragged end of the key sequence
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, offs_m,
                               k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
                               n_full, hi, Lk, off, window, alpha, c_a2, c_p,
                               DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                               True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + pid_bh * Lq + offs_m, lse, mask=m_ok)
    o_base = O + b * stride_ob + h * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_dv[None, :], out.to(O.dtype.element_ty),
             mask=m_ok[:, None] & (offs_dv[None, :] < DV))


# ----------------------------------------------------------------------------------------------------
# Decode (Lq ≤ 16): GQA-packed rows, split-K over the key axis, then a combine kernel
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _tapa_decode_kernel(Q, K, V, ACC, ML, QPOS, KPOS, KPM, QSEG, KSEG,
                        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn,
                        H, HKV, GROUP, Lq, Lk, SPLIT_LEN, NUM_SPLITS, KV_LO, alpha, c_a2, c_p, window,
                        DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                        DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
                        LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    split = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    b = pid_bkv // HKV
    kvh = pid_bkv % HKV
    rows = tl.arange(0, BLOCK_M)
    r_ok = rows < GROUP * Lq
    g = rows // Lq
    qi = rows % Lq
    h = kvh * GROUP + g
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    q_row = Q + b * stride_qb + h * stride_qh + qi * stride_qm
    qa = tl.load(q_row[:, None] + offs_da[None, :], mask=r_ok[:, None] & (offs_da[None, :] < DA), other=0.0)
    qp = tl.load(q_row[:, None] + DA + offs_dp[None, :], mask=r_ok[:, None] & (offs_dp[None, :] < DP), other=0.0)
    q_sum = tl.sum(qp.to(tl.float32), 1)
    q_pos = tl.load(QPOS + b * Lq + qi, mask=r_ok, other=0)
    if HAS_SEG:
        q_seg = tl.load(QSEG + b * Lq + qi, mask=r_ok, other=-2)
    else:
        q_seg = qi
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    off = Lk - Lq
    if WINDOW:
        lo = KV_LO + split * SPLIT_LEN  # the splits cover only [KV_LO, Lk): keys left of it are out of every window
    else:
        lo = split * SPLIT_LEN
    hi = tl.minimum(lo + SPLIT_LEN, Lk)
    if CAUSAL:
        full_hi = off + 1  # keys 0..Lk-Lq are visible to every query row
    else:
        full_hi = Lk
    mid = tl.maximum(lo, tl.minimum(hi, (full_hi // BLOCK_N) * BLOCK_N))
    if WINDOW:
        # every row (the last one is key Lk − 1) sees keys j >= Lk − W; the band before is masked
        win_full = tl.cdiv(tl.maximum(Lk - window, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(win_full, lo), mid)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, qi,
                                   k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
                                   lo, full_lo, Lk, off, window, alpha, c_a2, c_p,
                                   DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                                   True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    else:
        full_lo = lo
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, qi,
                               k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
                               full_lo, mid, Lk, off, window, alpha, c_a2, c_p,
                               DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                               False, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qa, qp, q_sum, q_pos, q_seg, qi,
                               k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
                               mid, hi, Lk, off, window, alpha, c_a2, c_p,
                               DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
                               True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    # partials laid out [B, H, Lq, NUM_SPLITS, (BDV | 2)]
    row_id = ((b * H + h) * Lq + qi) * NUM_SPLITS + split
    tl.store(ACC + row_id[:, None] * BDV + offs_dv[None, :], acc, mask=r_ok[:, None])
    tl.store(ML + row_id * 2, m_i, mask=r_ok)
    tl.store(ML + row_id * 2 + 1, l_i, mask=r_ok)


@triton.jit
def _tapa_decode_combine_kernel(ACC, ML, O, LSE, H, Lq, NUM_SPLITS,
                                stride_ob, stride_oh, stride_om,
                                DV: tl.constexpr, BDV: tl.constexpr, BLOCK_S: tl.constexpr):
    pid = tl.program_id(0)  # flattened (b, h, i)
    i = pid % Lq
    bh = pid // Lq
    b = bh // H
    h = bh % H
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BDV)
    s_ok = offs_s < NUM_SPLITS
    base = pid * NUM_SPLITS + offs_s
    m_s = tl.load(ML + base * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ML + base * 2 + 1, mask=s_ok, other=0.0)
    acc = tl.load(ACC + base[:, None] * BDV + offs_dv[None, :], mask=s_ok[:, None], other=0.0)
    m = tl.max(m_s, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(m_s - m_use)
    l_tot = tl.sum(l_s * w, 0)
    out = tl.sum(acc * w[:, None], 0)
    empty = l_tot == 0.0
    out = out / tl.where(empty, 1.0, l_tot)
    lse = tl.where(empty, float("inf"), m_use + tl.log2(tl.where(empty, 1.0, l_tot)))
    tl.store(LSE + pid, lse)
    tl.store(O + b * stride_ob + h * stride_oh + i * stride_om + offs_dv, out.to(O.dtype.element_ty),
             mask=offs_dv < DV)


# ----------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _tapa_bwd_preprocess(O, DO, DELTA, n_rows, D: tl.constexpr, BD: tl.constexpr, BLOCK: tl.constexpr):
    """Δ_i = rowsum(dO ∘ O) over contiguous [n_rows, D] views."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BD)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < D)
    o = tl.load(O + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=rows < n_rows)


@triton.jit
def _bwd_dkdv_inner(dk_a, dk_p, dk_psum, dv, ka, kp, k_sum, v, k_pos, k_seg, k_pad, offs_n, n_ok,
                    q_base, do_base, stride_qm, stride_dom, lse_base, delta_base, qpos_base, qseg_base,
                    lo, hi, Lq, off, window, alpha, c_a, c_p,
                    DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                    DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                    HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
                    LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    """Accumulate dK/dV of one key block over query blocks [lo, hi) of one query head ([N, M] tiles)."""
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    c_a2 = c_a * 1.4426950408889634
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        if MASKED:
            m_ok = offs_m < Lq
        else:
            m_ok = offs_m >= 0
        qa = tl.load(q_base + offs_m[:, None] * stride_qm + offs_da[None, :],
                     mask=m_ok[:, None] & (offs_da[None, :] < DA), other=0.0)
        qp = tl.load(q_base + offs_m[:, None] * stride_qm + DA + offs_dp[None, :],
                     mask=m_ok[:, None] & (offs_dp[None, :] < DP), other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_dv[None, :],
                     mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        lse = tl.load(lse_base + offs_m, mask=m_ok, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        q_pos = tl.load(qpos_base + offs_m, mask=m_ok, other=0)
        if HAS_SEG:
            q_seg = tl.load(qseg_base + offs_m, mask=m_ok, other=-2)
        else:
            q_seg = offs_m
        amp = tl.dot(ka, tl.trans(qa), input_precision=IN_PREC)  # [N, M]
        if LINEAR:
            q_sum = tl.sum(qp.to(tl.float32), 1)
            ph = k_sum[:, None] + q_sum[None, :]
        else:
            ph = tl.dot(kp, tl.trans(qp), input_precision=IN_PREC)
        d_pow, r = _phase_turns(q_pos[None, :], k_pos[:, None], ph, alpha, c_p)
        cos_phi = tl.cos(TWO_PI * r)
        s = c_a2 * amp * cos_phi
        s = _apply_mask(s, offs_m[None, :], offs_n[:, None], m_ok[None, :], n_ok[:, None], off, window,
                        q_seg[None, :], k_seg[:, None], k_pad[:, None], MASKED, CAUSAL, WINDOW, HAS_KPM, HAS_SEG)
        p = tl.exp2(s - lse[None, :])
        dv += tl.dot(p.to(do.dtype), do, input_precision=IN_PREC)
        dp = tl.dot(v, tl.trans(do), input_precision=IN_PREC)
        ds = p * (dp - delta[None, :])
        g_a = ds * (c_a * cos_phi)
        g_p = ds * ((-TWO_PI * c_a * c_p) * d_pow * amp * tl.sin(TWO_PI * r))
        dk_a += tl.dot(g_a.to(qa.dtype), qa, input_precision=IN_PREC)
        if LINEAR:
            dk_psum += tl.sum(g_p, 1)
        else:
            dk_p += tl.dot(g_p.to(qp.dtype), qp, input_precision=IN_PREC)
    return dk_a, dk_p, dk_psum, dv


@triton.jit
def _tapa_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, QPOS, KPOS, KPM, QSEG, KSEG,
                          stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                          stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          H, HKV, GROUP, Lq, Lk, alpha, c_a, c_p, window,
                          DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                          DV_: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CAUSAL: tl.constexpr, WINDOW: tl.constexpr, HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
                          LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    b = pid_bkv // HKV
    kvh = pid_bkv % HKV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < Lk
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    ka = tl.load(k_base + offs_n[:, None] * stride_kn + offs_da[None, :],
                 mask=n_ok[:, None] & (offs_da[None, :] < DA), other=0.0)
    kp = tl.load(k_base + offs_n[:, None] * stride_kn + DA + offs_dp[None, :],
                 mask=n_ok[:, None] & (offs_dp[None, :] < DP), other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :],
                mask=n_ok[:, None] & (offs_dv[None, :] < DV_), other=0.0)
    k_sum = tl.sum(kp.to(tl.float32), 1)
    k_pos = tl.load(KPOS + b * Lk + offs_n, mask=n_ok, other=0)
    if HAS_KPM:
        k_pad = tl.load(KPM + b * Lk + offs_n, mask=n_ok, other=0) != 0
    else:
        k_pad = n_ok
    if HAS_SEG:
        k_seg = tl.load(KSEG + b * Lk + offs_n, mask=n_ok, other=-1)
    else:
        k_seg = offs_n
    dk_a = tl.zeros([BLOCK_N, BDA], dtype=tl.float32)
    dk_p = tl.zeros([BLOCK_N, BDP], dtype=tl.float32)
    dk_psum = tl.zeros([BLOCK_N], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BDV], dtype=tl.float32)

    off = Lk - Lq
    lq_end = tl.cdiv(Lq, BLOCK_M) * BLOCK_M
    if CAUSAL:
        m_lo = (tl.maximum(start_n - off, 0) // BLOCK_M) * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M
    else:
        m_lo = start_n * 0
        full_lo = start_n * 0
    full_lo = tl.maximum(full_lo, m_lo)
    full_lo = tl.where(start_n + BLOCK_N > Lk, lq_end, full_lo)  # ragged key block: mask every query block
    full_lo = tl.minimum(full_lo, lq_end)
    if WINDOW:
        # query i sees key j only if i < j − off + W: rows past the block's last key's window are
        # skipped (m_hi), and only rows i < start_n − off + W see every key of the block (unmasked)
        m_hi = tl.minimum(lq_end, tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - off + window, 0), BLOCK_M) * BLOCK_M)
        win_full = (tl.maximum(start_n - off + window, 0) // BLOCK_M) * BLOCK_M
        m_lo = tl.minimum(m_lo, m_hi)
        full_lo = tl.minimum(full_lo, m_hi)
        full_hi = tl.minimum(tl.maximum(full_lo, tl.minimum((Lq // BLOCK_M) * BLOCK_M, win_full)), m_hi)
    else:
        m_hi = lq_end
        full_hi = tl.maximum(full_lo, (Lq // BLOCK_M) * BLOCK_M)

    for g in range(0, GROUP):
        h = kvh * GROUP + g
        bh = b * H + h
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        # masked diagonal band, fully visible blocks, masked ragged tail / window edge
        dk_a, dk_p, dk_psum, dv = _bwd_dkdv_inner(
            dk_a, dk_p, dk_psum, dv, ka, kp, k_sum, v, k_pos, k_seg, k_pad, offs_n, n_ok,
            q_base, do_base, stride_qm, stride_dom, LSE + bh * Lq, DELTA + bh * Lq, QPOS + b * Lq, QSEG + b * Lq,
            m_lo, full_lo, Lq, off, window, alpha, c_a, c_p, DA, BDA, DP, BDP, DV_, BDV, BLOCK_M,
            True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
        dk_a, dk_p, dk_psum, dv = _bwd_dkdv_inner(
            dk_a, dk_p, dk_psum, dv, ka, kp, k_sum, v, k_pos, k_seg, k_pad, offs_n, n_ok,
            q_base, do_base, stride_qm, stride_dom, LSE + bh * Lq, DELTA + bh * Lq, QPOS + b * Lq, QSEG + b * Lq,
            full_lo, full_hi, Lq, off, window, alpha, c_a, c_p, DA, BDA, DP, BDP, DV_, BDV, BLOCK_M,
            False, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
        dk_a, dk_p, dk_psum, dv = _bwd_dkdv_inner(
            dk_a, dk_p, dk_psum, dv, ka, kp, k_sum, v, k_pos, k_seg, k_pad, offs_n, n_ok,
            q_base, do_base, stride_qm, stride_dom, LSE + bh * Lq, DELTA + bh * Lq, QPOS + b * Lq, QSEG + b * Lq,
            full_hi, m_hi, Lq, off, window, alpha, c_a, c_p, DA, BDA, DP, BDP, DV_, BDV, BLOCK_M,
            True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)

    if LINEAR:
        dk_p = dk_p + dk_psum[:, None]
    dk_base = DK + b * stride_dkb + kvh * stride_dkh
    tl.store(dk_base + offs_n[:, None] * stride_dkn + offs_da[None, :], dk_a.to(DK.dtype.element_ty),
             mask=n_ok[:, None] & (offs_da[None, :] < DA))
    tl.store(dk_base + offs_n[:, None] * stride_dkn + DA + offs_dp[None, :], dk_p.to(DK.dtype.element_ty),
             mask=n_ok[:, None] & (offs_dp[None, :] < DP))
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + offs_n[:, None] * stride_dvn + offs_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=n_ok[:, None] & (offs_dv[None, :] < DV_))


@triton.jit
def _bwd_dq_inner(dq_a, dq_p, dq_psum, qa, qp, q_sum, do, lse, delta, q_pos, q_seg, offs_m,
                  k_base, v_base, stride_kn, stride_vn, kpos_base, kpm_base, kseg_base,
                  lo, hi, Lk, off, window, alpha, c_a, c_p,
                  DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                  DV: tl.constexpr, BDV: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                  HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
                  LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi) ([M, N] tiles)."""
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    c_a2 = c_a * 1.4426950408889634
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < Lk
        if MASKED:
            ld_n = n_ok
        else:
            ld_n = offs_n >= 0
        ka = tl.load(k_base + offs_n[:, None] * stride_kn + offs_da[None, :],
                     mask=ld_n[:, None] & (offs_da[None, :] < DA), other=0.0)
        kp = tl.load(k_base + offs_n[:, None] * stride_kn + DA + offs_dp[None, :],
                     mask=ld_n[:, None] & (offs_dp[None, :] < DP), other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :],
                    mask=ld_n[:, None] & (offs_dv[None, :] < DV), other=0.0)
        k_pos = tl.load(kpos_base + offs_n, mask=ld_n, other=0)
        amp = tl.dot(qa, tl.trans(ka), input_precision=IN_PREC)
        if LINEAR:
            k_sum = tl.sum(kp.to(tl.float32), 1)
            ph = q_sum[:, None] + k_sum[None, :]
        else:
            ph = tl.dot(qp, tl.trans(kp), input_precision=IN_PREC)
        d_pow, r = _phase_turns(q_pos[:, None], k_pos[None, :], ph, alpha, c_p)
        cos_phi = tl.cos(TWO_PI * r)
        s = c_a2 * amp * cos_phi
        if HAS_KPM:
            k_pad = tl.load(kpm_base + offs_n, mask=ld_n, other=0) != 0
        else:
            k_pad = n_ok
        if HAS_SEG:
            k_seg = tl.load(kseg_base + offs_n, mask=ld_n, other=-1)
        else:
            k_seg = offs_n
        s = _apply_mask(s, offs_m[:, None], offs_n[None, :], offs_m[:, None] >= 0, n_ok[None, :], off, window,
                        q_seg[:, None], k_seg[None, :], k_pad[None, :], MASKED, CAUSAL, WINDOW, HAS_KPM, HAS_SEG)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=IN_PREC)
        ds = p * (dp - delta[:, None])
        g_a = ds * (c_a * cos_phi)
        g_p = ds * ((-TWO_PI * c_a * c_p) * d_pow * amp * tl.sin(TWO_PI * r))
        dq_a += tl.dot(g_a.to(ka.dtype), ka, input_precision=IN_PREC)
        if LINEAR:
            dq_psum += tl.sum(g_p, 1)
        else:
            dq_p += tl.dot(g_p.to(kp.dtype), kp, input_precision=IN_PREC)
    return dq_a, dq_p, dq_psum


@triton.jit
def _tapa_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, QPOS, KPOS, KPM, QSEG, KSEG,
                        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                        stride_dqb, stride_dqh, stride_dqm,
                        H, GROUP, Lq, Lk, alpha, c_a, c_p, window,
                        DA: tl.constexpr, BDA: tl.constexpr, DP: tl.constexpr, BDP: tl.constexpr,
                        DV: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, HAS_KPM: tl.constexpr, HAS_SEG: tl.constexpr,
                        LINEAR: tl.constexpr, IN_PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < Lq
    offs_da = tl.arange(0, BDA)
    offs_dp = tl.arange(0, BDP)
    offs_dv = tl.arange(0, BDV)
    q_base = Q + b * stride_qb + h * stride_qh
    qa = tl.load(q_base + offs_m[:, None] * stride_qm + offs_da[None, :],
                 mask=m_ok[:, None] & (offs_da[None, :] < DA), other=0.0)
    qp = tl.load(q_base + offs_m[:, None] * stride_qm + DA + offs_dp[None, :],
                 mask=m_ok[:, None] & (offs_dp[None, :] < DP), other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_dv[None, :],
                 mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    q_sum = tl.sum(qp.to(tl.float32), 1)
    lse = tl.load(LSE + pid_bh * Lq + offs_m, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * Lq + offs_m, mask=m_ok, other=0.0)
    q_pos = tl.load(QPOS + b * Lq + offs_m, mask=m_ok, other=0)
    if HAS_SEG:
        q_seg = tl.load(QSEG + b * Lq + offs_m, mask=m_ok, other=-2)
    else:
        q_seg = offs_m
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    dq_a = tl.zeros([BLOCK_M, BDA], dtype=tl.float32)
    dq_p = tl.zeros([BLOCK_M, BDP], dtype=tl.float32)
    dq_psum = tl.zeros([BLOCK_M], dtype=tl.float32)
    off = Lk - Lq
    if CAUSAL:
        hi = tl.minimum(Lk, start_m + BLOCK_M + off)
        full_hi = tl.minimum(Lk, start_m + off + 1)
    else:
        hi = Lk
        full_hi = Lk
    n_full = (full_hi // BLOCK_N) * BLOCK_N
    if WINDOW:  # same three stages as the forward
        lo = (tl.maximum(start_m + off - window + 1, 0) // BLOCK_N) * BLOCK_N
        win_full = tl.cdiv(tl.maximum(start_m + BLOCK_M + off - window, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.minimum(tl.maximum(win_full, lo), n_full)
        dq_a, dq_p, dq_psum = _bwd_dq_inner(
            dq_a, dq_p, dq_psum, qa, qp, q_sum, do, lse, delta, q_pos, q_seg, offs_m,
            k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
            lo, full_lo, Lk, off, window, alpha, c_a, c_p, DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
            True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    else:
        full_lo = 0
    dq_a, dq_p, dq_psum = _bwd_dq_inner(
        dq_a, dq_p, dq_psum, qa, qp, q_sum, do, lse, delta, q_pos, q_seg, offs_m,
        k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
        full_lo, n_full, Lk, off, window, alpha, c_a, c_p, DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
        False, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    dq_a, dq_p, dq_psum = _bwd_dq_inner(
        dq_a, dq_p, dq_psum, qa, qp, q_sum, do, lse, delta, q_pos, q_seg, offs_m,
        k_base, v_base, stride_kn, stride_vn, KPOS + b * Lk, KPM + b * Lk, KSEG + b * Lk,
        n_full, hi, Lk, off, window, alpha, c_a, c_p, DA, BDA, DP, BDP, DV, BDV, BLOCK_N,
        True, CAUSAL, WINDOW, HAS_KPM, HAS_SEG, LINEAR, IN_PREC)
    if LINEAR:
        dq_p = dq_p + dq_psum[:, None]
    dq_base = DQ + b * stride_dqb + h * stride_dqh
    tl.store(dq_base + offs_m[:, None] * stride_dqm + offs_da[None, :], dq_a.to(DQ.dtype.element_ty),
             mask=m_ok[:, None] & (offs_da[None, :] < DA))
    tl.store(dq_base + offs_m[:, None] * stride_dqm + DA + offs_dp[None, :], dq_p.to(DQ.dtype.element_ty),
             mask=m_ok[:, None] & (offs_dp[None, :] < DP))


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def _configs(head_dim: int) -> dict[str, tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel. Small tiles under the interpreter so the
    tests cross several blocks; GPU-legal (powers of two, >= 16) everywhere. GPU values are untuned."""
    if _interpreting():
        return {"fwd": (16, 16, 4, 1), "dkdv": (16, 16, 4, 1), "dq": (16, 16, 4, 1), "decode_n": (16, 0, 4, 1)}
    big = head_dim > 128
    return {
        "fwd": (64, 32, 4, 2) if big else (128, 64, 8, 2),
        "dkdv": (32, 32, 4, 1) if big else (32, 64, 4, 2),
        "dq": (32, 32, 4, 1) if big else (64, 32, 4, 2),
        "decode_n": (64, 0, 4, 2),
    }


class _Prepared:
    """Kernel-ready views of the validated arguments (int32 positions / masks, dims, constants)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, args: TapaArgs):
        self.args = args
        self.B, self.H, self.Lq, self.D = q.shape
        self.HKV, self.Lk = k.shape[1], k.shape[2]
        self.qpos = args.q_positions.to(torch.int32).contiguous()
        self.kpos = args.k_positions.to(torch.int32).contiguous()
        self.kpm = args.key_padding_mask.to(torch.int8).contiguous() if args.key_padding_mask is not None else None
        self.qseg = args.q_segment_ids.to(torch.int32).contiguous() if args.q_segment_ids is not None else None
        self.kseg = args.k_segment_ids.to(torch.int32).contiguous() if args.k_segment_ids is not None else None
        self.c_a = 1.0 / math.sqrt(args.amp_dims)
        self.c_p = 1.0 / math.sqrt(args.phase_dims)
        self.in_prec = "ieee" if q.dtype == torch.float32 else "tf32"
        # a window of Lk or more keys removes nothing: compile the plain kernels (WINDOW=False)
        w = args.sliding_window
        self.window = w if w is not None and w < self.Lk else None

    def mask_ptrs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dummy = self.qpos
        return (
            self.qpos,
            self.kpos,
            self.kpm if self.kpm is not None else dummy,
            self.qseg if self.qseg is not None else dummy,
            self.kseg if self.kseg is not None else dummy,
        )

    @property
    def window_arg(self) -> int:
        """Runtime window size handed to the kernels (unused when WINDOW=False)."""
        return self.window if self.window is not None else 0

    def decode_kv_lo(self, block_n: int) -> int:
        """First key block the decode splits must cover: keys j < Lk − Lq − W + 1 are outside every
        query's window (0 without a window)."""
        if self.window is None:
            return 0
        return (max(self.Lk - self.Lq - self.window + 1, 0) // block_n) * block_n

    def meta(self) -> dict:
        a = self.args
        return dict(
            DA=a.amp_dims, BDA=_pow2(a.amp_dims), DP=a.phase_dims, BDP=_pow2(a.phase_dims),
            CAUSAL=a.causal, WINDOW=self.window is not None, HAS_KPM=self.kpm is not None,
            HAS_SEG=self.qseg is not None,
            LINEAR=a.linear, IN_PREC=self.in_prec,
        )


def use_decode_path(Lq: int, group: int) -> bool:
    """Whether the split-K decode kernel handles this call (Lq ≤ 16 and the packed group fits a tile)."""
    return Lq <= DECODE_MAX_LQ and Lq * group <= DECODE_MAX_ROWS


def _num_splits(prep: _Prepared, kv_len: int, block_n: int, q: torch.Tensor) -> int:
    n_blocks = triton.cdiv(kv_len, block_n)
    if _interpreting():
        blocks_per_split = 2
        return triton.cdiv(n_blocks, blocks_per_split)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    want = max(1, triton.cdiv(2 * sms, prep.B * prep.HKV))
    return max(1, min(n_blocks, want, 128))


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prep: _Prepared) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, Lq, D, HKV, Lk = prep.B, prep.H, prep.Lq, prep.D, prep.HKV, prep.Lk
    a = prep.args
    o = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    qpos, kpos, kpm, qseg, kseg = prep.mask_ptrs()
    cfg = _configs(D)
    meta = prep.meta()
    if use_decode_path(Lq, a.group):
        block_n, _, warps, stages = cfg["decode_n"]
        kv_lo = prep.decode_kv_lo(block_n)
        kv_len = Lk - kv_lo  # the key range [kv_lo, Lk) the splits share
        splits = _num_splits(prep, kv_len, block_n, q)
        split_len = triton.cdiv(triton.cdiv(kv_len, splits), block_n) * block_n
        splits = triton.cdiv(kv_len, split_len)
        bdv = _pow2(D)
        acc = torch.empty((B, H, Lq, splits, bdv), dtype=torch.float32, device=q.device)
        ml = torch.empty((B, H, Lq, splits, 2), dtype=torch.float32, device=q.device)
        _tapa_decode_kernel[(splits, B * HKV)](
            q, k, v, acc, ml, qpos, kpos, kpm, qseg, kseg,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            H, HKV, a.group, Lq, Lk, split_len, splits, kv_lo, a.alpha, prep.c_a * LOG2E, prep.c_p, prep.window_arg,
            DV=D, BDV=bdv, BLOCK_M=_pow2(Lq * a.group), BLOCK_N=block_n,
            num_warps=warps, num_stages=stages, **meta,
        )
        _tapa_decode_combine_kernel[(B * H * Lq,)](
            acc, ml, o, lse, H, Lq, splits, o.stride(0), o.stride(1), o.stride(2),
            DV=D, BDV=bdv, BLOCK_S=_pow2(splits, 2), num_warps=4,
        )
        return o, lse
    bm, bn, warps, stages = cfg["fwd"]
    _tapa_fwd_kernel[(triton.cdiv(Lq, bm), B * H)](
        q, k, v, o, lse, qpos, kpos, kpm, qseg, kseg,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        H, a.group, Lq, Lk, a.alpha, prep.c_a * LOG2E, prep.c_p, prep.window_arg,
        DV=D, BDV=_pow2(D), BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
    )
    return o, lse


def _backward(q, k, v, o, lse, do, prep: _Prepared) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, Lq, D, HKV, Lk = prep.B, prep.H, prep.Lq, prep.D, prep.HKV, prep.Lk
    a = prep.args
    do = do.contiguous()
    delta = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    n_rows = B * H * Lq
    _tapa_bwd_preprocess[(triton.cdiv(n_rows, 32),)](o, do, delta, n_rows, D=D, BD=_pow2(D), BLOCK=32)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    qpos, kpos, kpm, qseg, kseg = prep.mask_ptrs()
    cfg = _configs(D)
    meta = prep.meta()
    bm, bn, warps, stages = cfg["dkdv"]
    _tapa_bwd_dkdv_kernel[(triton.cdiv(Lk, bn), B * HKV)](
        q, k, v, do, lse, delta, dk, dv, qpos, kpos, kpm, qseg, kseg,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        H, HKV, a.group, Lq, Lk, a.alpha, prep.c_a, prep.c_p, prep.window_arg,
        DV_=D, BDV=_pow2(D), BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
    )
    bm, bn, warps, stages = cfg["dq"]
    _tapa_bwd_dq_kernel[(triton.cdiv(Lq, bm), B * H)](
        q, k, v, do, lse, delta, dq, qpos, kpos, kpm, qseg, kseg,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        H, a.group, Lq, Lk, a.alpha, prep.c_a, prep.c_p, prep.window_arg,
        DV=D, BDV=_pow2(D), BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
    )
    return dq, dk, dv


class _TapaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs) -> torch.Tensor:
        prep = _Prepared(q, k, args)
        o, lse = _forward(q, k, v, prep)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.prep = prep
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.prep)
        return dq, dk, dv, None


def tapa_attention_triton(
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
) -> torch.Tensor:
    """TAPA attention (eq. 12 / eq. 16) with the fused Triton kernels; same contract as the reference.

    `sliding_window` (int >= 1 or None): query i sees key j only if i + (Lk − Lq) − j < sliding_window;
    key blocks outside every window are skipped.

    Differentiable in q, k, v (positions, masks and segment ids are not). Runs on CUDA tensors, or on
    CPU tensors under TRITON_INTERPRET=1. Returns [B, Hq, Lq, D] in q's dtype.
    """
    args = validate_tapa_args(
        q, k, v, alpha=alpha, theta=theta, phase=phase, causal=causal, q_positions=q_positions,
        k_positions=k_positions, key_padding_mask=key_padding_mask, q_segment_ids=q_segment_ids,
        k_segment_ids=k_segment_ids, sliding_window=sliding_window,
    )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"the Triton TAPA kernel takes float16/bfloat16/float32 inputs, got {q.dtype}; "
                        "use tapa_attention_reference for float64")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError("tapa_attention_triton needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tests); "
                         "use tapa_attention_reference on CPU")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return _TapaFunction.apply(q, k, v, args)
