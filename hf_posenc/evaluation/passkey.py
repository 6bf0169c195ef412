"""Passkey retrieval in the format of Landmark attention (Mohtashami & Jaggi, 2023).

The prompt is five lines joined by ``"\\n"``: the task description, filler before the needle, the needle, filler after
it, and the question. The filler is the sentence block :data:`FILLER` repeated (joined by spaces) and cut to a number of
characters; like the original, both filler parts are prefixes of that same repetition. The depth ``d`` puts
``round(d · n)`` of the ``n`` filler characters before the needle, and ``n`` is the largest amount whose prompt fits the
target token length. The model decodes greedily and is right when the first integer it writes is the key (exact match).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .prompting import largest_fitting

TASK_DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
KEY_RANGE = (1, 50000)  # keys are drawn uniformly from this range (inclusive), as in the original
#: Greedy tokens decoded by default (a 5-digit key plus room for a leading space on digit-wise tokenizers).
MAX_NEW_TOKENS = 10


def filler_text(num_chars: int) -> str:
    """The first ``num_chars`` characters of ``FILLER`` repeated and joined by single spaces."""
    if num_chars < 0:
        raise ValueError(f"num_chars must be >= 0, got {num_chars}")
    repeats = num_chars // (len(FILLER) + 1) + 1
    return " ".join([FILLER] * repeats)[:num_chars]


def passkey_prompt(prefix_chars: int, suffix_chars: int, key: int) -> str:
    """The exact prompt with ``prefix_chars`` filler characters before the needle and ``suffix_chars`` after it."""
    lines = [TASK_DESCRIPTION, filler_text(prefix_chars), NEEDLE.format(key=key), filler_text(suffix_chars), QUESTION]
    return "\n".join(lines)


@dataclass
class PasskeyPrompt:
    """One passkey prompt: its text, key, token count and how the filler was split."""

    text: str
    key: int
    tokens: int
    depth: float
    prefix_chars: int
    suffix_chars: int

    @property
    def answers(self) -> list[str]:
        return [str(self.key)]


def _check_depth(depth: float) -> float:
    depth = float(depth)
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth is the fraction of filler before the needle and must lie in [0, 1], got {depth}")
    return depth


def build_passkey_prompt(tokenizer: Any, length: int, depth: float, key: int) -> PasskeyPrompt:
    """The longest passkey prompt with at most ``length`` tokens and the needle at ``depth`` of the filler."""
    depth = _check_depth(depth)
    if not KEY_RANGE[0] <= int(key) <= KEY_RANGE[1]:
        raise ValueError(f"key must be an integer in {KEY_RANGE[0]}..{KEY_RANGE[1]}, got {key}")

    def build(n: int) -> str:
        prefix = round(depth * n)
        return passkey_prompt(prefix, n - prefix, key)

    n, text, tokens = largest_fitting(build, tokenizer, length, "passkey")
    prefix = round(depth * n)
    return PasskeyPrompt(text=text, key=int(key), tokens=tokens, depth=depth, prefix_chars=prefix,
                         suffix_chars=n - prefix)


def score_passkey(output: str, key: int) -> bool:
    """Exact match: the first integer in the generated text equals the key."""
    match = re.search(r"\d+", output)
    return match is not None and int(match.group()) == int(key)


def key_digit_accuracy(model: Any, tokenizer: Any, prompt: PasskeyPrompt) -> float:
    """Teacher-forced retrieval: the fraction of the key's digits that the model ranks first *among the ten digits*
    when the prompt is followed by ``" {key}"``.

    A graded companion to exact match for small models, which rarely write all five digits right (and may never
    rank a digit above every letter): a model that copies the key from the needle scores near 1, one that guesses
    about 0.1. Needs a tokenizer that writes each digit as one token (byte-level, SmolLM2, Llama 3 and most BPE
    vocabularies) and whose prompt tokens are a prefix of the continued text's; otherwise a ``ValueError`` says so."""
    import torch

    digit_ids = []
    for d in "0123456789":
        ids = tokenizer(d, add_special_tokens=False).input_ids
        if len(ids) != 1:
            raise ValueError(f"the tokenizer writes the digit {d!r} as {len(ids)} tokens; key_digit_accuracy needs "
                             "one token per digit")
        digit_ids.append(ids[0])
    prompt_ids = tokenizer(prompt.text, add_special_tokens=False).input_ids
    full_ids = tokenizer(f"{prompt.text} {prompt.key}", add_special_tokens=False).input_ids
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError("the tokenizer merges the prompt's last token with the key; teacher-forced key accuracy "
                         "needs the prompt's tokens to be a prefix of the prompt followed by the key")
    positions = [i for i in range(len(prompt_ids), len(full_ids)) if full_ids[i] in digit_ids]
    if len(positions) != len(str(prompt.key)):
        raise ValueError(f"the key {prompt.key} is not one token per digit after the prompt with this tokenizer")
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([full_ids], device=device)).logits[0]
    among = logits[[i - 1 for i in positions]][:, digit_ids]  # [digits of the key, 10]
    predicted = [digit_ids[j] for j in among.argmax(-1).tolist()]
    return sum(p == full_ids[i] for p, i in zip(predicted, positions)) / len(positions)
