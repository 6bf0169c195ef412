"""Scheme specs on the command line: ``NAME`` or ``NAME:key=value,key=value`` (e.g. ``cope:clip_low_n=10``).

One parser for every ``key=value`` list of the command line (``hf-posenc patch -o``, ``hf-posenc eval --schemes``):
values are read as JSON when they parse (numbers, booleans, lists, dicts), else kept as strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .base import SchemeConfig
from .registry import make_scheme


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (``10``, ``1e7``, ``true``, ``[1, 2]``), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_key_values(pairs: Iterable[str], example: str = "clip_low_n=10") -> dict[str, Any]:
    """``["k=v", ...]`` as a dict (values through :func:`parse_value`); a malformed or repeated key is a
    ``ValueError`` showing the expected form."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"option {pair!r} must look like key=value (e.g. {example}).")
        if key in options:
            raise ValueError(f"option {key!r} is given twice ({pair!r}); give each option once.")
        options[key] = parse_value(value.strip())
    return options


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes, so JSON values (``scaling_options={"beta_fast":32,...}``) stay
    whole."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0 and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def parse_scheme_spec(spec: str) -> SchemeConfig:
    """``"cope:clip_low_n=10,rope_theta=1e7"`` → ``CoPEConfig(clip_low_n=10, rope_theta=1e7)``; ``"tapa"`` → the
    scheme's defaults. Unknown schemes and options are errors naming the valid ones (from the scheme's config)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a scheme spec is NAME or NAME:key=value,... (e.g. cope:clip_low_n=10), got {spec!r}.")
    name, _, rest = spec.strip().partition(":")
    return make_scheme(name.strip(), **parse_key_values(_split_top_level(rest), example=f"{name.strip()}:key=value"))


__all__ = ["parse_value", "parse_key_values", "parse_scheme_spec"]
