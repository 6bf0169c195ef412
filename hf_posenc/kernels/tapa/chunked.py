"""Chunked (flash-style) TAPA attention for CPU: O(N) memory, exact backward by recomputation.

Same contract and numbers as the reference (:func:`.naive.tapa_attention_reference`, paper eq. 12, or
eq. 16 with ``phase="linear"``), without the [B, H, Lq, Lk] score matrix. Per block of queries × block of
keys, with a = q_A·k_A and p = q_P·k_P (eq. 16: p = Σq_P + Σk_P) and d = |m − n|:

    s = c_A·a·cos(2π·r),   r = frac(t),   t = (c_P·d^α)·p                 (eq. 12; cos(2πr) = cos(2πt))

followed by the online softmax of FlashAttention (running max, running sum, rescaled accumulator). The
forward keeps only the output and the per-row log-sum-exp; the backward recomputes each block's scores
and applies dS = P∘(dP − Δ), Δ = rowsum(dO∘O), through both products:

    ∂s/∂a = c_A·cos(2πr),   ∂s/∂p = −2π·(c_P·d^α)·c_A·a·sin(2πr)       (zero at d = 0)

so training memory is O(N) too. Layout and cost:

- Grouped-query attention without repeating K/V: the G = Hq/Hkv query heads that share a KV head are
  stacked as rows, [B, Hkv, L, G, D], so one matmul per block serves the whole group and dK/dV sum over it.
- c_A·log2(e) is folded into q_A once and the softmax runs in base 2 (exp2 is several times faster than exp
  in PyTorch on CPU). c_P·d^α is one [BM, BN] tensor per block shared by every head: where positions are
  consecutive the block is a Toeplitz matrix read from BM + BN − 1 entries of a distance table (built once
  per query block for its whole key range), elsewhere a table lookup per pair (a direct power when the
  positions span more than the table covers).
- Causal attention visits only key blocks left of the diagonal; sliding windows skip blocks left of every
  row's window; key blocks with every key padded, or whose segment ids meet none of the block's queries,
  are skipped. Per-element masks (an additive 0/−inf bias) are built only for blocks that cut a boundary.
- Query blocks are independent tasks run by :func:`..cpu_parallel.run_tasks` on single-threaded workers
  (thousands of small ops, each its own OpenMP region, stall on a busy machine); in the backward each
  worker accumulates its own dK/dV, summed at the end.
- Everything accumulates in fp32 (float64 inputs stay float64), as in the reference; autocast is off inside.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from dataclasses import dataclass
from typing import Iterator

import torch

from ..cpu_parallel import run_tasks, single_threaded
from .args import TapaArgs, tapa_op

TWO_PI = 2.0 * math.pi
LOG2E = 1.0 / math.log(2.0)  # scores are kept in base 2 (exp2 is several times faster than exp on CPU)
LN2 = math.log(2.0)
NO_SCORE = -1e30  # running max before any visible key (below any score; exp2(NO_SCORE − score) = 0)
# Score elements (batch × heads × rows × keys) one block step works on (2 MiB per fp32 temporary): large enough
# that the Python overhead per step is small against its work, small enough to stay in cache. With SmolLM2's 9
# heads this gives 128 queries × 512 keys, the fastest of 64-256 × 227-1024 tried at 2k-4k tokens (1 thread).
BLOCK_ELEMENTS = 1 << 19
DEFAULT_BLOCK_Q = 128
MAX_BLOCK_K = 4096
# Calls with fewer (batch × heads × queries × keys) scores than this run on the calling thread with single-threaded
# ops (about a millisecond of work: handing tasks to workers, or an OpenMP barrier per op, costs more).
PARALLEL_MIN_SCORES = 1 << 18
# The c_P·d^α table covers distances up to this many entries past the sequence lengths; wider position
# spans fall back to computing the power per block.
TABLE_SLACK = 1 << 16

__all__ = ["tapa_attention_chunked"]


@dataclass(frozen=True)
class _Block:
    """One (query block, key block) step: ranges and the mask it needs (None: every pair visible)."""

    i0: int
    i1: int
    j0: int
    j1: int
    bias: torch.Tensor | None  # [B', 1, BM, 1, BN]: 0 where the query sees the key, −inf elsewhere
    scale: torch.Tensor  # [B', 1, BM, 1, BN]: c_P·d^α


def is_small(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Few enough scores to run on the calling thread with single-threaded ops (planning included)."""
    return q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] < PARALLEL_MIN_SCORES


