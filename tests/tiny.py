"""Tiny random models of every supported family (shared by the tests and the benchmarks)."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    LlamaConfig,
    Qwen2Config,
    Qwen3Config,
)

COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=128, max_position_embeddings=256, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
ARCHS = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


def tiny_config(arch: str, **overrides):
    """A two-layer config of ``arch`` (GQA 4/2 heads, head dim 16 = 8 RoPE frequencies)."""
    kw = dict(COMMON, **overrides)
    if arch == "llama":
        return LlamaConfig(**kw)
    if arch == "qwen2":
        return Qwen2Config(**kw)
    if arch == "qwen3":
        return Qwen3Config(**kw)
    if arch == "gemma":
        return GemmaConfig(**kw)
    if arch == "gemma2":
        return Gemma2Config(**{"sliding_window": 16, **kw})
    if arch == "gemma3_text":
        kw.setdefault("layer_types", ["sliding_attention", "full_attention"])
        return Gemma3TextConfig(**{"sliding_window": 16, **kw})
    raise ValueError(arch)


def tiny_model(arch: str, attn_implementation: str = "eager", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), attn_implementation=attn_implementation)
    return model.eval()


def random_ids(batch: int = 2, length: int = 24, seed: int = 1, vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=g)


def backends(arch: str, candidates=("eager", "sdpa", "flex_attention")) -> list[str]:
    """The attention backends Transformers offers for ``arch`` (Gemma2's soft-capping has no SDPA path)."""
    return [b for b in candidates if not (arch == "gemma2" and b == "sdpa")]


def arch_backend_pairs(candidates=("eager", "sdpa", "flex_attention")) -> list[tuple[str, str]]:
    return [(a, b) for a in ARCHS for b in backends(a, candidates)]


def logits(model, ids, **kw):
    """Logits without autograd (flex_attention has no CPU backward)."""
    with torch.no_grad():
        return model(ids, **kw).logits


def padded_batch(length: int = 20, pads: int = 5):
    """Two random rows, the first left-padded with ``pads`` masked tokens."""
    ids = random_ids(2, length)
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return ids, mask


def greedy_without_cache(model, ids, steps):
    """Greedy decoding by full forward passes: what cached generation must reproduce."""
    for _ in range(steps):
        ids = torch.cat([ids, logits(model, ids)[:, -1].argmax(-1, keepdim=True)], dim=-1)
    return ids
