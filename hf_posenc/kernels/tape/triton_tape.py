"""Flash-style Triton kernels for TAPE attention (paper §3.2, eq. 6–7) with an exact backward.

One softmax P = softmax(scale·q kᵀ + masks) mixes both the values and the positional states:
O = P·V (eq. 6) and Ẽ = P·E (eq. 7). E has its own width De (complex frequencies stored as re/im
channels, De = 2F), independent of the head width D; both are padded to powers of two and masked.

Forward: a program owns a tile of query rows and streams the K/V/E tiles of its KV head once. The
online softmax runs in base 2 (log2(e) folded into the scale, applied in the exponent's FMA) and both
accumulators, O and Ẽ, are rescaled and updated with the SAME probabilities in the same pass (rescaled lazily,
only when a row maximum grows by more than 2^8: `hf_posenc.kernels._triton.blocks.lazy_max`). Key blocks
every row of the tile sees in full run through an unmasked loop; the causal diagonal and the ragged end run
through a masked loop. Causality and the presence of a key-padding mask are runtime integers, so one binary
serves every mask combination; with padding every visible block takes the masked loop. GQA reads kv head
h // group; repeated K/V/E are never materialised. The base-2 log-sum-exp is saved for the backward. Batch
and head offsets are 64-bit (the scalar part of every address).

Decode (Lq <= 16) runs through the same forward kernel with another layout, planned in `decode.py`: the query
rows of a whole GQA group packed into 16-row tiles, the key axis split across programs (split-K), the partial
(O | Ẽ, LSE) merged by the shared split-combine kernel.

Backward (exact, FlashAttention-2 scheme, no atomics). With dO and dẼ the output gradients:
    Δ  = rowsum(dO∘O) + rowsum(dẼ∘Ẽ)
    dP = dO·Vᵀ + dẼ·Eᵀ
    dS = P∘(dP − Δ)
    dq = scale·dS·k,  dk = scale·dSᵀ·q,  dv = Pᵀ·dO,  de = Pᵀ·dẼ
dk, dv, de are summed over the query heads of each KV group inside one program per key block (which
loops over the group's heads and the query blocks); dq comes from a program per query block looping
over key blocks. The dẼ terms enter dP and Δ, so dq and dk receive the positional outputs' gradient
(the released kernel dropped exactly those contributions).

All host-side choices are made by `plan_forward` (`decode.plan_decode` for decode) / `plan_backward` for a
`Target`; the launcher runs those plans and the compile lane compiles them. Constexprs that follow from other
arguments (padded widths BLOCK_D / BLOCK_DE, their masks D_MASK / DE_MASK, the dot precision DOT_PREC of the input
dtype, LAZY) are declared on the kernels with `triton.heuristics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl

from .._triton.blocks import (
    add_cols,
    block_range,
    finite_max,
    lazy_max,
    load_tile,
    load_vector,
    masked_block,
    next_pair,
    packed_rows,
    query_block_range,
    store_rows,
    visible,
)
from .._triton.combine import plan_row_dot
from .._triton.fastmath import LOG2E, exp2, fp32
from .._triton.launch import (
    LaunchSpec,
    Target,
    dot_precision,
    interpreting,
    jit_runtime_ints,
    launch_all,
    padded_widths,
    pow2,
)
from .._triton.layout import DECODE_MAX_LQ, INTERPRETER_TILE, ForwardLayout, Tile, strides, table_row, use_decode_path
from .args import TapeArgs, tape_op, validate_tape_args
from .decode import plan_decode

_jit = jit_runtime_ints("H_PROG", "GP", "GROUP", "R", "Hq", "Hkv", "Lq", "Lk", "D", "DE", "split_len", "causal",
                        "has_kpm")
# constexprs every TAPE kernel derives from its other arguments: the padded widths of V and E, whether they are
# padded (column masks), the dot precision of the inputs
_WIDTHS = dict(padded_widths(BLOCK_D="D", BLOCK_DE="DE"), D_MASK=lambda a: a["BLOCK_D"] != a["D"],
               DE_MASK=lambda a: a["BLOCK_DE"] != a["DE"], DOT_PREC=lambda a: dot_precision(a["Q"]))


# ----------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _row_tiles(X, Y, Z, rows64, row_ok, stride_x, stride_y, stride_z, D, DE, BLOCK_D: tl.constexpr,
               BLOCK_DE: tl.constexpr, D_MASK: tl.constexpr, DE_MASK: tl.constexpr):
    """Rows `rows64` (64-bit) of three row-major views: x and y (q|k-like, v|dO-like) D wide, z (E-like) DE wide.
    Returns (x, y, z, the column offsets of D and DE and their masks)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_de = tl.arange(0, BLOCK_DE)
    d_ok = offs_d < D
    de_ok = offs_de < DE
    x = load_tile((X + rows64 * stride_x)[:, None] + offs_d[None, :], row_ok, d_ok, True, D_MASK)
    y = load_tile((Y + rows64 * stride_y)[:, None] + offs_d[None, :], row_ok, d_ok, True, D_MASK)
    z = load_tile((Z + rows64 * stride_z)[:, None] + offs_de[None, :], row_ok, de_ok, True, DE_MASK)
    return x, y, z, offs_d, offs_de, d_ok, de_ok


