"""Gemma family adapter: nothing differs from the shared mechanism for frequency schemes."""

from transformers import GemmaConfig, GemmaForCausalLM

from .base import make_family

ADAPTER = make_family(GemmaConfig, GemmaForCausalLM, __name__)
