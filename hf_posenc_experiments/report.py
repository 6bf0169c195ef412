"""Writing an experiment's results: ``results.json`` (everything, including the rerun command), ``results.md``
(the table of mean ± sd, the tests of every comparison, one line per paper claim) and a PNG plot of held-out loss
against evaluation length.

``results.md`` is rendered from ``results.json`` alone (each experiment module's ``analyse`` and ``render``), so
:func:`rerender` rewrites it, and the analysis fields of the JSON (``verdict``, ``comparisons``, ``claims``), from
a committed ``results.json`` without training anything: ``hf-posenc experiment NAME --render-only --out DIR``.
"""

from __future__ import annotations

import importlib
import json
import math
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_posenc.results_io import dumps, pyplot, write_json
from .config import EXPERIMENT_CONFIGS
from .runner import Summary, fingerprint, mean_sd
from .stats import NO_DIFFERENCE, Difference, phrase, t_quantile
from .why import why_section

__all__ = ["fmt", "markdown_table", "plot_summary", "write_results", "make_payload", "closing_lines", "Tests",
           "plot_settings", "tied_with_best", "tests_explained", "config_of", "publish", "rerender", "ANALYSIS_FIELDS"]

# the JSON fields computed from the runs by an experiment's analyse() (rewritten by rerender)
ANALYSIS_FIELDS = ("verdict", "comparisons", "claims")
# a detected difference smaller than this (nats/byte, the precision of the tables) is called negligible
NEGLIGIBLE = 0.001


def fmt(mean: float, sd: float, digits: int = 3) -> str:
    """``"1.234 ± 0.012"`` (``"inf"`` for diverged values)."""
    if math.isinf(mean) or math.isnan(mean):
        return str(mean)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def tied_with_best(summary: Summary, negligible: float | None = None) -> dict[int, set[str]]:
    """Per length: the row with the lowest mean and every row whose difference from it has a 95 % interval
    containing 0 (:func:`.stats.compare`: paired by seed where the seeds match) or is smaller than ``negligible``
    (default :data:`NEGLIGIBLE`). Rows without per-seed values tie with nothing."""
    negligible = NEGLIGIBLE if negligible is None else negligible
    out = {}
    for n in summary.lengths:
        best = min(summary.rows, key=lambda label: summary.rows[label][n][0])
        tied = {best}
        if best in summary.values:
            for label in summary.rows:
                if label != best and label in summary.values and len(summary.values[label][n]) > 0:
                    diff = summary.diff(label, best, n)
                    if diff.finite and (not diff.detected or abs(diff.estimate) < negligible):
                        tied.add(label)
        out[n] = tied
    return out


