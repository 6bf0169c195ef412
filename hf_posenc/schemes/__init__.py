"""Positional-encoding schemes (imports only :mod:`hf_posenc.kernels`): one module per scheme with its typed config
dataclass and its Transformers glue (rope init functions, attention and mask functions, install/uninstall on a
model); :data:`SCHEMES` and :func:`make_scheme` are the registry the rest of the package reads."""

from __future__ import annotations

from typing import Any

from .base import FrequencySchemeConfig, SchemeConfig
from .cope import CoPEConfig, HardClipConfig
from .prope import PRoPEConfig
from .rope import RoPEConfig
from .tapa import TAPAConfig
from .tape import TAPEConfig

SCHEMES: dict[str, type[SchemeConfig]] = {
    cls.name: cls for cls in (RoPEConfig, CoPEConfig, HardClipConfig, PRoPEConfig, TAPAConfig, TAPEConfig)
}


def make_scheme(scheme: str | SchemeConfig, **options: Any) -> SchemeConfig:
    """Build a scheme config from a name and options, or pass a config through (then no options are allowed)."""
    if isinstance(scheme, SchemeConfig):
        if options:
            raise TypeError(
                f"pass options either inside the {type(scheme).__name__} or as keywords with scheme={scheme.name!r}, "
                f"not both (got {sorted(options)})."
            )
        return scheme
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a name or a scheme config, got {type(scheme).__name__}.")
    cls = SCHEMES.get(scheme)
    if cls is None:
        raise ValueError(f"unknown scheme {scheme!r}; valid schemes are {sorted(SCHEMES)}.")
    return cls.from_dict(options)


__all__ = [
    "SCHEMES", "SchemeConfig", "FrequencySchemeConfig", "RoPEConfig", "CoPEConfig", "HardClipConfig", "PRoPEConfig",
    "TAPAConfig", "TAPEConfig", "make_scheme",
]
