"""Llama family adapter: nothing differs from the shared mechanism for frequency schemes."""

from transformers import LlamaConfig, LlamaForCausalLM

from .base import make_family

ADAPTER = make_family(LlamaConfig, LlamaForCausalLM, __name__)
