"""Distance bias (tapa-token-aware-phase-attention Appendix I, Fig. 1).

Sample pairs of attention scores that share a query position ``i``: one key at a short distance λ ∈ I_short and one at a
long distance Λ ∈ I_long, and histogram Δ = Attn(i, i−λ) − Attn(i, i−Λ) (pre-softmax logits, the row offset cancels).
The paper uses I_short = [0, 100], I_long = [10000, 10100] and finds μ ≈ 4.1, σ ≈ 0.85 for RoPE (a bias toward near
tokens) and μ ≈ 0.03 for TAPA. :func:`scaled_ranges` shrinks both intervals proportionally to a shorter context.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .capture import capture_window, check_heads, check_ids, check_layers, layer_frequencies, softmax_scale
from .results import ResultMixin, normalise_named, pyplot, save_figure
from .rope_math import pair_logits

PAPER_SHORT = (0, 100)
PAPER_LONG = (10000, 10100)


def check_ranges(short: tuple[int, int], long: tuple[int, int]) -> None:
    for label, (lo, hi) in (("short", short), ("long", long)):
        if not (isinstance(lo, int) and isinstance(hi, int)) or lo < 0 or hi < lo:
            raise ValueError(f"the {label} distance range must be integers 0 <= lo <= hi, got {(lo, hi)}.")
    if long[0] <= short[1]:
        raise ValueError(f"the long range {long} must start after the short range {short} ends.")


def scaled_ranges(context: int, short: tuple[int, int] = PAPER_SHORT, long: tuple[int, int] = PAPER_LONG):
    """The paper's intervals scaled by ``(context − 1) / long[1]`` when the context is shorter than ``long[1] + 1``
    (unchanged otherwise), keeping them disjoint."""
    if context <= long[1]:
        s = (context - 1) / long[1]
        short = (round(short[0] * s), round(short[1] * s))
        long = (max(short[1] + 1, round(long[0] * s)), context - 1)
    check_ranges(short, long)
    return short, long


def sample_pairs(
    length: int, short: tuple[int, int], long: tuple[int, int], samples: int, seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query positions ``i ∈ [long[1], length)``, short distances λ and long distances Λ (uniform, from ``seed``)."""
    check_ranges(short, long)
    if length <= long[1]:
        raise ValueError(
            f"the long distances reach {long[1]} but the text has only {length} tokens; use a text of at least "
            f"{long[1] + 1} tokens or scaled ranges (scaled_ranges(length))."
        )
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}.")
    generator = torch.Generator().manual_seed(seed)
    i = torch.randint(long[1], length, (samples,), generator=generator)
    lam = torch.randint(short[0], short[1] + 1, (samples,), generator=generator)
    big = torch.randint(long[0], long[1] + 1, (samples,), generator=generator)
    return i, lam, big


def bias_from_logit_fn(
    logit: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], length: int, short: tuple[int, int],
    long: tuple[int, int], samples: int, seed: int = 0,
) -> torch.Tensor:
    """Δ samples for any ``logit(i, j)`` (vectorised over index tensors; returns ``[..., samples]``)."""
    i, lam, big = sample_pairs(length, short, long, samples, seed)
    return logit(i, i - lam) - logit(i, i - big)


@dataclass
class DistanceBiasResult(ResultMixin):
    """Mean/std of Δ per ``[layer][head]`` and pooled, with a pooled histogram."""

    analysis = "distance_bias"
    model: str
    layers: list[int]
    heads: list[int]
    short: tuple[int, int]
    long: tuple[int, int]
    samples: int
    mean: list[list[float]]
    std: list[list[float]]
    pooled_mean: float
    pooled_std: float
    histogram_edges: list[float]
    histogram_counts: list[int]


def summarise(model: str, layers, heads, short, long, samples, deltas: torch.Tensor, bins: int = 60) -> DistanceBiasResult:
    """Build the result from Δ samples ``[L, H, samples]``."""
    flat = deltas.flatten().double()
    lo, hi = float(flat.min()), float(flat.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts = torch.histc(flat, bins=bins, min=lo, max=hi)
    return DistanceBiasResult(
        model=model, layers=list(layers), heads=list(heads), short=tuple(short), long=tuple(long), samples=samples,
        mean=deltas.double().mean(-1).tolist(), std=deltas.double().std(-1).tolist(),
        pooled_mean=float(flat.mean()), pooled_std=float(flat.std()),
        histogram_edges=torch.linspace(lo, hi, bins + 1).tolist(), histogram_counts=[int(c) for c in counts.tolist()],
    )


@torch.no_grad()
def distance_bias(
    model: nn.Module, input_ids: torch.Tensor, *, layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None, short: tuple[int, int] | None = None, long: tuple[int, int] | None = None,
    samples: int = 10000, seed: int = 0, name: str = "",
) -> DistanceBiasResult:
    """Histogram of Attn(short) − Attn(long) per layer and head over one forward pass of the text.

    ``short``/``long`` default to the paper's intervals scaled to the text length (:func:`scaled_ranges`); an
    explicit range longer than the text raises."""
    layers = check_layers(model, layers)
    heads = check_heads(model, heads)
    input_ids = check_ids(input_ids, 3, "distance_bias")
    length = input_ids.shape[1]
    if short is None and long is None:  # half the text, so queries can sit at many positions past the long range
        short, long = scaled_ranges((length + 1) // 2)
    elif short is None or long is None:
        raise ValueError("pass both short and long distance ranges, or neither (paper ranges scaled to the text).")
    short, long = tuple(short), tuple(long)
    i, lam, big = sample_pairs(length, short, long, samples, seed)
    captured = capture_window(model, input_ids, layers, heads, kinds=("q", "k"))
    deltas = []
    for layer in layers:
        inv_freq, att_scale = layer_frequencies(model, layer)
        scale = softmax_scale(model, layer) * att_scale**2
        q, k = captured[layer]["q"][0], captured[layer]["k"][0]
        near = pair_logits(q[:, i], k[:, i - lam], lam, inv_freq, scale)
        far = pair_logits(q[:, i], k[:, i - big], big, inv_freq, scale)
        deltas.append(near - far)
    return summarise(name, layers, heads, short, long, samples, torch.stack(deltas))


def plot_distance_bias(results: DistanceBiasResult | Mapping[str, DistanceBiasResult], path: str | os.PathLike) -> str:
    """Pooled Δ histograms (density) overlaid, one per model, with μ and σ in the legend."""
    named = normalise_named(results, DistanceBiasResult)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, res in named.items():
        edges = torch.tensor(res.histogram_edges)
        counts = torch.tensor(res.histogram_counts, dtype=torch.float64)
        width = float(edges[1] - edges[0])
        density = counts / counts.sum().clamp_min(1) / width
        ax.stairs(density.numpy(), edges.numpy(), fill=True, alpha=0.4,
                  label=f"{name}: μ={res.pooled_mean:.2f}, σ={res.pooled_std:.2f}")
    first = next(iter(named.values()))
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel(f"Δ = Attn(short {first.short}) − Attn(long {first.long})")
    ax.set_ylabel("density")
    ax.set_title("Distance bias (TAPA App. I; paper RoPE μ≈4.1, σ≈0.85)", fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
