"""TAPA's kernels in `hf-posenc selftest` (``TAPAConfig.selftest``; the interface: ``selftest.checks.families``): the
Triton kernel and, on CPU, the chunked path against ``tapa_attention_reference`` (eq. 12 / 16), and the timing of
prefill and decode against RoPE + SDPA flash (also behind `benchmarks/tapa_attention.py`)."""

from __future__ import annotations

import functools
from typing import Callable

import torch

from .. import tapa, timing
from ..checks import CheckCase, case_shapes
from ..timing import (
    apply_rope, causal_flops, peak_memory, rope_tables, sdpa_flash, time_interleaved,
)
from . import chunked

CHUNKED_BLOCK = 16  # small blocks for the chunked CPU path, so small shapes still cross several
KERNELS = {  # the chunked CPU path is checked on CPU only
    "tapa": lambda: (tapa.tapa_attention_triton, tapa.tapa_attention_reference),
    "tapa_chunked": lambda: (functools.partial(chunked.tapa_attention_chunked, block_q=CHUNKED_BLOCK,
                                               block_k=CHUNKED_BLOCK), tapa.tapa_attention_reference),
}
TIMING = ("fwd", "fwd_bwd", "decode")
LABELS = {"tapa_kernel": "TAPA (Triton)", "sdpa_flash_rope": timing.ROPE}


def cases(s, dtype: str, device) -> list[CheckCase]:
    """Causal GQA at every head dim, non-causal with non-default α/θ, key padding, packed segments, sliding window,
    linear phase (eq. 16), chunked prefill (Lq < Lk) with backward, and decode (Lq = 1, and Lq = 4 with padding and
    a window); for the Triton kernel also its deterministic two-kernel backward at every head dim."""
    prefill, prefill0, chunk0, decode0 = case_shapes(s, dtype, positions=True)
    out: list[CheckCase] = []
    for kernel in KERNELS if device.type == "cpu" else ["tapa"]:
        out += [CheckCase(kernel, "causal-gqa", head_dim=d, **prefill) for d in s.head_dims] + [
            CheckCase(kernel, "noncausal-alpha0.5-theta0.25",
                      options=(("causal", False), ("alpha", 0.5), ("theta", 0.25)), **prefill0),
            CheckCase(kernel, "key-padding", masking="padding", **prefill0),
            CheckCase(kernel, "packed-segments", masking="segments", **prefill0),
            CheckCase(kernel, "sliding-window", options=(("sliding_window", s.window),), **prefill0),
            CheckCase(kernel, "linear-phase", options=(("phase", "linear"),), **prefill0),
            CheckCase(kernel, "chunked-prefill", **chunk0),
            CheckCase(kernel, "decode", q_len=1, **decode0),
            CheckCase(kernel, "decode-padded-window", q_len=4, masking="padding",
                      options=(("sliding_window", s.window),), **decode0),
        ]
        if kernel == "tapa":  # the two-kernel backward (the fused one, with atomic dQ, is the default on Hopper)
            out += [CheckCase(kernel, f"deterministic-backward-d{d}", head_dim=d,
                              options=(("deterministic", True),), **prefill) for d in s.head_dims]
    return out


def time_unit(mode: str, length: int, batch: int, plan, dtype, device) -> dict:
    """{candidate: record} of :func:`bench_decode` or :func:`bench_prefill`, GQA as in the plan."""
    group = plan.q_heads // plan.kv_heads
    if mode == "decode":
        return bench_decode(batch, plan.q_heads, length, plan.head_dim, dtype, device, plan.repeats, group,
                                   warmup=plan.warmup)["results"]
    return bench_prefill(batch, plan.q_heads, length, plan.head_dim, mode, dtype, device, plan.repeats,
                                group, candidates=tuple(LABELS), warmup=plan.warmup)["results"]


# Timing (paper eq. 12): fused kernel vs eager reference vs RoPE + SDPA flash

TAPA_CANDIDATES = ("tapa_kernel", "sdpa_flash_rope", "tapa_eager")


def make_runner(kind: str, mode: str, q, k, v, rope) -> Callable[[], object]:
    """A closure running one TAPA-benchmark candidate once (forward only, or forward + backward)."""
    cos, sin = rope

    def forward():
        if kind == "tapa_kernel":
            return tapa.tapa_attention_triton(q, k, v)
        if kind == "tapa_eager":
            return tapa.tapa_attention_reference(q, k, v)
        if kind == "sdpa_flash_rope":
            return sdpa_flash(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=q.shape[2] > 1)
        raise ValueError(f"unknown TAPA benchmark candidate {kind!r}; pick from {TAPA_CANDIDATES}")

    if mode == "fwd":
        def run():
            with torch.no_grad():
                return forward()
        return run

    def run_bwd():
        out = forward()
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return run_bwd