class _Plan:
    """Shapes, block schedule, distance table and masks derived once from the validated arguments; shared by
    the forward and the backward."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, args: TapaArgs, block_q: int | None, block_k: int | None):
        self.args = args
        self.B, self.Hq, self.Lq, self.D = q.shape
        self.Hkv, self.Lk = k.shape[1], k.shape[2]
        self.G = args.group
        self.Da, self.Dp = args.amp_dims, args.phase_dims
        self.off = self.Lk - self.Lq  # query i is key index i + off
        self.dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.device = q.device
        self.c_a = 1.0 / math.sqrt(self.Da)
        self.c_p = 1.0 / math.sqrt(self.Dp)
        self.window = args.sliding_window if args.sliding_window is not None and args.sliding_window < self.Lk else None
        self.block_q = _check_block("block_q", block_q) or min(DEFAULT_BLOCK_Q, self.Lq)
        # key blocks a multiple of the query block, so the causal diagonal cuts blocks in few distinct patterns
        per_row = BLOCK_ELEMENTS / (self.B * self.Hq * self.block_q)
        auto_k = min(MAX_BLOCK_K, max(1, round(per_row / self.block_q)) * self.block_q)
        self.block_k = _check_block("block_k", block_k) or min(auto_k, self.Lk)
        self._positions()
        self._key_block_flags()
        self._bands: dict[tuple, torch.Tensor] = {}
        self.threads = 1 if is_small(q, k) else None

    # -- distances -------------------------------------------------------------------------------------------
    def _positions(self) -> None:
        qpos, kpos = self.args.q_positions, self.args.k_positions
        shared = self.B == 1 or (bool((qpos == qpos[:1]).all()) and bool((kpos == kpos[:1]).all()))
        self.qpos = qpos[:1] if shared else qpos  # [B', Lq], B' = 1 when every row has the same positions
        self.kpos = kpos[:1] if shared else kpos
        lo = min(int(self.qpos.min()), int(self.kpos.min()))
        hi = max(int(self.qpos.max()), int(self.kpos.max()))
        self.span = hi - lo  # every distance lies in [0, span]
        self.table = self.signed = None
        if self.span <= self.Lq + self.Lk + TABLE_SLACK:
            self.table = self._scale_of(torch.arange(self.span + 1, device=self.device))
            self.signed = torch.cat([self.table.flip(0)[:-1], self.table])  # signed distance x at [span + x]
        # Runs of consecutive positions (position − index constant in every row): inside one, the distances of a
        # block form a Toeplitz matrix, read from BM + BN − 1 table entries instead of BM·BN lookups.
        self.q_breaks = _break_counts(self.qpos)
        self.k_breaks = _break_counts(self.kpos)
        self.qpos_list = self.qpos.tolist()
        self.kpos_list = self.kpos.tolist()

    def _scale_of(self, d: torch.Tensor) -> torch.Tensor:
        """c_P·d^α for integer distances d (0 at d = 0), in the compute dtype, as the reference computes it."""
        df = d.to(self.dtype)
        d_pow = torch.where(df > 0, df.clamp_min(1.0) ** self.args.alpha, torch.zeros_like(df))
        return d_pow * self.c_p

    def phase_scale(self, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
        """c_P·d^α for queries [i0, i1) × keys [j0, j1), shaped [B', BM, BN]."""
        qb, kb = self.q_breaks, self.k_breaks
        if qb[i1 - 1] == qb[i0] and kb[j1 - 1] == kb[j0]:  # consecutive positions: d = |c + i' − j'|
            bm, bn = i1 - i0, j1 - j0
            cs = [qp[i0] - kp[j0] for qp, kp in zip(self.qpos_list, self.kpos_list)]  # one offset per row
            if self.signed is not None:  # u[x] = c_P·|c + x − (BN − 1)|^α, x = i' − j' + BN − 1
                us = [self.signed[self.span + c - bn + 1 : self.span + c + bm] for c in cs]
                u = us[0][None] if len(us) == 1 else torch.stack(us)
            else:
                x = torch.arange(1 - bn, bm, device=self.device)
                u = self._scale_of((torch.tensor(cs, device=self.device)[:, None] + x).abs_())
            # [i', j'] = u[i' − j' + BN − 1] = w[(BM − 1 − i') + j'] with w = u reversed: rows of w's sliding
            # windows in reverse order (index_select writes them contiguously, several times faster than flip)
            rows_reversed = torch.arange(bm - 1, -1, -1, device=self.device)
            return u.flip(-1).unfold(-1, bn, 1).index_select(-2, rows_reversed)
        d = (self.qpos[:, i0:i1, None] - self.kpos[:, None, j0:j1]).abs_()
        return self.table[d] if self.table is not None else self._scale_of(d)

    # -- masks and schedule ----------------------------------------------------------------------------------
    def _key_block_flags(self) -> None:
        """Per aligned key block: whether every key is unpadded / every key is padded (in every batch row), and
        the segment id range per batch row, so blocks can be skipped or left unmasked without looking inside."""
        a, bk = self.args, self.block_k
        nkb = -(-self.Lk // bk)
        pad = bk * nkb - self.Lk
        self.kpm_all = self.kpm_none = None
        if a.key_padding_mask is not None:
            kpm = torch.nn.functional.pad(a.key_padding_mask, (0, pad), value=True).view(self.B, nkb, bk)
            kpm_off = torch.nn.functional.pad(a.key_padding_mask, (0, pad), value=False).view(self.B, nkb, bk)
            self.kpm_all = kpm.all(-1).all(0).tolist()
            self.kpm_none = (~kpm_off.any(-1)).all(0).tolist()
        self.seg = None
        if a.q_segment_ids is not None:
            ks = a.k_segment_ids
            kmin = torch.nn.functional.pad(ks, (0, pad), value=torch.iinfo(torch.long).max).view(self.B, nkb, bk)
            kmax = torch.nn.functional.pad(ks, (0, pad), value=torch.iinfo(torch.long).min).view(self.B, nkb, bk)
            self.seg = (kmin.amin(-1), kmax.amax(-1))  # [B, nkb]

    def _segment_state(self, i0: int, i1: int, j0: int, j1: int) -> str:
        """'skip' (no query of the block shares a segment with a key of the block, in any row), 'full' (all share
        one segment in every row) or 'mask'."""
        qs = self.args.q_segment_ids[:, i0:i1]
        kb = j0 // self.block_k
        kmin, kmax = self.seg[0][:, kb], self.seg[1][:, kb]
        if j1 - j0 != self.block_k or j0 % self.block_k:  # a clipped block: exact range of its keys
            ks = self.args.k_segment_ids[:, j0:j1]
            kmin, kmax = ks.amin(-1), ks.amax(-1)
        qmin, qmax = qs.amin(-1), qs.amax(-1)
        if bool(((qmax < kmin) | (kmax < qmin)).all()):
            return "skip"
        if bool(((qmin == qmax) & (kmin == kmax) & (qmin == kmin)).all()):
            return "full"
        return "mask"

    def _band(self, diag: int, bm: int, bn: int, causal: bool, window: bool):
        """Causal / sliding-window visibility of a block whose first query is key index j0 + diag, as a bool mask
        and as an additive bias (0 / −inf), each [1, 1, BM, 1, BN]; (None, None) when neither mask applies.
        They depend only on these numbers, so blocks share them (a bias add is a vectorised pass over every head,
        cheaper than masked_fill)."""
        if not (causal or window):
            return None, None
        key = (diag, bm, bn, causal, window)
        cached = self._bands.get(key)
        if cached is None:
            rel = torch.arange(diag, diag + bm, device=self.device)[:, None] - torch.arange(bn, device=self.device)
            band = torch.ones(bm, bn, dtype=torch.bool, device=self.device)
            if causal:
                band &= rel >= 0
            if window:
                band &= rel < self.window
            band = band[None, None, :, None, :]
            cached = band, torch.where(band, 0.0, -math.inf).to(self.dtype)
            if len(self._bands) >= 16:  # a handful of patterns repeat along the diagonal; bound the memory anyway
                self._bands.clear()
            self._bands[key] = cached
        return cached

    def release(self) -> None:
        """Drop the cached block masks (the plan lives on in the autograd graph until the backward)."""
        self._bands.clear()

    def key_range(self, i0: int, i1: int) -> tuple[int, int]:
        """Keys [lo, hi) that some query of [i0, i1) may see under the causal mask and the sliding window."""
        hi = min(self.Lk, i1 + self.off) if self.args.causal else self.Lk
        lo = max(0, i0 + self.off - self.window + 1) if self.window is not None else 0
        return lo, hi

    def task_order(self) -> list[tuple[int, int]]:
        """Query blocks, those that visit the most keys first (so parallel workers finish together)."""

        def keys_visited(block: tuple[int, int]) -> int:
            lo, hi = self.key_range(*block)
            return hi - lo

        blocks = [(i0, min(i0 + self.block_q, self.Lq)) for i0 in range(0, self.Lq, self.block_q)]
        return sorted(blocks, key=keys_visited, reverse=True)

    def key_blocks(self, i0: int, i1: int) -> Iterator[_Block]:
        """The key blocks query block [i0, i1) must visit, each with its visibility mask (None: all visible)."""
        a, bk = self.args, self.block_k
        lo, hi = self.key_range(i0, i1)  # never empty: a query's own key index lies in it
        # c_P·d^α for the whole strip of keys at once when its positions are consecutive (one tensor op per query
        # block instead of per key block); per block otherwise
        strip = self.phase_scale(i0, i1, lo, hi) if self.k_breaks[hi - 1] == self.k_breaks[lo] else None
        for start in range((lo // bk) * bk, hi, bk):
            j0, j1 = max(start, lo), min(start + bk, hi)
            kb = start // bk
            if self.kpm_none is not None and self.kpm_none[kb]:
                continue
            seg_state = self._segment_state(i0, i1, j0, j1) if self.seg is not None else "full"
            if seg_state == "skip":
                continue
            need_causal = a.causal and j1 - 1 > i0 + self.off
            need_window = self.window is not None and j0 <= i1 - 1 + self.off - self.window
            band, bias = self._band(i0 + self.off - j0, i1 - i0, j1 - j0, need_causal, need_window)
            visible = None
            if self.kpm_all is not None and not self.kpm_all[kb]:
                visible = a.key_padding_mask[:, None, None, None, j0:j1]
            if seg_state == "mask":
                same = (a.q_segment_ids[:, i0:i1, None] == a.k_segment_ids[:, None, j0:j1])[:, None, :, None, :]
                visible = same if visible is None else visible & same
            if visible is not None:
                visible = visible if band is None else visible & band
                bias = torch.where(visible, 0.0, -math.inf).to(self.dtype)
            scale = strip[:, :, j0 - lo : j1 - lo] if strip is not None else self.phase_scale(i0, i1, j0, j1)
            yield _Block(i0, i1, j0, j1, bias, scale[:, None, :, None, :])

    # -- layouts ---------------------------------------------------------------------------------------------
    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hq, L, C] -> [B, Hkv, L, G, C] in the compute dtype (query heads of one group as rows)."""
        B, _, L, C = x.shape
        return x.to(self.dtype).reshape(B, self.Hkv, self.G, L, C).transpose(2, 3).contiguous()

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`rows`: [B, Hkv, L, G, C] -> [B, Hq, L, C]."""
        B, _, L, _, C = x.shape
        return x.transpose(2, 3).reshape(B, self.Hq, L, C)


def _break_counts(pos: torch.Tensor) -> list[int]:
    """Number of places up to each index where position − index changes (in any row): indices a and b lie in one
    run of consecutive positions iff their counts are equal."""
    step = (pos[:, 1:] - pos[:, :-1] != 1).any(0)
    return torch.cat([step.new_zeros(1, dtype=torch.long), step.long().cumsum(0)]).tolist()


def _check_block(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int (tokens per block) or None for the default, got {value!r}")
    return value


@dataclass
class _Operands:
    """Kernel-ready operands: q_A pre-scaled by c_A·log2(e), the phase halves (or their sums for eq. 16), V."""

    qa: torch.Tensor  # [B, Hkv, Lq, G, Da]
    qp: torch.Tensor  # [B, Hkv, Lq, G, Dp], or [B, Hkv, Lq, G] row sums (linear phase)
    ka: torch.Tensor  # [B, Hkv, Lk, Da] (a view of k)
    kp: torch.Tensor  # [B, Hkv, Lk, Dp] (a view of k), or [B, Hkv, Lk] row sums (linear phase)
    v: torch.Tensor  # [B, Hkv, Lk, D]


def _operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan) -> _Operands:
    q, k, v = q.detach(), k.detach(), v.detach()  # operands never carry autograd history (the Function does)
    qa = plan.rows(q[..., : plan.Da]) * (plan.c_a * LOG2E)  # s·log2(e) = (c_A·log2(e)·q_A)·k_A·cos(2πr)
    qp = plan.rows(q[..., plan.Da :])
    # one [B, Hkv, Lk, D] block: Transformers hands TAPA its keys unrotated, as a transposed view of [B, Lk, Hkv, D],
    # whose batch and head dims cannot be merged for the batched matmuls without it
    kc = k.to(plan.dtype).contiguous()
    ka = kc[..., : plan.Da]  # strided views of it (row stride D): BLAS reads them as they are
    kp = kc[..., plan.Da :]
    if plan.args.linear:
        qp, kp = qp.sum(-1), kp.sum(-1)
    return _Operands(qa, qp, ka, kp, v.to(plan.dtype).contiguous())


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, n, (G,) C] block -> [B·Hkv, n·G, C] (a view for the slices taken here)."""
    return x.view(x.shape[0] * x.shape[1], -1, x.shape[-1])


def _amp_and_angle(ops: _Operands, plan: _Plan, blk: _Block) -> tuple[torch.Tensor, torch.Tensor]:
    """log2(e)·c_A·a and the angle 2π·r of one block, each [B·Hkv, BM·G, BN]."""
    i0, i1, j0, j1 = blk.i0, blk.i1, blk.j0, blk.j1
    amp = torch.bmm(_flat(ops.qa[:, :, i0:i1]), _flat(ops.ka[:, :, j0:j1]).transpose(1, 2))
    if plan.args.linear:
        qs = ops.qp[:, :, i0:i1].reshape(plan.B * plan.Hkv, -1, 1)
        ks = ops.kp[:, :, j0:j1].reshape(plan.B * plan.Hkv, 1, -1)
        t = qs + ks
    else:
        t = torch.bmm(_flat(ops.qp[:, :, i0:i1]), _flat(ops.kp[:, :, j0:j1]).transpose(1, 2))
    _five(t, plan, blk).mul_(blk.scale)  # turns t = (c_P·d^α)·p
    t.frac_().mul_(TWO_PI)  # range reduction: cos(2πt) = cos(2π·frac(t)), exactly (the reference uses t − round t)
    return amp, t


def _five(x: torch.Tensor, plan: _Plan, blk: _Block) -> torch.Tensor:
    """[B·Hkv, BM·G, BN] -> [B, Hkv, BM, G, BN] view, where per-(query, key) tables broadcast."""
    return x.view(plan.B, plan.Hkv, blk.i1 - blk.i0, plan.G, blk.j1 - blk.j0)


def _mask_(s: torch.Tensor, plan: _Plan, blk: _Block) -> None:
    if blk.bias is not None:
        _five(s, plan, blk).add_(blk.bias)


def _forward(ops: _Operands, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [B, Hkv, G, Lq, D] (= [B, Hq, Lq, D] once viewed) and the base-2 log-sum-exp of the scores·log2(e),
    [B, Hkv, Lq, G] (+inf on rows that see no key). Query blocks are independent tasks (disjoint rows)."""
    out = torch.zeros(plan.B, plan.Hkv, plan.G, plan.Lq, plan.D, dtype=plan.dtype, device=plan.device)
    lse = torch.full((plan.B, plan.Hkv, plan.Lq, plan.G), float("inf"), dtype=plan.dtype, device=plan.device)
    tasks = [functools.partial(_forward_rows, ops, plan, i0, i1, out, lse) for i0, i1 in plan.task_order()]
    run_tasks(tasks, plan.threads)
    return out, lse


def _forward_rows(ops: _Operands, plan: _Plan, i0: int, i1: int, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Online softmax of query block [i0, i1) over its key blocks; writes its rows of `out` and `lse`."""
    B, Hkv, G, D = plan.B, plan.Hkv, plan.G, plan.D
    rows = (i1 - i0) * G
    # a finite start: exp2(s − m) of a fully masked block is exp2(−inf) = 0, no special case for −inf − (−inf)
    m = torch.full((B * Hkv, rows), NO_SCORE, dtype=plan.dtype, device=plan.device)
    l = torch.zeros(B * Hkv, rows, dtype=plan.dtype, device=plan.device)
    acc = torch.zeros(B * Hkv, rows, D, dtype=plan.dtype, device=plan.device)
    seen = False
    for blk in plan.key_blocks(i0, i1):
        seen = True
        amp, angle = _amp_and_angle(ops, plan, blk)
        s = amp.mul_(angle.cos_())
        _mask_(s, plan, blk)
        m_new = torch.maximum(m, s.amax(-1))
        p = s.sub_(m_new[..., None]).exp2_()
        corr = (m - m_new).exp2_()
        l.mul_(corr).add_(p.sum(-1))
        acc.mul_(corr[..., None]).baddbmm_(p, _flat(ops.v[:, :, blk.j0 : blk.j1]))
        m = m_new
    if not seen:  # every key of the block is masked: the rows stay 0 with lse = +inf
        return
    ok = l > 0
    acc.div_(torch.where(ok, l, torch.ones_like(l))[..., None])
    out[:, :, :, i0:i1] = acc.view(B, Hkv, i1 - i0, G, D).transpose(2, 3)
    lse[:, :, i0:i1] = torch.where(ok, m + l.log2(), float("inf")).view(B, Hkv, i1 - i0, G)


def _backward(ops: _Operands, plan: _Plan, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor):
    """Gradients w.r.t. the operands (qa, qp, ka, kp, v), recomputing each block's scores (FlashAttention-2).
    `out` and `dout` are [B, Hq, Lq, D]. Query blocks are tasks: each writes its rows of dq and adds to its
    worker's own dK/dV accumulators, which are summed at the end."""
    delta = (dout.to(plan.dtype) * out.to(plan.dtype)).sum(-1)  # Δ = rowsum(dO∘O), [B, Hq, Lq]
    delta = delta.view(plan.B, plan.Hkv, plan.G, plan.Lq).transpose(2, 3).contiguous()  # [B, Hkv, Lq, G]
    dout = plan.rows(dout)
    dqa = torch.zeros_like(ops.qa)
    dqp = torch.zeros_like(ops.qp)
    per_worker: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    local = threading.local()
    lock = threading.Lock()

    def key_grads() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not hasattr(local, "grads"):
            local.grads = (torch.zeros_like(ops.ka), torch.zeros_like(ops.kp), torch.zeros_like(ops.v))
            with lock:
                per_worker.append(local.grads)
        return local.grads

    tasks = [
        functools.partial(_backward_rows, ops, plan, i0, i1, lse, delta, dout, dqa, dqp, key_grads)
        for i0, i1 in plan.task_order()
    ]
    run_tasks(tasks, plan.threads)
    if not per_worker:  # no query sees any key
        return dqa, dqp, torch.zeros_like(ops.ka), torch.zeros_like(ops.kp), torch.zeros_like(ops.v)
    dka, dkp, dv = per_worker[0]
    for other in per_worker[1:]:
        dka.add_(other[0])
        dkp.add_(other[1])
        dv.add_(other[2])
    return dqa, dqp, dka, dkp, dv


def _backward_rows(ops: _Operands, plan: _Plan, i0: int, i1: int, lse: torch.Tensor, delta: torch.Tensor,
                   dout: torch.Tensor, dqa: torch.Tensor, dqp: torch.Tensor, key_grads) -> None:
    B, Hkv, G = plan.B, plan.Hkv, plan.G
    BH, rows = B * Hkv, (i1 - i0) * G
    linear = plan.args.linear
    lse_b = lse[:, :, i0:i1].reshape(BH, rows, 1)
    delta_b = delta[:, :, i0:i1].reshape(BH, rows, 1)
    do_b = _flat(dout[:, :, i0:i1])
    qa_b = _flat(ops.qa[:, :, i0:i1])
    dqa_b = _flat(dqa[:, :, i0:i1])
    if linear:
        dqp_b = dqp[:, :, i0:i1].view(BH, rows)
    else:
        qp_b, dqp_b = _flat(ops.qp[:, :, i0:i1]), _flat(dqp[:, :, i0:i1])
    for blk in plan.key_blocks(i0, i1):
        j0, j1 = blk.j0, blk.j1
        dka, dkp, dv = key_grads()
        amp, angle = _amp_and_angle(ops, plan, blk)
        cos = torch.cos(angle)
        sin = angle.sin_()
        s = amp * cos
        _mask_(s, plan, blk)
        p = s.sub_(lse_b).exp2_()  # rows that see no key have lse = +inf: p = 0
        v_b, ka_b = _flat(ops.v[:, :, j0:j1]), _flat(ops.ka[:, :, j0:j1])
        _flat(dv[:, :, j0:j1]).baddbmm_(p.transpose(1, 2), do_b)
        # dS = P∘(dP − Δ) is ∂L/∂s; the block's scores are s·log2(e), hence the factor ln 2
        ds = torch.bmm(do_b, v_b.transpose(1, 2)).sub_(delta_b).mul_(p).mul_(LN2)
        g_a = cos.mul_(ds)  # ∂L/∂(log2(e)·c_A·a)
        dqa_b.baddbmm_(g_a, ka_b)
        _flat(dka[:, :, j0:j1]).baddbmm_(g_a.transpose(1, 2), qa_b)
        g_p = sin.mul_(amp).mul_(ds)  # ∂L/∂p = −2π·(c_P·d^α)·(c_A·a)·sin(2πr)·dS
        _five(g_p, plan, blk).mul_(blk.scale).mul_(-TWO_PI)
        if linear:  # p = Σq_P + Σk_P: every phase coordinate gets the row / column sum
            dqp_b.add_(g_p.sum(-1))
            dkp[:, :, j0:j1].add_(g_p.sum(1).view(B, Hkv, j1 - j0))
        else:
            dqp_b.baddbmm_(g_p, _flat(ops.kp[:, :, j0:j1]))
            _flat(dkp[:, :, j0:j1]).baddbmm_(g_p.transpose(1, 2), qp_b)


def _threads_for(plan: _Plan) -> contextlib.AbstractContextManager:
    return single_threaded() if plan.threads == 1 else contextlib.nullcontext()


class _ChunkedTapa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan) -> torch.Tensor:
        # autocast off: the compute dtype is chosen here, in every thread
        with torch.autocast(q.device.type, enabled=False), _threads_for(plan):
            ops = _operands(q, k, v, plan)
            out, lse = _forward(ops, plan)
            plan.release()
        result = out.view(q.shape).to(q.dtype)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, result, lse)
        return result

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: torch.Tensor):
        q, k, v, result, lse = ctx.saved_tensors
        plan: _Plan = ctx.plan
        with torch.autocast(q.device.type, enabled=False), _threads_for(plan):
            ops = _operands(q, k, v, plan)  # recomputed: O(N), so only the inputs are kept between the passes
            dqa, dqp, dka, dkp, dv = _backward(ops, plan, result, lse, dout)
            plan.release()
        if plan.args.linear:
            dqp = dqp[..., None].expand(*dqp.shape, plan.Dp)
            dkp = dkp[..., None].expand(*dkp.shape, plan.Dp)
        dq = plan.heads(torch.cat([dqa * (plan.c_a * LOG2E), dqp], dim=-1)).to(q.dtype)
        dk = torch.cat([dka, dkp], dim=-1).to(k.dtype)
        return dq, dk, dv.to(v.dtype), None


@tapa_op
def tapa_attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs, *,
                           block_q: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """TAPA attention (eq. 12, or eq. 16 with phase="linear") in query × key blocks with an online softmax.

    Same contract as :func:`tapa_attention_reference` (q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], queries are the
    last Lq keys, rows without a visible key return 0), in O(B·H·(Lq + Lk)·D) memory plus one block of scores.
    Differentiable in q, k, v with a recomputing backward (positions, masks and segment ids are not).
    `block_q` / `block_k` (tokens per block) override the defaults (128 queries; keys a multiple of that, so
    that a block holds about 2^19 scores over all heads). Written for CPU, where it is the default of
    `tapa_attention`; the ops are plain PyTorch, so it also runs on other devices. Options:
    :func:`~hf_posenc.kernels.tapa.args.validate_tapa_args`.
    """
    with single_threaded() if is_small(q, k) else contextlib.nullcontext():  # the planning's small ops too
        plan = _Plan(q, k, args, block_q, block_k)
    return _ChunkedTapa.apply(q, k, v, plan)
