"""The distributed-engine support table: scheme × engine (DDP, FSDP2, ZeRO-3, Ulysses sequence parallel with
ZeRO-3, context parallel), as the two-process tests (``tests/test_distributed.py``) found it.

Written by ``scripts/engines_table.py`` from a run of those tests and committed as ``hf_posenc/data/engines.json``;
each cell names the test that decides it. ``verified``: the test passed (two CPU processes, loss equal to one
process's, complete adapter loading with the same logits); ``refused``: the launch fails before any step with the
reason; ``not verifiable here``: what stops the check on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENGINE_TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "engines.json"
ENGINES = ("DDP", "FSDP2", "ZeRO-3", "sequence parallel (Ulysses)", "context parallel")


def load_engine_table() -> dict[str, Any]:
    """The committed table: ``{"versions", "cells": {engine: {scheme: {"status", "test", "reason"?}}}, "resume"}``."""
    if not ENGINE_TABLE_PATH.is_file():
        raise FileNotFoundError(f"{ENGINE_TABLE_PATH} is missing; regenerate it with "
                                "`python scripts/engines_table.py`.")
    return json.loads(ENGINE_TABLE_PATH.read_text())


def format_engine_table(table: dict[str, Any]) -> str:
    """The table as Markdown (docs/training.md embeds it)."""
    lines = ["| scheme | " + " | ".join(ENGINES) + " |", "|---|" + "---|" * len(ENGINES)]
    reasons: dict[str, int] = {}
    for scheme in table["cells"][ENGINES[0]]:  # the schemes the two-process tests ran, in their order
        cells = []
        for engine in ENGINES:
            entry = table["cells"][engine][scheme]
            cell = entry["status"]
            if "reason" in entry:
                n = reasons.setdefault(entry["reason"], len(reasons) + 1)
                cell += f" ({n})"
            cells.append(cell)
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    lines += ["", *(f"({n}) {reason}." for reason, n in reasons.items())]
    resume = ", ".join(f"{engine} (`{test}`)" for engine, test in table["resume"].items())
    versions = ", ".join(f"{k} {v}" for k, v in table["versions"].items())
    lines += ["", f"Resume after a kill verified: {resume}. Versions: {versions}."]
    return "\n".join(lines)


__all__ = ["ENGINES", "ENGINE_TABLE_PATH", "format_engine_table", "load_engine_table"]
