"""Long-term decay of semantic attention (CoPE paper, eq. 6 / Thm 3.2, Fig. 3) and the ringing of hard clipping
(CoPE paper, eq. 9 / Thm 4.1, Fig. 4), for any frequency set.

For i.i.d. query/key components of standard deviation σ and a similar key k′ = q + ε,

    E[qᵀR_Δt k′ − qᵀR_Δt k] = 2σ² Σ_i cos(Δt·θ_i)                                    (eq. 6)

for *any* frequency set θ (RoPE, CoPE, HardClip, p-RoPE, YaRN…: pass the model's ``inv_freq``). The empirical gap
is measured with random Gaussian vectors rotated with those frequencies.

**Clipping.** CoPE (eq. 10) multiplies the lowest ``c`` frequencies by a cosine taper w_j ∈ [0, 1]; HardClip sets
them to 0. Only those ``c`` terms of eq. 6 change, so each scheme's difference to RoPE,

    E(Δt) = Σ_{clipped j} [cos(Δt·w_j·θ_j) − cos(Δt·θ_j)]    (w_j = 0 for HardClip),

is the error term of Thm 4.1 (eq. 9) evaluated on the real, discrete spectrum. A hard cut makes it ring (oscillate)
at the cut θ_c (the fastest frequency it zeroes; period 2π/θ_c); the taper makes it rise smoothly. The full curves hide
this: their unclipped terms, identical for all three, oscillate fast and never die out for a head's 32 or 64
frequencies (they dephase, they do not decay). :func:`clipping_comparison` therefore reports the differences, over
a few periods 2π/θ_c (beyond a model's context when its base is large), and :func:`ringing_index` of each.

**Smoothing.** Every curve here is a sum of cosines, so a moving average has a closed form too: the Gaussian
average (standard deviation s tokens) of cos(θ·(Δt + u)) is cos(θ·Δt)·exp(−θ²s²/2). :func:`smoothed_closed_form_gap`
and ``empirical_gap(..., smooth=s)`` apply it exactly, at any grid spacing (no aliasing of the fast terms).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..schemes.cope import CoPEConfig, taper_weights
from .capture import check_layers, layer_frequencies
from .results import ResultMixin, normalise_named, pyplot, save_figure
from .rope_math import chunk_products, rotate

CLIPPING_LABELS = ("RoPE", "HardClip", "CoPE")


def gaussian_factors(inv_freq: torch.Tensor, smooth: float) -> torch.Tensor:
    """exp(−θ²s²/2) per frequency: what a Gaussian moving average of std ``smooth`` tokens does to cos(Δt·θ)."""
    if smooth < 0 or not math.isfinite(smooth):
        raise ValueError(f"smooth must be a finite number of tokens >= 0, got {smooth}.")
    return torch.exp(-0.5 * (inv_freq.double() * smooth) ** 2)


def closed_form_gap(inv_freq: torch.Tensor, distances: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """2σ²·Σ_i cos(Δt·θ_i) for every Δt in ``distances`` (CoPE paper, eq. 6 / Thm 3.2), float64."""
    angles = distances.double()[:, None] * inv_freq.double()[None]
    return 2 * sigma**2 * torch.cos(angles).sum(-1)


def smoothed_closed_form_gap(
    inv_freq: torch.Tensor, distances: torch.Tensor, smooth: float, sigma: float = 1.0,
) -> torch.Tensor:
    """eq. 6 (CoPE paper, Thm 3.2) averaged over a Gaussian window of std ``smooth`` tokens around each Δt:
    2σ²·Σ_i cos(Δt·θ_i)·exp(−θ_i²·smooth²/2) (exact; ``smooth=0`` is :func:`closed_form_gap`)."""
    angles = distances.double()[:, None] * inv_freq.double()[None]
    return 2 * sigma**2 * (torch.cos(angles) * gaussian_factors(inv_freq, smooth)).sum(-1)


def _random_pairs(n_dim: int, samples: int, sigma: float, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = (sigma * torch.randn(samples, n_dim, generator=g, dtype=torch.float64) for _ in range(2))
    similar = q + noise * torch.randn(samples, n_dim, generator=g, dtype=torch.float64)
    return q, k, similar


def empirical_gap(
    inv_freq: torch.Tensor, distances: torch.Tensor, sigma: float = 1.0, samples: int = 4096, noise: float = 0.5,
    seed: int = 0, smooth: float = 0.0,
) -> torch.Tensor:
    """Sample mean of qᵀR_Δt k′ − qᵀR_Δt k over random Gaussian q, k and k′ = q + ε (ε ~ N(0, noise²)).

    The rotation is linear, so the mean is taken per chunk once (cosine and sine coefficients) and evaluated at
    every Δt; :func:`empirical_gap_reference` rotates explicitly. ``smooth`` > 0 returns the Gaussian moving
    average (std ``smooth`` tokens) of that mean, exactly (each chunk's terms times exp(−θ²·smooth²/2))."""
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}.")
    q, k, similar = _random_pairs(2 * inv_freq.numel(), samples, sigma, noise, seed)
    c_sim, s_sim = chunk_products(q, similar)
    c_rnd, s_rnd = chunk_products(q, k)
    g = gaussian_factors(inv_freq, smooth)
    c, s = (c_sim - c_rnd).mean(0) * g, (s_sim - s_rnd).mean(0) * g
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
    """Total upward variation of ``curve`` after its first local minimum (0 for a monotone curve).

    ``smooth`` > 1 first takes a moving average over that many points, which removes the fast wiggles of the
    highest frequencies and keeps the slow Gibbs ringing of a low-frequency cut (period 2π/θ_c)."""
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


