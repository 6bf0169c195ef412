"""Qwen3 family adapter: nothing differs from the shared mechanism for frequency schemes."""

from transformers import Qwen3Config, Qwen3ForCausalLM

from .base import make_family

ADAPTER = make_family(Qwen3Config, Qwen3ForCausalLM, __name__)
