"""The one TAPA dispatcher: which implementation runs a call, for the op (`tapa_attention`) and for the scheme's
configured backend (`tapa_function`).

``auto`` runs the fused Triton kernel when the inputs live on CUDA or when TRITON_INTERPRET=1 is set (CPU tests;
not for float64, which the kernel does not take), the chunked flash-style PyTorch path on CPU (O(N) memory, exact
recomputing backward), and the eager reference otherwise.

A checkpoint's remote code carries this module with the reference and the chunked path, not the Triton kernels: the
kernel comes from the installed kernel package (``kernels.tapa``), imported inside ``try``. Where that package, or
Triton, is missing, ``auto`` runs the chunked path on CPU and the reference elsewhere, and the Triton entry point
raises an ImportError that says how to install it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from ..optional import needs_triton
from .args import TapaArgs, tapa_op
from .chunked import tapa_attention_chunked
from .naive import tapa_attention_reference

try:  # the installed kernel package (imports the Triton kernel when Triton is there); not in remote code
    from . import TRITON_IMPORT_ERROR, tapa_attention_triton
except ImportError as exc:  # remote code where hf-posenc is not installed
    TRITON_IMPORT_ERROR = exc
    tapa_attention_triton = needs_triton("tapa_attention_triton", "tapa_attention_chunked / tapa_attention_reference",
                                         exc, missing="hf-posenc (its Triton kernels are not in the remote code)")

BACKENDS = ("auto", "triton", "chunked", "reference")  # TAPAConfig.backend: `tapa_function`


def uses_triton(q: torch.Tensor) -> bool:
    """True when `tapa_attention` would run the Triton kernel for this query tensor."""
    return TRITON_IMPORT_ERROR is None and (q.device.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1")


@tapa_op
def tapa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: TapaArgs) -> torch.Tensor:
    """TAPA attention (eq. 12, or eq. 16 with phase="linear"): Triton kernel on CUDA / under the interpreter
    (not for float64, which the kernel does not take), the chunked path on CPU, the eager reference on other
    devices. Options: :func:`~hf_posenc.kernels.tapa.args.validate_tapa_args`."""
    if uses_triton(q) and q.dtype != torch.float64:
        return tapa_attention_triton.with_args(q, k, v, args)
    if q.device.type == "cpu":
        return tapa_attention_chunked.with_args(q, k, v, args)
    return tapa_attention_reference.with_args(q, k, v, args)


def tapa_function(backend: str) -> Callable[..., torch.Tensor]:
    """The TAPA op for a backend (:data:`BACKENDS`): the dispatcher `tapa_attention` (``auto``), the Triton kernel,
    the chunked CPU path or the reference."""
    ops = {"auto": tapa_attention, "triton": tapa_attention_triton, "chunked": tapa_attention_chunked,
           "reference": tapa_attention_reference}
    if backend not in ops:
        raise ValueError(f"tapa: backend must be one of {BACKENDS}, got {backend!r}")
    return ops[backend]
