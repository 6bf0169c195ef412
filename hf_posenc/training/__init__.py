"""Continued training and context extension with a positional-encoding scheme (``hf-posenc train``).

``load_recipe`` parses and validates a YAML recipe (no weights loaded); ``run_training`` loads, patches, wraps
with LoRA, packs the data, trains with the HF Trainer (chunked cross-entropy, gradient checkpointing), saves the
adapter (and a merged checkpoint) and evaluates. See :mod:`.trainer` for which schemes work with context
parallelism.
"""

from .config import Recipe, RecipeError, load_recipe, validate_recipe
from .data import build_dataset, collate, pack_concat, pack_restart, read_documents
from .loss import chunked_linear_cross_entropy, full_linear_cross_entropy
from .trainer import TrainResult, context_length_notes, load_trained, run_training

__all__ = [
    "Recipe", "RecipeError", "load_recipe", "validate_recipe", "build_dataset", "collate", "pack_concat",
    "pack_restart", "read_documents", "chunked_linear_cross_entropy", "full_linear_cross_entropy", "TrainResult",
    "context_length_notes", "load_trained", "run_training",
]
