"""Qwen2 family adapter: nothing differs from the shared mechanism for frequency schemes."""

from transformers import Qwen2Config, Qwen2ForCausalLM

from .base import make_family

ADAPTER = make_family(Qwen2Config, Qwen2ForCausalLM, __name__)
