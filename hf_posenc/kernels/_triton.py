"""Triton plumbing shared by the kernel families (TAPA, TAPE): launch plans, targets, fast math, two small
helper kernels, and compiling a launch plan into a GPU binary on a machine without a GPU.

One source of truth for launches: a family's host code *plans* every kernel launch as a :class:`LaunchSpec`
(kernel, grid, every argument by name, num_warps, num_stages) for a :class:`Target`, and the real launcher runs
exactly those specs. Constexprs that are pure functions of other arguments (padded tile widths, padding masks,
the dot precision of the input dtype) are not planned: the kernels declare them with ``triton.heuristics``, and
:class:`LaunchSpec` evaluates those same rules, so a spec knows every value a launch binds. The compile lane
(``hf_posenc.kernels.compile_lane``) plans the same calls on ``meta`` tensors for an A100 / H100 target and
compiles each spec with :func:`compile_spec`, which derives the kernel signature, constexprs and specialisation
attributes through Triton's own argument binder, so what is compiled here is what ``kernel[grid](...)`` would
compile on that GPU.

Forward launches are laid out by :class:`ForwardLayout`: prefill runs one query head per program over all keys;
calls with at most ``DECODE_MAX_LQ`` queries (:func:`use_decode_path`) run as split-K decode, planned by each
op's ``decode.py``.

Fast math (``FAST`` constexpr, on for CUDA targets, off in the interpreter, which has no inline assembly): the
transcendental helpers below lower to the PTX approximate instructions (special-function unit, ``MUFU``):
``ex2.approx.ftz.f32``, ``lg2.approx.ftz.f32``, ``cos/sin.approx.ftz.f32``. Error bounds documented in the PTX
ISA / CUDA guide: ex2 about 2 ulp (relative 2^-22.5), lg2 absolute 2^-22 on [0.5, 2] and 2 ulp of the result
elsewhere, cos/sin absolute 2^-21 on [-π, π]. The trig helpers take the phase in *turns* and range-reduce it
exactly (r = t − rint(t), exact in fp32), so the approximate instruction only ever sees arguments in [-π, π];
TAPA's d^α takes lg2 of d·2^-e, 2^e a power of two near the tile's distances (exact scaling, exact log2), so the
approximate lg2 works near 1 in tiles far from the diagonal, where phases are large. The kernel tests
emulate errors several times these bounds on the float64 reference and check the result stays inside bf16
tolerance.

fp32 inputs: kernels pass ``input_precision="ieee"`` for fp32 tensors, so their dots run on the FMA units, not
the tensor cores (exact to fp32 accumulation, several times slower); bf16/fp16 inputs take the tensor cores
(``mma``/``wgmma`` with fp32 accumulation). Use bf16/fp16 on GPUs for speed.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Heuristics

LOG2E = 1.4426950408889634
# largest dynamic shared memory one block may use (cudaDevAttrMaxSharedMemoryPerBlockOptin): Triton's launcher
# refuses a kernel above it ("out of resources: shared memory")
SHARED_LIMIT = {80: 166912, 90: 232448}
SM_COUNT = {80: 108, 90: 132}  # A100-SXM / H100-SXM, for split-K planning in the lane
NO_WINDOW = 1 << 30  # window handed to the kernels when there is none (larger than any i_abs − j)


# the compile lane fails a kernel that spills registers at head dims up to this (larger ones may spill)
SPILL_FREE_MAX_HEAD_DIM = 128


def interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter (TRITON_INTERPRET=1, read at kernel import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pow2(n: int, lo: int = 16) -> int:
    """Next power of two >= n, at least `lo` (tile extents must be powers of two; dots need >= 16). Host ints."""
    return max(lo, 1 << (n - 1).bit_length() if n >= 1 else triton.next_power_of_2(n))  # as triton's, no call cost


@dataclass(frozen=True)
class Target:
    """What the host code plans launches for: a CUDA architecture (80 = A100, 90 = H100) or the interpreter."""

    arch: int | None  # compute capability major * 10 + minor; None = Triton's CPU interpreter
    sm_count: int

    @property
    def interpreter(self) -> bool:
        return self.arch is None

    @property
    def fast_math(self) -> bool:
        """Approximate special-function instructions: CUDA only (the interpreter has no inline assembly). fp32
        inputs too: on an H200 their worst selftest error was the same with the accurate routines (4.2e-4 against
        3.6e-4), the fp32 rounding of TAPA's phase argument, which the readable reference in fp32 shares."""
        return self.arch is not None

    @property
    def hopper(self) -> bool:
        return self.arch is not None and self.arch >= 90

    @classmethod
    def gpu(cls, arch: int) -> "Target":
        """The lane's stand-in for a real device of that architecture."""
        if arch not in SM_COUNT:
            raise ValueError(f"no compile-lane target for sm_{arch}; known: {sorted(SM_COUNT)}")
        return cls(arch, SM_COUNT[arch])

    @classmethod
    def of(cls, t: torch.Tensor) -> "Target":
        """The target a launch on tensor `t` runs on (the interpreter when TRITON_INTERPRET=1)."""
        if interpreting():
            return INTERPRETER
        if t.device.type != "cuda":
            raise ValueError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got a {t.device} tensor")
        return _cuda_target(t.device.index if t.device.index is not None else torch.cuda.current_device())


