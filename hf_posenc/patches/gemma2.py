"""Gemma2 family adapter: nothing differs from the shared mechanism for frequency schemes."""

from transformers import Gemma2Config, Gemma2ForCausalLM

from .base import make_family

ADAPTER = make_family(Gemma2Config, Gemma2ForCausalLM, __name__)
