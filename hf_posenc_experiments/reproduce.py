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

from .stats import t_quantile

__all__ = ["t_quantile", "compare", "write_comparison"]


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