@triton.jit
def _fwd_block(acc_o, acc_e, m_i, l_i, q, qi, start_n, k_base, v_base, e_base, k_off, v_off, e_off,
               stride_kl, stride_vl, stride_el, KPM, d_ok, de_ok, Lk, rb, has_kpm, qk_scale,
               BLOCK_N: tl.constexpr, D_MASK: tl.constexpr, DE_MASK: tl.constexpr, MASKED: tl.constexpr,
               DOT_PREC: tl.constexpr, FAST: tl.constexpr, LAZY: tl.constexpr):
    """One key block through the online softmax; both accumulators use the same probabilities."""
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < Lk
    n64 = tl.cast(start_n, tl.int64)
    k = load_tile(k_base + n64 * stride_kl + k_off, col_ok, d_ok, MASKED, D_MASK)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if MASKED:
        keep = col_ok & (tl.load(KPM + cols, mask=cols < Lk * has_kpm, other=1) != 0)  # has_kpm is 0 or 1
        s = tl.where(visible(qi[:, None], cols[None, :], keep[None, :], rb, -Lk - 1), s, float("-inf"))
    m_new, move = lazy_max(m_i, tl.max(s, 1) * qk_scale, LAZY)
    if move:
        corr = exp2(m_i - finite_max(m_new), FAST)
        acc_o = acc_o * corr[:, None]
        acc_e = acc_e * corr[:, None]
        l_i = l_i * corr
        m_i = m_new
    p = exp2(s * qk_scale - finite_max(m_i)[:, None], FAST)
    l_i = l_i + tl.sum(p, 1)
    v = load_tile(v_base + n64 * stride_vl + v_off, col_ok, d_ok, MASKED, D_MASK)
    e = load_tile(e_base + n64 * stride_el + e_off, col_ok, de_ok, MASKED, DE_MASK)
    p_lo = p.to(v.dtype)
    acc_o = acc_o + tl.dot(p_lo, v, input_precision=DOT_PREC)
    acc_e = acc_e + tl.dot(p_lo, e, input_precision=DOT_PREC)
    return acc_o, acc_e, m_i, l_i


