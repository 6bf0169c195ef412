"""The family support table: model type × scheme, as the test matrix (``tests/test_families.py``) found it.

The table is data, written by ``scripts/families_table.py`` from the same checks the tests run, and committed as
``hf_posenc/data/families.json``; a test re-runs the checks on a sample and compares. Entries are
``{"status": "verified" | "refused" | "untested", "reason": "..."}`` (no reason for verified ones).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ..schemes import SCHEMES as REGISTERED

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "families.json"
SCHEMES = tuple(sorted(REGISTERED))  # the committed table's columns: the schemes of the package, by name


def table_schemes() -> tuple[str, ...]:
    """The columns of a table built now: every registered scheme, those registered from outside the package
    (``register_scheme`` after ``import hf_posenc``) included."""
    return tuple(sorted(REGISTERED))


@functools.cache
def load_table() -> dict[str, Any]:
    """The support table (``{"transformers_version", "schemes", "families": {type: {scheme: entry}}}``)."""
    if not TABLE_PATH.is_file():
        raise FileNotFoundError(
            f"the family support table {TABLE_PATH} is missing; regenerate it with `python scripts/families_table.py`."
        )
    return json.loads(TABLE_PATH.read_text())


def verified_types(scheme: str) -> list[str]:
    """The model types the test matrix verified with ``scheme`` (sorted)."""
    families = load_table()["families"]
    return sorted(t for t, row in families.items() if row.get(scheme, {}).get("status") == "verified")


def format_table(table: dict[str, Any], markdown: bool = False) -> str:
    """The table as aligned text (``hf-posenc families``) or as Markdown (for docs/families.md)."""
    schemes = table["schemes"]
    rows = []
    for model_type, row in sorted(table["families"].items()):
        cells = []
        for scheme in schemes:
            entry = row.get(scheme, {"status": "untested", "reason": "not in the table"})
            reason = entry.get("reason")
            cells.append(entry["status"] + (f" ({reason})" if reason and not markdown else ""))
        reasons = sorted({e["reason"] for e in row.values() if e.get("reason")})
        rows.append((model_type, cells, reasons))
    counts = {s: sum(table["families"][t].get(s, {}).get("status") == "verified" for t in table["families"])
              for s in schemes}
    summary = ", ".join(f"{s}: {counts[s]}" for s in schemes)
    if markdown:
        lines = ["| model type | " + " | ".join(schemes) + " | reasons |", "|---|" + "---|" * len(schemes) + "---|"]
        for model_type, cells, reasons in rows:
            lines.append(f"| {model_type} | " + " | ".join(cells) + " | " + "; ".join(reasons) + " |")
        lines.append("")
        lines.append(f"Verified per scheme (Transformers {table['transformers_version']}): {summary}.")
        return "\n".join(lines)
    lines = [f"Transformers {table['transformers_version']}; verified per scheme: {summary}", ""]
    for model_type, cells, _ in rows:
        lines.append(model_type)
        lines.extend(f"  {scheme:<9}{cell}" for scheme, cell in zip(schemes, cells))
    return "\n".join(lines)


__all__ = ["SCHEMES", "TABLE_PATH", "format_table", "load_table", "table_schemes", "verified_types"]
