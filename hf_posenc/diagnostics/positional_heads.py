"""Positional heads (prope-round-and-round-we-go §5, Definition 5.1, Fig. 5–6).

A *diagonal* head puts attention α_{i,i} > 1 − ε on the token itself, a *previous-token* head α_{i,i−1} > 1 − ε
(Definition 5.1). The paper finds such heads "remarkably consistent[ly]" by their use of the highest RoPE
frequencies. Every head gets three scores:

* ``diagonal``: mean over query rows i ≥ 1 of α_{i,i};
* ``previous``: mean over rows i ≥ 1 of α_{i,i−1};
* ``high_freq_usage``: the share of the Cauchy–Schwarz bound Σ_k ‖q^(k)‖‖k^(k)‖ held by the top
  ``high_fraction`` of chunks by frequency (uniform use gives ≈ ``high_fraction``).

Attention maps are rebuilt from the captured q/k with the model's own frequencies, softmax scale, sliding window
and soft-capping, a block of query rows at a time, so no full map is ever held.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from .capture import (
    attention_module, capture_window, check_heads, check_ids, check_layers, layer_frequencies, softmax_scale, windows,
)
from .results import ResultMixin, normalise_named, pyplot, save_figure
from .rope_math import causal_attention_rows, chunk_norms, rotate


@dataclass
class PositionalHead:
    layer: int
    head: int
    kinds: list[str]
    diagonal: float
    previous: float
    high_freq_usage: float


@dataclass
class PositionalHeadsResult(ResultMixin):
    """Per-head scores ``[layer][head]`` and the heads that pass the thresholds."""

    analysis = "positional_heads"
    model: str
    layers: list[int]
    heads: list[int]
    diagonal: list[list[float]]
    previous: list[list[float]]
    high_freq_usage: list[list[float]]
    thresholds: dict[str, float]
    found: list[PositionalHead] = field(default_factory=list)
    tokens: int = 0


def score_attention_maps(attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference scores of full maps ``[H, S, S]``: mean α_{i,i} and mean α_{i,i−1} over rows i ≥ 1."""
    if attn.dim() != 3 or attn.shape[-1] != attn.shape[-2] or attn.shape[-1] < 2:
        raise ValueError(f"attention maps must be [heads, S, S] with S >= 2, got {tuple(attn.shape)}.")
    diag = torch.diagonal(attn, dim1=-2, dim2=-1)[:, 1:]
    prev = torch.diagonal(attn, offset=-1, dim1=-2, dim2=-1)
    return diag.double().mean(-1), prev.double().mean(-1)


def high_frequency_share(q_norms: torch.Tensor, k_norms: torch.Tensor, inv_freq: torch.Tensor, fraction: float) -> torch.Tensor:
    """Share of Σ_k ‖q^(k)‖‖k^(k)‖ in the top ``fraction`` of chunks by frequency; ``[H, D/2] -> [H]``."""
    if not 0 < fraction <= 1:
        raise ValueError(f"high_fraction must be in (0, 1], got {fraction}.")
    bound = q_norms.double() * k_norms.double()
    top = torch.sort(inv_freq, descending=True, stable=True).indices[: max(1, math.ceil(fraction * inv_freq.numel()))]
    total = bound.sum(-1)
    return torch.where(total > 0, bound[:, top].sum(-1) / total.clamp_min(1e-300), torch.full_like(total, float("nan")))


def find_heads(
    layers: Sequence[int], heads: Sequence[int], diagonal: torch.Tensor, previous: torch.Tensor, usage: torch.Tensor,
    diagonal_threshold: float, previous_threshold: float, high_freq_threshold: float,
) -> list[PositionalHead]:
    """Heads whose scores reach a threshold, with the criteria they meet (``[L, H]`` score tables)."""
    criteria = (("diagonal", diagonal, diagonal_threshold), ("previous_token", previous, previous_threshold),
                ("high_frequency", usage, high_freq_threshold))
    found = []
    for li, layer in enumerate(layers):
        for hi, head in enumerate(heads):
            kinds = [kind for kind, scores, threshold in criteria if scores[li, hi] >= threshold]
            if kinds:
                found.append(PositionalHead(
                    layer, head, kinds, float(diagonal[li, hi]), float(previous[li, hi]), float(usage[li, hi])
                ))
    return found


