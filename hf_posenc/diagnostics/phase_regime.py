"""TAPA's phase regime (tapa-token-aware-phase-attention eq. 12): how far the phase term turns at distance 1 on
a text, per layer and head.

At |m − n| = 1 the phase of eq. 12 is ``2π·c_P·q_P·k_P`` radians whatever α (:mod:`hf_posenc.schemes.tapa.phase`);
it changes by a factor 2^α − 1 (7 % at the paper's α = 0.1) from distance 1 to 2, so a model can tell its
neighbours apart by phase only where this phase is several radians. Near 0 the cosine is flat and TAPA is
position-free matching on half of each head: the cold regime of small models initialised with Llama's 0.02.
The analysis captures the queries and keys of every adjacent pair of the text (query at m, key at m − 1) and
reports the median magnitude per layer and head, pooled, and the median step from distance 1 to 2. A model that is
not TAPA has no phase term: its result says so, with no numbers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..record import RECORD_KEY
from ..schemes.tapa.phase import phase_pairs
from .capture import capture_window, check_heads, check_ids, check_layers, windows
from .results import ResultMixin, normalise_named, pyplot, save_figure


@dataclass
class PhaseRegimeResult(ResultMixin):
    """The phase at distance 1 of a TAPA model on a text (radians).

    Attributes:
        model: a name for the model.
        scheme: the model's hf-posenc scheme (``None``: unpatched).
        alpha, theta, phase: TAPA's options (``None`` for another scheme).
        layers, heads: what was measured.
        per_head: ``per_head[i][j]``, the median |phase at distance 1| of layer ``layers[i]``, head ``heads[j]``.
        per_layer: the median over the layer's heads and pairs.
        median_phase_at_distance_1: the median over every layer, head and pair.
        step_1_to_2: ``(2^α − 1)`` × that median: how much the phase moves from distance 1 to 2.
        pairs: adjacent pairs measured per head.
    """

    model: str
    scheme: str | None
    alpha: float | None = None
    theta: float | None = None
    phase: str | None = None
    layers: list[int] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    per_head: list[list[float]] = field(default_factory=list)
    per_layer: list[float] = field(default_factory=list)
    median_phase_at_distance_1: float | None = None
    step_1_to_2: float | None = None
    pairs: int = 0
    analysis: str = "phase_regime"

    @property
    def applies(self) -> bool:
        return self.scheme == "tapa"


@torch.no_grad()
def phase_regime(model: nn.Module, input_ids: torch.Tensor, layers: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, window: int = 1024, name: str = "",
                 progress: bool = False) -> PhaseRegimeResult:
    """The phase at distance 1 of a TAPA-patched ``model`` over ``input_ids`` (disjoint windows of ``window``
    tokens, adjacent pairs inside each); for any other model a result with ``applies`` false and no numbers."""
    record = getattr(model.config, RECORD_KEY, None) or {}
    scheme = record.get("scheme")
    if scheme != "tapa":
        return PhaseRegimeResult(model=name, scheme=scheme)
    from ..kernels.tapa.args import tapa_split

    options = record["options"]
    layers, heads = check_layers(model, layers), check_heads(model, heads)
    ids = check_ids(input_ids, 2, "phase_regime")
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    amp_dims, _ = tapa_split(head_dim, float(options["theta"]))
    values: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    spans = list(windows(ids.shape[1], window))
    from tqdm.auto import tqdm

    for start, end in tqdm(spans, desc=f"phase regime {name}".strip(), disable=not progress):
        captured = capture_window(model, ids[:, start:end], layers, heads, kinds=("q", "k"))
        for layer, phases in phase_pairs(captured, amp_dims, options["phase"]):
            values[layer].append(phases[0].transpose(0, 1).reshape(-1, len(heads)))  # [pairs, heads]
    per_layer_pairs = {layer: torch.cat(chunks) for layer, chunks in values.items()}
    pooled = torch.cat([v.flatten() for v in per_layer_pairs.values()])
    median = float(pooled.median())
    alpha = float(options["alpha"])
    return PhaseRegimeResult(
        model=name, scheme=scheme, alpha=alpha, theta=float(options["theta"]), phase=options["phase"],
        layers=layers, heads=heads,
        per_head=[[float(v[:, j].median()) for j in range(len(heads))] for v in per_layer_pairs.values()],
        per_layer=[float(v.median()) for v in per_layer_pairs.values()],
        median_phase_at_distance_1=median, step_1_to_2=(2.0 ** alpha - 1.0) * median,
        pairs=int(next(iter(per_layer_pairs.values())).shape[0]),
    )


def plot_phase_regime(results: PhaseRegimeResult | Mapping[str, PhaseRegimeResult],
                      path: str | os.PathLike) -> str:
    """Median |phase at distance 1| per layer, one line per TAPA model (others are named as not TAPA)."""
    named = normalise_named(results, PhaseRegimeResult)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    others = []
    for name, result in named.items():
        if not result.applies:
            others.append(name)
            continue
        ax.plot(result.layers, result.per_layer, marker="o",
                label=f"{name} (median {result.median_phase_at_distance_1:.3g} rad)")
    ax.set_xlabel("layer")
    ax.set_ylabel("median |phase at distance 1| (rad)")
    ax.set_yscale("log")
    title = "TAPA's phase at distance 1 (eq. 12)"
    if others:
        title += f"; not TAPA: {', '.join(others)}"
    ax.set_title(title, fontsize=9)
    if len(others) < len(named):
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def describe(result: PhaseRegimeResult) -> str:
    """The summary line: the pooled median, the per-layer range and the step to distance 2."""
    if not result.applies:
        return f"not a TAPA model (scheme {result.scheme}): no phase term"
    low, high = min(result.per_layer), max(result.per_layer)
    spread = "" if len(result.per_layer) == 1 else f" (layers {low:.3g}–{high:.3g})"
    return (f"{result.median_phase_at_distance_1:.3g} rad{spread}; step to distance 2 {result.step_1_to_2:.3g} rad "
            f"(α = {result.alpha:g}); over {len(result.heads)} heads × {result.pairs} pairs")