INTERPRETER = Target(None, 4)


@lru_cache(maxsize=None)
def _cuda_target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    return Target(props.major * 10 + props.minor, props.multi_processor_count)


Rule = Callable[[dict[str, Any]], Any]  # a triton.heuristics rule: launch arguments by name -> one constexpr


def unwrap_heuristics(kernel: Any) -> tuple[Any, dict[str, Rule]]:
    """(the JIT function under any ``triton.heuristics`` wrappers, their rules in the order Triton applies them
    at launch: the outermost wrapper's first, each rule in its dict's order, each seeing the values before it)."""
    rules: dict[str, Rule] = {}
    while isinstance(kernel, Heuristics):
        rules.update(kernel.values)
        kernel = kernel.fn
    return kernel, rules


@dataclass
class LaunchSpec:
    """One planned kernel launch: every kernel parameter by name (tensors, ints, floats and constexprs) except
    the constexprs the kernel derives with ``triton.heuristics``; those are evaluated here from `args` by the
    kernel's own rules, as Triton evaluates them when :meth:`launch` runs the kernel, into `derived`
    (`all_args` = what the launch binds, which the compile lane compiles).

    Planning runs on every call of an op (decode calls are host-bound), so what does not change between calls is
    read once per kernel: its parameters (`kernel_info`) and the check of each list of planned names
    (`check_arg_names`). No tensor is kept from call to call."""

    name: str
    kernel: Any  # triton JITFunction (InterpretedFunction under TRITON_INTERPRET=1), maybe in triton.heuristics
    grid: tuple[int, ...]
    args: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 1
    jit: Any = field(default=None, init=False)  # `kernel` without its heuristics wrappers
    derived: dict[str, Any] = field(default_factory=dict, init=False)
    constexpr_names: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        # unwrap the heuristics and check the planned names against the kernel's parameters (once per kernel and
        # list of names: KernelInfo), evaluate the rules
        info = kernel_info(self.kernel)
        check_arg_names(self.name, info, self.args)
        self.jit, self.constexpr_names = info.jit, info.constexpr_names
        # what Heuristics.run hands each rule: the launch's keyword arguments plus the values derived before it
        self.derived = derive_constexprs(info, self.args, self.launch_options())

    def launch_options(self) -> dict[str, Any]:
        """The launch's own keywords, which Triton hands the heuristics rules beside the arguments."""
        return dict(grid=self.grid, warmup=False, num_warps=self.num_warps, num_stages=self.num_stages)

    def launch(self) -> None:
        if any(g <= 0 for g in self.grid):
            return
        # the JIT function itself with the derived constexprs evaluated once, in __post_init__ (going through the
        # heuristics wrapper would evaluate every rule again on each launch)
        self.jit[self.grid](**self.all_args, num_warps=self.num_warps, num_stages=self.num_stages)

    @property
    def all_args(self) -> dict[str, Any]:
        """Every kernel parameter as the launch binds it: the planned arguments and the derived constexprs."""
        return {**self.args, **self.derived}

    @property
    def constexprs(self) -> dict[str, Any]:
        values = self.all_args
        return {n: values[n] for n in self.constexpr_names}


def padded_widths(**widths: str) -> dict[str, Rule]:
    """``triton.heuristics`` rules for padded tile extents: ``padded_widths(BDA="DA")`` derives BDA = pow2(DA)
    from the launch's DA (a constexpr or a runtime int)."""
    return {name: (lambda a, w=width: pow2(a[w])) for name, width in widths.items()}


def dot_precision(t: torch.Tensor) -> str:
    """``input_precision`` of a kernel's dots on this input: exact fp32 ("ieee", FMA units) for fp32 tensors;
    16-bit inputs take the tensor cores (where the flag is ignored)."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def jit_runtime_ints(*names: str):
    """`triton.jit` that does not specialise the named integer parameters (those a kernel has): shapes and
    windows change from call to call, so one binary serves them all (no `== 1` / `% 16` variants), which is
    also what makes the compile lane's binaries the ones every call uses."""

    def wrap(fn):
        params = inspect.signature(fn).parameters
        return triton.jit(do_not_specialize=[n for n in names if n in params])(fn)

    return wrap