def default_clip_low_n(n_freq: int) -> int:
    """CoPE's default number of clipped frequencies for ``n_freq`` of them (the paper's 20 of 64, scaled)."""
    return CoPEConfig().resolved(2 * n_freq).clip_low_n


def clipped_frequency_sets(inv_freq: torch.Tensor, clip_low_n: int | None = None) -> dict[str, torch.Tensor]:
    """``{"RoPE": θ, "HardClip": θ·𝟏[kept], "CoPE": θ·w}``: what ``patch_model(m, "hardclip")`` and
    ``patch_model(m, "cope")`` make of the frequencies θ (same taper code, :func:`hf_posenc.schemes.cope.taper_weights`,
    on the last ``clip_low_n`` indices, i.e. the lowest frequencies in Transformers' order; CoPE paper eq. 10)."""
    theta = torch.as_tensor(inv_freq, dtype=torch.float64).flatten()
    n = theta.numel()
    c = default_clip_low_n(n) if clip_low_n is None else clip_low_n
    return {"RoPE": theta, "HardClip": theta * taper_weights(n, c, hard=True), "CoPE": theta * taper_weights(n, c)}


@dataclass
class ClippingComparison:
    """Closed forms (eq. 6) of RoPE, HardClip and CoPE on one frequency set, normalised by 2σ²·n.

    Attributes:
        clip_low_n: how many of the lowest frequencies HardClip zeroes and CoPE tapers.
        cut_frequency / cut_period: θ_c, the fastest frequency HardClip zeroes (the cut of Thm 4.1's high-pass
            filter), and 2π/θ_c in tokens: the period of its ringing.
        distances: Δt grid, 0 to ``periods`` × ``cut_period``.
        smooth: std (tokens) of the Gaussian moving average applied to ``curves``.
        curves: smoothed closed forms per scheme (:data:`CLIPPING_LABELS`).
        differences: exact (unsmoothed) HardClip − RoPE and CoPE − RoPE: only the clipped, slow terms, so no
            smoothing is needed; Thm 4.1's error term E(Δt) on the discrete spectrum.
        ringing: :func:`ringing_index` of each difference (0 = rises without oscillating).
    """

    clip_low_n: int
    cut_frequency: float
    cut_period: float
    periods: float
    distances: list[int]
    smooth: float
    curves: dict[str, list[float]]
    differences: dict[str, list[float]]
    ringing: dict[str, float]


