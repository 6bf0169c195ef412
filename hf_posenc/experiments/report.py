"""Writing an experiment's results: ``results.json`` (everything, including the rerun command), ``results.md``
(the table of mean ± sd) and a PNG plot of held-out loss against evaluation length."""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..results_io import pyplot, write_json
from .runner import Summary, fingerprint
from .why import why_section

__all__ = ["fmt", "markdown_table", "plot_summary", "write_results", "closing_lines"]


def fmt(mean: float, sd: float, digits: int = 3) -> str:
    """``"1.234 ± 0.012"`` (``"inf"`` for diverged values)."""
    if math.isinf(mean) or math.isnan(mean):
        return str(mean)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def markdown_table(summary: Summary, length_names: Sequence[str], floors: dict[str, float]) -> str:
    """Rows: schemes, then the floors; columns: evaluation lengths (held-out nats/byte, mean ± sd), train loss,
    time per run. The best mean in each column is bold."""
    head = ["scheme", *length_names, "final train loss", "s / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best = {n: min(row[n][0] for row in summary.rows.values()) for n in summary.lengths}
    for label, row in summary.rows.items():
        cells = [f"**{fmt(*row[n])}**" if row[n][0] == best[n] else fmt(*row[n]) for n in summary.lengths]
        train = fmt(*summary.train_loss[label]) if label in summary.train_loss else "n/a"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {train} | {summary.seconds[label]:.0f} |")
    for name, value in floors.items():
        lines.append(f"| *{name} floor* | " + " | ".join(f"{value:.3f}" for _ in summary.lengths) + " | | |")
    return "\n".join(lines)


def plot_summary(summary: Summary, path: str | Path, title: str, floors: dict[str, float], trained_length: int) -> None:
    """Held-out loss against evaluation length, one line per scheme with ±sd error bars, floors dashed, the trained
    length dotted."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, row in summary.rows.items():
        xs = [n for n in summary.lengths if math.isfinite(row[n][0])]
        ax.errorbar(xs, [row[n][0] for n in xs], yerr=[0.0 if math.isnan(row[n][1]) else row[n][1] for n in xs],
                    marker="o", capsize=3, label=label)
    for name, value in floors.items():
        ax.axhline(value, linestyle="--", color="grey", linewidth=1)
        ax.annotate(f"{name} floor", (summary.lengths[0], value), textcoords="offset points", xytext=(2, 3),
                    fontsize=8, color="grey")
    ax.axvline(trained_length, linestyle=":", color="black", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(summary.lengths, [str(n) for n in summary.lengths])
    ax.set_xlabel("evaluation context length (bytes)")
    ax.set_ylabel("held-out loss (nats / byte)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


TOKENIZER = "byte-level (256 bytes + <|endoftext|>), see hf_posenc.experiments.tokenizer"


def write_results(out: Path, experiment: str, command: str, config: dict[str, Any], corpus: str, units: str,
                  floors: dict[str, float], results: Sequence[dict[str, Any]], elapsed: float,
                  **fields: Any) -> dict[str, Any]:
    """Write ``out/results.json`` and return it: what was run (command, config and its fingerprint, corpus,
    tokenizer, units, floors), the experiment's own ``fields``, then its runs (without their model directories),
    the times and the machine (Python, torch, threads, platform)."""
    import torch

    payload = {
        "experiment": experiment, "command": command, "config": config, "config_fingerprint": fingerprint(config),
        "corpus": corpus, "tokenizer": TOKENIZER, "units": units, "floors": floors, **fields,
        "runs": [{k: v for k, v in r.items() if k != "model_dir"} for r in results],
        "wall_seconds": elapsed,
        "seconds_in_runs": sum(r["seconds"] for r in results),
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform()},
    }
    write_json(payload, out / "results.json")
    return payload


def closing_lines(verdict: Sequence[str], why: Any, window: int, wall: str) -> list[str]:
    """The end of every ``results.md``: the verdict as a list, the diagnostics section, the wall time and the
    plot."""
    return [*[f"- {line}" for line in verdict], "", *why_section(why, window), wall, "",
            "![held-out loss](heldout_loss.png)", ""]