@triton.heuristics(dict(_WIDTHS, LAZY=lambda a: not use_decode_path(a["Lq"])))
@_jit
def _tape_fwd_kernel(
    Q, K, V, E, KPM, O, EO, LSE,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, seb, seh, sel,
    sob, soh, sos, sol, seob, seoh, seos, seol, slb, slh, sls, skpm,
    H_PROG, GP, GROUP, R, Lq, Lk, D, DE, split_len, causal, has_kpm, qk_scale, lse_empty,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr,
    D_MASK: tl.constexpr, DE_MASK: tl.constexpr, DOT_PREC: tl.constexpr, FAST: tl.constexpr, LAZY: tl.constexpr,
):
    """Program (row block, (batch, head program), key split). Row r of the R = GP·Lq rows of a head program
    is query r mod Lq of query head hp·GP + r div Lq (GP = 1: plain tiles; GP = group: packed decode).
    Writes normalised O, Ẽ and the base-2 LSE of its split; rows without a visible key get zeros and LSE =
    lse_empty (−inf for split partials, +inf in the final LSE so that the backward's P = 0). LAZY (lazy
    rescaling) is on for prefill, off for decode lengths."""
    # fp32 scalars whatever the caller typed them (torch.compile's Inductor passes Python floats as fp64)
    qk_scale, lse_empty = fp32(qk_scale), fp32(lse_empty)
    pid_s = tl.program_id(2)
    b64, kvh64, row_ok, head64, qi, qi_lo, qi_hi = packed_rows(tl.program_id(0), tl.program_id(1), H_PROG, GP, GROUP,
                                                               R, Lq, BLOCK_M)
    qi64 = qi.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_de = tl.arange(0, BLOCK_DE)
    d_ok = offs_d < D
    de_ok = offs_de < DE
    q_rows = Q + b64 * sqb + head64 * sqh + qi64 * sql
    q = load_tile(q_rows[:, None] + offs_d[None, :], row_ok, d_ok, True, D_MASK)

    offs_n = tl.arange(0, BLOCK_N)
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh
    e_base = E + b64 * seb + kvh64 * seh
    k_off = offs_n[:, None] * skl + offs_d[None, :]
    v_off = offs_n[:, None] * svl + offs_d[None, :]
    e_off = offs_n[:, None] * sel + offs_de[None, :]
    kpm_b = KPM + b64 * skpm

    off = Lk - Lq
    rb = tl.where(causal != 0, off, Lk)  # key j visible to query i iff j − i <= rb
    lo_s = pid_s * split_len
    hi_s = tl.minimum(lo_s + split_len, Lk)
    lo, u_lo, u_hi, n_left, n_masked = block_range(lo_s, hi_s, qi_lo, qi_hi, off, rb, Lk + 1, has_kpm, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_o = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc_e = tl.zeros([BLOCK_M, BLOCK_DE], tl.float32)
    for start_n in range(u_lo, u_hi, BLOCK_N):
        acc_o, acc_e, m_i, l_i = _fwd_block(acc_o, acc_e, m_i, l_i, q, qi, start_n, k_base, v_base, e_base,
                                            k_off, v_off, e_off, skl, svl, sel, kpm_b, d_ok, de_ok, Lk, rb,
                                            has_kpm, qk_scale, BLOCK_N, D_MASK, DE_MASK, False, DOT_PREC, FAST,
                                            LAZY)
    for it in range(0, n_masked):
        # `masked_block` written out: the call costs this kernel 2 registers on sm_90 (ptxas)
        start_n = tl.where(it < n_left, lo + it * BLOCK_N, u_hi + (it - n_left) * BLOCK_N)
        acc_o, acc_e, m_i, l_i = _fwd_block(acc_o, acc_e, m_i, l_i, q, qi, start_n, k_base, v_base, e_base,
                                            k_off, v_off, e_off, skl, svl, sel, kpm_b, d_ok, de_ok, Lk, rb,
                                            has_kpm, qk_scale, BLOCK_N, D_MASK, DE_MASK, True, DOT_PREC, FAST,
                                            LAZY)

    has = l_i > 0.0
    inv = 1.0 / tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), lse_empty)
    o_rows = O + b64 * sob + head64 * soh + pid_s * sos + qi64 * sol
    store_rows(o_rows[:, None] + offs_d[None, :], (acc_o * inv[:, None]).to(O.dtype.element_ty), row_ok, d_ok,
               D_MASK)
    eo_rows = EO + b64 * seob + head64 * seoh + pid_s * seos + qi64 * seol
    store_rows(eo_rows[:, None] + offs_de[None, :], (acc_e * inv[:, None]).to(EO.dtype.element_ty), row_ok,
               de_ok, DE_MASK)
    tl.store(LSE + b64 * slb + head64 * slh + pid_s * sls + qi64, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _dkdv_block(dk, dv, de, k, v, e, keep, cols, start_m, q_base, do_base, deo_base, q_off, do_off, deo_off,
                sql, sdol, sdeol, LSE, DELTA, DQ, sdqm, offs_d, d_ok, de_ok, Lq, rb, qk_scale,
                BLOCK_M: tl.constexpr, D_MASK: tl.constexpr, DE_MASK: tl.constexpr, MASKED: tl.constexpr,
                DOT_PREC: tl.constexpr, FAST: tl.constexpr, DK: tl.constexpr, DVE: tl.constexpr,
                FUSE_DQ: tl.constexpr):
    """Contributions of query block [start_m, start_m + BLOCK_M) to one key block ([N, M] tiles): with DK to dk
    and, with FUSE_DQ, the block's dq, added atomically to the fp32 rows at DQ (scale not applied) from the same
    dS tile as dqᵀ = kᵀ·dSᵀ (the head dim is the product's M: Hopper's warpgroup MMA needs 64 or more); with DVE
    to dv and de (P alone, no dP)."""
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < Lq
    m64 = tl.cast(start_m, tl.int64)
    q = load_tile(q_base + m64 * sql + q_off, row_ok, d_ok, MASKED, D_MASK)
    do = load_tile(do_base + m64 * sdol + do_off, row_ok, d_ok, MASKED, D_MASK)
    deo = load_tile(deo_base + m64 * sdeol + deo_off, row_ok, de_ok, MASKED, DE_MASK)
    lse = load_vector(LSE + rows, row_ok, float("inf"), MASKED)
    s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # [BLOCK_N, BLOCK_M]
    if MASKED:
        s_t = tl.where(visible(rows[None, :], cols[:, None], keep[:, None], rb, -Lq - rb - 1), s_t, float("-inf"))
    p_t = exp2(s_t * qk_scale - lse[None, :], FAST)
    if DVE:
        p_lo = p_t.to(do.dtype)
        dv += tl.dot(p_lo, do, input_precision=DOT_PREC)
        de += tl.dot(p_lo, deo, input_precision=DOT_PREC)
    if DK:
        delta = load_vector(DELTA + rows, row_ok, 0.0, MASKED)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC) + tl.dot(e, tl.trans(deo), input_precision=DOT_PREC)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk += tl.dot(ds_t, q, input_precision=DOT_PREC)
        if FUSE_DQ:
            add_cols(DQ + rows.to(tl.int64)[None, :] * sdqm + offs_d[:, None],
                     tl.dot(tl.trans(k), ds_t, input_precision=DOT_PREC), row_ok, d_ok, MASKED, D_MASK)
    return dk, dv, de