def eager_fits(B: int, H: int, L: int, mode: str, device: torch.device) -> tuple[bool, str]:
    """The eager reference materialises several fp32 [B, H, L, L] tensors; (False, why) when they cannot fit."""
    need = B * H * L * L * 4 * (8 if mode == "fwd" else 16)
    if device.type != "cuda":
        return True, ""
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.8 * free:
        return False, f"needs ~{need / 2**30:.1f} GiB of [B,H,L,L] fp32 temporaries, {free / 2**30:.1f} GiB free"
    return True, ""


def bench_prefill(B, H, L, D, mode, dtype, device, repeats, group=1, candidates=TAPA_CANDIDATES,
                  warmup: int = 2) -> dict:
    """TAPA prefill (Lq = Lk = L, causal): median ms, TFLOP/s and peak memory per candidate, and the ratios
    kernel/SDPA and eager/kernel (time)."""
    g = torch.Generator(device=device).manual_seed(L + D)
    grad = mode == "fwd_bwd"
    q = torch.randn(B, H, L, D, device=device, dtype=dtype, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H // group, L, D, device=device, dtype=dtype, generator=g).requires_grad_(grad)
            for _ in range(2))
    rope = rope_tables(L, D, device, dtype)
    kinds = list(candidates)
    skipped = {}
    if "tapa_eager" in kinds:
        ok, why = eager_fits(B, H, L, mode, device)
        if not ok:
            kinds.remove("tapa_eager")
            skipped["tapa_eager"] = why
    runners = {kname: make_runner(kname, mode, q, k, v, rope) for kname in kinds}
    medians, _ = time_interleaved(runners, device, repeats, warmup)
    flops = causal_flops(B, H, L, D, mode)
    rows = {kname: {"median_ms": t * 1e3, "tflops": flops / t / 1e12,
                    "peak_mem_bytes": peak_memory(runners[kname], device)} for kname, t in medians.items()}
    rows.update({kname: {"skipped": why} for kname, why in skipped.items()})
    ratios = {}
    if "tapa_kernel" in medians and "sdpa_flash_rope" in medians:
        ratios["kernel_over_sdpa"] = medians["tapa_kernel"] / medians["sdpa_flash_rope"]
    if "tapa_eager" in medians and "tapa_kernel" in medians:
        ratios["eager_over_kernel"] = medians["tapa_eager"] / medians["tapa_kernel"]
    return {"B": B, "H": H, "Hkv": H // group, "L": L, "D": D, "mode": mode, "results": rows, "ratios": ratios}


def bench_decode(B, H, L, D, dtype, device, repeats, group=1, warmup: int = 2) -> dict:
    """TAPA decode (one query against an L-token cache): tokens/s of the kernel vs RoPE + SDPA flash (the
    RoPE cache holds rotated keys, so only the new query is rotated per step)."""
    g = torch.Generator(device=device).manual_seed(7 * L + D)
    q = torch.randn(B, H, 1, D, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, H // group, L, D, device=device, dtype=dtype, generator=g) for _ in range(2))
    rope = rope_tables(L, D, device, dtype)
    cos1, sin1 = rope[0][-1:], rope[1][-1:]
    kr = apply_rope(k, *rope)
    runners = {
        "tapa_kernel": lambda: tapa.tapa_attention_triton(q, k, v),
        "sdpa_flash_rope": lambda: sdpa_flash(apply_rope(q, cos1, sin1), kr, v, causal=False),
    }
    with torch.no_grad():
        medians, _ = time_interleaved(runners, device, repeats, warmup)
        mems = {n: peak_memory(fn, device) for n, fn in runners.items()}
    rows = {n: {"median_ms": t * 1e3, "tokens_per_s": B / t, "peak_mem_bytes": mems[n]} for n, t in medians.items()}
    return {"B": B, "H": H, "Hkv": H // group, "L": L, "D": D, "mode": "decode", "results": rows,
            "ratios": {"kernel_over_sdpa": medians["tapa_kernel"] / medians["sdpa_flash_rope"]}}
