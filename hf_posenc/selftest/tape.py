"""TAPE in `hf-posenc selftest` (``TAPEConfig.selftest``; the interface: ``checks.families``): the Triton kernel
against ``tape_attention_reference`` (eq. 6–7), timed against RoPE + SDPA flash."""

from ..kernels import tape
from . import timing
from .checks import CheckCase, case_shapes

KERNELS = {"tape": lambda: (tape.tape_attention_triton, tape.tape_attention_reference)}
TIMING = ("fwd", "fwd_bwd")
LABELS = {"rope": timing.ROPE, "fused": "TAPE (Triton)"}


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
    ]


def time_unit(mode: str, length: int, batch: int, plan, dtype, device) -> dict:
    """{candidate: record} (or {"error": ...}) of `timing.bench_tape_length`, layer scope (rotation included)."""
    shape = timing.TapeBenchShape(batch=batch, heads=plan.q_heads, kv_heads=plan.kv_heads, head_dim=plan.head_dim,
                                  e_dim=plan.head_dim, scope="layer")
    return timing.bench_tape_length(shape, length, device, dtype, plan.repeats, modes=(mode,), warmup=plan.warmup,
                                    candidates=tuple(LABELS))[mode]