def launch_all(specs: list[LaunchSpec]) -> None:
    for spec in specs:
        spec.launch()


# ----------------------------------------------------------------------------------------------------
# Fast math (constexpr-gated: FAST=False is the interpreter's path and the accurate reference lowering)
# ----------------------------------------------------------------------------------------------------


@triton.jit
def fp32(x):
    """A scalar kernel argument as fp32: Triton's launcher types Python floats fp32, torch.compile's Inductor
    fp64 (it compiles the kernels itself), which would turn loop-carried fp32 state into fp64 and fail."""
    return tl.cast(x, tl.float32)


@triton.jit
def exp2(x, FAST: tl.constexpr):
    """2^x; ex2.approx.ftz.f32 on CUDA (2^-inf = 0, as the masks rely on)."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def log2(x, FAST: tl.constexpr):
    """log2(x); lg2.approx.ftz.f32 on CUDA (log2(0) = -inf)."""
    if FAST:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.log2(x)


@triton.jit
def cos_turns(t, FAST: tl.constexpr):
    """cos(2π·t) for t in turns: exact reduction r = t − rint(t) ∈ [-½, ½], then cos(2π·r)."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 n, r; cvt.rni.f32.f32 n, $1; sub.f32 r, $1, n; mul.f32 r, r, 0f40C90FDB; "
            "cos.approx.ftz.f32 $0, r; }",
            "=r,r", [t], dtype=tl.float32, is_pure=True, pack=1)
    else:
        r = t - tl.floor(t + 0.5)
        return tl.cos(6.283185307179586 * r)


@triton.jit
def cos_sin_turns(t, FAST: tl.constexpr):
    """(cos(2π·t), sin(2π·t)) for t in turns, one shared exact range reduction."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 n, r; cvt.rni.f32.f32 n, $2; sub.f32 r, $2, n; mul.f32 r, r, 0f40C90FDB; "
            "cos.approx.ftz.f32 $0, r; sin.approx.ftz.f32 $1, r; }",
            "=r,=r,r", [t], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        r = 6.283185307179586 * (t - tl.floor(t + 0.5))
        return tl.cos(r), tl.sin(r)


# ----------------------------------------------------------------------------------------------------
# Tiles and masks shared by the attention kernels
# ----------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------
# Two helper kernels both families use
# ----------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------
# Compiling a launch spec for a GPU that is not there, and reading the binary
# ----------------------------------------------------------------------------------------------------


def _tool(name: str) -> str:
    from triton.backends.nvidia import compiler as nvidia

    path = os.path.join(os.path.dirname(nvidia.__file__), "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} not found at {path}: the Triton wheel ships it under "
                                "triton/backends/nvidia/bin (reinstall triton)")
    return path


def compile_inputs(spec: LaunchSpec, arch: int) -> tuple[Any, dict, Any]:
    """(ASTSource, options dict, GPUTarget) exactly as `spec.launch()` would build them on an sm_<arch> device:
    signature, constexprs and divisibility attributes come from Triton's own argument binder over
    `spec.all_args` (planned arguments and the constexprs the kernel's heuristics derive; pointers of the planned
    tensors, which the lane allocates on the meta device, count as 16-byte aligned)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    kernel = spec.jit
    if not isinstance(kernel, JITFunction):
        raise TypeError(f"{spec.name}: {type(kernel).__name__} cannot be compiled for a GPU; unset "
                        "TRITON_INTERPRET before importing the kernels")
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(num_warps=spec.num_warps, num_stages=spec.num_stages)
    kwargs["debug"] = kernel.debug or knobs.runtime.debug
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # as JITFunction.run passes them (3.6 has one)
        if hasattr(knobs.compilation, knob):
            kwargs[knob] = getattr(knobs.compilation, knob)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    args = spec.all_args
    bound_args, specialization, _ = binder(*[args[n] for n in kernel.arg_names], **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, kwargs)
    return ASTSource(kernel, signature, constexprs, attrs), options.__dict__, target


def compile_spec(spec: LaunchSpec, arch: int) -> Any:
    """Compile one planned launch for sm_<arch> (PTX and cubin via the bundled ptxas; no GPU needed).
    Binaries are cached by Triton under TRITON_CACHE_DIR, keyed by the kernel source and options."""
    src, options, target = compile_inputs(spec, arch)
    return triton.compile(src, target=target, options=options)


