"""Every fast kernel against its readable reference, on fresh random inputs: the shared machinery. Each scheme
names the module with its cases and kernels, in its kernel package (``SchemeConfig.selftest``, :func:`families`:
``kernels/tapa/selftest.py``, ``kernels/tape/selftest.py``), built on :mod:`hf_posenc.kernels.checks` and
:mod:`hf_posenc.kernels.timing`.

Each case runs the fast path (a Triton kernel; on CPU also a CPU path such as TAPA's chunked one) in the case's
dtype, and the reference (`tapa_attention_reference`, TAPA paper eq. 12 / 16; `tape_attention_reference`,
TAPE paper eq. 6–7) in float64 on the SAME input values, so the measured error is the fast path's alone.
Forward outputs and, for backward cases, every input gradient are compared.

Error measure, per output tensor: the largest row-relative error

    max over rows i of ‖x_i − r_i‖ / (‖r_i‖ + f·rms_i ‖r_i‖)

(rows are query rows for outputs and dq, key rows for dk/dv/de). Attention outputs shrink like 1/√(keys
seen), so an absolute tolerance is either loose for long rows or tight for short ones; the row-relative
error is scale-free. The floor f keeps rows whose reference is exactly zero (fully masked queries, padded
keys) strict: any non-zero value there fails. Outputs use f = 0.05. Gradients use f = 1: a flash-style
backward forms Δ = rowsum(dO∘O) from the output rounded to the input dtype, which leaves an absolute error
of the size of a typical row in rows whose exact gradient nearly cancels (a query seeing one key has dq = 0).

Tolerances per dtype, for outputs (TOLERANCES) and for input gradients (GRADIENT_TOLERANCES), sit above what
rounding alone costs, measured by emulating in float64 a kernel that rounds P, Δ's O and dS to the input dtype
before the products and rounds its outputs. Outputs, at L = 1024, D = 128, causal TAPA: bf16 2e-3, fp16 2.5e-4
(10× and 20× below their tolerances). Gradients are dominated by Δ = rowsum(dO∘O) formed from the outputs
rounded to the input dtype (every flash-style backward does; TAPE sums it over O and Ẽ): in causal rows that see
few keys dq nearly cancels and keeps that rounding whole. Emulated for TAPE's realistic cases
(tests/test_selftest.py::test_gradient_tolerance_covers_the_rounding_of_delta): dq up to 2.2e-2 in bf16 and
2.3e-3 in fp16 (key padding), and an H200 measured 1.9e-2 and 2.6e-3 -- so bf16 gradients need 5e-2, not the
outputs' 2e-2 (which the emulated key-padding case exceeds), and fp16 gradients 1e-2. fp32 (exact "ieee" dots):
below 5e-5, except where TAPA's phase argument c_P·d^α·p spans hundreds of turns (non-causal, α = 0.5, 1024
keys: its fp32 rounding moves the cosine), where the readable reference evaluated in fp32 is itself 1.2e-4
(output) / 3.6e-4 (dq) off float64, and an H200 measured 1.4e-4 / 4.2e-4.
"""

from __future__ import annotations

import importlib
import time
import traceback
import zlib
from dataclasses import dataclass, field

import torch

from ..kernels.checks import CheckCase, CheckShapes, case_shapes

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCES = {"fp32": 2e-3, "fp16": 5e-3, "bf16": 2e-2}  # outputs
GRADIENT_TOLERANCES = {"fp32": 2e-3, "fp16": 1e-2, "bf16": 5e-2}  # input gradients (module docstring)
GRADIENTS = ("dq", "dk", "dv", "de")  # the names of input gradients in CheckResult.errors
OUTPUT_FLOOR = 0.05  # f of the row-relative error for outputs
GRADIENT_FLOOR = 1.0  # ... and for input gradients


SHAPES = {
    "realistic": CheckShapes(batch=2, q_heads=8, kv_heads=2, length=1024, head_dims=(128, 64), decode_length=4096,
                             window=256, chunk=256),
    "small": CheckShapes(batch=2, q_heads=4, kv_heads=2, length=48, head_dims=(32, 64), decode_length=80,
                         window=16, chunk=16),
    "tiny": CheckShapes(batch=1, q_heads=2, kv_heads=1, length=20, head_dims=(16,), decode_length=40,
                        window=6, chunk=8),
}


