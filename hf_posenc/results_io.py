"""Writing results the way every report of hf-posenc does: strict JSON (tensors as lists, dataclasses as dicts,
NaN and infinities as ``null``) and matplotlib on the Agg backend (files only, no display needed)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable


def strict_json(value: Any, nonfinite: Callable[[float], Any] = lambda x: None) -> Any:
    """``value`` with tensors turned into lists, dataclasses into dicts and non-finite floats into
    ``nonfinite(x)`` (default ``None``), recursively: what ``json.dumps(..., allow_nan=False)`` accepts."""
    if hasattr(value, "tolist") and callable(value.tolist) and not isinstance(value, (list, tuple)):
        return strict_json(value.tolist(), nonfinite)  # torch tensors, numpy arrays and scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: strict_json(getattr(value, f.name), nonfinite) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): strict_json(v, nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v, nonfinite) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return nonfinite(value)
    return value


def dumps(value: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``value`` (see :func:`strict_json`)."""
    return json.dumps(strict_json(value), indent=indent, allow_nan=False)


def write_json(value: Any, path: str | os.PathLike, indent: int | None = 2) -> str:
    """Write :func:`dumps` of ``value`` to ``path`` (parent folders created, trailing newline); returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(value, indent) + "\n")
    return path


def pyplot():
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt
