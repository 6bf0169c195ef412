"""Continued training and context extension with a positional-encoding scheme (``hf-posenc train``).

``load_recipe`` parses and validates a YAML recipe (no weights loaded); ``run_training`` loads, patches, wraps with
LoRA, packs the data, trains with the HF Trainer (chunked cross-entropy, gradient checkpointing), saves the adapter (and
a merged checkpoint) and evaluates. See :mod:`.trainer` for which schemes work with context parallelism.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the submodule defining it, imported on first use: `hf-posenc`'s parser imports .cli, which must not pull in
# datasets, accelerate and the Trainer (not installed in the demo's environment, and seconds to import)
_EXPORTS = {
    "Recipe": "config", "RecipeError": "config", "load_recipe": "config", "validate_recipe": "config",
    "build_dataset": "data", "collate": "data", "pack_concat": "data", "pack_restart": "data",
    "read_documents": "data", "chunked_linear_cross_entropy": "loss", "full_linear_cross_entropy": "loss",
    "TrainResult": "trainer", "context_length_notes": "trainer", "load_trained": "trainer", "run_training": "trainer",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)
