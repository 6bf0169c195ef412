"""JSON serialisation and plotting helpers shared by the diagnostics results."""

from __future__ import annotations

import os
from typing import Any

from ..results_io import dumps, pyplot, strict_json, write_json

__all__ = ["ResultMixin", "pyplot", "normalise_named", "save_figure"]


class ResultMixin:
    """``to_dict``/``to_json``/``save_json`` for the result dataclasses (strict JSON: NaN becomes ``null``)."""

    analysis: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = strict_json(self)
        out["analysis"] = self.analysis
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return dumps(self.to_dict(), indent)

    def save_json(self, path: str | os.PathLike) -> str:
        return write_json(self.to_dict(), path)


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