@dataclass(frozen=True)
class Resources:
    """Per-thread registers, spill memory (local/stack bytes) and shared memory of one compiled kernel."""

    registers: int
    stack: int
    local: int
    shared: int  # bytes the launch requests (Triton's metadata.shared), checked against SHARED_LIMIT

    @property
    def spills(self) -> int:
        return self.stack + self.local


def _write_cubin(compiled: Any, directory: str) -> str:
    path = os.path.join(directory, f"{compiled.metadata.name}.cubin")
    with open(path, "wb") as fh:
        fh.write(compiled.asm["cubin"])
    return path


def resources(compiled: Any) -> Resources:
    """Read registers / STACK / LOCAL with the bundled `cuobjdump -res-usage`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_cubin(compiled, tmp)
        out = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"Function\s+(\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:\d+\s+LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"could not parse cuobjdump -res-usage output:\n{out}")
    return Resources(int(m.group(2)), int(m.group(3)), int(m.group(4)), int(compiled.metadata.shared))


def sass(compiled: Any) -> str:
    """SASS of the compiled kernel (bundled nvdisasm)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_cubin(compiled, tmp)
        return subprocess.run([_tool("nvdisasm"), "-c", path], capture_output=True, text=True, check=True).stdout


# ----------------------------------------------------------------------------------------------------
# Planning on every call, cheaply: what `LaunchSpec` reads once per kernel (kept at the end of the module: a JIT
# function's line number is part of Triton's cache key, so the kernels above keep theirs)
# ----------------------------------------------------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host integers: ``triton.cdiv`` without its ``constexpr_function`` call overhead (planning
    runs on every call, and decode calls are host-bound)."""
    return -(-a // b)


@dataclass(frozen=True, eq=False)
class KernelInfo:
    """What planning a launch reads of a kernel object (`kernel_info`): the JIT function under its heuristics
    wrappers, their rules (`unwrap_heuristics`), the parameter names and the constexpr parameter names; and the
    lists of planned names that passed `check_arg_names`."""

    jit: Any
    rules: dict[str, Rule]
    arg_names: tuple[str, ...]
    constexpr_names: tuple[str, ...]
    checked: set[tuple[str, ...]] = field(default_factory=set)


_KERNEL_INFO: dict[int, tuple[Any, KernelInfo]] = {}  # id(kernel) -> (kernel, info): the entry keeps its id taken


def kernel_info(kernel: Any) -> KernelInfo:
    """`KernelInfo` of a kernel, read once per kernel object (interpreter objects have no ``params``: their
    constexprs come from the Python function's annotations, which ``inspect.signature`` parses slowly)."""
    hit = _KERNEL_INFO.get(id(kernel))
    if hit is not None and hit[0] is kernel:
        return hit[1]
    jit, rules = unwrap_heuristics(kernel)
    params = getattr(jit, "params", None)
    if params is not None:
        constexpr_names = tuple(p.name for p in params if p.is_constexpr)
    else:  # interpreter objects: read the annotations of the Python function
        sig = inspect.signature(getattr(jit, "fn", jit))
        constexpr_names = tuple(n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation))
    info = KernelInfo(jit, rules, tuple(jit.arg_names), constexpr_names)
    _KERNEL_INFO[id(kernel)] = (kernel, info)
    return info


def derive_constexprs(info: KernelInfo, args: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """The constexprs the kernel's ``triton.heuristics`` rules derive from the planned `args` and the launch
    options `launch` (grid, warmup, num_warps, num_stages), as ``Heuristics.run`` evaluates them: each rule sees
    the launch's keyword arguments plus the values derived before it."""
    seen = dict(args, **launch)
    derived = {}
    for n, rule in info.rules.items():
        seen[n] = derived[n] = rule(seen)
    return derived


def check_arg_names(name: str, info: KernelInfo, args: dict[str, Any]) -> None:
    """Raise TypeError unless `args` names every kernel parameter but the derived constexprs, and nothing else
    (checked once per kernel and list of names: `KernelInfo.checked`)."""
    planned = tuple(args)
    if planned in info.checked:
        return
    missing = [n for n in info.arg_names if n not in args and n not in info.rules]
    extra = [n for n in args if n not in info.arg_names]
    if missing or extra:
        raise TypeError(f"{name}: launch arguments do not match the kernel: missing {missing}, unknown {extra}")
    derived_planned = [n for n in info.rules if n in args]
    if derived_planned:
        raise TypeError(f"{name}: {derived_planned} are derived by the kernel's triton.heuristics and must not be "
                        "planned")
    info.checked.add(planned)