def clipping_comparison(
    inv_freq: torch.Tensor, clip_low_n: int | None = None, *, periods: float = 3.0, points: int = 512,
    smooth: float | None = None,
) -> ClippingComparison:
    """RoPE vs HardClip vs CoPE on the frequencies ``inv_freq`` (CoPE paper, eq. 6 / Thm 3.2 for the curves,
    eq. 9 / Thm 4.1 for the ringing of the differences, eq. 10 for the taper).

    Δt runs over ``periods`` periods 2π/θ_c of the fastest frequency HardClip zeroes; ``smooth`` (default
    2π/θ_c / 16 tokens) is the Gaussian moving average of the full curves. Over those periods HardClip − RoPE
    oscillates and CoPE − RoPE rises monotonically (ringing index 0) for RoPE bases 10⁴–10⁷ and 16–128
    frequencies; further out CoPE's few discrete tapered terms start to beat too."""
    sets = clipped_frequency_sets(inv_freq, clip_low_n)
    theta, hard = sets["RoPE"], sets["HardClip"]
    if not (theta > 0).all():
        raise ValueError("clipping_comparison needs frequencies > 0 (a set with zeros is already clipped).")
    n, c = theta.numel(), int((hard == 0).sum())
    if not 0 < c < n:
        raise ValueError(f"clip_low_n must leave at least one of {n} frequencies and clip at least one, got {c}.")
    if periods <= 0 or points < 3:
        raise ValueError("periods must be > 0 and points >= 3.")
    cut = float(theta[(hard == 0) & (theta > 0)].max())
    period = 2 * math.pi / cut
    smooth = period / 16 if smooth is None else float(smooth)
    distances = torch.unique(torch.linspace(0, periods * period, points).round().long())
    norm = 2.0 * n
    raw = {label: closed_form_gap(f, distances) / norm for label, f in sets.items()}
    curves = {label: (smoothed_closed_form_gap(f, distances, smooth) / norm).tolist() for label, f in sets.items()}
    diffs = {label: raw[label] - raw["RoPE"] for label in CLIPPING_LABELS[1:]}
    return ClippingComparison(
        clip_low_n=c, cut_frequency=cut, cut_period=period, periods=periods, distances=distances.tolist(),
        smooth=smooth, curves=curves, differences={k: v.tolist() for k, v in diffs.items()},
        ringing={k: ringing_index(v) for k, v in diffs.items()},
    )


@dataclass
class SemanticDecayResult(ResultMixin):
    """Closed-form and empirical semantic gap per frequency set (normalised: divided by 2σ²·n_freq).

    ``curves``/``empirical`` are the raw values at ``distances``; ``smoothed``/``empirical_smoothed`` their Gaussian
    moving averages (std ``smooth`` tokens). ``ringing`` is :func:`ringing_index` of each raw curve after a
    ``ringing_smooth``-point moving average (for a head's few frequencies it mostly counts the fast terms that never
    decay; the clipping ringing is in ``clipping``). ``clipping`` holds, for every set without zero frequencies,
    the RoPE / HardClip / CoPE comparison on those frequencies (:func:`clipping_comparison`)."""

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
    smooth: float = 0.0
    smoothed: dict[str, list[float]] = field(default_factory=dict)
    empirical_smoothed: dict[str, list[float]] = field(default_factory=dict)
    clipping: dict[str, ClippingComparison] = field(default_factory=dict)


