"""JSON serialisation and plotting helpers shared by the diagnostics results."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import torch


def _plain(value: Any) -> Any:
    """Tensors to lists, NaN/inf to ``None`` (strict JSON), recursively."""
    if isinstance(value, torch.Tensor):
        return _plain(value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultMixin:
    """``to_dict``/``to_json``/``save_json`` for the result dataclasses (strict JSON: NaN becomes ``null``)."""

    analysis: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = _plain(self)
        out["analysis"] = self.analysis
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save_json(self, path: str | os.PathLike) -> str:
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        return path


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def normalise_named(results: Any, kind: type) -> dict[str, Any]:
    """Accept one result or a ``{name: result}`` mapping (side-by-side comparison); check their type."""
    named = {getattr(results, "model", "") or "model": results} if isinstance(results, kind) else dict(results)
    if not named:
        raise ValueError("nothing to plot: pass a result or a non-empty {name: result} mapping.")
    for name, result in named.items():
        if not isinstance(result, kind):
            raise TypeError(f"{name!r}: expected a {kind.__name__}, got {type(result).__name__}.")
    return named


def save_figure(fig: Any, path: str | os.PathLike) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path