def markdown_table(summary: Summary, length_names: Sequence[str], floors: dict[str, float]) -> str:
    """Rows: schemes, then the floors; columns: evaluation lengths (held-out nats/byte, mean ± sd), train loss,
    time per run. Bold in each column: the best mean and every row not detectably different from it
    (:func:`tied_with_best`)."""
    head = ["scheme", *length_names, "final train loss", "s / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    bold = tied_with_best(summary)
    for label, row in summary.rows.items():
        cells = [f"**{fmt(*row[n])}**" if label in bold[n] else fmt(*row[n]) for n in summary.lengths]
        train = fmt(*summary.train_loss[label]) if label in summary.train_loss else "n/a"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {train} | {summary.seconds[label]:.0f} |")
    for name, value in floors.items():
        lines.append(f"| *{name} floor* | " + " | ".join(f"{value:.3f}" for _ in summary.lengths) + " | | |")
    return "\n".join(lines)


TABLE_NOTE = ("bold: in each column the best mean and every row whose difference from it has a 95 % interval "
              "containing 0 (no difference detected at this scale) or is below 0.001 (negligible)")


class Tests:
    """The comparisons of one report: each is recorded (for ``results.json`` → ``comparisons``) and written as
    ``"name +0.013 [-0.048, +0.074] (test): reading"`` (:func:`.stats.phrase`, differences below ``negligible``
    marked so)."""

    def __init__(self, negligible: float = NEGLIGIBLE) -> None:
        self.records: list[dict[str, Any]] = []
        self.found: dict[str, Difference] = {}
        self.negligible = negligible

    def item(self, name: str, diff: Difference, higher: str, lower: str, label: bool = True) -> str:
        """``"name +0.013 [-0.048, +0.074] (paired by seed, n = 3): reading"`` (without the test if not
        ``label``)."""
        reading = phrase(diff, higher, lower, self.negligible)
        self.records.append({"comparison": name, **diff.to_dict(), "described": diff.label, "reading": reading})
        self.found[name] = diff
        return f"{name} {diff.interval()}" + (f" ({diff.label})" if label else "") + f": {reading}"

    def line(self, items: Sequence[tuple[str, Difference, str, str]]) -> str:
        """Several comparisons in one sentence, each test named where it first applies (again when it changes)."""
        labels = [d.label for _, d, _, _ in items]
        return "; ".join(self.item(*it, label=i == 0 or labels[i] != labels[i - 1]) for i, it in enumerate(items))


def tests_explained(summary: Summary, level: float = 0.95) -> str:
    """The first verdict line: which test the intervals come from (paired by seed when every row trained the same
    seeds, Welch otherwise), with n and the t quantile, and how an interval containing 0 reads."""
    first = summary.lengths[0]
    seed_sets = {tuple(sorted(v[first])) for v in summary.values.values() if len(v[first]) > 1}
    if len(seed_sets) == 1:
        seeds = next(iter(seed_sets))
        n = len(seeds)
        how = (f"every row with several runs trained the same seeds ({', '.join(map(str, seeds))}), so two rows are "
               f"compared paired by seed (n = {n}, df = {n - 1}, t = {t_quantile(0.5 + level / 2, n - 1):.3f})")
    elif not seed_sets:
        return ("Tests: one run per row, so no comparison has an interval and none is a ranking; rerun with "
                "--seeds 3 or more.")
    else:
        how = "rows trained different seeds, so two rows are compared with Welch's interval"
    return (f"Tests: each interval is the {level:.0%} t interval of a difference in held-out loss (nats/byte; "
            f"positive: the first named is worse); {how}; a row against a constant (a floor, or a single run) is a "
            f"one-sample interval, a row at two lengths is paired by seed; an interval containing 0 reads "
            f"\"{NO_DIFFERENCE}\", never a ranking, and a detected difference smaller than {NEGLIGIBLE:g} "
            "nats/byte (the tables' precision) is marked negligible.")


def config_of(payload: dict[str, Any]) -> Any:
    """The experiment's configuration, rebuilt from the preset named in ``payload`` (size, seeds, first seed) and
    checked against the payload's fingerprint: rendering never guesses settings."""
    classes = {c.name: c for c in EXPERIMENT_CONFIGS}
    stored = payload["config"]
    base = stored.get("base", stored)
    config = classes[payload["experiment"]].preset(base["size"], seeds=base["seeds"], first_seed=base["first_seed"])
    if fingerprint(config.to_dict()) != payload["config_fingerprint"]:
        raise ValueError(f"the {payload['experiment']} report was run with settings that differ from the "
                         f"{base['size']!r} preset (fingerprint {payload['config_fingerprint']}); it cannot be "
                         "re-rendered by this version")
    return config


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


def plot_settings(series: dict[str, dict[Any, dict[int, float]]], path: str | Path, title: str, xlabel: str,
                  ylabel: str = "held-out loss (nats / byte)", floors: dict[str, float] | None = None,
                  zero_line: bool = False, connect: bool = True) -> None:
    """Values against settings that are not lengths (schemes, depths): ``series`` is name -> setting -> {seed:
    value}; the settings are categories on the x axis in order of first appearance, each series mean ± sd error
    bars (joined by a line if ``connect``) with every seed's value as a dot; ``floors`` dashed, ``zero_line`` a
    solid line at 0 (for differences)."""
    plt = pyplot()
    settings = list(dict.fromkeys(x for row in series.values() for x in row))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    width = 0.3 / max(1, len(series) - 1) if len(series) > 1 else 0.0
    for k, (name, row) in enumerate(series.items()):
        offset = (k - (len(series) - 1) / 2) * width
        xs = [settings.index(x) + offset for x in row]
        stats = [mean_sd(list(values.values())) for values in row.values()]
        line = ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3, label=name,
                           linestyle="-" if connect else "none")
        for x, values in zip(xs, row.values()):
            ax.scatter([x] * len(values), list(values.values()), s=9, alpha=0.5, color=line[0].get_color())
    for name, value in (floors or {}).items():
        ax.axhline(value, linestyle="--", color="grey", linewidth=1)
        ax.annotate(f"{name} floor", (0, value), textcoords="offset points", xytext=(2, 3), fontsize=8, color="grey")
    if zero_line:
        ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(settings)), [str(x) for x in settings])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


