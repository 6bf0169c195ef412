"""Flash-style Triton kernels for TAPE attention (paper §3.2, eq. 6–7) with an exact backward.

One softmax P = softmax(scale·q kᵀ + masks) mixes both the values and the positional states:
O = P·V (eq. 6) and Ẽ = P·E (eq. 7). E has its own width De (complex frequencies stored as re/im
channels, De = 2F), independent of the head width D; both are padded to powers of two and masked.

Forward: a program owns a tile of query rows and streams the K/V/E tiles of its KV head once. The
online softmax runs in base 2 (log2(e) folded into the scale) and both accumulators, O and Ẽ, are
rescaled and updated with the SAME probabilities in the same pass. Causal attention visits only the
key blocks left of the diagonal, in two stages: blocks every row of the tile sees in full (no causal or
bounds mask), then the masked band. GQA reads kv head h // group; repeated K/V/E are never
materialised. The base-2 log-sum-exp is saved for the backward.

Decode (Lq <= 16): the query rows of a whole GQA group are packed into one tile (row r is query
r mod Lq of head r div Lq), so every K/V/E tile is read once per KV head, and the key axis is split
across programs (split-K); a short combine step merges the partial (O, Ẽ, LSE) triples.

Backward (exact, FlashAttention-2 scheme, no atomics). With dO and dẼ the output gradients:
    Δ  = rowsum(dO∘O) + rowsum(dẼ∘Ẽ)
    dP = dO·Vᵀ + dẼ·Eᵀ
    dS = P∘(dP − Δ)
    dq = scale·dS·k,  dk = scale·dSᵀ·q,  dv = Pᵀ·dO,  de = Pᵀ·dẼ
dk, dv, de are summed over the query heads of each KV group inside one program per key block (which
loops over the group's heads and the query blocks); dq comes from a program per query block looping
over key blocks. The dẼ terms enter dP and Δ, so dq and dk receive the positional outputs' gradient
(the released kernel dropped exactly those contributions).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .naive import TapeArgs, validate_tape_args

LOG2E = 1.4426950408889634
DECODE_MAX_LQ = 16


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


# ----------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(acc_o, acc_e, m_i, l_i, q, qi, k_ptrs, v_ptrs, e_ptrs, stride_kl, stride_vl, stride_el,
               kpm_ptr, d_ok, de_ok, lo, hi, Lk, off, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,
               DOT_PREC: tl.constexpr):
    """Online-softmax pass over key blocks [lo, hi): both accumulators use the same probabilities."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < Lk
        k = tl.load(k_ptrs + cols[:, None] * stride_kl, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        if MASKED:
            vis = col_ok[None, :]
            if CAUSAL:
                vis = vis & (cols[None, :] <= qi[:, None] + off)
            s = tl.where(vis, s, float("-inf"))
        if HAS_KPM:
            keep = tl.load(kpm_ptr + cols, mask=col_ok, other=0) != 0
            s = tl.where(keep[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + cols[:, None] * stride_vl, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        e = tl.load(e_ptrs + cols[:, None] * stride_el, mask=col_ok[:, None] & de_ok[None, :], other=0.0)
        p_lo = p.to(v.dtype)
        acc_o = acc_o * alpha[:, None] + tl.dot(p_lo, v, input_precision=DOT_PREC)
        acc_e = acc_e * alpha[:, None] + tl.dot(p_lo, e, input_precision=DOT_PREC)
        m_i = m_new
    return acc_o, acc_e, m_i, l_i


@triton.jit
def _tape_fwd_kernel(
    Q, K, V, E, KPM, O, EO, LSE,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, seb, seh, sel,
    sob, soh, sos, sol, seob, seoh, seos, seol, slb, slh, sls, skpm,
    H_PROG, Lq, Lk, D, DE, R, GP, GROUP, off, split_len, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """Program (row block, (batch, head program), key split). Row r of the R = GP·Lq rows of a head program
    is query r mod Lq of query head hp·GP + r div Lq (GP = 1: plain tiles; GP = group: packed decode)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // H_PROG
    hp = pid_bh % H_PROG
    kvh = (hp * GP) // GROUP

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    rows_c = tl.minimum(rows, R - 1)
    head = hp * GP + rows_c // Lq
    qi = rows_c % Lq
    offs_d = tl.arange(0, BLOCK_D)
    offs_de = tl.arange(0, BLOCK_DE)
    d_ok = offs_d < D
    de_ok = offs_de < DE

    q_ptrs = Q + b.to(tl.int64) * sqb + head[:, None].to(tl.int64) * sqh + qi[:, None].to(tl.int64) * sql + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    k_ptrs = K + b.to(tl.int64) * skb + kvh.to(tl.int64) * skh + offs_d[None, :]
    v_ptrs = V + b.to(tl.int64) * svb + kvh.to(tl.int64) * svh + offs_d[None, :]
    e_ptrs = E + b.to(tl.int64) * seb + kvh.to(tl.int64) * seh + offs_de[None, :]
    kpm_ptr = KPM + b.to(tl.int64) * skpm

    # Key range of this split, then the causal bounds of this row tile (smallest / largest query index).
    lo = pid_s * split_len
    split_end = tl.minimum(lo + split_len, Lk)
    r0 = pid_m * BLOCK_M
    r1 = tl.minimum(r0 + BLOCK_M, R) - 1
    same_head = (r0 // Lq) == (r1 // Lq)
    qi_lo = tl.where(same_head, r0 % Lq, 0)
    qi_hi = tl.where(same_head, r1 % Lq, Lq - 1)
    if CAUSAL:
        hi = tl.minimum(split_end, qi_hi + off + 1)
        full = tl.minimum(split_end, qi_lo + off + 1)
    else:
        hi = split_end
        full = split_end
    full_end = tl.maximum(lo + ((full - lo) // BLOCK_N) * BLOCK_N, lo)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_o = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc_e = tl.zeros([BLOCK_M, BLOCK_DE], tl.float32)
    # Stage 1: key blocks every row of the tile sees in full.
    acc_o, acc_e, m_i, l_i = _fwd_inner(acc_o, acc_e, m_i, l_i, q, qi, k_ptrs, v_ptrs, e_ptrs, skl, svl, sel,
                                        kpm_ptr, d_ok, de_ok, lo, full_end, Lk, off, qk_scale,
                                        BLOCK_N, False, CAUSAL, HAS_KPM, DOT_PREC)
    # Stage 2: the diagonal band and the ragged last block (causal / bounds mask per element).
    acc_o, acc_e, m_i, l_i = _fwd_inner(acc_o, acc_e, m_i, l_i, q, qi, k_ptrs, v_ptrs, e_ptrs, skl, svl, sel,
                                        kpm_ptr, d_ok, de_ok, full_end, hi, Lk, off, qk_scale,
                                        BLOCK_N, True, CAUSAL, HAS_KPM, DOT_PREC)

    has = l_i > 0.0
    inv = 1.0 / tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    b64 = b.to(tl.int64)
    h64 = head.to(tl.int64)
    q64 = qi.to(tl.int64)
    o_ptrs = O + b64 * sob + h64[:, None] * soh + pid_s * sos + q64[:, None] * sol + offs_d[None, :]
    tl.store(o_ptrs, (acc_o * inv[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    eo_ptrs = EO + b64 * seob + h64[:, None] * seoh + pid_s * seos + q64[:, None] * seol + offs_de[None, :]
    tl.store(eo_ptrs, (acc_e * inv[:, None]).to(EO.dtype.element_ty), mask=row_ok[:, None] & de_ok[None, :])
    tl.store(LSE + b64 * slb + h64 * slh + pid_s * sls + q64, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _bwd_preprocess_kernel(O, DO, EO, DEO, DELTA, H, Lq, D, DE,
                           sob, soh, sol, seob, seoh, seol,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr):
    """Δ = rowsum(dO∘O) + rowsum(dẼ∘Ẽ) (fp32, [B, Hq, Lq]); O/dO and Ẽ/dẼ share their layouts."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Lq
    offs_d = tl.arange(0, BLOCK_D)
    offs_de = tl.arange(0, BLOCK_DE)
    mo = row_ok[:, None] & (offs_d[None, :] < D)
    me = row_ok[:, None] & (offs_de[None, :] < DE)
    po = b * sob + h * soh + rows[:, None].to(tl.int64) * sol + offs_d[None, :]
    pe = b * seob + h * seoh + rows[:, None].to(tl.int64) * seol + offs_de[None, :]
    o = tl.load(O + po, mask=mo, other=0.0).to(tl.float32)
    do = tl.load(DO + po, mask=mo, other=0.0).to(tl.float32)
    eo = tl.load(EO + pe, mask=me, other=0.0).to(tl.float32)
    deo = tl.load(DEO + pe, mask=me, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1) + tl.sum(eo * deo, 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * Lq + rows, delta, mask=row_ok)


@triton.jit
def _tape_bwd_dkdv_kernel(
    Q, K, V, E, DO, DEO, LSE, DELTA, KPM, DK, DV, DE_,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, seb, seh, sel,
    sdob, sdoh, sdol, sdeob, sdeoh, sdeol, skpm,
    Hq, Hkv, Lq, Lk, D, DE, GROUP, off, qk_scale, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dk, dv, de of one key block of one KV head, summed over the group's query heads and all query blocks.

    dK/dV/dE are written contiguous [B, Hkv, Lk, ·]."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hkv).to(tl.int64)
    kvh = pid_bh % Hkv
    start_n = pid_n * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < Lk
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_de = tl.arange(0, BLOCK_DE)
    d_ok = offs_d < D
    de_ok = offs_de < DE
    c64 = cols[:, None].to(tl.int64)
    kv64 = kvh.to(tl.int64)
    mkd = col_ok[:, None] & d_ok[None, :]
    mke = col_ok[:, None] & de_ok[None, :]
    k = tl.load(K + b * skb + kv64 * skh + c64 * skl + offs_d[None, :], mask=mkd, other=0.0)
    v = tl.load(V + b * svb + kv64 * svh + c64 * svl + offs_d[None, :], mask=mkd, other=0.0)
    e = tl.load(E + b * seb + kv64 * seh + c64 * sel + offs_de[None, :], mask=mke, other=0.0)
    keep = col_ok
    if HAS_KPM:
        keep = keep & (tl.load(KPM + b * skpm + cols, mask=col_ok, other=0) != 0)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    de = tl.zeros([BLOCK_N, BLOCK_DE], tl.float32)
    if CAUSAL:
        start_m = (tl.maximum(start_n - off, 0) // BLOCK_M) * BLOCK_M  # earlier queries see none of these keys
    else:
        start_m = 0
    for g in range(GROUP):
        h = kvh * GROUP + g
        h64 = h.to(tl.int64)
        row_base = (b * Hq + h64) * Lq
        for m0 in range(start_m, Lq, BLOCK_M):
            rows = m0 + offs_m
            row_ok = rows < Lq
            r64 = rows[:, None].to(tl.int64)
            q = tl.load(Q + b * sqb + h64 * sqh + r64 * sql + offs_d[None, :],
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            do = tl.load(DO + b * sdob + h64 * sdoh + r64 * sdol + offs_d[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            deo = tl.load(DEO + b * sdeob + h64 * sdeoh + r64 * sdeol + offs_de[None, :],
                          mask=row_ok[:, None] & de_ok[None, :], other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=row_ok, other=0.0)
            lse = tl.where(lse == float("-inf"), float("inf"), lse)  # empty rows: P = 0
            delta = tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0)
            s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
            vis = keep[:, None] & row_ok[None, :]
            if CAUSAL:
                vis = vis & (cols[:, None] <= rows[None, :] + off)
            p_t = tl.where(vis, tl.math.exp2(s_t - lse[None, :]), 0.0)
            p_lo = p_t.to(do.dtype)
            dv += tl.dot(p_lo, do, input_precision=DOT_PREC)
            de += tl.dot(p_lo, deo, input_precision=DOT_PREC)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC) + tl.dot(e, tl.trans(deo), input_precision=DOT_PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PREC)
    out_base = (b * Hkv + kv64) * Lk
    tl.store(DK + (out_base + c64) * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty), mask=mkd)
    tl.store(DV + (out_base + c64) * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=mkd)
    tl.store(DE_ + (out_base + c64) * DE + offs_de[None, :], de.to(DE_.dtype.element_ty), mask=mke)


@triton.jit
def _tape_bwd_dq_kernel(
    Q, K, V, E, DO, DEO, LSE, DELTA, KPM, DQ,
    sqb, sqh, sql, skb, skh, skl, svb, svh, svl, seb, seh, sel,
    sdob, sdoh, sdol, sdeob, sdeoh, sdeol, skpm,
    Hq, Lq, Lk, D, DE, GROUP, off, qk_scale, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dq of one query block of one query head, looping over the visible key blocks. dQ is contiguous."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hq).to(tl.int64)
    h = pid_bh % Hq
    h64 = h.to(tl.int64)
    kv64 = (h // GROUP).to(tl.int64)
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < Lq
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_de = tl.arange(0, BLOCK_DE)
    d_ok = offs_d < D
    de_ok = offs_de < DE
    r64 = rows[:, None].to(tl.int64)
    mqd = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * sqb + h64 * sqh + r64 * sql + offs_d[None, :], mask=mqd, other=0.0)
    do = tl.load(DO + b * sdob + h64 * sdoh + r64 * sdol + offs_d[None, :], mask=mqd, other=0.0)
    deo = tl.load(DEO + b * sdeob + h64 * sdeoh + r64 * sdeol + offs_de[None, :],
                  mask=row_ok[:, None] & de_ok[None, :], other=0.0)
    row_base = (b * Hq + h64) * Lq
    lse = tl.load(LSE + row_base + rows, mask=row_ok, other=0.0)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0)

    k_base = K + b * skb + kv64 * skh + offs_d[None, :]
    v_base = V + b * svb + kv64 * svh + offs_d[None, :]
    e_base = E + b * seb + kv64 * seh + offs_de[None, :]
    if CAUSAL:
        hi = tl.minimum(Lk, m0 + BLOCK_M + off)
    else:
        hi = Lk
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < Lk
        c64 = cols[:, None].to(tl.int64)
        k = tl.load(k_base + c64 * skl, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_base + c64 * svl, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        e = tl.load(e_base + c64 * sel, mask=col_ok[:, None] & de_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        vis = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            vis = vis & (cols[None, :] <= rows[:, None] + off)
        if HAS_KPM:
            vis = vis & (tl.load(KPM + b * skpm + cols, mask=col_ok, other=0) != 0)[None, :]
        p = tl.where(vis, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC) + tl.dot(deo, tl.trans(e), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PREC)
    tl.store(DQ + (row_base + r64) * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=mqd)


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 stays exact; 16-bit dots ignore the flag


def _fwd_config(block_d: int, block_de: int) -> dict:
    if _interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    width = block_d + block_de
    if width <= 128:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    if width <= 256:
        return dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def _bwd_config(block_d: int, block_de: int) -> dict:
    if _interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    width = block_d + block_de  # the dK/dV/dE program keeps 2·D + De fp32 accumulators per key row
    if width <= 128:
        return dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3)
    if width <= 256:
        return dict(BLOCK_M=32, BLOCK_N=64, num_warps=8, num_stages=2)
    return dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)


def _num_splits(args: TapeArgs, n_programs: int, block_n: int, device: torch.device) -> int:
    """Split-K factor for decode: enough programs to fill the machine, at least `min_blocks` key blocks each."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
        min_blocks = 4
    else:  # interpreter: small splits so tests exercise the combine step
        target, min_blocks = 4, 1
    max_splits = max(1, triton.cdiv(args.k_len, block_n * min_blocks))
    return max(1, min(max_splits, target // max(1, n_programs)))


def tape_forward(q, k, v, e, args: TapeArgs, key_padding_mask: torch.Tensor | None):
    """Launch the forward; returns (o, e_out, lse) with lse the fp32 base-2 log-sum-exp [B, Hq, Lq]
    (−inf for rows without a visible key)."""
    B, Hq, Hkv, Lq, Lk, D, De = (args.batch, args.q_heads, args.kv_heads, args.q_len, args.k_len,
                                 args.head_dim, args.e_dim)
    block_d, block_de = _pow2(D), _pow2(De)
    cfg = _fwd_config(block_d, block_de)
    decode = Lq <= DECODE_MAX_LQ
    if decode:  # pack a GQA group's rows into one tile
        gp, h_prog = args.group, Hkv
        rows = gp * Lq
        block_m = min(_pow2(rows), 64)
        cfg = dict(cfg, BLOCK_M=block_m, num_warps=4)
    else:
        gp, h_prog, rows, block_m = 1, Hq, Lq, cfg["BLOCK_M"]
    block_n = cfg["BLOCK_N"]
    n_programs = triton.cdiv(rows, block_m) * B * h_prog
    splits = _num_splits(args, n_programs, block_n, q.device) if decode else 1
    split_len = triton.cdiv(triton.cdiv(Lk, splits), block_n) * block_n
    splits = triton.cdiv(Lk, split_len)

    if splits == 1:
        o = torch.empty(B, Hq, Lq, D, device=q.device, dtype=q.dtype)
        eo = torch.empty(B, Hq, Lq, De, device=q.device, dtype=q.dtype)
        lse = torch.empty(B, Hq, Lq, device=q.device, dtype=torch.float32)
        so = (o.stride(0), o.stride(1), 0, o.stride(2))
        seo = (eo.stride(0), eo.stride(1), 0, eo.stride(2))
        sl = (lse.stride(0), lse.stride(1), 0)
    else:
        o = torch.empty(B, Hq, splits, Lq, D, device=q.device, dtype=torch.float32)
        eo = torch.empty(B, Hq, splits, Lq, De, device=q.device, dtype=torch.float32)
        lse = torch.empty(B, Hq, splits, Lq, device=q.device, dtype=torch.float32)
        so, seo, sl = o.stride()[:4], eo.stride()[:4], lse.stride()[:3]
    has_kpm = key_padding_mask is not None
    kpm = key_padding_mask.to(torch.int8).contiguous() if has_kpm else q.new_empty(1, dtype=torch.int8)
    grid = (triton.cdiv(rows, block_m), B * h_prog, splits)
    _tape_fwd_kernel[grid](
        q, k, v, e, kpm, o, eo, lse,
        *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(e),
        *so, *seo, *sl, kpm.stride(0) if has_kpm else 0,
        h_prog, Lq, Lk, D, De, rows, gp, args.group, args.offset, split_len, args.scale * LOG2E,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DE=block_de,
        CAUSAL=args.causal, HAS_KPM=has_kpm, DOT_PREC=_dot_precision(q.dtype),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if splits == 1:
        return o, eo, lse
    return _combine_splits(o, eo, lse, q.dtype)


def _combine_splits(o_s: torch.Tensor, eo_s: torch.Tensor, lse_s: torch.Tensor, dtype: torch.dtype):
    """Merge split-K partials: weights 2^(lse_s − lse), lse = log2 Σ_s 2^lse_s (empty splits carry −inf)."""
    m = lse_s.amax(dim=2, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp2(lse_s - m)  # [B, Hq, S, Lq]
    total = w.sum(dim=2)
    lse = torch.where(total > 0, m.squeeze(2) + torch.log2(total.clamp_min(1e-30)), torch.full_like(total, float("-inf")))
    w = (w / total.clamp_min(1e-30).unsqueeze(2)).unsqueeze(-1)
    o = (w * o_s).sum(dim=2).to(dtype)
    eo = (w * eo_s).sum(dim=2).to(dtype)
    return o, eo, lse


def tape_backward(do, deo, q, k, v, e, o, eo, lse, args: TapeArgs, key_padding_mask: torch.Tensor | None):
    """Exact gradients (dq, dk, dv, de) of O = P·V and Ẽ = P·E with P = softmax(scale·q kᵀ + masks)."""
    B, Hq, Hkv, Lq, Lk, D, De = (args.batch, args.q_heads, args.kv_heads, args.q_len, args.k_len,
                                 args.head_dim, args.e_dim)
    block_d, block_de = _pow2(D), _pow2(De)
    cfg = _bwd_config(block_d, block_de)
    do = do.contiguous()
    deo = deo.contiguous()
    o = o.contiguous()
    eo = eo.contiguous()
    delta = torch.empty(B, Hq, Lq, device=q.device, dtype=torch.float32)
    pre_m = 16 if _interpreting() else 64
    _bwd_preprocess_kernel[(triton.cdiv(Lq, pre_m), B * Hq)](
        o, do, eo, deo, delta, Hq, Lq, D, De, *_strides3(o), *_strides3(eo),
        BLOCK_M=pre_m, BLOCK_D=block_d, BLOCK_DE=block_de,
    )
    lse = lse.contiguous()
    has_kpm = key_padding_mask is not None
    kpm = key_padding_mask.to(torch.int8).contiguous() if has_kpm else q.new_empty(1, dtype=torch.int8)
    dq = torch.empty(B, Hq, Lq, D, device=q.device, dtype=q.dtype)
    dk = torch.empty(B, Hkv, Lk, D, device=q.device, dtype=k.dtype)
    dv = torch.empty(B, Hkv, Lk, D, device=q.device, dtype=v.dtype)
    de = torch.empty(B, Hkv, Lk, De, device=q.device, dtype=e.dtype)
    common = (*_strides3(q), *_strides3(k), *_strides3(v), *_strides3(e), *_strides3(do), *_strides3(deo),
              kpm.stride(0) if has_kpm else 0)
    meta = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=block_d, BLOCK_DE=block_de,
                CAUSAL=args.causal, HAS_KPM=has_kpm, DOT_PREC=_dot_precision(q.dtype),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    qk_scale = args.scale * LOG2E
    _tape_bwd_dkdv_kernel[(triton.cdiv(Lk, cfg["BLOCK_N"]), B * Hkv)](
        q, k, v, e, do, deo, lse, delta, kpm, dk, dv, de, *common,
        Hq, Hkv, Lq, Lk, D, De, args.group, args.offset, qk_scale, args.scale, **meta,
    )
    _tape_bwd_dq_kernel[(triton.cdiv(Lq, cfg["BLOCK_M"]), B * Hq)](
        q, k, v, e, do, deo, lse, delta, kpm, dq, *common,
        Hq, Lq, Lk, D, De, args.group, args.offset, qk_scale, args.scale, **meta,
    )
    return dq, dk, dv, de


class _TapeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, e, args: TapeArgs, key_padding_mask):
        q, k, v, e = (_last_dim_contiguous(t) for t in (q, k, v, e))
        o, eo, lse = tape_forward(q, k, v, e, args, key_padding_mask)
        ctx.save_for_backward(q, k, v, e, o, eo, lse)
        ctx.args = args
        ctx.key_padding_mask = key_padding_mask
        return o, eo

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, deo):
        q, k, v, e, o, eo, lse = ctx.saved_tensors
        dq, dk, dv, de = tape_backward(do, deo, q, k, v, e, o, eo, lse, ctx.args, ctx.key_padding_mask)
        return dq, dk, dv, de, None, None


def tape_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    e: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused TAPE attention (eq. 6–7): O = P·V and Ẽ = P·E from one online softmax, exact backward.

    Needs CUDA tensors or TRITON_INTERPRET=1 (CPU tensors) and fp16/bf16/fp32 inputs."""
    args = validate_tape_args(q, k, v, e, scale, causal, key_padding_mask)
    if q.dtype == torch.float64:
        raise TypeError("tape_attention_triton: float64 is not supported; use tape_attention_reference or cast to fp32")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(
            "tape_attention_triton: inputs must be CUDA tensors (or set TRITON_INTERPRET=1 before importing "
            "the kernel to run it on CPU)"
        )
    return _TapeAttention.apply(q, k, v, e, args, key_padding_mask)
