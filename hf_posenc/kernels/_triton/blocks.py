"""Device-side pieces both families' attention kernels are made of (``@triton.jit`` helpers, inlined into the
kernels that call them): tile loads and stores masked only where a constexpr says rows or columns can be out of
range, the causal / window visibility and the key- and query-block schedules derived from it, the GQA-packed rows
of a forward program, the base-2 online-softmax step with lazy rescaling, and atomic adds of fp32 tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fastmath import exp2


@triton.jit
def load_tile(ptrs, row_ok, col_ok, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Load a 2-D tile, masking rows / columns only where the constexpr says they can be out of range."""
    if ROWS:
        if COLS:
            return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        else:
            return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    else:
        if COLS:
            return tl.load(ptrs, mask=col_ok[None, :], other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def load_vector(ptrs, ok, other, MASKED: tl.constexpr):
    """Load one value per row, under the row mask only where the constexpr says rows can be out of range."""
    if MASKED:
        return tl.load(ptrs, mask=ok, other=other)
    else:
        return tl.load(ptrs)


@triton.jit
def visible(q_idx2, k_idx2, k_ok2, rb, lb):
    """Causal / window / bounds visibility: key j is visible to query i iff lb < j − i <= rb and j < Lk."""
    diff = k_idx2 - q_idx2
    return (diff <= rb) & (diff > lb) & k_ok2


@triton.jit
def block_range(lo_s, hi_s, qi_lo, qi_hi, off, rb, window, all_masked, BLOCK_N: tl.constexpr):
    """Key-block schedule of a tile whose rows are queries qi_lo..qi_hi, over keys [lo_s, hi_s) (lo_s a
    multiple of BLOCK_N); a key j is visible to query i iff off − window < j − i <= rb. Returns
    (lo, u_lo, u_hi, n_left, n_masked): blocks [u_lo, u_hi) are visible in full to every row (no mask); the
    n_masked masked blocks are the n_left blocks from lo (window edge), then those from u_hi (diagonal,
    ragged end). Blocks outside every row's window are never listed. all_masked != 0 (runtime; per-key masks
    such as padding present) sends every visible block through the masked path."""
    hi = tl.minimum(hi_s, qi_hi + rb + 1)
    lo = tl.maximum(lo_s, (tl.maximum(qi_lo + off - window + 1, 0) // BLOCK_N) * BLOCK_N)
    hi_al = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    u_lo = tl.cdiv(tl.maximum(qi_hi + off - window + 1, 0), BLOCK_N) * BLOCK_N
    u_lo = tl.minimum(tl.maximum(u_lo, lo), hi_al)
    u_hi = (tl.minimum(hi_s, qi_lo + rb + 1) // BLOCK_N) * BLOCK_N
    u_hi = tl.where(all_masked != 0, u_lo, tl.maximum(tl.minimum(u_hi, hi_al), u_lo))
    n_left = tl.maximum(u_lo - lo, 0) // BLOCK_N
    n_right = tl.cdiv(tl.maximum(hi - u_hi, 0), BLOCK_N)
    return lo, u_lo, u_hi, n_left, n_left + n_right


@triton.jit
def masked_block(it, n_left, lo, u_hi, BLOCK: tl.constexpr):
    """Start of the it-th masked block of a schedule (`block_range`, `query_block_range`): the n_left blocks from
    lo, then those from u_hi."""
    return tl.where(it < n_left, lo + it * BLOCK, u_hi + (it - n_left) * BLOCK)


@triton.jit
def query_block_range(start_n, Lq, Lk, rb, lb, all_masked, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query-block schedule of the backward's key block [start_n, start_n + BLOCK_N): query i sees key j iff
    lb < j − i <= rb, so rows i >= start_n − rb and i < start_n + BLOCK_N − 1 − lb; every key of the block for
    i >= start_n + BLOCK_N − 1 − rb (causal) and i + BLOCK_M <= start_n − lb (window), keys in range and
    all_masked == 0 (with per-key masks every block takes the masked path). Returns (m_lo, u_lo, u_hi, n_left,
    n_masked, n_full): the n_full blocks from u_lo are visible in full; the n_masked masked ones are the n_left
    from m_lo, then those from u_hi (`masked_block`)."""
    m_lo = (tl.maximum(start_n - rb, 0) // BLOCK_M) * BLOCK_M
    m_hi = tl.minimum(Lq, start_n + BLOCK_N - 1 - lb)
    m_hi_al = tl.cdiv(tl.maximum(m_hi, 0), BLOCK_M) * BLOCK_M
    u_lo = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - rb, 0), BLOCK_M) * BLOCK_M
    u_lo = tl.minimum(tl.maximum(u_lo, m_lo), m_hi_al)
    u_hi = (tl.maximum(tl.minimum(Lq, start_n - lb), 0) // BLOCK_M) * BLOCK_M
    u_hi = tl.where((start_n + BLOCK_N <= Lk) & (all_masked == 0), u_hi, 0)
    u_hi = tl.maximum(tl.minimum(u_hi, m_hi_al), u_lo)
    n_left = tl.maximum(u_lo - m_lo, 0) // BLOCK_M
    n_masked = n_left + tl.cdiv(tl.maximum(m_hi - u_hi, 0), BLOCK_M)
    n_full = tl.maximum(u_hi - u_lo, 0) // BLOCK_M
    return m_lo, u_lo, u_hi, n_left, n_masked, n_full


@triton.jit
def next_pair(h, j, n):
    """Advance a (head, block) pair counter over n blocks per head (the backward's flat loops over the query heads
    of a GQA group and their query blocks: nested loops cost registers)."""
    j += 1
    return tl.where(j == n, h + 1, h), tl.where(j == n, 0, j)


@triton.jit
def packed_rows(pid_m, pid_bh, H_PROG, GP, GROUP, R, Lq, BLOCK_M: tl.constexpr):
    """Rows of a forward program (row tile pid_m of head program pid_bh % H_PROG of batch pid_bh // H_PROG).
    A head program owns GP query heads whose R = GP·Lq rows are packed: row r is query r mod Lq of head
    hp·GP + r div Lq (GP = 1: plain query tiles; GP = group: GQA-packed decode). Returns (b64, kvh64, row_ok,
    head64, qi, qi_lo, qi_hi): 64-bit batch / kv-head / per-row head indices, the query index per row, and the
    smallest / largest query index of the tile (for the key-block schedule)."""
    b64 = (pid_bh // H_PROG).to(tl.int64)
    hp = pid_bh % H_PROG
    kvh64 = ((hp * GP) // GROUP).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    rows_c = tl.minimum(rows, R - 1)
    head64 = (hp * GP + rows_c // Lq).to(tl.int64)
    qi = rows_c % Lq
    r0 = pid_m * BLOCK_M
    r1 = tl.minimum(r0 + BLOCK_M, R) - 1
    same_head = (r0 // Lq) == (r1 // Lq)
    return b64, kvh64, row_ok, head64, qi, tl.where(same_head, r0 % Lq, 0), tl.where(same_head, r1 % Lq, Lq - 1)


@triton.jit
def store_rows(ptrs, x, row_ok, col_ok, COLS: tl.constexpr):
    """Store a 2-D tile under its row mask (and column mask when the constexpr says columns can overflow)."""
    if COLS:
        tl.store(ptrs, x, mask=row_ok[:, None] & col_ok[None, :])
    else:
        tl.store(ptrs, x, mask=row_ok[:, None])


@triton.jit
def finite_max(m):
    """The row maxima to subtract in exp2: 0 for rows that have seen no visible key yet (−inf)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def lazy_max(m_ref, block_max, LAZY: tl.constexpr):
    """Online softmax with lazy rescaling (as in FlashAttention-4): each row keeps its reference maximum m_ref
    while no row of the tile has a block maximum more than RESCALE_LOG2 = 8 above its reference, so the
    probabilities 2^(s − m_ref) stay below 2^8 and the accumulators need no rescaling (exact: the final
    normalisation divides by the sum taken against the same reference). Returns (the new maxima, whether the
    caller must move to them: multiply its accumulators and row sums by 2^(m_ref − finite_max(new)), then set
    m_ref = new). Rows going from no visible key (−inf) to a finite maximum always move. LAZY = False: always
    move (classic online softmax; decode tiles of 16 rows gain nothing from the branch, which costs them stack)."""
    m_new = tl.maximum(m_ref, block_max)
    if LAZY:
        grow = tl.where(m_new > m_ref, m_new - tl.maximum(m_ref, -3.0e38), 0.0)  # no −inf − (−inf) = NaN
        move = tl.max(grow, 0) > 8.0
    else:
        move = True
    return m_new, move


@triton.jit
def softmax_block(acc, l_i, m_i, s, scale, LAZY: tl.constexpr, FAST: tl.constexpr):
    """One key block of a base-2 online softmax with one accumulator: rescales (acc, l_i) when `lazy_max` says
    so and returns (acc, l_i + the block's row sums, the reference maxima, the block's probabilities P), so the
    caller adds P·V to acc."""
    m_new, move = lazy_max(m_i, tl.max(s, 1) * scale, LAZY)
    if move:
        corr = exp2(m_i - finite_max(m_new), FAST)
        acc = acc * corr[:, None]
        l_i = l_i * corr
        m_i = m_new
    p = exp2(s * scale - finite_max(m_i)[:, None], FAST)
    return acc, l_i + tl.sum(p, 1), m_i, p


@triton.jit
def add_rows(ptrs, x, row_ok, col_ok, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Atomically add a 2-D fp32 tile (relaxed order: the sum is exact up to fp32 rounding order), masking rows /
    columns only where the constexpr says they can be out of range."""
    if ROWS:
        if COLS:
            tl.atomic_add(ptrs, x, mask=row_ok[:, None] & col_ok[None, :], sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, mask=row_ok[:, None], sem="relaxed")
    else:
        if COLS:
            tl.atomic_add(ptrs, x, mask=col_ok[None, :], sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, sem="relaxed")


@triton.jit
def add_cols(ptrs, x, col_ok, row_ok, COLS: tl.constexpr, ROWS: tl.constexpr):
    """`add_rows` of a transposed tile: x[r, c] goes to row c of the output (a [D, M] product dQᵀ = Kᵀ·dSᵀ added to
    dQ's M rows), masking its columns (the output's rows) / rows (the output's columns) where the constexpr says."""
    if COLS:
        if ROWS:
            tl.atomic_add(ptrs, x, mask=col_ok[None, :] & row_ok[:, None], sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, mask=col_ok[None, :], sem="relaxed")
    else:
        if ROWS:
            tl.atomic_add(ptrs, x, mask=row_ok[:, None], sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, sem="relaxed")
