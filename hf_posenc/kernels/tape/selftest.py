"""TAPE's kernel in `hf-posenc selftest` (``TAPEConfig.selftest``; the interface: ``selftest.checks.families``): the
Triton kernel against ``tape_attention_reference`` (eq. 6–7), and its timing against RoPE + SDPA flash (also behind
`benchmarks/tape_attention.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import tape, timing
from ..checks import CheckCase, case_shapes
from ..timing import MODES, apply_rope, causal_flops, peak_memory, rope_tables, sdpa_flash, time_interleaved

KERNELS = {"tape": lambda: (tape.tape_attention_triton, tape.tape_attention_reference)}
TIMING = ("fwd", "fwd_bwd")
LABELS = {"rope": timing.ROPE, "fused": "TAPE (Triton)", "deterministic": "TAPE (Triton, deterministic backward)"}


def cases(s, dtype: str, device) -> list[CheckCase]:
    """Causal GQA at every head dim, De ≠ D with a custom scale, non-causal, key padding, chunked prefill, decode."""
    prefill, prefill0, chunk0, decode0 = case_shapes(s, dtype)
    d0 = s.head_dims[0]
    return [CheckCase("tape", "causal-gqa", head_dim=d, e_dim=d, **prefill) for d in s.head_dims] + [
        CheckCase("tape", "e-width-scale", e_dim=max(2, d0 // 2), options=(("scale", 0.3),), **prefill0),
        CheckCase("tape", "noncausal", e_dim=d0, options=(("causal", False),), **prefill0),
        CheckCase("tape", "key-padding", e_dim=d0, masking="padding", **prefill0),
        CheckCase("tape", "chunked-prefill", e_dim=d0, **chunk0),
        CheckCase("tape", "decode", e_dim=d0, q_len=1, **decode0),
        CheckCase("tape", "decode-padded", e_dim=d0, q_len=4, masking="padding", **decode0),
    ] + [CheckCase("tape", f"deterministic-backward-d{d}", head_dim=d, e_dim=d, options=(("deterministic", True),),
                   **prefill) for d in s.head_dims]  # the two-kernel backward (fused, atomic dq: the default)


def time_unit(mode: str, length: int, batch: int, plan, dtype, device) -> dict:
    """{candidate: record} (or {"error": ...}) of :func:`bench_tape_length`, layer scope (rotation included)."""
    shape = TapeBenchShape(batch=batch, heads=plan.q_heads, kv_heads=plan.kv_heads, head_dim=plan.head_dim,
                                  e_dim=plan.head_dim, scope="layer")
    return bench_tape_length(shape, length, device, dtype, plan.repeats, modes=(mode,), warmup=plan.warmup,
                                    candidates=tuple(LABELS))[mode]


# Timing (paper eq. 6–7): fused kernel vs SDPA fold vs eager reference vs RoPE + SDPA flash

TAPE_CANDIDATES = ("rope", "fused", "deterministic", "sdpa_fold", "reference")
BACKWARD_ONLY = ("deterministic",)  # candidates that differ from "fused" only in the backward
TAPE_TARGET_RATIO = 1.3  # fused TAPE within 1.3× of RoPE attention


@dataclass(frozen=True)
class TapeBenchShape:
    """Shapes and scope of one TAPE benchmark. scope "layer" times the q/k rotation plus the attention core
    (needs e_dim == head_dim: q/k are rotated by E), "op" the attention core alone on pre-rotated q/k."""

    batch: int = 1
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    e_dim: int = 128
    scope: str = "layer"
    reference_max: int = 4096  # longest length for the eager reference (it materialises L×L in fp32)

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (complex pairs)")
        if self.scope not in ("layer", "op"):
            raise ValueError(f"scope must be 'layer' or 'op', got {self.scope!r}")
        if self.scope == "layer" and self.e_dim != self.head_dim:
            raise ValueError("scope 'layer' rotates q/k by E, which needs e_dim == head_dim (De = 2F, F = D/2)")


def tape_rotate(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Multiply each frequency pair of x [B, H, L, D] by the complex positional state e [B, Hkv, L, D]
    (re = e[..., :F], im = e[..., F:]), broadcast over the query heads of a GQA group (eq. 6, φ = id)."""
    b, h, length, d = x.shape
    hkv = e.shape[1]
    xs = x.view(b, hkv, h // hkv, length, d)
    f = d // 2
    re, im = e[..., :f].unsqueeze(2), e[..., f:].unsqueeze(2)
    x1, x2 = xs[..., :f], xs[..., f:]
    out = torch.cat([x1 * re - x2 * im, x1 * im + x2 * re], dim=-1)
    return out.view(b, h, length, d)


def build_tape_cases(shape: TapeBenchShape, length: int, device: torch.device, dtype: torch.dtype, backward: bool,
                     candidates=TAPE_CANDIDATES) -> dict[str, Callable[[], None]]:
    """{candidate: callable} running forward (and backward when asked) on fresh tensors of this length; the
    eager reference only up to shape.reference_max."""
    B, H, Hkv, D, De = shape.batch, shape.heads, shape.kv_heads, shape.head_dim, shape.e_dim
    gen = dict(device=device, dtype=dtype, requires_grad=backward)
    q = torch.randn(B, H, length, D, **gen)
    k, v = (torch.randn(B, Hkv, length, D, **gen) for _ in range(2))
    cos32, sin32 = rope_tables(length, D, device, torch.float32, theta=10_000.0)
    cos, sin = cos32.to(dtype), sin32.to(dtype)
    # positional state: RoPE-initialised (Appendix B) and perturbed per head, as after a TAPE update
    if De == D:
        e0 = torch.cat([cos32[:, : D // 2], sin32[:, : D // 2]], -1).expand(B, Hkv, length, De)
    else:  # scope "op" with a free positional width: no rotation, any state will do
        e0 = torch.zeros(B, Hkv, length, De, device=device)
    e = (e0 + 0.1 * torch.randn(B, Hkv, length, De, device=device)).to(dtype).requires_grad_(backward)
    go = torch.randn(B, H, length, D, device=device, dtype=dtype)
    ge = torch.randn(B, H, length, De, device=device, dtype=dtype)
    layer = shape.scope == "layer"

    def rope():
        qq, kk = (apply_rope(q, cos, sin), apply_rope(k, cos, sin)) if layer else (q, k)
        o = sdpa_flash(qq, kk, v, causal=True)
        if backward:
            torch.autograd.backward([o], [go])

    def run_tape(name: str, **options) -> Callable[[], None]:
        def run():
            fn = getattr(tape, name)  # looked up per call, so a patched kernel is the one timed
            qq, kk = (tape_rotate(q, e), tape_rotate(k, e)) if layer else (q, k)
            o, eo = fn(qq, kk, v, e, causal=True, **options)
            if backward:
                torch.autograd.backward([o, eo], [go, ge])
        return run

    every = {"rope": rope, "fused": run_tape("tape_attention_triton"),
             "deterministic": run_tape("tape_attention_triton", deterministic=True),
             "sdpa_fold": run_tape("tape_attention_sdpa"), "reference": run_tape("tape_attention_reference")}
    unknown = set(candidates) - set(every)
    if unknown:
        raise ValueError(f"unknown TAPE benchmark candidates {sorted(unknown)}; pick from {TAPE_CANDIDATES}")
    cases = {n: every[n] for n in candidates if backward or n not in BACKWARD_ONLY}
    if length > shape.reference_max:
        cases.pop("reference", None)
    return cases


def bench_tape_length(shape: TapeBenchShape, length: int, device: torch.device, dtype: torch.dtype, repeats: int,
                      modes=MODES, warmup: int = 3, candidates=TAPE_CANDIDATES) -> dict:
    """One length, causal Lq = Lk: per mode {candidate: median_ms, ratio_vs_rope, tflops, peak_mem_bytes}
    and whether fused meets the 1.3× target. Out-of-memory is recorded in the row as {"error": ...}."""
    row: dict = {"length": length}
    for mode in modes:
        backward = mode == "fwd_bwd"
        cases = build_tape_cases(shape, length, device, dtype, backward, candidates)
        grad_ctx = torch.enable_grad() if backward else torch.inference_mode()
        try:
            with grad_ctx:
                medians, _ = time_interleaved(cases, device, repeats, warmup=warmup)
                mems = {n: peak_memory(fn, device) for n, fn in cases.items()}
        except torch.cuda.OutOfMemoryError as exc:  # recorded in the JSON, not hidden
            row[mode] = {"error": f"out of memory: {exc}".splitlines()[0]}
            continue
        finally:
            del cases
            if device.type == "cuda":
                torch.cuda.empty_cache()
        base = medians.get("rope")
        entry: dict = {}
        for name, t in medians.items():
            width = shape.head_dim if name == "rope" else shape.head_dim + shape.e_dim  # P·V (and P·E)
            flops = causal_flops(shape.batch, shape.heads, length, shape.head_dim, mode, value_dim=width)
            entry[name] = {"median_ms": t * 1e3, "ratio_vs_rope": None if base is None else t / base,
                           "tflops": flops / t / 1e12, "peak_mem_bytes": mems[name]}
        if base is not None and "fused" in medians:
            entry["fused_meets_target"] = medians["fused"] / base <= TAPE_TARGET_RATIO
        row[mode] = entry
    return row
