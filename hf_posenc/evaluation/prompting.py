"""Helpers shared by the retrieval tasks: counting tokens, growing filler to a token budget, greedy decoding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: ``generate(model, tokenizer, prompt, max_new_tokens) -> generated text`` (the prompt excluded).
GenerateFn = Callable[[Any, Any, str, int], str]


def count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens the model is fed for ``text`` (special tokens the tokenizer adds included)."""
    return len(tokenizer(text).input_ids)


def largest_fitting(build: Callable[[int], str], tokenizer: Any, target: int, what: str) -> tuple[int, str, int]:
    """The largest filler amount ``n >= 0`` whose prompt ``build(n)`` has at most ``target`` tokens.

    Returns ``(n, prompt, tokens)``. Doubling then bisection; token counts grow with ``n`` except for tokenizer
    merges at the edges, so the result is the largest fitting ``n`` up to such a wobble, and always fits."""
    if not isinstance(target, int) or target < 1:
        raise ValueError(f"{what}: target length must be a positive int, got {target!r}")

    def measure(n: int) -> tuple[int, str, int]:
        prompt = build(n)
        return n, prompt, count_tokens(tokenizer, prompt)

    best = measure(0)  # the largest n known to fit, with its prompt and token count
    if best[2] > target:
        raise ValueError(f"{what}: the prompt without filler already has {best[2]} tokens, more than the requested "
                         f"length {target}; ask for a length of at least {best[2]}")
    hi = 64
    while (probe := measure(hi))[2] <= target:  # grow hi until it overflows
        best, hi = probe, hi * 2
    while hi - best[0] > 1:
        probe = measure((best[0] + hi) // 2)
        if probe[2] <= target:
            best = probe
        else:
            hi = probe[0]
    return best


def greedy_generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> str:
    """Greedy decoding of ``max_new_tokens`` tokens (stopping at EOS) after ``prompt``; returns the new text."""
    from transformers import GenerationConfig

    ids = torch.as_tensor(tokenizer(prompt).input_ids, dtype=torch.long).reshape(1, -1)
    ids = ids.to(next(model.parameters()).device)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = eos[0] if isinstance(eos, list) else eos
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, eos_token_id=eos,
                              pad_token_id=pad)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
