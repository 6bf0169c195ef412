"""The checkpoint format: what a patched model records in ``config.json`` under the ``hf_posenc`` key.

```
"hf_posenc": {
  "format_version": 1,             # bumped on any incompatible change; newer versions are refused
  "library_version": "0.1.0",      # hf-posenc version that wrote it (information only)
  "scheme": "cope",                # a name in hf_posenc.schemes.SCHEMES
  "options": {...},                # the scheme config, resolved (model-dependent defaults filled in)
  "stock_model_type": "llama",     # the model type before patching (used by export_stock and unpatching)
  "original_rope_parameters": {...}  # the rope parameters before patching (used by replace=True)
}
```

A stock export (``export_stock``: a checkpoint plain Transformers loads, the scheme written as stock rope types such
as ``longrope`` factors) carries no record, and stock Transformers ignores one small top-level key that says where
it came from, so that patching it again is refused instead of applying the scheme twice::

    "hf_posenc_export": {"scheme": "cope", "options": {...}, "exported_from": "<the patched model's name or path>",
                         "library_version": "0.1.0"}
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .schemes import SCHEMES, SchemeConfig

FORMAT_VERSION = 1
LIBRARY_VERSION = "0.1.0"
RECORD_KEY = "hf_posenc"
EXPORT_KEY = "hf_posenc_export"
# Options that choose how a scheme is computed, not what: an adapter trained with one backend fits the others, and
# the patch_model call that reproduces a record leaves them out.
IMPLEMENTATION_OPTIONS = ("backend",)


@dataclass(frozen=True)
class SchemeRecord:
    """The parsed ``hf_posenc`` entry of a config."""

    scheme: SchemeConfig
    stock_model_type: str
    original_rope_parameters: dict[str, Any]
    format_version: int = FORMAT_VERSION
    library_version: str = LIBRARY_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "library_version": self.library_version,
            "scheme": self.scheme.name,
            "options": self.scheme.to_dict(),
            "stock_model_type": self.stock_model_type,
            "original_rope_parameters": copy.deepcopy(self.original_rope_parameters),
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SchemeRecord:
        """Parse and validate a record; a record this version cannot honour is a clear error, never ignored."""
        if not isinstance(record, dict):
            raise ValueError(f"config.{RECORD_KEY} must be a dict, got {type(record).__name__}.")
        version = record.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"config.{RECORD_KEY} has no valid format_version: {version!r}.")
        if version > FORMAT_VERSION:
            raise ValueError(
                f"this checkpoint was written by hf-posenc {record.get('library_version', '?')} in checkpoint format "
                f"{version}, newer than the format {FORMAT_VERSION} this hf-posenc {LIBRARY_VERSION} reads; upgrade "
                "with `pip install -U hf-posenc`."
            )
        name = record.get("scheme")
        if name not in SCHEMES:
            raise ValueError(
                f"this checkpoint uses the positional-encoding scheme {name!r}, which is not registered here "
                f"(hf-posenc {LIBRARY_VERSION} knows {sorted(SCHEMES)}): if {name!r} comes from your own code or "
                "another package (`hf_posenc.register_scheme`), import or run that first; if it is a scheme of a "
                "newer hf-posenc, upgrade with `pip install -U hf-posenc`."
            )
        missing = [k for k in ("options", "stock_model_type", "original_rope_parameters") if k not in record]
        if missing:
            raise ValueError(f"config.{RECORD_KEY} misses {missing}.")
        return cls(
            scheme=SCHEMES[name].from_dict(record["options"]),
            stock_model_type=record["stock_model_type"],
            original_rope_parameters=copy.deepcopy(record["original_rope_parameters"]),
            format_version=version,
            library_version=record.get("library_version", "?"),
        )


def compact(value: Any) -> Any:
    """``value`` without ``None`` or empty-dict entries (the defaults of every scheme option that can hold them)."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items() if v is not None and v != {}}
    return value


def patch_call(record: dict[str, Any], replace: bool = False, model: str = "base") -> str:
    """The ``patch_model`` call (Python source) giving ``model`` this scheme record, options at defaults left out."""
    defaults = SCHEMES[record["scheme"]]().to_dict()  # every scheme option has a default
    options = [f"{k}={compact(v)!r}" for k, v in record["options"].items()
               if k not in IMPLEMENTATION_OPTIONS and (k not in defaults or defaults[k] != v)]
    args = ", ".join([f"{model}, {record['scheme']!r}", *options, *(["replace=True"] if replace else [])])
    return f"hf_posenc.patch_model({args})"