@triton.heuristics(_WIDTHS)
@_jit
def _tape_bwd_dkdv_kernel(
    Q, K, V, E, DO, DEO, LSE, DELTA, KPM, DK_, DV, DE_, DQ,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, seb, seh, sel,
    sdob, sdoh, sdol, sdeob, sdeoh, sdeol, sdqb, sdqh, sdqm, skpm,
    Hq, Hkv, Lq, Lk, D, DE, GROUP, causal, has_kpm, qk_scale, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr,
    D_MASK: tl.constexpr, DE_MASK: tl.constexpr, DOT_PREC: tl.constexpr, FAST: tl.constexpr, DK: tl.constexpr,
    DVE: tl.constexpr, FUSE_DQ: tl.constexpr,
):
    """The key-side gradients of one key block of one KV head, summed over the group's query heads and all query
    blocks: dk (DK) and dv, de (DVE). The two-kernel backward computes all three here (DK and DVE) and dq in
    `_tape_bwd_dq_kernel`; the fused backward launches this kernel twice, once for dv, de (DVE: P only) and once
    for dk with dq (DK, FUSE_DQ: atomic fp32 adds into DQ, which the host scales and casts), so each program holds
    at most two wide accumulators and dP is computed once: 8 matrix products per score element, against 10.

    dK/dV/dE are written contiguous [B, Hkv, Lk, ·]."""
    # fp32 scalars whatever the caller typed them (torch.compile's Inductor passes Python floats as fp64)
    qk_scale, scale = fp32(qk_scale), fp32(scale)
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b64 = (pid_bh // Hkv).to(tl.int64)
    kv64 = (pid_bh % Hkv).to(tl.int64)
    start_n = pid_n * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < Lk
    c64 = cols.to(tl.int64)
    k, v, e, offs_d, offs_de, d_ok, de_ok = _row_tiles(
        K + b64 * skb + kv64 * skh, V + b64 * svb + kv64 * svh, E + b64 * seb + kv64 * seh, c64, col_ok, skl, svl,
        sel, D, DE, BLOCK_D, BLOCK_DE, D_MASK, DE_MASK)
    keep = col_ok & (tl.load(KPM + b64 * skpm + cols, mask=cols < Lk * has_kpm, other=1) != 0)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    de = tl.zeros([BLOCK_N, BLOCK_DE], tl.float32)
    rb = tl.where(causal != 0, Lk - Lq, Lk)
    # no window: lb = −Lq − 1 is below every j − i
    m_lo, u_lo, u_hi, n_left, n_masked, n_full = query_block_range(start_n, Lq, Lk, rb, -Lq - 1, has_kpm, BLOCK_M,
                                                                   BLOCK_N)

    offs_m = tl.arange(0, BLOCK_M)
    q_off = offs_m[:, None] * sql + offs_d[None, :]
    do_off = offs_m[:, None] * sdol + offs_d[None, :]
    deo_off = offs_m[:, None] * sdeol + offs_de[None, :]
    # (query head of the group, query block) pairs in flat loops (`next_pair`): blocks all of whose rows see
    # every key of this block, then the masked ones. h64 / j count the pairs.
    h64 = kv64 * GROUP
    j = start_n * 0
    for _ in range(0, GROUP * n_full):
        row0 = (b64 * Hq + h64) * Lq
        dk, dv, de = _dkdv_block(dk, dv, de, k, v, e, keep, cols, u_lo + j * BLOCK_M, Q + b64 * sqb + h64 * sqh,
                                 DO + b64 * sdob + h64 * sdoh, DEO + b64 * sdeob + h64 * sdeoh, q_off, do_off,
                                 deo_off, sql, sdol, sdeol, LSE + row0, DELTA + row0,
                                 DQ + b64 * sdqb + h64 * sdqh, sdqm, offs_d, d_ok, de_ok, Lq, rb, qk_scale,
                                 BLOCK_M, D_MASK, DE_MASK, False, DOT_PREC, FAST, DK, DVE, FUSE_DQ)
        h64, j = next_pair(h64, j, n_full)
    h64 = kv64 * GROUP
    j = start_n * 0
    for _ in range(0, GROUP * n_masked):
        start_m = masked_block(j, n_left, m_lo, u_hi, BLOCK_M)
        row0 = (b64 * Hq + h64) * Lq
        dk, dv, de = _dkdv_block(dk, dv, de, k, v, e, keep, cols, start_m, Q + b64 * sqb + h64 * sqh,
                                 DO + b64 * sdob + h64 * sdoh, DEO + b64 * sdeob + h64 * sdeoh, q_off, do_off,
                                 deo_off, sql, sdol, sdeol, LSE + row0, DELTA + row0,
                                 DQ + b64 * sdqb + h64 * sdqh, sdqm, offs_d, d_ok, de_ok, Lq, rb, qk_scale,
                                 BLOCK_M, D_MASK, DE_MASK, True, DOT_PREC, FAST, DK, DVE, FUSE_DQ)
        h64, j = next_pair(h64, j, n_masked)

    out_rows = (b64 * Hkv + kv64) * Lk + c64
    if DK:
        store_rows((DK_ + out_rows * D)[:, None] + offs_d[None, :], (dk * scale).to(DK_.dtype.element_ty), col_ok,
                   d_ok, D_MASK)
    if DVE:
        store_rows((DV + out_rows * D)[:, None] + offs_d[None, :], dv.to(DV.dtype.element_ty), col_ok, d_ok,
                   D_MASK)
        store_rows((DE_ + out_rows * DE)[:, None] + offs_de[None, :], de.to(DE_.dtype.element_ty), col_ok, de_ok,
                   DE_MASK)


@triton.jit
def _dq_block(dq, q, do, deo, lse, delta, rows, start_n, k_base, v_base, e_base, k_off, v_off, e_off,
              skl, svl, sel, KPM, d_ok, de_ok, Lk, rb, has_kpm, qk_scale,
              BLOCK_N: tl.constexpr, D_MASK: tl.constexpr, DE_MASK: tl.constexpr, MASKED: tl.constexpr,
              DOT_PREC: tl.constexpr, FAST: tl.constexpr):
    """dq contribution of key block [start_n, start_n + BLOCK_N) to one query block ([M, N])."""
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < Lk
    n64 = tl.cast(start_n, tl.int64)
    k = load_tile(k_base + n64 * skl + k_off, col_ok, d_ok, MASKED, D_MASK)
    v = load_tile(v_base + n64 * svl + v_off, col_ok, d_ok, MASKED, D_MASK)
    e = load_tile(e_base + n64 * sel + e_off, col_ok, de_ok, MASKED, DE_MASK)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if MASKED:
        keep = col_ok & (tl.load(KPM + cols, mask=cols < Lk * has_kpm, other=1) != 0)
        s = tl.where(visible(rows[:, None], cols[None, :], keep[None, :], rb, -Lk - 1), s, float("-inf"))
    p = exp2(s * qk_scale - lse[:, None], FAST)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC) + tl.dot(deo, tl.trans(e), input_precision=DOT_PREC)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PREC)
    return dq


