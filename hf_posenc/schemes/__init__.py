"""Positional-encoding schemes (imports only :mod:`hf_posenc.kernels`).

One package per scheme (``rope``, ``cope`` with HardClip, ``prope``, ``tapa``, ``tape``) holds its typed config
dataclass and its Transformers glue (rope init functions, attention and mask functions, install/uninstall on a
model) and registers itself once with :func:`register_scheme`; :mod:`.registry` derives the rest from that call:
:data:`SCHEMES` and :func:`make_scheme`, :func:`register_with_transformers`, the rope-type validators of the patched
configs and the checkpoint remote code. ``base`` holds the config base classes, ``masks`` the padding-mask function
shared by the schemes with their own attention, ``spec`` the command-line ``NAME:key=value`` parser.
"""

from __future__ import annotations

from .base import FrequencySchemeConfig, SchemeConfig
from .registry import (
    REGISTRY, ROPE_TYPES, SCHEMES, AttentionFunctions, RopeType, Scheme, make_scheme, on_register, register_scheme,
    register_with_transformers,
)

# Each scheme package registers itself when imported; this order is the order of SCHEMES.
from .rope import RoPEConfig  # noqa: I001
from .cope import CoPEConfig, HardClipConfig
from .prope import PRoPEConfig
from .tapa import TAPAConfig
from .tape import TAPEConfig

__all__ = [
    "SCHEMES", "REGISTRY", "ROPE_TYPES", "Scheme", "RopeType", "AttentionFunctions", "register_scheme", "on_register",
    "register_with_transformers", "make_scheme", "SchemeConfig", "FrequencySchemeConfig", "RoPEConfig", "CoPEConfig", "HardClipConfig",
    "PRoPEConfig", "TAPAConfig", "TAPEConfig",
]