def semantic_decay(
    frequency_sets: Mapping[str, torch.Tensor], distances: torch.Tensor | None = None, *, max_distance: int = 32768,
    points: int = 2048, sigma: float = 1.0, samples: int = 4096, noise: float = 0.5, seed: int = 0,
    ringing_smooth: int = 16, smooth: float | None = None, clipping: bool = True, clip_low_n: int | None = None,
    name: str = "",
) -> SemanticDecayResult:
    """Decay curves (CoPE paper, eq. 6 / Thm 3.2) and the empirical gap for named frequency sets, e.g.
    ``{"rope": θ, "cope": θ′}``.

    Curves are reported normalised by their value at Δt = 0 for full RoPE (2σ²·n_freq), so 1 = perfect
    preference for the similar key and 0 = none. ``smooth`` (default: the largest Δt / 64) is the std in tokens of
    the Gaussian moving average behind ``smoothed`` and ``empirical_smoothed``. ``clipping`` adds
    :func:`clipping_comparison` (``clip_low_n``, default CoPE's) for every set whose frequencies are all > 0."""
    if not frequency_sets:
        raise ValueError("pass at least one named frequency set.")
    if distances is None:
        if max_distance < 1 or points < 2:
            raise ValueError("max_distance must be >= 1 and points >= 2.")
        distances = torch.unique(torch.linspace(0, max_distance, points).round().long())
    smooth = float(distances.max()) / 64 if smooth is None else float(smooth)
    curves, emp, err, ring, freqs, smoothed, emp_smoothed, clip = {}, {}, {}, {}, {}, {}, {}, {}
    for label, inv_freq in frequency_sets.items():
        inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64).flatten()
        if inv_freq.numel() == 0 or not torch.isfinite(inv_freq).all() or (inv_freq < 0).any():
            raise ValueError(f"{label!r}: frequencies must be a non-empty set of finite values >= 0.")
        norm = 2 * sigma**2 * inv_freq.numel()
        closed = closed_form_gap(inv_freq, distances, sigma) / norm
        measured = empirical_gap(inv_freq, distances, sigma, samples, noise, seed) / norm
        curves[label], emp[label] = closed.tolist(), measured.tolist()
        smoothed[label] = (smoothed_closed_form_gap(inv_freq, distances, smooth, sigma) / norm).tolist()
        emp_smoothed[label] = (empirical_gap(inv_freq, distances, sigma, samples, noise, seed, smooth) / norm).tolist()
        err[label] = float((closed - measured).abs().max())
        ring[label] = ringing_index(closed, ringing_smooth)
        freqs[label] = inv_freq.tolist()
        n = inv_freq.numel()
        c = default_clip_low_n(n) if clip_low_n is None else clip_low_n
        if clipping and (inv_freq > 0).all() and 0 < c < n:
            clip[label] = clipping_comparison(inv_freq, c)
    return SemanticDecayResult(
        model=name, distances=distances.tolist(), sigma=sigma, samples=samples, curves=curves, empirical=emp,
        max_abs_error=err, ringing=ring, frequencies=freqs, smooth=smooth, smoothed=smoothed,
        empirical_smoothed=emp_smoothed, clipping=clip,
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


def _first_clipping(named: Mapping[str, SemanticDecayResult]) -> tuple[str, ClippingComparison] | None:
    for name, res in named.items():
        for label, comparison in res.clipping.items():
            return (name if len(res.curves) == 1 else f"{name} · {label}"), comparison
    return None


def _thousands(x: float) -> str:
    return f"{x / 1000:.0f}k" if x >= 10000 else f"{x:,.0f}"


def plot_semantic_decay(results: SemanticDecayResult | Mapping[str, SemanticDecayResult], path: str | os.PathLike) -> str:
    """Left (when a set without zero frequencies was analysed): RoPE, HardClip and CoPE closed forms on the first
    such set, smoothed, and their exact differences to RoPE (Thm 4.1's ringing). Right: every set of every result,
    closed form (lines) and empirical gap (dots), smoothed, and their differences to the first set."""
    named = normalise_named(results, SemanticDecayResult)
    plt = pyplot()
    reference = _first_clipping(named)
    columns = 2 if reference else 1
    fig, axes = plt.subplots(2, columns, figsize=(7.2 * columns, 7.2), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [1.4, 1]})
    if reference:
        source, cmp = reference
        top, bottom = axes[0, 0], axes[1, 0]
        d = torch.tensor(cmp.distances).numpy()
        colours = {"RoPE": "tab:blue", "HardClip": "tab:red", "CoPE": "tab:green"}
        for label in CLIPPING_LABELS:
            extra = "" if label == "RoPE" else (
                f" ({cmp.clip_low_n} lowest → 0)" if label == "HardClip" else f" ({cmp.clip_low_n} lowest tapered)")
            top.plot(d, cmp.curves[label], color=colours[label], lw=1.4, label=label + extra)
        for label, curve in cmp.differences.items():
            bottom.plot(d, curve, color=colours[label], lw=1.4,
                        label=f"{label} − RoPE (ringing index {cmp.ringing[label]:.3f})")
        span = max(max(res.distances) for res in named.values())  # the right panels' range, marked if inside
        for ax in (top, bottom):
            for k in range(1, int(cmp.periods) + 1):
                ax.axvline(k * cmp.cut_period, color="0.8", lw=0.6, zorder=0)
            if span < cmp.distances[-1]:
                ax.axvline(span, color="k", ls=":", lw=0.9)
            ax.axhline(0, color="k", lw=0.5)
        if span < cmp.distances[-1]:
            top.text(span, top.get_ylim()[1], f" right: Δt ≤ {_thousands(span)}", fontsize=7, va="top")
        top.set_title(f"Closed form (CoPE eq. 6) on {source}'s frequencies, smoothed (σ = {cmp.smooth:,.0f} tokens)",
                      fontsize=9)
        bottom.set_title(f"Difference to RoPE (exact; Thm 4.1): grey lines every 2π/θ_c = {cmp.cut_period:,.0f} "
                         "tokens", fontsize=9)
        top.set_ylabel("gap / (2σ²·n)")
        bottom.set_ylabel("difference to RoPE")
        bottom.set_xlabel("relative distance Δt")
        top.legend(fontsize=7)
        bottom.legend(fontsize=7, loc="lower right")
    top, bottom = axes[0, -1], axes[1, -1]
    first: tuple[list[int], list[float], list[float]] | None = None
    compared = False
    smooth = next(iter(named.values())).smooth
    for name, res in named.items():
        d = torch.tensor(res.distances).numpy()
        step = max(1, len(d) // 48)
        for label, curve in res.curves.items():
            tag = label if len(named) == 1 else (name if len(res.curves) == 1 else f"{name} · {label}")
            smoothed = res.smoothed.get(label) or curve
            measured = res.empirical_smoothed.get(label) or res.empirical[label]
            (line,) = top.plot(d, smoothed, lw=1.3, label=tag)
            top.plot(d[::step], measured[::step], "o", ms=2.5, color=line.get_color())
            if first is None:
                first, first_tag = (res.distances, smoothed, measured), tag
                top.plot(d, curve, lw=0.4, alpha=0.3, color=line.get_color(), zorder=0, label=f"{tag}, unsmoothed")
            elif res.distances == first[0]:
                diff = torch.tensor(smoothed) - torch.tensor(first[1])
                emp = torch.tensor(measured) - torch.tensor(first[2])
                bottom.plot(d, diff.numpy(), lw=1.3, color=line.get_color(), label=f"{tag} − {first_tag}")
                bottom.plot(d[::step], emp[::step].numpy(), "o", ms=2.5, color=line.get_color())
                compared = True
    for ax in (top, bottom):
        ax.axhline(0, color="k", lw=0.5)
    top.set_title(f"Sets analysed, smoothed (σ = {smooth:,.0f} tokens): lines closed form, dots Monte-Carlo",
                  fontsize=9)
    bottom.set_title("Difference to the first set (smoothed)", fontsize=9)
    top.set_ylabel("gap / (2σ²·n)")
    bottom.set_xlabel("relative distance Δt")
    top.legend(fontsize=7)
    if compared:
        bottom.legend(fontsize=7)
    fig.suptitle("Long-term decay of semantic attention (CoPE paper Thm 3.2) and the ringing of hard clipping "
                 "(Thm 4.1)", fontsize=10)
    return save_figure(fig, path)
