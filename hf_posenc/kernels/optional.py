"""Triton is optional (``pip install hf-posenc[triton]``): without it each op keeps its CPU paths, and its Triton
entry point is a stand-in that raises an ImportError saying how to install it (macOS and Windows have no Triton)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def triton_missing(exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """``exc`` when it is the Triton package that is missing; any other import error propagates."""
    if not (exc.name or "").startswith("triton"):
        raise exc
    return exc


def needs_triton(entry: str, instead: str, error: ImportError, missing: str = "Triton") -> Callable[..., Any]:
    """The stand-in for the Triton entry point ``entry`` (also as ``entry.with_args``, as the ops call it); `missing`
    names what is not installed (Triton, or hf-posenc itself where a checkpoint's remote code runs)."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"{entry} needs {missing}, which is not installed: `pip install hf-posenc[triton]` (or "
                          f"call {instead})") from error

    stand_in.with_args = stand_in  # type: ignore[attr-defined]
    return stand_in
