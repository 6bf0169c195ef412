"""Tolerance to position perturbations (position-generalization-mechanism §4.1, Fig. 5).

Two perturbations of a fraction γ of the tokens within a maximum distance l:

* ``"transpose"`` (text transposition): each chosen token swaps places with the token ``1..l`` positions later
  (within the window); the perplexity is that of the perturbed text as the model reads it.
* ``"position_offset"`` (position-encoding manipulation): each chosen token's position id is moved by a random
  non-zero offset in ``[−l, l]`` (clamped at 0); the text and its targets are unchanged.

The paper finds both cost little (e.g. +0.02 perplexity for 1 % of tokens shuffled up to 1000 apart, 2,048-token
windows), scoring only the targets that were not perturbed: ``score="unperturbed"`` does the same, and gives beside
each perturbed perplexity the unperturbed text's perplexity over the same targets (a paired comparison);
``score="all"`` scores every target of the perturbed text.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from hf_posenc_cli.vocabulary import PERTURBATION_SCORES

from .capture import check_ids, forward, windows
from .results import ResultMixin, normalise_named, pyplot, save_figure

MODES = ("transpose", "position_offset")
SCORES = PERTURBATION_SCORES  # the command line's vocabulary (hf_posenc_cli.vocabulary)


def transpose_tokens(ids: torch.Tensor, fraction: float, max_distance: int, generator: torch.Generator) -> torch.Tensor:
    """Swap ``round(fraction·S)`` randomly chosen tokens of ``ids [S]`` with the token 1..``max_distance`` later."""
    out = ids.clone()
    n = ids.numel()
    count = round(fraction * n)
    for pos in torch.randperm(n, generator=generator)[:count].tolist():
        offset = int(torch.randint(1, max_distance + 1, (1,), generator=generator))
        other = min(n - 1, pos + offset)
        out[pos], out[other] = out[other].clone(), out[pos].clone()
    return out


def offset_positions(n: int, fraction: float, max_distance: int, generator: torch.Generator) -> torch.Tensor:
    """Position ids ``0..n−1`` with ``round(fraction·n)`` of them moved by a non-zero offset in ``[−l, l]``."""
    positions = torch.arange(n)
    count = round(fraction * n)
    chosen = torch.randperm(n, generator=generator)[:count]
    magnitude = torch.randint(1, max_distance + 1, (count,), generator=generator)
    sign = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
    positions[chosen] = (positions[chosen] + sign * magnitude).clamp_min(0)
    return positions


@torch.no_grad()
def token_nll(model: nn.Module, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token negative log-likelihood of every target of one window ``ids [S]``: ``[S − 1]`` (entry t scores
    token t + 1), fp32 on the CPU."""
    logits = forward(model, ids[None], None if position_ids is None else position_ids[None]).logits[0, :-1].float()
    return torch.nn.functional.cross_entropy(logits, ids[1:].to(logits.device), reduction="none").cpu()


# Tokens a batched forward of :func:`windows_token_nll` holds at most: the logits' peak ([tokens, vocabulary] in fp32,
# 1 GB at a 128k vocabulary) stays that of one window of the paper's 2,048 tokens; a longer window runs alone, as
# :func:`token_nll` runs it.
BATCH_TOKENS = 2048


@torch.no_grad()
def windows_token_nll(model: nn.Module, chunks: Sequence[torch.Tensor],
                      positions: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """:func:`token_nll` of every window ``chunks[i]`` (with position ids ``positions[i]`` or None), as a list in
    the same order; windows of one length (and all with or all without position ids) run as one batch of at most
    :data:`BATCH_TOKENS` tokens. A window's row of a batch sees only itself (causal attention, no padding), so each
    entry equals ``token_nll`` of that window alone (the readable one-window reference) up to the summation order of
    the batched matrix products."""
    if len(positions) != len(chunks):
        raise ValueError(f"positions must give one entry (a tensor or None) per window: {len(chunks)} windows, "
                         f"{len(positions)} entries.")
    for i, (chunk, pos) in enumerate(zip(chunks, positions)):
        if chunk.dim() != 1 or chunk.numel() == 0:
            raise ValueError(f"window {i} must be a non-empty 1-D tensor of token ids, got shape {tuple(chunk.shape)}.")
        if pos is not None and pos.shape != chunk.shape:
            raise ValueError(f"window {i} has {chunk.numel()} tokens but {tuple(pos.shape)} position ids; give one "
                             "position id per token, or None.")
    out: list[torch.Tensor | None] = [None] * len(chunks)
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, (chunk, pos) in enumerate(zip(chunks, positions)):
        groups.setdefault((chunk.numel(), pos is None), []).append(i)
    for (length, no_positions), members in groups.items():
        per_batch = max(1, BATCH_TOKENS // length)
        for first in range(0, len(members), per_batch):
            batch = members[first:first + per_batch]
            ids = torch.stack([chunks[i] for i in batch])
            pos = None if no_positions else torch.stack([positions[i] for i in batch])
            logits = forward(model, ids, pos).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:].to(logits.device),
                                                    reduction="none").cpu()
            for row, i in enumerate(batch):
                out[i] = nll[row]
    return out  # type: ignore[return-value]


