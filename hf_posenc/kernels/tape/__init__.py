"""TAPE attention op (paper §3.2, eq. 6–7): one softmax P mixes the values and the positional states.

    tape_attention(q, k, v, e, *, scale=None, causal=True, key_padding_mask=None) -> (o, e_out)

q [B, Hq, Lq, D]; k, v [B, Hkv, Lk, D]; e [B, Hkv, Lk, De] (positional channels, per KV head);
o = P·V [B, Hq, Lq, D]; e_out = P·E [B, Hq, Lq, De]. Hq % Hkv == 0, Lq <= Lk with the queries at the
last Lq positions (causal: key j visible to query i iff j <= i + Lk − Lq), key_padding_mask [B, Lk]
bool with True = attend, scale defaults to D ** -0.5; rows with no visible key return zeros.

`tape_attention` runs the fused Triton kernel when the inputs live on CUDA or TRITON_INTERPRET=1 is set
(CPU tests), and the eager reference otherwise (and for float64 inputs, which the kernel does not take, or
without Triton installed: then `tape_attention_triton` raises an ImportError that says how to install it).
The variants are exported too: `tape_attention_reference` (the specification), `tape_attention_sdpa`
(E folded into extra value channels of one SDPA call) and `tape_attention_triton`.
"""

from __future__ import annotations

import os

import torch

from ..optional import needs_triton, triton_missing
from .args import TapeArgs, tape_op, validate_tape_args
from .naive import tape_attention_reference
from .sdpa import tape_attention_sdpa

try:
    from .triton_tape import tape_attention_triton

    TRITON_IMPORT_ERROR: ImportError | None = None
except ModuleNotFoundError as exc:  # only a missing Triton package; any other import error propagates
    TRITON_IMPORT_ERROR = triton_missing(exc)
    tape_attention_triton = needs_triton("tape_attention_triton", "tape_attention_reference", exc)

LANE_FAMILIES = ("hf_posenc.kernels.tape.triton_tape",)  # what the compile lane compiles (compile_lane.FAMILIES)
__all__ = [
    "TapeArgs",
    "tape_attention",
    "tape_attention_reference",
    "tape_attention_sdpa",
    "tape_attention_triton",
    "uses_triton",
    "validate_tape_args",
]


def uses_triton(q: torch.Tensor) -> bool:
    """True when `tape_attention` would run the Triton kernel for this query tensor."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    return TRITON_IMPORT_ERROR is None and (q.device.type == "cuda" or interpret) and q.dtype != torch.float64


@tape_op
def tape_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, args: TapeArgs
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """TAPE attention (eq. 6–7): (P·V, P·E) with one shared softmax. Triton on CUDA / interpreter, reference otherwise.
    Options: :func:`validate_tape_args`."""
    fn = tape_attention_triton if uses_triton(q) else tape_attention_reference
    return fn.with_args(q, k, v, e, args)