def streamed_scores(
    q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, scale: float, block: int = 128,
    sliding_window: int | None = None, softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of α_{i,i} and α_{i,i−1} over rows i ≥ 1 for pre-rotation ``q, k [H, S, D]``, ``block`` rows at a time."""
    positions = torch.arange(q.shape[-2])
    q_rot, k_rot = rotate(q, positions, inv_freq), rotate(k, positions, inv_freq)
    diag_sum = torch.zeros(q.shape[0], dtype=torch.float64)
    prev_sum = torch.zeros_like(diag_sum)
    for start in range(1, q.shape[-2], block):
        rows = positions[start : start + block]
        attn = causal_attention_rows(q_rot[:, rows], k_rot, rows, scale, sliding_window, softcap)
        r = torch.arange(len(rows))
        diag_sum += attn[:, r, rows].double().sum(-1)
        prev_sum += attn[:, r, rows - 1].double().sum(-1)
    return diag_sum, prev_sum


@torch.no_grad()
def positional_heads(
    model: nn.Module, input_ids: torch.Tensor, *, layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None, window: int = 512, diagonal_threshold: float = 0.5,
    previous_threshold: float = 0.5, high_freq_threshold: float | None = None, high_fraction: float = 0.125,
    block: int = 128, name: str = "", progress: bool = True,
) -> PositionalHeadsResult:
    """Score every (layer, head) for diagonal / previous-token attention and high-frequency use (§5).

    ``high_freq_threshold`` defaults to twice the uniform share (``2 · high_fraction``)."""
    layers = check_layers(model, layers)
    heads = check_heads(model, heads)
    input_ids = check_ids(input_ids, 2, "positional_heads")
    for label, value in (("diagonal_threshold", diagonal_threshold), ("previous_threshold", previous_threshold)):
        if not 0 <= value <= 1:
            raise ValueError(f"{label} is an attention probability and must be in [0, 1], got {value}.")
    if high_freq_threshold is None:
        high_freq_threshold = min(1.0, 2 * high_fraction)
    n_l, n_h = len(layers), len(heads)
    diag = torch.zeros(n_l, n_h, dtype=torch.float64)
    prev = torch.zeros_like(diag)
    qn: dict[int, torch.Tensor] = {}
    kn: dict[int, torch.Tensor] = {}
    rows = tokens = 0
    spans = list(windows(input_ids.shape[1], window))
    for start, end in tqdm(spans, desc="positional heads", disable=not progress or len(spans) < 2):
        captured = capture_window(model, input_ids[:, start:end], layers, heads, kinds=("q", "k"))
        for li, layer in enumerate(layers):
            q, k = captured[layer]["q"][0], captured[layer]["k"][0]
            inv_freq, att_scale = layer_frequencies(model, layer)
            attn_mod = attention_module(model, layer)
            d, p = streamed_scores(
                q, k, inv_freq, softmax_scale(model, layer) * att_scale**2, block,
                getattr(attn_mod, "sliding_window", None), getattr(attn_mod, "attn_logit_softcapping", None),
            )
            diag[li] += d
            prev[li] += p
            qn[layer] = qn.get(layer, 0) + chunk_norms(q.double()).sum(1)
            kn[layer] = kn.get(layer, 0) + chunk_norms(k.double()).sum(1)
        rows += end - start - 1
        tokens += end - start
    diag /= rows
    prev /= rows
    usage = torch.stack([
        high_frequency_share(qn[layer] / tokens, kn[layer] / tokens, layer_frequencies(model, layer)[0], high_fraction)
        for layer in layers
    ])
    thresholds = {
        "diagonal": diagonal_threshold, "previous_token": previous_threshold,
        "high_frequency": high_freq_threshold, "high_fraction": high_fraction,
    }
    return PositionalHeadsResult(
        model=name, layers=layers, heads=heads, diagonal=diag.tolist(), previous=prev.tolist(),
        high_freq_usage=usage.tolist(), thresholds=thresholds,
        found=find_heads(layers, heads, diag, prev, usage, diagonal_threshold, previous_threshold, high_freq_threshold),
        tokens=tokens,
    )


def plot_positional_heads(
    results: PositionalHeadsResult | Mapping[str, PositionalHeadsResult], path: str | os.PathLike,
) -> str:
    """Layer × head heatmaps of the three scores, one row per model; found heads are circled."""
    named = normalise_named(results, PositionalHeadsResult)
    plt = pyplot()
    fig, axes = plt.subplots(len(named), 3, figsize=(13, 3.2 * len(named)), squeeze=False, layout="constrained")
    for row, (name, res) in enumerate(named.items()):
        for col, (key, label) in enumerate(
            (("diagonal", "diagonal α_ii"), ("previous", "previous-token α_i,i−1"), ("high_freq_usage", "high-freq share"))
        ):
            ax = axes[row, col]
            im = ax.imshow(torch.tensor(getattr(res, key)).numpy(), aspect="auto", cmap="magma", vmin=0, vmax=1)
            ax.set_title(f"{name}: {label}", fontsize=9)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(len(res.heads)), [str(h) for h in res.heads], fontsize=6)
            step = max(1, len(res.layers) // 8)
            ax.set_yticks(range(0, len(res.layers), step), [str(x) for x in res.layers[::step]])
            for h in res.found:
                ax.scatter(res.heads.index(h.head), res.layers.index(h.layer), s=40, facecolors="none", edgecolors="cyan")
            fig.colorbar(im, ax=ax, fraction=0.04)
    fig.suptitle("Positional heads (Barbero et al. §5): circled = above a threshold")
    return save_figure(fig, path)