def window_nll(model: nn.Module, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> tuple[float, int]:
    """Summed next-token negative log-likelihood of one window ``ids [S]`` and the number of predictions."""
    return float(token_nll(model, ids, position_ids).sum()), ids.numel() - 1


def perturb(chunk: torch.Tensor, mode: str | None, fraction: float, max_distance: int, generator: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(the window's ids, its position ids or None, which of its ``S − 1`` targets were not perturbed): a target is
    perturbed where its token moved (``transpose``) or its position id did (``position_offset``)."""
    positions, moved = None, torch.zeros(chunk.numel(), dtype=torch.bool)
    if mode == "transpose" and fraction > 0:
        perturbed = transpose_tokens(chunk, fraction, max_distance, generator)
        moved, chunk = perturbed != chunk, perturbed
    elif mode == "position_offset" and fraction > 0:
        positions = offset_positions(chunk.numel(), fraction, max_distance, generator)
        moved = positions != torch.arange(chunk.numel())
    return chunk, positions, ~moved[1:]


def _check_perturbation(mode: str | None, fraction: float, max_distance: int, score: str) -> None:
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} or None, got {mode!r}.")
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction is a share of the tokens and must be in [0, 1], got {fraction}.")
    if max_distance < 1:
        raise ValueError(f"max_distance must be >= 1, got {max_distance}.")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}.")


@torch.no_grad()
def perplexity(
    model: nn.Module, input_ids: torch.Tensor, window: int = 512, mode: str | None = None, fraction: float = 0.0,
    max_distance: int = 1, seed: int = 0, score: str = "all",
) -> float:
    """Perplexity over non-overlapping windows, optionally perturbed (``mode`` in :data:`MODES`); ``score``
    ``"unperturbed"`` leaves out the perturbed targets."""
    _check_perturbation(mode, fraction, max_distance, score)
    ids = check_ids(input_ids, 2, "perplexity")[0]
    g = torch.Generator().manual_seed(seed)
    drawn = [perturb(ids[start:end], mode, fraction, max_distance, g) for start, end in windows(ids.numel(), window)]
    total, count = 0.0, 0
    for nll, (_, _, kept) in zip(windows_token_nll(model, [d[0] for d in drawn], [d[1] for d in drawn]), drawn):
        if score == "unperturbed":
            nll = nll[kept]
        total, count = total + float(nll.sum()), count + nll.numel()
    return math.exp(total / count)


@torch.no_grad()
def paired_perplexities(
    model: nn.Module, input_ids: torch.Tensor, window: int, mode: str, fraction: float, max_distance: int,
    seed: int, clean: Sequence[torch.Tensor] | None = None,
) -> tuple[float, float]:
    """(perturbed, unperturbed) perplexity over the same targets, those the perturbation left alone (the paper's
    scoring): the unperturbed text's per-target NLLs (``clean``, one tensor per window; computed when None) are
    averaged over the targets each draw kept."""
    _check_perturbation(mode, fraction, max_distance, "unperturbed")
    ids = check_ids(input_ids, 2, "paired_perplexities")[0]
    spans = list(windows(ids.numel(), window))
    clean = clean if clean is not None else windows_token_nll(model, [ids[a:b] for a, b in spans], [None] * len(spans))
    g = torch.Generator().manual_seed(seed)
    drawn = [perturb(ids[start:end], mode, fraction, max_distance, g) for start, end in spans]
    perturbed = windows_token_nll(model, [d[0] for d in drawn], [d[1] for d in drawn])
    perturbed_total, clean_total, count = 0.0, 0.0, 0
    for nll, reference, (_, _, kept) in zip(perturbed, clean, drawn):
        perturbed_total += float(nll[kept].sum())
        clean_total += float(reference[kept].sum())
        count += int(kept.sum())
    return math.exp(perturbed_total / count), math.exp(clean_total / count)


@dataclass
class PerturbationPoint:
    mode: str
    fraction: float
    max_distance: int
    perplexity: float
    perplexity_std: float
    trials: int
    baseline_same_targets: float | None = None  # score "unperturbed": the clean text over the same targets (mean)


@dataclass
class PerturbationResult(ResultMixin):
    analysis = "perturbation"
    model: str
    baseline_perplexity: float
    window: int
    tokens: int
    points: list[PerturbationPoint] = field(default_factory=list)
    score: str = "all"  # "unperturbed": perturbed targets left out, each point paired with the clean text


def perturbation_tolerance(
    model: nn.Module, input_ids: torch.Tensor, *, modes: Sequence[str] = MODES,
    fractions: Sequence[float] = (0.01, 0.05, 0.1), max_distances: Sequence[int] = (5, 10),
    trials: int = 2, window: int = 512, seed: int = 0, name: str = "", progress: bool = True, score: str = "all",
) -> PerturbationResult:
    """Perplexity under every (mode, fraction, max distance), ``trials`` random draws each (§4.1); with ``score``
    ``"unperturbed"`` over the targets each draw left alone, beside the clean text's over the same ones."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty subset of {MODES}, got {list(modes)}.")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}.")
    _check_perturbation(None, 0.0, 1, score)
    ids = check_ids(input_ids, 2, "perturbation_tolerance")
    for distance in max_distances:
        if distance >= min(window, ids.shape[1]):
            raise ValueError(
                f"max_distance {distance} does not fit in a window of {min(window, ids.shape[1])} tokens; use a "
                "longer text/window or a smaller distance."
            )
    model.eval()
    row = ids[0]
    spans = list(windows(row.numel(), window))
    clean = windows_token_nll(model, [row[a:b] for a, b in spans], [None] * len(spans))
    baseline = math.exp(sum(float(c.sum()) for c in clean) / sum(c.numel() for c in clean))
    grid = [(m, f, d) for m in modes for f in fractions for d in max_distances]
    points = []
    for mode, fraction, distance in tqdm(grid, desc="perturbation", disable=not progress):
        if score == "unperturbed":
            pairs = torch.tensor([paired_perplexities(model, ids, window, mode, fraction, distance, seed + t, clean)
                                  for t in range(trials)], dtype=torch.float64)
            values, same = pairs[:, 0], float(pairs[:, 1].mean())
        else:
            values = torch.tensor([perplexity(model, ids, window, mode, fraction, distance, seed + t)
                                   for t in range(trials)], dtype=torch.float64)
            same = None
        std = float(values.std()) if trials > 1 else 0.0
        points.append(PerturbationPoint(mode, float(fraction), int(distance), float(values.mean()), std, trials, same))
    return PerturbationResult(model=name, baseline_perplexity=baseline, window=window, tokens=ids.shape[1],
                              points=points, score=score)


def plot_perturbation(results: PerturbationResult | Mapping[str, PerturbationResult], path: str | os.PathLike) -> str:
    """Perplexity increase over the baseline against the perturbed fraction, one panel per mode."""
    named = normalise_named(results, PerturbationResult)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(MODES), figsize=(11, 3.8), squeeze=False)
    for ax, mode in zip(axes[0], MODES):
        for name, res in named.items():
            for distance in sorted({p.max_distance for p in res.points if p.mode == mode}):
                pts = sorted((p for p in res.points if p.mode == mode and p.max_distance == distance), key=lambda p: p.fraction)
                ax.errorbar([p.fraction for p in pts], [p.perplexity - res.baseline_perplexity for p in pts],
                            yerr=[p.perplexity_std for p in pts], marker="o", capsize=2, label=f"{name}, l={distance}")
        ax.set_title(mode.replace("_", " "), fontsize=9)
        ax.set_xlabel("fraction of tokens perturbed γ")
        ax.set_ylabel("perplexity − baseline")
        ax.axhline(0, color="k", lw=0.6)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("Tolerance to position perturbations (position-generalization §4.1)")
    return save_figure(fig, path)
