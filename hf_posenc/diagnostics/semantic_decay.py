"""Long-term decay of semantic attention (cope-clipped-rope Theorem 3.2 eq. 6, Fig. 3) and clipping ringing (Fig. 4).

For i.i.d. query/key components of standard deviation σ and a similar key k′ = q + ε,

    E[qᵀR_Δt k′ − qᵀR_Δt k] = 2σ² Σ_i cos(Δt·θ_i)                                    (eq. 6)

for *any* frequency set θ (RoPE, CoPE, HardClip, p-RoPE, YaRN…: pass the model's ``inv_freq``). The empirical gap
is measured with random Gaussian vectors. Ringing (Theorem 4.1: a hard spectral cut convolves the signal with a
slowly decaying sinc) shows as a curve that rises again after falling; :func:`ringing_index` measures it as the
total upward variation after the first local minimum, normalised by the number of frequencies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .capture import check_layers, layer_frequencies
from .results import ResultMixin, normalise_named, pyplot, save_figure
from .rope_math import chunk_products, rotate


def closed_form_gap(inv_freq: torch.Tensor, distances: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """2σ²·Σ_i cos(Δt·θ_i) for every Δt in ``distances`` (eq. 6), float64."""
    angles = distances.double()[:, None] * inv_freq.double()[None]
    return 2 * sigma**2 * torch.cos(angles).sum(-1)


def _random_pairs(n_dim: int, samples: int, sigma: float, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = (sigma * torch.randn(samples, n_dim, generator=g, dtype=torch.float64) for _ in range(2))
    similar = q + noise * torch.randn(samples, n_dim, generator=g, dtype=torch.float64)
    return q, k, similar


def empirical_gap(
    inv_freq: torch.Tensor, distances: torch.Tensor, sigma: float = 1.0, samples: int = 4096, noise: float = 0.5,
    seed: int = 0,
) -> torch.Tensor:
    """Sample mean of qᵀR_Δt k′ − qᵀR_Δt k over random Gaussian q, k and k′ = q + ε (ε ~ N(0, noise²)).

    The rotation is linear, so the mean is taken per chunk once (cosine and sine coefficients) and evaluated at
    every Δt; :func:`empirical_gap_reference` rotates explicitly.
    """
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}.")
    q, k, similar = _random_pairs(2 * inv_freq.numel(), samples, sigma, noise, seed)
    c_sim, s_sim = chunk_products(q, similar)
    c_rnd, s_rnd = chunk_products(q, k)
    c, s = (c_sim - c_rnd).mean(0), (s_sim - s_rnd).mean(0)
    angles = distances.double()[:, None] * inv_freq.double()[None]
    return (torch.cos(angles) * c + torch.sin(angles) * s).sum(-1)


def empirical_gap_reference(
    inv_freq: torch.Tensor, distances: torch.Tensor, sigma: float = 1.0, samples: int = 4096, noise: float = 0.5,
    seed: int = 0,
) -> torch.Tensor:
    """Reference: rotate the query to position Δt and the keys to 0, take the dot products, average."""
    q, k, similar = _random_pairs(2 * inv_freq.numel(), samples, sigma, noise, seed)
    out = []
    for dt in distances.tolist():
        q_rot = rotate(q[:, None], torch.tensor([dt]), inv_freq)[:, 0]
        out.append(((q_rot * similar).sum(-1) - (q_rot * k).sum(-1)).mean())
    return torch.stack(out)


def ringing_index(curve: torch.Tensor, smooth: int = 1) -> float:
    """Total upward variation of ``curve`` after its first local minimum (0 for a curve that only decays).

    ``smooth`` > 1 first takes a moving average over that many points, which removes the fast wiggles of the
    highest frequencies and keeps the slow Gibbs ringing of a low-frequency cut (period 2π/θ_c).
    """
    curve = curve.double().flatten()
    if smooth > 1:
        if smooth > curve.numel():
            raise ValueError(f"smooth={smooth} exceeds the curve's {curve.numel()} points.")
        curve = torch.nn.functional.avg_pool1d(curve[None, None], smooth, 1).flatten()
    diff = torch.diff(curve)
    turns = ((diff[:-1] < 0) & (diff[1:] >= 0)).nonzero()
    if turns.numel() == 0:
        return 0.0
    return float(diff[int(turns[0, 0]) + 1 :].clamp_min(0).sum())


@dataclass
class SemanticDecayResult(ResultMixin):
    """Closed-form and empirical semantic gap per frequency set (normalised: divided by 2σ²·n_freq)."""

    analysis = "semantic_decay"
    model: str
    distances: list[int]
    sigma: float
    samples: int
    curves: dict[str, list[float]]
    empirical: dict[str, list[float]]
    max_abs_error: dict[str, float]
    ringing: dict[str, float]
    frequencies: dict[str, list[float]]


def semantic_decay(
    frequency_sets: Mapping[str, torch.Tensor], distances: torch.Tensor | None = None, *, max_distance: int = 32768,
    points: int = 2048, sigma: float = 1.0, samples: int = 4096, noise: float = 0.5, seed: int = 0,
    ringing_smooth: int = 16, name: str = "",
) -> SemanticDecayResult:
    """Decay curves (eq. 6) and the empirical gap for named frequency sets, e.g. ``{"rope": θ, "cope": θ′}``.

    Curves are reported normalised by their value at Δt = 0 for full RoPE (2σ²·n_freq), so 1 = perfect
    preference for the similar key and 0 = none. ``ringing`` is :func:`ringing_index` of each normalised curve
    (moving average over ``ringing_smooth`` grid points first).
    """
    if not frequency_sets:
        raise ValueError("pass at least one named frequency set.")
    if distances is None:
        if max_distance < 1 or points < 2:
            raise ValueError("max_distance must be >= 1 and points >= 2.")
        distances = torch.unique(torch.linspace(0, max_distance, points).round().long())
    curves, emp, err, ring, freqs = {}, {}, {}, {}, {}
    for label, inv_freq in frequency_sets.items():
        inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64).flatten()
        if inv_freq.numel() == 0 or not torch.isfinite(inv_freq).all() or (inv_freq < 0).any():
            raise ValueError(f"{label!r}: frequencies must be a non-empty set of finite values >= 0.")
        norm = 2 * sigma**2 * inv_freq.numel()
        closed = closed_form_gap(inv_freq, distances, sigma) / norm
        measured = empirical_gap(inv_freq, distances, sigma, samples, noise, seed) / norm
        curves[label], emp[label] = closed.tolist(), measured.tolist()
        err[label] = float((closed - measured).abs().max())
        ring[label] = ringing_index(closed, ringing_smooth)
        freqs[label] = inv_freq.tolist()
    return SemanticDecayResult(
        model=name, distances=distances.tolist(), sigma=sigma, samples=samples, curves=curves, empirical=emp,
        max_abs_error=err, ringing=ring, frequencies=freqs,
    )


def model_frequency_sets(model: nn.Module, layers: list[int] | None = None) -> dict[str, torch.Tensor]:
    """The distinct inverse-frequency sets of a model's layers: ``{"model": θ}`` when every layer shares one,
    else ``{"layers 0,2,4": θ, "layers 1,3": θ′}`` (Gemma3's local and global layers)."""
    groups: dict[tuple[float, ...], list[int]] = {}  # frequencies -> the layers that use them
    for layer in check_layers(model, layers):
        groups.setdefault(tuple(layer_frequencies(model, layer)[0].tolist()), []).append(layer)
    sets = {"layers " + ",".join(map(str, members)): torch.tensor(freqs, dtype=torch.float64)
            for freqs, members in groups.items()}
    return {"model": next(iter(sets.values()))} if len(sets) == 1 else sets


def plot_semantic_decay(results: SemanticDecayResult | Mapping[str, SemanticDecayResult], path: str | os.PathLike) -> str:
    """Closed-form curves (lines) and empirical gaps (dots) of every frequency set of every result."""
    named = normalise_named(results, SemanticDecayResult)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for name, res in named.items():
        d = torch.tensor(res.distances)
        for label, curve in res.curves.items():
            tag = label if len(named) == 1 else f"{name} · {label}"
            (line,) = ax.plot(d.numpy(), curve, lw=1.0, label=f"{tag} (ringing {res.ringing[label]:.2f})")
            step = max(1, len(d) // 64)
            ax.plot(d[::step].numpy(), res.empirical[label][::step], ".", ms=3, color=line.get_color())
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("relative distance Δt")
    ax.set_ylabel("similar − random key gap / (2σ²·n)")
    ax.set_title("Long-term decay of semantic attention (CoPE Thm 3.2 eq. 6): lines closed form, dots empirical", fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path)
