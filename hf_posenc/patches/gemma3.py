"""Gemma3 (text) adapter: separate rotary settings for sliding (local) and full (global) attention layers.

``config.rope_parameters`` is nested as ``{"full_attention": {...}, "sliding_attention": {...}}``; a scheme
rewrites the global entry by default and both with ``layers="all"`` (see ``FamilyAdapter.rope_layer_keys``).
"""

from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from .base import make_family

ADAPTER = make_family(
    Gemma3TextConfig,
    Gemma3ForCausalLM,
    __name__,
    notes=["schemes apply to the global (full-attention) layers unless layers='all' is given"],
)
