"""The GGUF column of the family support table: whether ``export_gguf`` carries a frequency scheme of each family to
llama.cpp, found by the same tiny models as the scheme columns (tests/family_matrix.py).

Shared by ``tests/test_families.py`` and ``scripts/families_table.py``. A cell is ``{"status": "verified",
"arch": ARCH}`` when ``export_gguf``'s checks accept CoPE on the family's tiny model and the ``rope_freqs`` factors
it writes make llama.cpp's frequencies (θ_i / f_i, θ_i = b^(−2i/d)) the patched model's, where ARCH is the
llama.cpp architecture the family converts to (hf_posenc/data/llama_cpp.json); ``{"status": "refused", "reason"}``
with export_gguf's (or patch_model's) reason otherwise; ``untested`` where no tiny model could be built. Running
the files in llama.cpp is tests/test_serving_llamacpp.py (Llama, Mistral).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from family_matrix import Refused, TinyConfigError, _patch, active_options, refusal_reason, rotary_inv_freqs, stock_model
from hf_posenc import gguf_export
from hf_posenc.families.derive import static_refusal
from hf_posenc.schemes.base import STOCK_INF_FACTOR

SCHEME = "cope"  # the frequency scheme the column exports (its active setting in family_matrix)
PREFIX = "export_gguf: "


def check_gguf(model_type: str, stock: Any = None) -> dict[str, str]:
    """The GGUF cell of ``model_type`` (see the module docstring); a wrong ``rope_freqs`` raises AssertionError."""
    reason = static_refusal(model_type)
    if reason is not None:
        return {"status": "refused", "reason": reason}
    try:
        stock = stock_model(model_type) if stock is None else stock
    except TinyConfigError as exc:
        return {"status": "untested", "reason": f"no tiny config: {exc}"}
    try:
        model = _patch(copy.deepcopy(stock), SCHEME, **active_options(stock, SCHEME))
    except Refused as exc:
        return {"status": "refused", "reason": refusal_reason(str(exc))}
    try:
        factors, _, theta = gguf_export.gguf_rope_parameters(model)
    except ValueError as exc:
        return {"status": "refused", "reason": str(exc).removeprefix(PREFIX).split(". `hf-posenc families`")[0]
                .rstrip(".")}
    dim = 2 * factors.shape[0]
    llama_cpp = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim) / factors.double()
    # one rope_parameters (export_gguf refuses per-layer-type ones), which every rotary module computes
    for name, inv_freq in rotary_inv_freqs(model).items():
        zero = inv_freq == 0
        assert torch.all(factors[zero] == STOCK_INF_FACTOR), f"{model_type} {name}: rope_freqs of stopped frequencies"
        torch.testing.assert_close(llama_cpp[~zero], inv_freq[~zero], rtol=1e-6, atol=0,
                                   msg=lambda m: f"{model_type} {name}: llama.cpp's frequencies with rope_freqs: {m}")
    return {"status": "verified", "arch": gguf_export.llama_cpp_arch(model.config)}
