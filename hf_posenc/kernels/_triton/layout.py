"""How the programs of a launch cover the work: tile sizes and the per-target tile tables, and the forward layout.

Forward launches are laid out by :class:`ForwardLayout`: prefill runs one query head per program over all keys;
calls with at most ``DECODE_MAX_LQ`` queries (:func:`use_decode_path`) run as split-K decode, planned by each
op's ``decode.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .launch import Target, cdiv

NO_WINDOW = 1 << 30  # window handed to the kernels when there is none (larger than any i_abs − j)


@dataclass(frozen=True)
class Tile:
    """Tile sizes (query rows x key columns), warps and pipeline stages of one kernel launch."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def strides(t: torch.Tensor, n: int = 3) -> tuple[int, ...]:
    """The first n strides of t (one call into torch, not n)."""
    return t.stride()[:n]


def table_row(table: dict[str, dict[int, Any]], target: Target, width: int, itemsize: int = 2) -> Any:
    """The entry of a tile table in the smallest width bucket >= `width` (the largest bucket beyond it): the
    ``"sm90"`` table for Hopper and newer, ``"sm80"`` otherwise, for 16-bit inputs; the ``"fp32"`` table (both
    architectures) for fp32 inputs (`itemsize` 4), whose operands take twice the registers and shared memory:
    the 16-bit tiles overflow shared memory there (seen on an H200: 294912 B requested, 232448 B available)."""
    buckets = table["fp32" if itemsize >= 4 else "sm90" if target.hopper else "sm80"]
    return buckets[min((b for b in buckets if b >= width), default=max(buckets))]


INTERPRETER_TILE = Tile(16, 16, 4, 1)  # every kernel's tile in the interpreter: small tests cross several blocks
DECODE_MAX_LQ = 16  # calls with at most this many queries run as split-K decode


def use_decode_path(q_len: int) -> bool:
    """Whether a forward call runs as split-K decode with GQA-packed rows (`ForwardLayout.split_k`, planned by
    the op's ``decode.py``): at most DECODE_MAX_LQ queries. The forward kernels' LAZY heuristic reads it too."""
    return q_len <= DECODE_MAX_LQ


DECODE_PROGRAMS_PER_SM = 2  # split-K density of decode launches


def num_splits(target: Target, n_programs: int, kv_len: int, block_n: int) -> int:
    """Split-K factor for decode: about DECODE_PROGRAMS_PER_SM programs per SM, at least 4 key blocks per split
    (1 in the interpreter so the tests exercise the combine step)."""
    min_blocks = 1 if target.interpreter else 4
    max_splits = max(1, cdiv(kv_len, block_n * min_blocks))
    return max(1, min(max_splits, (DECODE_PROGRAMS_PER_SM * target.sm_count) // max(1, n_programs), 128))


@dataclass(frozen=True)
class ForwardLayout:
    """How the programs of a forward launch cover rows and keys; grid (row tiles, batch × head programs, key
    splits). A head program owns `heads` query heads whose `rows` = heads·Lq rows it packs (`packed_rows`: row r
    is query r mod Lq of head r div Lq); the keys are cut into `splits` ranges of `split_len` keys (a multiple of
    BLOCK_N). With one split the kernel writes the results; with several, per-split partials (normalised O and
    base-2 LSE, −inf for an empty split) that `plan_split_combine` merges."""

    heads: int
    head_programs: int
    rows: int
    row_tiles: int
    splits: int
    split_len: int

    @classmethod
    def prefill(cls, q_heads: int, q_len: int, k_len: int, tile: Tile) -> "ForwardLayout":
        """One query head per program, all keys in one split."""
        return cls._cover(1, q_heads, q_len, k_len, tile, 1)

    @classmethod
    def split_k(cls, target: Target, batch: int, kv_heads: int, group: int, q_len: int, k_len: int,
                tile: Tile) -> "ForwardLayout":
        """Decode: a whole GQA group's rows per program (each K/V block is read once per kv head and row tile),
        the key axis split across programs (`num_splits`)."""
        n_programs = cdiv(group * q_len, tile.block_m) * batch * kv_heads
        return cls._cover(group, kv_heads, q_len, k_len, tile, num_splits(target, n_programs, k_len, tile.block_n))

    @classmethod
    def _cover(cls, heads: int, head_programs: int, q_len: int, k_len: int, tile: Tile,
               splits: int) -> "ForwardLayout":
        rows = heads * q_len
        split_len = cdiv(cdiv(k_len, splits), tile.block_n) * tile.block_n
        return cls(heads, head_programs, rows, cdiv(rows, tile.block_m), cdiv(k_len, split_len), split_len)

    def grid(self, batch: int) -> tuple[int, int, int]:
        return self.row_tiles, batch * self.head_programs, self.splits

    def kernel_args(self, group: int, q_len: int, k_len: int) -> dict[str, Any]:
        """The layout parameters of the forward kernels (both families name them alike)."""
        return dict(H_PROG=self.head_programs, GP=self.heads, GROUP=group, R=self.rows, Lq=q_len, Lk=k_len,
                    split_len=self.split_len, lse_empty=float("inf") if self.splits == 1 else float("-inf"))

    def write_strides(self, t: torch.Tensor) -> tuple[int, ...]:
        """(batch, head, split, row) strides of an output the forward kernel writes (the last dim, if any,
        contiguous): a [B, H, S, Lq(, W)] partial with several splits, the [B, H, Lq(, W)] result itself (split
        stride 0) with one."""
        if self.splits > 1:
            return tuple(t.stride()[:-1])
        return (t.stride(0), t.stride(1), 0, *t.stride()[2:-1])