TOKENIZER = "byte-level (256 bytes + <|endoftext|>), see hf_posenc_experiments.tokenizer"


def analysis(tests: Tests, verdict: Sequence[str], claims: Sequence[Any]) -> dict[str, Any]:
    """The analysis fields of ``results.json``: ``verdict`` (lines), ``comparisons`` (every test behind them, as
    ``tests`` recorded them) and ``claims`` (one per paper claim: :class:`.claims.Claim`). Every experiment's
    ``analyse`` returns this, its verdict computed before its claims."""
    return {"verdict": list(verdict), "comparisons": tests.records, "claims": [c.to_dict() for c in claims]}


def make_payload(experiment: str, command: str, config: dict[str, Any], corpus: str, units: str,
                 floors: dict[str, float], results: Sequence[dict[str, Any]], elapsed: float,
                 **fields: Any) -> dict[str, Any]:
    """What ``results.json`` holds: what was run (command, config and its fingerprint, corpus, tokenizer, units,
    floors), the experiment's own ``fields``, then its runs (without their model directories), the times and the
    machine (Python, torch, threads, platform)."""
    import torch

    return {
        "experiment": experiment, "command": command, "config": config, "config_fingerprint": fingerprint(config),
        "corpus": corpus, "tokenizer": TOKENIZER, "units": units, "floors": floors, **fields,
        "runs": [{k: v for k, v in r.items() if k != "model_dir"} for r in results],
        "wall_seconds": elapsed,
        "seconds_in_runs": sum(r["seconds"] for r in results),
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform()},
    }


def write_results(out: Path, experiment: str, command: str, config: dict[str, Any], corpus: str, units: str,
                  floors: dict[str, float], results: Sequence[dict[str, Any]], elapsed: float,
                  **fields: Any) -> dict[str, Any]:
    """Write :func:`make_payload` to ``out/results.json`` and return it."""
    payload = make_payload(experiment, command, config, corpus, units, floors, results, elapsed, **fields)
    write_json(payload, Path(out) / "results.json")
    return payload


def _module(payload: dict[str, Any]) -> Any:
    return importlib.import_module(f"{__package__}.{payload['experiment']}")


def publish(out: str | Path, payload: dict[str, Any], config: Any = None) -> dict[str, Any]:
    """Analyse ``payload`` (its experiment module's ``analyse``: verdict, comparisons with their tests, paper
    claims), store the analysis in it just before the diagnostics (replacing an older one), write ``results.json``
    and ``results.md`` (the module's ``render``) to ``out``; returns the payload. ``config``: the experiment's
    settings (default: :func:`config_of` the payload)."""
    module = _module(payload)
    config = config_of(payload) if config is None else config
    analysis = module.analyse(payload, config)
    ordered: dict[str, Any] = {}
    for key, value in payload.items():
        if key in ANALYSIS_FIELDS:
            continue
        if key == "why":  # the analysis goes where the verdict always was: just before the diagnostics
            ordered.update(analysis)
        ordered[key] = value
    if "why" not in payload:
        ordered.update(analysis)
    payload.clear()
    payload.update(ordered)
    out = Path(out)
    write_json(payload, out / "results.json")
    (out / "results.md").write_text(module.render(payload, config))
    return payload


def rerender(out: str | Path) -> dict[str, Any]:
    """Rewrite ``out/results.md`` and the analysis fields of ``out/results.json`` from that ``results.json``
    (nothing is trained or evaluated; the runs, summary and diagnostics stay as they are; the PNGs are not
    touched); returns the payload."""
    path = Path(out) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results.json to render (run the experiment first)")
    payload = json.loads(path.read_text())
    summary = Summary.from_results(payload["runs"], payload["summary"]["lengths"]).to_dict()
    if json.loads(dumps(summary)) != payload["summary"]:
        raise ValueError(f"{path}: its summary does not follow from its runs; refusing to render it")
    return publish(out, payload)


def closing_lines(verdict: Sequence[str], why: Any, window: int, wall: str,
                  claims: Sequence[str] = ()) -> list[str]:
    """The end of every ``results.md``: the verdict as a list, the diagnostics section, the wall time, the plot
    and, last, ``claims`` (the lines of :func:`.claims.claims_section`)."""
    return [*[f"- {line}" for line in verdict], "", *why_section(why, window), wall, "",
            "![held-out loss](heldout_loss.png)", "", *claims]
