"""The few numbers that matter from each diagnostic, as Markdown lines (``hf-posenc diagnose`` writes them to
``summary.md`` beside the JSON/PNG files and prints them at the end).

One bullet per analysis: what the number is and which files hold the rest, then one sub-bullet per model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch


def _num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _frequency_usage(res: Any) -> str:
    q = res.layer_means("q").mean(0)  # [chunk], highest → lowest frequency
    parts = torch.tensor_split(q, min(4, q.numel()))
    means = [float(p.mean()) for p in parts]
    where = "lowest" if means[-1] == max(means) else "highest" if means[0] == max(means) else "middle"
    return " · ".join(_num(m) for m in means) + f" (largest in the {where} band)"


def _positional_heads(res: Any) -> str:
    total = len(res.layers) * len(res.heads)
    out = []
    for kind in ("diagonal", "previous_token", "high_frequency"):
        noun = kind.replace("_", "-")
        found = [f"{h.layer}.{h.head}" for h in res.found if kind in h.kinds]
        shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
        out.append(f"{len(found)} {noun}" + (f" ({shown})" if found else ""))
    return "; ".join(out) + f" of {total} heads"


def _disentanglement(res: Any) -> str:
    per_layer = torch.tensor(res.fake_distance_correlation, dtype=torch.float64).nanmean(1)
    text = (f"{_num(res.mean_fake_distance_correlation)} (layers {_num(float(per_layer.min()))}–"
            f"{_num(float(per_layer.max()))})")
    if res.mean_three_axis_correlation is not None:
        text += f"; 3-axis fit {_num(res.mean_three_axis_correlation)}"
    return text


def _distance_bias(res: Any) -> str:
    return f"μ {_num(res.pooled_mean)}, σ {_num(res.pooled_std)} (short {list(res.short)}, long {list(res.long)})"


def _semantic_decay(res: Any) -> str:
    out = []
    for label, curve in res.curves.items():
        tag = "" if len(res.curves) == 1 else f"{label}: "
        smoothed = res.smoothed.get(label) or curve
        text = f"{tag}{_num(smoothed[-1])} at Δt = {res.distances[-1]:,}"
        cmp = res.clipping.get(label)
        if cmp is not None:
            text += (f"; ringing of HardClip − RoPE {cmp.ringing['HardClip']:.3f} vs CoPE − RoPE "
                     f"{cmp.ringing['CoPE']:.3f} over Δt ≤ {cmp.distances[-1]:,}")
        out.append(text)
    return " | ".join(out)


def _perturbation(res: Any) -> str:
    text = f"{_num(res.baseline_perplexity, 4)} clean"
    for mode in dict.fromkeys(p.mode for p in res.points):
        worst = max((p for p in res.points if p.mode == mode), key=lambda p: p.perplexity)
        text += (f"; {mode.replace('_', ' ')} worst {_num(worst.perplexity, 4)} "
                 f"({worst.fraction:g} of tokens, ≤ {worst.max_distance} apart)")
    return text


def _phase_regime(res: Any) -> str:
    from .phase_regime import describe

    return describe(res)


# analysis -> (what the number is, the per-model finding)
HEADLINES: dict[str, tuple[str, Callable[[Any], str]]] = {
    "frequency_usage": ("mean query chunk norm per frequency band, highest → lowest", _frequency_usage),
    "positional_heads": ("heads found (layer.head)", _positional_heads),
    "disentanglement": ("fake-distance fit W′ ≈ a_d + b_j, mean correlation", _disentanglement),
    "distance_bias": ("Δ = logit(short) − logit(long) over the heads; μ > 0: near keys favoured", _distance_bias),
    "semantic_decay": ("normalised similar − random key gap (1 at Δt = 0), smoothed, at the largest Δt",
                       _semantic_decay),
    "perturbation": ("perplexity", _perturbation),
    "phase_regime": ("TAPA's median |phase at distance 1| (eq. 12), radians: near 0 the cosine is flat (cold); a "
                     "few radians tell neighbours apart", _phase_regime),
}


def summary_lines(results: Mapping[str, Mapping[str, Any]], written: Sequence[str] = ()) -> list[str]:
    """``results[analysis][model] = result`` -> Markdown bullets; ``written``: the files to point at (by name)."""
    lines = []
    for analysis, per_model in results.items():
        what, finding = HEADLINES[analysis]
        files = [os.path.basename(p) for p in written if os.path.basename(p).startswith(analysis + ".")]
        pointer = f" → {', '.join(f'`{f}`' for f in files)}" if files else ""
        lines.append(f"- **{analysis}**: {what}{pointer}")
        lines += [f"  - {name}: {finding(result)}" for name, result in per_model.items()]
    return lines


def write_summary(
    results: Mapping[str, Mapping[str, Any]], out_dir: str | os.PathLike, written: Sequence[str] = (),
    title: str = "hf-posenc diagnose: summary",
) -> tuple[str, list[str]]:
    """Write ``out_dir/summary.md``; returns its path and the bullet lines (what the command prints)."""
    lines = summary_lines(results, written)
    path = os.path.join(os.fspath(out_dir), "summary.md")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# {title}\n\n" + "\n".join(lines) + "\n")
    return path, lines
