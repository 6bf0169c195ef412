"""Kernels the compile lane must judge (used by tests/test_compile_lane.py, compiled in a subprocess):

* `_reads_float_global`: reads a module-level Python float inside @triton.jit. The interpreter runs it;
  every GPU compiler refuses it ("Cannot access global variable ...") — the bug that shipped in TAPA.
* `_reads_constexpr_global`: the fix, the same global wrapped in tl.constexpr; compiles.
* `_spills`: a loop-carried fp32 tile of 256 values per thread (one warp) cannot fit in 255 registers.
* `_scales_loop_state`: multiplies loop-carried fp32 state by a float argument. Triton's launcher types the
  argument fp32 and it compiles; torch.compile's Inductor types Python floats fp64, which turns the state fp64
  inside the loop and fails (the bug the TAPA and TAPE kernels had under compiled static-cache generation).
* `_scales_loop_state_fp32`: the fix, the argument cast to fp32 first (`fp32`); compiles either way.
"""

import torch
import triton
import triton.language as tl

from hf_posenc.kernels._triton.fastmath import fp32
from hf_posenc.kernels._triton.launch import LaunchSpec

HALF = 0.5
HALF_CONSTEXPR = tl.constexpr(0.5)


@triton.jit
def _reads_float_global(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs) * HALF)


@triton.jit
def _reads_constexpr_global(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs) * HALF_CONSTEXPR)


@triton.jit
def _spills(X, Y, n, ROWS: tl.constexpr, COLS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    acc = tl.zeros([ROWS, COLS], tl.float32)
    for i in range(0, n):
        acc = acc * 0.5 + tl.load(X + i * ROWS * COLS + offs).to(tl.float32)
    tl.store(Y + offs, acc)


@triton.jit
def _scales_loop_state(X, Y, scale, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n):
        acc = acc + tl.load(X + i * BLOCK + offs).to(tl.float32) * scale
    tl.store(Y + offs, acc)


@triton.jit
def _scales_loop_state_fp32(X, Y, scale, n, BLOCK: tl.constexpr):
    scale = fp32(scale)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n):
        acc = acc + tl.load(X + i * BLOCK + offs).to(tl.float32) * scale
    tl.store(Y + offs, acc)


def lane_specs(target, dtype: torch.dtype, head_dim: int) -> list[LaunchSpec]:
    x = torch.empty(4 * 64 * 128, device="meta", dtype=dtype)
    y = torch.empty(64 * 128, device="meta", dtype=torch.float32)
    return [
        LaunchSpec("reads_float_global", _reads_float_global, (1,), dict(X=x, Y=y, BLOCK=128)),
        LaunchSpec("reads_constexpr_global", _reads_constexpr_global, (1,), dict(X=x, Y=y, BLOCK=128)),
        LaunchSpec("spills", _spills, (1,), dict(X=x, Y=y, n=4, ROWS=64, COLS=128), num_warps=1),
        LaunchSpec("scales_loop_state", _scales_loop_state, (1,), dict(X=x, Y=y, scale=0.5, n=4, BLOCK=128)),
        LaunchSpec("scales_loop_state_fp32", _scales_loop_state_fp32, (1,), dict(X=x, Y=y, scale=0.5, n=4, BLOCK=128)),
    ]
