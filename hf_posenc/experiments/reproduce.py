"""Do an experiment's means reproduce with other seeds? A rerun with ``--first-seed`` (new seeds) is compared with
the committed report: for each row and length, the new seeds' mean against the 95 % prediction interval of a
mean of that many new seeds, from the committed mean and sd of n seeds:
``mean ± t_{0.975, n−1} · sd · sqrt(1/n + 1/m)`` (m new seeds). About 1 cell in 20 falls outside by chance.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t distribution with ``df`` degrees of freedom (bisection on the CDF, whose density
    is integrated with Simpson's rule; accurate to about 1e-6 for the p used here)."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"need 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float, steps: int = 4000) -> float:  # P(T <= x) for x >= 0
        h = x / steps
        total = 0.0
        for i in range(steps + 1):
            t = i * h
            w = 1 if i in (0, steps) else (4 if i % 2 else 2)
            total += w * math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))
        return 0.5 + total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def compare(committed: dict[str, Any], rerun: dict[str, Any], level: float = 0.95) -> dict[str, Any]:
    """Per row and length of both reports: committed mean ± sd (n seeds), the rerun's mean (m seeds), the
    prediction interval and whether the rerun falls in it."""
    n = committed["config"].get("seeds") or committed["config"]["base"]["seeds"]
    m = rerun["config"].get("seeds") or rerun["config"]["base"]["seeds"]
    if n < 2:
        raise ValueError("the committed report has one seed: it gives no spread to compare with")
    t = t_quantile(0.5 + level / 2, n - 1)
    old, new = committed["summary"]["heldout_nll"], rerun["summary"]["heldout_nll"]
    cells = []
    for label, row in old.items():
        if label not in new:
            continue
        for length, stats in row.items():
            if length not in new[label]:
                continue
            half = t * stats["sd"] * math.sqrt(1 / n + 1 / m)
            value = new[label][length]["mean"]
            cells.append({"label": label, "length": int(length), "committed_mean": stats["mean"],
                          "committed_sd": stats["sd"], "rerun_mean": value, "half_width": half,
                          "inside": abs(value - stats["mean"]) <= half})
    if not cells:
        raise ValueError("the two reports share no (row, length): compare reruns of the same experiment")
    inside = sum(c["inside"] for c in cells)
    return {"level": level, "committed_seeds": n, "rerun_seeds": m, "t": t, "cells": cells, "inside": inside,
            "total": len(cells)}


def write_comparison(result: dict[str, Any], out: str | Path, committed_path: str, command: str) -> str:
    """``reproducibility.json`` and ``reproducibility.md`` in ``out``; returns the Markdown."""
    out = Path(out)
    (out / "reproducibility.json").write_text(json.dumps({"committed": committed_path, "command": command,
                                                           **result}, indent=2) + "\n")
    lines = [
        "# Do the means reproduce with other seeds?",
        "",
        f"Rerun: `{command}`, compared with `{committed_path}`: the rerun's mean of {result['rerun_seeds']} new "
        f"seed(s) against the {result['level']:.0%} prediction interval mean ± t·sd·sqrt(1/n + 1/m) of the "
        f"committed {result['committed_seeds']} seeds (t = {result['t']:.3f}).",
        "",
        f"**{result['inside']} of {result['total']} cells inside** (about 1 in 20 outside is expected by chance).",
        "",
        "| row | length | committed mean ± sd | rerun | interval | inside |",
        "|---|---|---|---|---|---|",
    ]
    for c in result["cells"]:
        lines.append(f"| {c['label']} | {c['length']} | {c['committed_mean']:.3f} ± {c['committed_sd']:.3f} | "
                     f"{c['rerun_mean']:.3f} | ± {c['half_width']:.3f} | {'yes' if c['inside'] else '**no**'} |")
    text = "\n".join(lines) + "\n"
    (out / "reproducibility.md").write_text(text)
    return text