@dataclass
class CheckResult:
    """Outcome of one case: errors per tensor (row-relative, see the module docstring) against `tolerance`
    (outputs) and `gradient_tolerance` (input gradients, backward cases); `message` says what failed (the tensor
    over its tolerance, or the exception a kernel raised)."""

    name: str
    kernel: str
    dtype: str
    shape: dict
    options: dict
    masking: str
    backward: bool
    passed: bool
    tolerance: float
    errors: dict[str, float] = field(default_factory=dict)
    message: str | None = None
    traceback: str | None = None
    seconds: float = 0.0
    gradient_tolerance: float | None = None

    def tolerance_of(self, tensor: str) -> float:
        """The tolerance `errors[tensor]` is held to (reports written before gradients had their own: `tolerance`)."""
        gradient = tensor in GRADIENTS and self.gradient_tolerance is not None
        return self.gradient_tolerance if gradient else self.tolerance


def families() -> list:
    """The selftest modules the registered schemes name (``SchemeConfig.selftest``), in registration order (imported
    here: they import their kernels). Each has ``KERNELS`` ({kernel: () -> (fast path, reference)}, looked up as a
    case runs; a check name starts with the kernel, timing rows carry the first), ``cases(shapes, dtype, device) ->
    [CheckCase]``, ``TIMING`` (the modes it times), ``LABELS`` ({candidate: report label}, in timing order, RoPE's
    ``kernels.timing.ROPE``) and ``time_unit(mode, length, batch, plan, dtype, device) -> {candidate: record}``."""
    from ..schemes import SCHEMES

    return [importlib.import_module(m) for m in dict.fromkeys(s.selftest for s in SCHEMES.values() if s.selftest)]


def build_cases(shapes: CheckShapes, dtypes: tuple[str, ...], device: torch.device) -> list[CheckCase]:
    """Every family's cases, dtype by dtype, for the fast paths that run on ``device`` (the CPU has paths of its
    own). ``dtypes`` are keys of DTYPES (checked by ``run_selftest``)."""
    return [c for dt in dtypes for family in families() for c in family.cases(shapes, dt, device)]


# -- Inputs ---------------------------------------------------------------------------------------------------


def _left_padding(batch: int, k_len: int) -> torch.Tensor:
    """Bool [B, Lk], True = real token: row b is left-padded by b·Lk/(2B) tokens (row 0 by Lk/4 when B = 1)."""
    mask = torch.ones(batch, k_len, dtype=torch.bool)
    for b in range(batch):
        pad = (b * k_len) // (2 * batch) if batch > 1 else k_len // 4
        mask[b, :pad] = False
    return mask


