"""The family support table: model type × scheme, as the test matrix (``tests/test_families.py``) found it.

The table is data, written by ``scripts/families_table.py`` from the same checks the tests run, and committed as
``hf_posenc/data/families.json``; a test re-runs the checks on a sample and compares. Entries are
``{"status": "verified" | "refused" | "untested", "reason": "..."}`` (no reason for verified ones). Each row also has
a ``"gguf"`` cell: whether ``export_gguf`` carries a frequency scheme of the family to llama.cpp (verified, with the
llama.cpp architecture ``"arch"`` it converts to, or refused with export_gguf's reason; ``tests/gguf_matrix.py``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ..schemes import SCHEMES as REGISTERED

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "families.json"
SCHEMES = tuple(sorted(REGISTERED))  # the committed table's columns: the schemes of the package, by name
GGUF = "gguf"  # the column after the schemes: export_gguf's verdict for the family


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
        gguf = row.get(GGUF)
        if gguf is not None:  # the llama.cpp architecture it exports to; the refusal's reason in the text form only
            verified = gguf["status"] == "verified"
            cells.append(gguf["arch"] if verified else gguf["status"] + ("" if markdown else f" ({gguf['reason']})"))
        reasons = sorted({e["reason"] for k, e in row.items() if e.get("reason") and k != GGUF})
        rows.append((model_type, cells, reasons))
    columns = list(schemes) + ([GGUF] if any(GGUF in r for r in table["families"].values()) else [])
    counts = {s: sum(table["families"][t].get(s, {}).get("status") == "verified" for t in table["families"])
              for s in schemes}
    summary = ", ".join(f"{s}: {counts[s]}" for s in schemes)
    if markdown:
        lines = ["| model type | " + " | ".join(columns) + " | reasons |", "|---|" + "---|" * len(columns) + "---|"]
        for model_type, cells, reasons in rows:
            lines.append(f"| {model_type} | " + " | ".join(cells) + " | " + "; ".join(reasons) + " |")
        lines.append("")
        lines.append(f"Verified per scheme (Transformers {table['transformers_version']}): {summary}."
                     + _gguf_summary(table))
        return "\n".join(lines)
    lines = [f"Transformers {table['transformers_version']}; verified per scheme: {summary}.{_gguf_summary(table)}",
             ""]
    for model_type, cells, _ in rows:
        lines.append(model_type)
        lines.extend(f"  {column:<9}{cell}" for column, cell in zip(columns, cells))
    return "\n".join(lines)


def gguf_types(table: dict[str, Any] | None = None) -> list[str]:
    """The model types whose GGUF cell is verified: ``export_gguf`` carries their frequency schemes to llama.cpp."""
    families = (table or load_table())["families"]
    return sorted(t for t, row in families.items() if row.get(GGUF, {}).get("status") == "verified")


def format_gguf_families(table: dict[str, Any] | None = None) -> str:
    """The families ``export_gguf`` carries to llama.cpp, with the llama.cpp architecture each converts to, as one
    Markdown sentence (embedded in docs/export-and-serving.md; a test keeps it equal to the table)."""
    table = table or load_table()
    by_arch: dict[str, list[str]] = {}
    for model_type in gguf_types(table):
        by_arch.setdefault(table["families"][model_type][GGUF]["arch"], []).append(model_type)
    groups = "; ".join(f"`{arch}`: {', '.join(types)}" for arch, types in sorted(by_arch.items()))
    return (f"{len(gguf_types(table))} of the {len(table['families'])} model types export to GGUF (llama.cpp "
            f"architecture: model types): {groups}.")


def _gguf_summary(table: dict[str, Any]) -> str:
    exported = gguf_types(table)
    return (f" Export to GGUF: {len(exported)} (the {GGUF} column: the llama.cpp architecture each converts to)."
            if exported else "")


__all__ = ["GGUF", "SCHEMES", "TABLE_PATH", "format_gguf_families", "format_table", "gguf_types", "load_table", "table_schemes",
           "verified_types"]
