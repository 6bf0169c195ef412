"""TAPA in `hf-posenc selftest` (``TAPAConfig.selftest``; the interface: ``checks.families``): the Triton kernel
and, on CPU, the chunked path against ``tapa_attention_reference`` (eq. 12 / 16), timed against RoPE + SDPA flash."""

import functools

from ..kernels import tapa
from ..kernels.tapa import chunked
from . import timing
from .checks import CheckCase, case_shapes

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
    """{candidate: record} of `timing.bench_decode` or `timing.bench_prefill`, GQA as in the plan."""
    group = plan.q_heads // plan.kv_heads
    if mode == "decode":
        return timing.bench_decode(batch, plan.q_heads, length, plan.head_dim, dtype, device, plan.repeats, group,
                                   warmup=plan.warmup)["results"]
    return timing.bench_prefill(batch, plan.q_heads, length, plan.head_dim, mode, dtype, device, plan.repeats,
                                group, candidates=tuple(LABELS), warmup=plan.warmup)["results"]
