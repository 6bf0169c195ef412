"""TAPA (token-aware phase attention, paper eq. 12; linear-phase ablation eq. 16) attention op.

`tapa_attention` dispatches (``dispatch.py``, the one dispatcher, which the scheme's backends use too) to the fused
Triton kernel when the inputs live on CUDA or when TRITON_INTERPRET=1 is set (CPU tests), to the chunked
flash-style PyTorch path on CPU (O(N) memory, exact recomputing backward), and to the eager reference otherwise.
The reference (`tapa_attention_reference`, ``naive.py``) is the specification the other two are tested against;
each path can also be called directly. All take (options and their checks: ``args.py``)

    tapa_attention(q, k, v, *, alpha=0.1, theta=0.5, phase="quadratic", causal=True,
                   q_positions=None, k_positions=None, key_padding_mask=None,
                   q_segment_ids=None, k_segment_ids=None, sliding_window=None) -> out

with q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D] (Hq % Hkv == 0, Lq <= Lk, queries = last Lq keys).
sliding_window=W (int >= 1) is Transformers' sliding-window causal mask: query i (key index
i + Lk − Lq) sees key j only if i + Lk − Lq − j < W.

Triton is optional (``pip install hf-posenc[triton]``); without it the CPU paths work and
`tapa_attention_triton` raises an ImportError that says so.
"""

from __future__ import annotations

from ..optional import needs_triton, triton_missing
from .args import TapaArgs, tapa_op, tapa_split, validate_tapa_args
from .chunked import tapa_attention_chunked
from .naive import tapa_attention_reference

try:
    from .triton_tapa import tapa_attention_triton

    TRITON_IMPORT_ERROR: ImportError | None = None
except ModuleNotFoundError as exc:  # only a missing Triton package; any other import error propagates
    TRITON_IMPORT_ERROR = triton_missing(exc)
    tapa_attention_triton = needs_triton("tapa_attention_triton",
                                         "tapa_attention_chunked / tapa_attention_reference", exc)

# after the Triton entry point: the dispatcher takes it from this package
from .dispatch import BACKENDS, tapa_attention, tapa_function, uses_triton  # noqa: E402

LANE_FAMILIES = ("hf_posenc.kernels.tapa.triton_tapa",)  # what the compile lane compiles (compile_lane.FAMILIES)
__all__ = [
    "BACKENDS",
    "tapa_attention",
    "tapa_attention_chunked",
    "tapa_attention_reference",
    "tapa_attention_triton",
    "tapa_function",
    "tapa_split",
    "validate_tapa_args",
    "uses_triton",
]