@triton.heuristics(_WIDTHS)
@_jit
def _tape_bwd_dq_kernel(
    Q, K, V, E, DO, DEO, LSE, DELTA, KPM, DQ,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, seb, seh, sel,
    sdob, sdoh, sdol, sdeob, sdeoh, sdeol, skpm,
    Hq, Lq, Lk, D, DE, GROUP, causal, has_kpm, qk_scale, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr,
    D_MASK: tl.constexpr, DE_MASK: tl.constexpr, DOT_PREC: tl.constexpr, FAST: tl.constexpr,
):
    """dq of one query block of one query head, looping over the visible key blocks. dQ is contiguous."""
    # fp32 scalars whatever the caller typed them (torch.compile's Inductor passes Python floats as fp64)
    qk_scale, scale = fp32(qk_scale), fp32(scale)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b64 = (pid_bh // Hq).to(tl.int64)
    h = pid_bh % Hq
    h64 = h.to(tl.int64)
    kv64 = (h // GROUP).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < Lq
    r64 = rows.to(tl.int64)
    q, do, deo, offs_d, offs_de, d_ok, de_ok = _row_tiles(
        Q + b64 * sqb + h64 * sqh, DO + b64 * sdob + h64 * sdoh, DEO + b64 * sdeob + h64 * sdeoh, r64, row_ok, sql,
        sdol, sdeol, D, DE, BLOCK_D, BLOCK_DE, D_MASK, DE_MASK)
    row0 = (b64 * Hq + h64) * Lq
    lse = tl.load(LSE + row0 + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + rows, mask=row_ok, other=0.0)

    k_base = K + b64 * skb + kv64 * skh
    v_base = V + b64 * svb + kv64 * svh
    e_base = E + b64 * seb + kv64 * seh
    offs_n = tl.arange(0, BLOCK_N)
    k_off = offs_n[:, None] * skl + offs_d[None, :]
    v_off = offs_n[:, None] * svl + offs_d[None, :]
    e_off = offs_n[:, None] * sel + offs_de[None, :]
    kpm_b = KPM + b64 * skpm
    off = Lk - Lq
    rb = tl.where(causal != 0, off, Lk)
    r1 = tl.minimum(m0 + BLOCK_M, Lq) - 1
    lo, u_lo, u_hi, n_left, n_masked = block_range(m0 * 0, Lk, m0, r1, off, rb, Lk + 1, has_kpm, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(u_lo, u_hi, BLOCK_N):
        dq = _dq_block(dq, q, do, deo, lse, delta, rows, start_n, k_base, v_base, e_base, k_off, v_off, e_off,
                       skl, svl, sel, kpm_b, d_ok, de_ok, Lk, rb, has_kpm, qk_scale,
                       BLOCK_N, D_MASK, DE_MASK, False, DOT_PREC, FAST)
    for it in range(0, n_masked):
        start_n = masked_block(it, n_left, lo, u_hi, BLOCK_N)
        dq = _dq_block(dq, q, do, deo, lse, delta, rows, start_n, k_base, v_base, e_base, k_off, v_off, e_off,
                       skl, svl, sel, kpm_b, d_ok, de_ok, Lk, rb, has_kpm, qk_scale,
                       BLOCK_N, D_MASK, DE_MASK, True, DOT_PREC, FAST)
    store_rows((DQ + (row0 + r64) * D)[:, None] + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty), row_ok,
               d_ok, D_MASK)


# ----------------------------------------------------------------------------------------------------
# Host side: tiles per target, launch plans, autograd
# ----------------------------------------------------------------------------------------------------


# GPU tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per architecture and padded width of [V | E], chosen
# offline by benchmarks/tune_tiles.py (no spills at D <= 128, shared memory within the limit, fewest issued
# instructions per score element). Decode tiles: decode.py. The fused backward's launches "dvde" + "dkdq" (the
# default where listed; "dkdv" + "dq" elsewhere and when asked to be deterministic): by the pipe model's bound
# (`tune_tiles.py --rank bound`), key blocks of 64+ for the warpgroup MMA; sm_90, D = 128: 0.25 + 0.31 SM clocks per
# score element against 0.75 + 0.25, D = 64: 0.094 + 0.156 against 0.375 + 0.125 (static; on an H200, 2026-12-04,
# forward + backward took 1.47x SDPA flash's at 16k, the two-kernel backward 2.61x).
_TILES = {
    "sm90": {
        128: dict(fwd=(128, 64, 8, 2), dvde=(64, 128, 8, 2), dkdq=(64, 128, 8, 2), dkdv=(32, 32, 4, 2),
                  dq=(128, 64, 8, 1)),
        256: dict(fwd=(128, 64, 8, 2), dvde=(64, 64, 8, 2), dkdq=(64, 128, 8, 2), dkdv=(64, 32, 8, 1),
                  dq=(128, 64, 8, 1)),
        512: dict(fwd=(64, 64, 8, 2), dkdv=(32, 32, 8, 1), dq=(32, 32, 4, 1)),
    },
    "sm80": {
        128: dict(fwd=(128, 64, 8, 3), dkdv=(32, 32, 4, 2), dq=(128, 64, 8, 2)),
        256: dict(fwd=(64, 64, 8, 2), dkdv=(64, 32, 8, 1), dq=(128, 64, 8, 2)),
        512: dict(fwd=(64, 64, 8, 2), dkdv=(32, 32, 8, 1), dq=(32, 32, 4, 1)),
    },
    "fp32": {  # fp32 inputs ("ieee" dots on the FMA units): small tiles so shared memory fits; they spill
        128: dict(fwd=(64, 32, 4, 1), dkdv=(32, 32, 4, 1), dq=(32, 32, 4, 1)),
        256: dict(fwd=(32, 32, 4, 1), dkdv=(16, 32, 4, 1), dq=(32, 16, 4, 1)),
        512: dict(fwd=(32, 16, 4, 1), dkdv=(16, 16, 4, 1), dq=(16, 16, 4, 1)),
    },
}


def tiles(target: Target, block_d: int, block_de: int, itemsize: int = 2) -> dict[str, Tile]:
    """Tile / warp / stage choice per kernel ("fwd", the fused backward's "dvde" + "dkdq" where listed, the two-kernel
    backward's "dkdv" + "dq"; decode: `decode.tile`) for a target and the
    padded widths of V and E (their sum sets the accumulator width). Interpreter: 16-wide tiles so small tests
    cross several blocks. GPUs: the sm_90 table for Hopper and newer, the sm_80 table otherwise, the fp32 table
    for fp32 inputs (`itemsize` 4, `table_row`)."""
    if target.interpreter:
        return dict.fromkeys(("fwd", "dvde", "dkdq", "dkdv", "dq"), INTERPRETER_TILE)
    return {k: Tile(*v) for k, v in table_row(_TILES, target, block_d + block_de, itemsize).items()}


def _common(q, k, v, e, args: TapeArgs, target: Target) -> dict:
    """Arguments every TAPE kernel takes: the inputs and their strides, the int8 keep mask and its batch stride (a
    never-read stand-in without a mask: has_kpm = 0), the shapes and options."""
    has_kpm = args.key_padding_mask is not None
    kpm = args.key_padding_mask.to(torch.int8).contiguous() if has_kpm else q.new_empty(1, dtype=torch.int8)
    return dict(Q=q, K=k, V=v, E=e, KPM=kpm, skpm=kpm.stride(0) if has_kpm else 0,
                **dict(zip(("sqb", "sqh", "sql"), strides(q))), **dict(zip(("skb", "skh", "skl"), strides(k))),
                **dict(zip(("svb", "svh", "svl"), strides(v))), **dict(zip(("seb", "seh", "sel"), strides(e))),
                D=args.head_dim, DE=args.e_dim, causal=int(args.causal), has_kpm=int(has_kpm),
                qk_scale=args.scale * LOG2E, FAST=target.fast_math)


def _forward_spec(q, k, v, e, args: TapeArgs, target: Target, name: str, layout: ForwardLayout, tile: Tile,
                  o_out: torch.Tensor, eo_out: torch.Tensor, lse_out: torch.Tensor) -> LaunchSpec:
    """The forward kernel's launch for a layout and tile, writing O, Ẽ and the base-2 LSE to `o_out`, `eo_out`,
    `lse_out` (the results with one split, the partials with several: `ForwardLayout.write_strides`)."""
    return LaunchSpec(
        name, _tape_fwd_kernel, layout.grid(args.batch),
        dict(_common(q, k, v, e, args, target), O=o_out, EO=eo_out, LSE=lse_out,
             **dict(zip(("sob", "soh", "sos", "sol"), layout.write_strides(o_out))),
             **dict(zip(("seob", "seoh", "seos", "seol"), layout.write_strides(eo_out))),
             **dict(zip(("slb", "slh", "sls"), layout.write_strides(lse_out))),
             **layout.kernel_args(args.group, args.q_len, args.k_len), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n),
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )


def plan_forward(q, k, v, e, args: TapeArgs, target: Target
                 ) -> tuple[list[LaunchSpec], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch plan of the forward: (specs, o, e_out, lse) with lse the fp32 base-2 log-sum-exp [B, Hq, Lq]
    (+inf for rows without a visible key). q, k, v, e must have a contiguous last dim. Prefill here; decode
    lengths (`use_decode_path`) by `decode.plan_decode`."""
    B, Hq, Lq, D, De = args.batch, args.q_heads, args.q_len, args.head_dim, args.e_dim
    forward = partial(_forward_spec, q, k, v, e, args, target)
    if use_decode_path(Lq):
        return plan_decode(q, args, target, forward)
    tile = tiles(target, pow2(D), pow2(De), q.element_size())["fwd"]
    o = torch.empty(B, Hq, Lq, D, device=q.device, dtype=q.dtype)
    eo = torch.empty(B, Hq, Lq, De, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, Lq, device=q.device, dtype=torch.float32)
    return [forward("tape_fwd", ForwardLayout.prefill(Hq, Lq, args.k_len, tile), tile, o, eo, lse)], o, eo, lse


@dataclass
class BackwardPlan:
    """Launches of one backward and the gradients they write. Fused (the default where the tile table has "dkdq" and
    "dvde" tiles): one key-side kernel gives dv, de, the other dk and adds each tile's dq into an fp32 accumulator
    (atomically, so the summation order varies from run to run); `finish` scales and casts it. Two-kernel: dk, dv,
    de in one kernel and a separate dq kernel that recomputes the scores and dP (bitwise reproducible)."""

    specs: list[LaunchSpec]
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    de: torch.Tensor
    dq_scale: float | None = None  # the softmax scale, when dq is the fp32 accumulator
    dq_dtype: torch.dtype | None = None

    def finish(self) -> torch.Tensor:
        """dq in q's dtype: scale·acc for the fused backward (the accumulator this backward owns, scaled in place)."""
        if self.dq_scale is None:
            return self.dq
        return self.dq.mul_(self.dq_scale).to(self.dq_dtype)


def plan_backward(do, deo, q, k, v, e, o, eo, lse, args: TapeArgs, target: Target, deterministic: bool = False
                  ) -> BackwardPlan:
    """Launch plan of the exact backward: fused where the target's tile table has a fused tile and `deterministic`
    is False, the two-kernel backward otherwise. do, deo, o, eo, lse must be contiguous."""
    B, Hq, Hkv, Lq, Lk, D, De = (args.batch, args.q_heads, args.kv_heads, args.q_len, args.k_len,
                                 args.head_dim, args.e_dim)
    cfg = tiles(target, pow2(D), pow2(De), q.element_size())
    deterministic = deterministic or "dkdq" not in cfg
    delta = torch.empty(B, Hq, Lq, device=q.device, dtype=torch.float32)
    if deterministic:
        dq = torch.empty(B, Hq, Lq, D, device=q.device, dtype=q.dtype)
    else:
        dq = torch.zeros(B, Hq, Lq, D, device=q.device, dtype=torch.float32)
    dk = torch.empty(B, Hkv, Lk, D, device=q.device, dtype=k.dtype)
    dv = torch.empty(B, Hkv, Lk, D, device=q.device, dtype=v.dtype)
    de = torch.empty(B, Hkv, Lk, De, device=q.device, dtype=e.dtype)
    common = dict(_common(q, k, v, e, args, target), DO=do, DEO=deo, LSE=lse, DELTA=delta,
                  **dict(zip(("sdob", "sdoh", "sdol"), strides(do))),
                  **dict(zip(("sdeob", "sdeoh", "sdeol"), strides(deo))),
                  Hq=Hq, Lq=Lq, Lk=Lk, GROUP=args.group, scale=args.scale)
    def key_side(name: str, dk_: bool, dve: bool) -> LaunchSpec:
        t = cfg[name.removeprefix("tape_bwd_")]
        return LaunchSpec(name, _tape_bwd_dkdv_kernel, (triton.cdiv(Lk, t.block_n), B * Hkv),
                          dict(common, DK_=dk, DV=dv, DE_=de, DQ=dq, Hkv=Hkv, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                               DK=dk_, DVE=dve, FUSE_DQ=not deterministic,
                               **dict(zip(("sdqb", "sdqh", "sdqm"), strides(dq)))),
                          num_warps=t.num_warps, num_stages=t.num_stages)

    specs = [plan_row_dot(o, do, delta, target, eo, deo)]
    if not deterministic:
        specs += [key_side("tape_bwd_dvde", False, True), key_side("tape_bwd_dkdq", True, False)]
        return BackwardPlan(specs, dq, dk, dv, de, args.scale, q.dtype)
    t = cfg["dq"]
    specs += [key_side("tape_bwd_dkdv", True, True),
              LaunchSpec("tape_bwd_dq", _tape_bwd_dq_kernel, (triton.cdiv(Lq, t.block_m), B * Hq),
                         dict(common, DQ=dq, BLOCK_M=t.block_m, BLOCK_N=t.block_n),
                         num_warps=t.num_warps, num_stages=t.num_stages)]
    return BackwardPlan(specs, dq, dk, dv, de)


class _TapeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, e, args: TapeArgs, deterministic: bool):
        specs, o, eo, lse = plan_forward(q, k, v, e, args, Target.of(q))
        launch_all(specs)
        ctx.save_for_backward(q, k, v, e, o, eo, lse)
        ctx.args, ctx.deterministic = args, deterministic
        return o, eo

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, deo):
        """Exact gradients (dq, dk, dv, de) of O = P·V and Ẽ = P·E with P = softmax(scale·q kᵀ + masks)."""
        q, k, v, e, o, eo, lse = ctx.saved_tensors
        plan = plan_backward(do.contiguous(), deo.contiguous(), q, k, v, e, o.contiguous(), eo.contiguous(),
                             lse.contiguous(), ctx.args, Target.of(q), ctx.deterministic)
        launch_all(plan.specs)
        return plan.finish(), plan.dk, plan.dv, plan.de, None, None


@tape_op
def tape_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, args: TapeArgs, *,
                          deterministic: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused TAPE attention (eq. 6–7): O = P·V and Ẽ = P·E from one online softmax, exact backward.

    Needs CUDA tensors or TRITON_INTERPRET=1 (CPU tensors) and fp16/bf16/fp32 inputs. bf16/fp16 run on the
    tensor cores; fp32 inputs use exact fp32 ("ieee") dots on the FMA units, which is much slower on GPUs.
    Options: :func:`~hf_posenc.kernels.tape.args.validate_tape_args`.

    `deterministic` (default: `torch.are_deterministic_algorithms_enabled()`): where the tile table has a fused
    backward (Hopper at head dims <= 128, see `tiles`) dq is added atomically in fp32 from the dk kernel's dS tiles,
    so gradients vary from run to run within fp32 rounding, as FlashAttention-2's do; True always runs the
    two-kernel backward (a separate dq kernel recomputes the scores), which is bitwise reproducible."""
    if q.dtype == torch.float64:
        raise TypeError("tape_attention_triton: float64 is not supported; use tape_attention_reference or cast to fp32")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(
            "tape_attention_triton: inputs must be CUDA tensors (or set TRITON_INTERPRET=1 before importing "
            "the kernel to run it on CPU)"
        )
    q, k, v, e = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, e))  # plans need a unit last stride
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, e)):
        if deterministic is None:
            deterministic = torch.are_deterministic_algorithms_enabled()
        return _TapeAttention.apply(q, k, v, e, args, bool(deterministic))
    # no gradient to build (generate runs under no_grad): the forward as _TapeAttention.forward runs it, without
    # autograd.Function's bookkeeping (a decode call is host-bound)
    specs, o, eo, _ = plan_forward(q, k, v, e, args, Target.of(q))
    launch_all(specs)
    return o, eo


def lane_specs(target: Target, dtype: torch.dtype, head_dim: int) -> list[LaunchSpec]:
    """Every launch the host code plans for `target` at this dtype and head dim (E as wide as the head, as the
    TAPE scheme uses it), on meta tensors: prefill forward + backward and split-K decode + combine, causal
    and non-causal, with and without key padding (runtime arguments: one binary each)."""
    B, H, HKV, L = 2, 8, 2, 1024

    def meta(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    specs: list[LaunchSpec] = []
    for causal in (True, False):
        for kpm in (None, meta(B, L, dt=torch.bool)):
            for lq in (L, 1):
                q = meta(B, H, lq, head_dim)
                k, v, e = (meta(B, HKV, L, head_dim) for _ in range(3))
                args = validate_tape_args(q, k, v, e, causal=causal, key_padding_mask=kpm)
                fwd, o, eo, lse = plan_forward(q, k, v, e, args, target)
                specs += fwd
                if not use_decode_path(lq):
                    for deterministic in (False, True):
                        specs += plan_backward(torch.empty_like(o), torch.empty_like(eo), q, k, v, e, o, eo, lse,
                                               args, target, deterministic).specs
    return specs


__all__ = ["tape_attention_triton", "plan_forward", "plan_backward", "tiles", "use_decode_path", "DECODE_MAX_LQ",
           "lane_specs"]
