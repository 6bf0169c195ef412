"""Frequency usage (prope-round-and-round-we-go §4–5, Fig. 3–4).

By Cauchy–Schwarz the contribution of RoPE chunk ``k`` to a logit is bounded by ``‖q^(k)‖·‖k^(k)‖``, so the mean
2-norm of every 2-D chunk of the (pre-rotation) queries and keys, per layer and head, ordered by frequency, shows
which frequencies a model uses. Values, which are never rotated, are the control (the paper's Fig. 14).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from .capture import capture_window, check_heads, check_ids, check_layers, layer_frequencies, windows
from .results import ResultMixin, normalise_named, pyplot, save_figure
from .rope_math import chunk_norms


@dataclass
class FrequencyUsageResult(ResultMixin):
    """Mean chunk norms, ordered from the highest to the lowest frequency.

    Attributes:
        layers / heads: the selection analysed.
        frequencies: per layer, the inverse frequencies in plotted order (highest first).
        chunk_index: per layer, the original chunk index of every plotted position.
        query_norms / key_norms / value_norms: ``[layer][head][chunk]`` mean 2-norms (key/value heads are those
            each query head reads under GQA).
        tokens: how many token positions were averaged.
    """

    analysis = "frequency_usage"
    model: str
    layers: list[int]
    heads: list[int]
    frequencies: list[list[float]]
    chunk_index: list[list[int]]
    query_norms: list[list[list[float]]]
    key_norms: list[list[list[float]]]
    value_norms: list[list[list[float]]]
    tokens: int

    def layer_means(self, kind: str = "q") -> torch.Tensor:
        """``[layer, chunk]`` norms averaged over heads (the paper's Fig. 3)."""
        return torch.tensor(self._norms(kind)).mean(dim=1)

    def _norms(self, kind: str) -> list:
        table = {"q": self.query_norms, "k": self.key_norms, "v": self.value_norms}
        if kind not in table:
            raise ValueError(f"kind must be 'q', 'k' or 'v', got {kind!r}.")
        return table[kind]


def usage_from_tensors(x: torch.Tensor) -> torch.Tensor:
    """Mean chunk norm over batch and positions: ``[B, H, S, D] -> [H, D/2]`` (the reference computation)."""
    return chunk_norms(x.double()).mean(dim=(0, 2))


@torch.no_grad()
def frequency_usage(
    model: nn.Module, input_ids: torch.Tensor, *, layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None, window: int = 512, name: str = "", progress: bool = True,
) -> FrequencyUsageResult:
    """Mean 2-norm of every RoPE chunk of q, k (and v as control) per layer and head over a text.

    The text is streamed in non-overlapping windows of ``window`` tokens (each its own forward pass), so only the
    running sums are kept."""
    layers = check_layers(model, layers)
    heads = check_heads(model, heads)
    input_ids = check_ids(input_ids, 2, "frequency_usage")
    sums: dict[tuple[int, str], torch.Tensor] = {}
    tokens = 0
    spans = list(windows(input_ids.shape[1], window))
    for start, end in tqdm(spans, desc="frequency usage", disable=not progress or len(spans) < 2):
        captured = capture_window(model, input_ids[:, start:end], layers, heads, kinds=("q", "k", "v"))
        for layer in layers:
            for kind in ("q", "k", "v"):
                part = chunk_norms(captured[layer][kind].double()).sum(dim=(0, 2))
                sums[layer, kind] = sums.get((layer, kind), 0) + part
        tokens += end - start
    freqs, order_all, norms = [], [], {"q": [], "k": [], "v": []}
    for layer in layers:
        inv_freq, _ = layer_frequencies(model, layer)
        order = torch.sort(inv_freq, descending=True, stable=True).indices
        freqs.append(inv_freq[order].tolist())
        order_all.append(order.tolist())
        for kind in norms:
            norms[kind].append((sums[layer, kind] / tokens)[:, order].tolist())
    return FrequencyUsageResult(
        model=name, layers=layers, heads=heads, frequencies=freqs, chunk_index=order_all,
        query_norms=norms["q"], key_norms=norms["k"], value_norms=norms["v"], tokens=tokens,
    )


def plot_frequency_usage(
    results: FrequencyUsageResult | Mapping[str, FrequencyUsageResult], path: str | os.PathLike,
    per_head_layer: int | None = None,
) -> str:
    """Heatmaps of mean chunk norms (rows: layers, or the heads of ``per_head_layer``; columns: frequency, high →
    low) for q, k and v, one row of panels per model (Fig. 3 / Fig. 4)."""
    named = normalise_named(results, FrequencyUsageResult)
    plt = pyplot()
    fig, axes = plt.subplots(len(named), 3, figsize=(13, 3.2 * len(named)), squeeze=False, layout="constrained")
    for row, (name, res) in enumerate(named.items()):
        for col, (kind, label) in enumerate((("q", "queries"), ("k", "keys"), ("v", "values (control)"))):
            if per_head_layer is None:
                data, ylabel = res.layer_means(kind), "layer"
                ticks = res.layers
            else:
                if per_head_layer not in res.layers:
                    raise ValueError(f"layer {per_head_layer} was not analysed; analysed layers: {res.layers}.")
                data = torch.tensor(res._norms(kind))[res.layers.index(per_head_layer)]
                ylabel, ticks = f"head (layer {per_head_layer})", res.heads
            ax = axes[row, col]
            im = ax.imshow(data.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
            ax.set_title(f"{name}: {label}", fontsize=9)
            ax.set_xlabel("RoPE chunk, highest → lowest frequency")
            ax.set_ylabel(ylabel)
            step = max(1, len(ticks) // 8)
            ax.set_yticks(range(0, len(ticks), step), [str(t) for t in ticks[::step]])
            fig.colorbar(im, ax=ax, fraction=0.04)
    fig.suptitle("Mean 2-norm of RoPE chunks (Barbero et al. §4)")
    return save_figure(fig, path)
