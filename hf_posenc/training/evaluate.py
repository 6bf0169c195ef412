"""Evaluation at the end of a training run, delegated to :mod:`hf_posenc.evaluation` when it is available.

Calls ``hf_posenc.evaluation.evaluate({scheme_name: model}, tokenizer, tasks=..., lengths=..., text=...,
**evaluation.options)`` and ``write_report(result, <output.dir>/eval)``; the perplexity text is
``evaluation.text_files`` joined, else the training documents.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

from .config import Recipe
from .data import read_documents


def evaluation_available() -> bool:
    """True when ``hf_posenc.evaluation`` provides ``evaluate`` and ``write_report``."""
    if importlib.util.find_spec("hf_posenc.evaluation") is None:
        return False
    from .. import evaluation

    return hasattr(evaluation, "evaluate") and hasattr(evaluation, "write_report")


def evaluation_text(recipe: Recipe) -> str:
    """The perplexity text: ``evaluation.text_files`` joined, else the training documents."""
    ev = recipe.evaluation
    if ev.text_files:
        return "\n\n".join(Path(p).expanduser().read_text(encoding="utf-8", errors="replace") for p in ev.text_files)
    return "\n\n".join(read_documents(recipe.data)["text"])


def evaluate_after_training(recipe: Recipe, model: Any, tokenizer: Any, output_dir: str | Path) -> dict | None:
    """Evaluate the trained model at ``evaluation.lengths`` (default: the training length); writes
    ``<output_dir>/eval/`` and returns the result as a dict, or ``None`` (with a warning) when
    ``hf_posenc.evaluation`` is missing."""
    if not evaluation_available():
        warnings.warn("evaluation.enabled is set but hf_posenc.evaluation is not available; skipped.", stacklevel=2)
        return None
    from .. import evaluation

    ev = recipe.evaluation
    lengths = list(ev.lengths or [recipe.context_length])
    text = evaluation_text(recipe) if any(t == "ppl" for t in ev.tasks) else None
    result = evaluation.evaluate({recipe.scheme.name: model}, tokenizer, tasks=list(ev.tasks), lengths=lengths,
                                 text=text, **ev.options)
    out = Path(output_dir) / "eval"
    evaluation.write_report(result, out)
    payload = result.to_dict() if hasattr(result, "to_dict") else {"result": repr(result)}
    (Path(output_dir) / "eval.json").write_text(json.dumps(payload, indent=2, default=str))
    return payload