def _segments(batch: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed documents: segment ids [B, Lk] (three documents per row, cut differently per row) and
    positions restarting at 0 in each document."""
    seg = torch.zeros(batch, k_len, dtype=torch.long)
    pos = torch.zeros(batch, k_len, dtype=torch.long)
    for b in range(batch):
        cuts = [0, max(1, k_len // (3 + b)), max(2, (2 * k_len) // 3 - b), k_len]
        for s_id, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
            seg[b, lo:hi] = s_id
            pos[b, lo:hi] = torch.arange(hi - lo)
    return seg, pos


def _inputs(case: CheckCase, gen: torch.Generator) -> tuple[list[torch.Tensor], dict]:
    """Float32 CPU tensors (q, k, v[, e]) and the masking keyword arguments, on CPU."""
    B, Hq, Hkv, Lq, Lk, D = case.batch, case.q_heads, case.kv_heads, case.q_len, case.k_len, case.head_dim
    tensors = [torch.randn(B, Hq, Lq, D, generator=gen), torch.randn(B, Hkv, Lk, D, generator=gen),
               torch.randn(B, Hkv, Lk, D, generator=gen)]
    if case.e_dim:
        tensors.append(torch.randn(B, Hkv, Lk, case.e_dim, generator=gen))
    extra: dict = {}
    if case.masking == "padding":
        mask = _left_padding(B, Lk)
        extra["key_padding_mask"] = mask
        if case.positions:
            k_pos = (mask.long().cumsum(-1) - 1).clamp_min(0)
            extra.update(k_positions=k_pos, q_positions=k_pos[:, Lk - Lq:])
    elif case.masking == "segments":
        seg, pos = _segments(B, Lk)
        extra.update(k_segment_ids=seg, q_segment_ids=seg[:, Lk - Lq:], k_positions=pos, q_positions=pos[:, Lk - Lq:])
    return tensors, extra


# -- Running one case -----------------------------------------------------------------------------------------


def row_relative_error(x: torch.Tensor, ref: torch.Tensor, floor: float) -> float:
    """max_i ‖x_i − r_i‖ / (‖r_i‖ + floor·rms_i ‖r_i‖) over the rows (last dim) of float64 tensors;
    inf if x has a non-finite entry."""
    if not torch.isfinite(x).all():
        return float("inf")
    diff = (x - ref).flatten(0, -2).norm(dim=-1)
    norms = ref.flatten(0, -2).norm(dim=-1)
    eps = max(floor * norms.pow(2).mean().sqrt().item(), 1e-30)
    return (diff / (norms + eps)).max().item()


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def run_case(case: CheckCase, device: torch.device) -> CheckResult:
    """Run one case on `device`; an exception from a kernel (compile error, launch failure, ...) makes the
    case fail with its type and message recorded, and the remaining cases still run."""
    result = CheckResult(case.name, case.kernel, case.dtype, case.describe(), dict(case.options), case.masking,
                         case.backward, passed=False, tolerance=TOLERANCES[case.dtype],
                         gradient_tolerance=GRADIENT_TOLERANCES[case.dtype] if case.backward else None)
    start = time.perf_counter()
    try:
        result.errors = _compare(case, device)
        bad = {k: v for k, v in result.errors.items() if not v <= result.tolerance_of(k)}
        result.passed = not bad
        if bad:
            result.message = "; ".join(f"{k}: row-relative error {v:.3g} > tolerance {result.tolerance_of(k):g}"
                                       for k, v in bad.items())
    except Exception as exc:  # noqa: BLE001 -- reported as this case's failure, with the traceback in the JSON
        result.message = f"{type(exc).__name__}: {exc}".strip()[:2000]
        result.traceback = traceback.format_exc()
    result.seconds = time.perf_counter() - start
    return result


FAST_PATH_ONLY = frozenset({"deterministic"})  # options of the kernel's execution, not of the maths


def _compare(case: CheckCase, device: torch.device) -> dict[str, float]:
    fast, reference = {k: lookup for f in families() for k, lookup in f.KERNELS.items()}[case.kernel]()
    dtype = DTYPES[case.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    base, extra = _inputs(case, gen)
    extra = {k: v.to(device) for k, v in extra.items()}
    kwargs = {**dict(case.options), **extra}
    ref_kwargs = {k: v for k, v in kwargs.items() if k not in FAST_PATH_ONLY}
    xs = [t.to(device=device, dtype=dtype).requires_grad_(case.backward) for t in base]
    refs = [t.detach().to(device=device, dtype=torch.float64).requires_grad_(case.backward) for t in xs]

    outs = _as_tuple(fast(*xs, **kwargs))
    ref_outs = _as_tuple(reference(*refs, **ref_kwargs))
    out_names = ("out",) if len(ref_outs) == 1 else ("o", "e_out")
    if len(outs) != len(ref_outs):
        raise AssertionError(f"the fast path returned {len(outs)} outputs, the reference {len(ref_outs)}")
    errors = {}
    for name, o, r in zip(out_names, outs, ref_outs):
        if o.shape != r.shape or o.dtype != dtype:
            raise AssertionError(f"{name}: got {o.dtype} {list(o.shape)}, expected {dtype} {list(r.shape)}")
        errors[name] = row_relative_error(o.detach().double(), r.detach(), OUTPUT_FLOOR)
    if case.backward:
        cots = [torch.randn(r.shape, generator=gen).to(device=device, dtype=dtype) for r in ref_outs]
        grads = torch.autograd.grad(outs, xs, cots)
        ref_grads = torch.autograd.grad(ref_outs, refs, [c.double() for c in cots])
        for name, g, r in zip(GRADIENTS, grads, ref_grads):
            if g.dtype != dtype:
                raise AssertionError(f"{name}: got {g.dtype}, expected {dtype} like the inputs")
            errors[name] = row_relative_error(g.double(), r, GRADIENT_FLOOR)
    return errors
