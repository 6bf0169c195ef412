"""The math the kernels share, on the special-function unit.

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
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


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
