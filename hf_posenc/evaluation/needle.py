"""Synthetic needle-in-a-haystack tasks in the style of RULER (Hsieh et al., 2024), generated offline.

Needles are ``"One of the special magic numbers for {key} is: {value}."`` with word-pair keys and 7-digit values,
hidden between the sentences of a repeated filler (the passkey filler, so no download is needed):

* ``single``: one needle, asked for its value;
* ``multikey``: the asked needle plus ``num_distractors`` needles with other keys;
* ``multivalue``: ``num_values`` needles sharing one key; every value must be returned.

The queried needle (for ``multivalue``, the first value) sits at ``depth`` of the filler sentences; the others at
seeded random depths. The filler is the largest number of sentences whose prompt fits the target token length.
Scoring follows RULER's "string match all": the fraction of expected values among the integers the model writes
(``score``) and whether all were found (``exact``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from hf_posenc_cli.arguments import NEEDLE_TASKS

from .passkey import FILLER, _check_depth
from .prompting import largest_fitting

SENTENCES = tuple(s.strip() + "." for s in FILLER.split(".") if s.strip())
NEEDLE = "One of the special magic numbers for {key} is: {value}."
INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
         "I will quiz you about the numbers afterwards.")
QUESTION_ONE = ("What is the special magic number for {key} mentioned in the provided text? "
                "The special magic number for {key} mentioned in the provided text is")
QUESTION_ALL = ("What are all the special magic numbers for {key} mentioned in the provided text? "
                "The special magic numbers for {key} mentioned in the provided text are")
_ADJECTIVES = ("amber", "brave", "calm", "damp", "eager", "faint", "gentle", "hollow", "icy", "jolly", "keen",
               "lucky", "mellow", "noble", "odd", "plain", "quiet", "rapid", "shy", "tidy", "upset", "vivid", "wary",
               "young", "zesty", "bold", "crisp", "dusty", "early", "fuzzy")
_NOUNS = ("anchor", "badger", "candle", "desert", "engine", "falcon", "garden", "harbor", "island", "jacket",
          "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "river", "saddle", "tunnel",
          "umbrella", "valley", "walnut", "yacht", "zipper", "basket", "cactus", "donkey", "ember", "fossil")
#: Greedy tokens decoded per expected value by default (7 digits plus separators on digit-wise tokenizers).
TOKENS_PER_VALUE = 12


@dataclass
class NeedlePrompt:
    """One needle prompt: its text, the values that must be returned, and its token count."""

    text: str
    task: str
    key: str
    answers: list[str]
    tokens: int
    depth: float
    num_sentences: int


def _random_key(rng: random.Random, taken: set[str]) -> str:
    while True:
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        if key not in taken:
            taken.add(key)
            return key


def _random_value(rng: random.Random, taken: set[str]) -> str:
    while True:
        value = str(rng.randint(1_000_000, 9_999_999))
        if value not in taken:
            taken.add(value)
            return value


def needle_prompt(sentences: int, needles: list[tuple[float, str]], question: str) -> str:
    """The prompt with ``sentences`` filler sentences and each ``(depth, needle)`` inserted before sentence
    ``round(depth · sentences)`` (ties keep the list order)."""
    filler = [SENTENCES[i % len(SENTENCES)] for i in range(sentences)]
    slots: dict[int, list[str]] = {}
    for depth, needle in needles:
        slots.setdefault(round(depth * sentences), []).append(needle)
    parts: list[str] = []
    for i in range(sentences + 1):
        parts += slots.get(i, [])
        if i < sentences:
            parts.append(filler[i])
    return "\n".join([INTRO, " ".join(parts), question])


def build_needle_prompt(
    tokenizer: Any,
    task: str,
    length: int,
    depth: float,
    rng: random.Random,
    num_distractors: int = 3,
    num_values: int = 4,
) -> NeedlePrompt:
    """A ``task`` prompt (see :data:`NEEDLE_TASKS`) of at most ``length`` tokens, drawn from ``rng``."""
    if task not in NEEDLE_TASKS:
        raise ValueError(f"unknown needle task {task!r}; choose from {', '.join(NEEDLE_TASKS)}")
    if num_distractors < 1 or num_values < 2:
        raise ValueError(f"need num_distractors >= 1 and num_values >= 2, got {num_distractors} and {num_values}")
    depth = _check_depth(depth)
    keys: set[str] = set()
    values: set[str] = set()
    key = _random_key(rng, keys)
    answers = [_random_value(rng, values) for _ in range(num_values if task == "multivalue" else 1)]
    needles = [(depth, NEEDLE.format(key=key, value=answers[0]))]
    needles += [(rng.random(), NEEDLE.format(key=key, value=v)) for v in answers[1:]]
    if task == "multikey":
        needles += [(rng.random(), NEEDLE.format(key=_random_key(rng, keys), value=_random_value(rng, values)))
                    for _ in range(num_distractors)]
    question = (QUESTION_ALL if task == "multivalue" else QUESTION_ONE).format(key=key)
    n, text, tokens = largest_fitting(lambda s: needle_prompt(s, needles, question), tokenizer, length,
                                      f"needle {task}")
    return NeedlePrompt(text=text, task=task, key=key, answers=answers, tokens=tokens, depth=depth, num_sentences=n)


def score_needle(output: str, answers: list[str]) -> tuple[float, bool]:
    """``(fraction of answers among the integers in output, all found)``."""
    if not answers:
        raise ValueError("answers must not be empty")
    found = set(re.findall(r"\d+", output))
    hits = sum(a in found for a in answers)
    return hits / len(answers), hits == len(answers)
