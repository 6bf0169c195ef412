"""Write an :class:`~hf_posenc.evaluation.results.EvaluationResult` as JSON, a Markdown table and PNG plots.

Files in the output directory:

* ``results.json``: every measurement (loads back with ``EvaluationResult.load_json``);
* ``report.md``: perplexity per model × context length, passkey accuracy and lm-eval RULER scores per task × model
  × length;
* ``perplexity.png``: perplexity against context length, one line per model (log y when it spans decades);
* ``passkey.png``: passkey accuracy heatmaps over length × depth per model;
* ``ruler.png``: lm-eval RULER score heatmaps over length × task per model.

Plots use matplotlib's Agg canvas directly, so no display and no global backend switch is needed.
"""

from __future__ import annotations

import math
import os
from typing import Any

from .results import EvaluationResult


def _fmt(value: float, digits: int = 3) -> str:
    return "–" if value is None or math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.{digits}f}")


def markdown_report(result: EvaluationResult) -> str:
    """The Markdown tables of ``result``."""
    lines: list[str] = ["# Evaluation", ""]
    models = result.models()
    if result.perplexity:
        lengths = sorted({r.context_length for r in result.perplexity})
        lines += [f"## Perplexity: {result.perplexity[0].method}", ""]
        lines += ["| model | " + " | ".join(f"L={n}" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
        for m in models:
            cells = []
            for n in lengths:
                found = [r for r in result.perplexity if r.model == m and r.context_length == n]
                took = f", {found[0].seconds:.0f} s" if found and found[0].seconds is not None else ""
                cells.append(_fmt(found[0].perplexity) + f" (s={found[0].stride}{took})" if found else "–")
            if any(c != "–" for c in cells):
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    for task in result.tasks():
        lengths = sorted({t.length for t in result.retrieval if t.task == task})
        lines += [f"## {task}: exact-match accuracy (mean over depths and trials; partial score in brackets)", ""]
        lines += ["| model | " + " | ".join(f"L={n}" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
        for m in models:
            if not any(t.model == m and t.task == task for t in result.retrieval):
                continue
            cells = [f"{_fmt(result.mean_accuracy(m, task, n), 2)} "
                     f"({_fmt(result.mean_accuracy(m, task, n, 'score'), 2)})" for n in lengths]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    if result.lm_eval:
        lines += _lm_eval_tables(result)
    return "\n".join(lines)


def _lm_eval_tables(result: EvaluationResult) -> list[str]:
    """One table per lm-eval task: each model's mean score at each length."""
    version = result.settings.get("lm_eval_version", "?")
    lines: list[str] = []
    for task in result.lm_eval_tasks():
        rows = [s for s in result.lm_eval if s.task == task]
        lengths = sorted({s.length for s in rows})
        models = list(dict.fromkeys(s.model for s in rows))
        counts = sorted({sum(s.model == m and s.length == n for s in rows) for m in models for n in lengths})
        lines += [f"## {task} (lm-eval {version}, RULER): mean score, {'/'.join(map(str, counts))} samples per "
                  "length", ""]
        lines += ["| model | " + " | ".join(f"L={n}" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
        for m in models:
            cells = []
            for n in lengths:
                scores = [s.score for s in rows if s.model == m and s.length == n]
                cells.append(_fmt(sum(scores) / len(scores), 2) if scores else "–")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_perplexity(result: EvaluationResult, path: str | os.PathLike) -> str:
    """Perplexity against context length, one line per model (log y when the values span more than 3×)."""
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot()
    for m in result.models():
        rows = sorted((r.context_length, r.perplexity) for r in result.perplexity if r.model == m)
        if rows:
            ax.plot([x for x, _ in rows], [y if math.isfinite(y) else math.nan for _, y in rows], marker="o", label=m)
    lengths = sorted({r.context_length for r in result.perplexity})
    finite = [r.perplexity for r in result.perplexity if math.isfinite(r.perplexity) and r.perplexity > 0]
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    if finite and max(finite) > 3 * min(finite):  # extrapolation blow-ups span decades
        ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("Sliding-window perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(os.fspath(path), dpi=120)
    return os.fspath(path)


def plot_accuracy_heatmaps(result: EvaluationResult, task: str, path: str | os.PathLike, metric: str = "exact") -> str:
    """One heatmap per model of the mean ``metric`` over depth (rows) × context length (columns)."""
    models = [m for m in result.models() if any(t.model == m and t.task == task for t in result.retrieval)]
    if not models:
        raise ValueError(f"no {task!r} trials in the result; nothing to plot")
    fig = _figure(1.0 + 3.2 * len(models), 3.4)
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    image = None
    for ax, m in zip(axes, models):
        lengths, depths, grid = result.accuracy_grid(m, task, metric)
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(m)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, _fmt(v, 2), ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=list(axes), label=f"{task} accuracy ({metric})")
    fig.savefig(os.fspath(path), dpi=120)
    return os.fspath(path)


def plot_lm_eval_heatmaps(result: EvaluationResult, path: str | os.PathLike) -> str:
    """One heatmap per model of the mean lm-eval score over task (rows) × context length (columns)."""
    models = [m for m in result.models() if any(s.model == m for s in result.lm_eval)]
    if not models:
        raise ValueError("no lm-eval samples in the result; nothing to plot")
    tasks = result.lm_eval_tasks()
    fig = _figure(1.5 + 3.2 * len(models), 1.6 + 0.35 * len(tasks))
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    image = None
    for ax, m in zip(axes, models):
        tasks, lengths, grid = result.lm_eval_grid(m)
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45)
        ax.set_yticks(range(len(tasks)), tasks)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(m)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, _fmt(v, 2), ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=list(axes), label="lm-eval RULER score")
    fig.savefig(os.fspath(path), dpi=120)
    return os.fspath(path)


def write_report(result: EvaluationResult, out_dir: str | os.PathLike) -> list[str]:
    """Write ``results.json``, ``report.md`` and the plots into ``out_dir``; returns the written paths."""
    out_dir = os.fspath(out_dir)
    written = [result.save_json(os.path.join(out_dir, "results.json"))]  # write_json creates out_dir
    md = os.path.join(out_dir, "report.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(markdown_report(result))
    written.append(md)
    if result.perplexity:
        written.append(plot_perplexity(result, os.path.join(out_dir, "perplexity.png")))
    for task in result.tasks():
        written.append(plot_accuracy_heatmaps(result, task, os.path.join(out_dir, f"{task}.png")))
    if result.lm_eval:
        written.append(plot_lm_eval_heatmaps(result, os.path.join(out_dir, "ruler.png")))
    return written
