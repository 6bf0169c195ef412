"""Evaluation at the end of a training run, with :mod:`hf_posenc.evaluation`.

Calls ``hf_posenc.evaluation.evaluate({scheme_name: model}, tokenizer, tasks=..., lengths=..., text=...,
**evaluation.options)`` and ``write_report(result, <output.dir>/eval)``; the perplexity text is
``evaluation.text_files`` joined, else the training documents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..evaluation import evaluate, write_report
from .config import Recipe
from .data import read_documents


def evaluation_text(recipe: Recipe) -> str:
    """The perplexity text: ``evaluation.text_files`` joined, else the training documents."""
    ev = recipe.evaluation
    if ev.text_files:
        return "\n\n".join(Path(p).expanduser().read_text(encoding="utf-8", errors="replace") for p in ev.text_files)
    return "\n\n".join(read_documents(recipe.data)["text"])


def evaluate_after_training(recipe: Recipe, model: Any, tokenizer: Any, output_dir: str | Path) -> dict:
    """Evaluate the trained model at ``evaluation.lengths`` (default: the training length); writes
    ``<output_dir>/eval/`` and ``<output_dir>/eval.json`` and returns the result as a dict."""
    ev = recipe.evaluation
    text = evaluation_text(recipe) if "ppl" in ev.tasks else None
    result = evaluate({recipe.scheme.name: model}, tokenizer, tasks=list(ev.tasks),
                      lengths=list(ev.lengths or [recipe.context_length]), text=text, **ev.options)
    write_report(result, Path(output_dir) / "eval")
    payload = result.to_dict()
    (Path(output_dir) / "eval.json").write_text(json.dumps(payload, indent=2, default=str))
    return payload
