"""One small adapter per model family; :data:`ADAPTERS` maps the stock model type to it.

Adding a family (Mistral, Phi3, ...) is a file like ``llama.py`` plus one line here.
"""

from __future__ import annotations

from .base import FamilyAdapter
from . import gemma, gemma2, gemma3, llama, qwen2, qwen3

ADAPTERS: dict[str, FamilyAdapter] = {
    m.ADAPTER.stock_model_type: m.ADAPTER for m in (llama, qwen2, qwen3, gemma, gemma2, gemma3)
}
PATCHED_TYPES: dict[str, FamilyAdapter] = {a.model_type: a for a in ADAPTERS.values()}


def adapter_for(model_type: str) -> FamilyAdapter:
    """The adapter of a stock or patched model type; an unsupported type names the supported ones."""
    adapter = ADAPTERS.get(model_type) or PATCHED_TYPES.get(model_type)
    if adapter is None:
        raise ValueError(
            f"hf-posenc does not support model type {model_type!r}; supported: {sorted(ADAPTERS)} "
            "(Gemma3 as its text model, gemma3_text)."
        )
    return adapter


__all__ = ["ADAPTERS", "PATCHED_TYPES", "FamilyAdapter", "adapter_for"]
