"""The scheme registry: every scheme package registers itself once, everything else is derived from here.

A scheme package (``hf_posenc/schemes/<name>/``) ends its ``__init__`` with one call::

    register_scheme(CoPEConfig, rope_types={"cope": RopeType(init=..., validate=...)})
    register_scheme(TAPAConfig, attention=AttentionFunctions(name="hf_posenc_tapa", forward=..., mask=...))

From that call come :data:`SCHEMES` and :func:`make_scheme` (names → configs), the Transformers registrations
(:func:`register_with_transformers`: rope init functions, attention and mask functions; ``import hf_posenc`` makes
them for every scheme, later ones included), the rope-type validators the patched configs learn (through
:func:`on_register`), and the checkpoint remote code (``hf_posenc.remote_code`` bundles
every registered scheme's package). Adding a scheme is one package plus its import in ``schemes/__init__``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import SchemeConfig


@dataclass(frozen=True)
class RopeType:
    """A Transformers rope type a scheme adds: ``init`` goes into ``ROPE_INIT_FUNCTIONS`` (``(config, device,
    seq_len, layer_type) -> (inv_freq, attention_scaling)``), ``validate`` becomes the patched configs'
    ``_validate_<type>_rope_parameters`` (``(config, rope_parameters, ignore_keys)``).

    What export reads (``hf_posenc.export_stock``, ``hf_posenc.export_gguf``; neither names a scheme):

    * ``dynamic``: the frequencies depend on the sequence length (Transformers recomputes them as it grows, which it
      does for a rope type whose name contains "dynamic", so such a name must declare it). No fixed vector expresses
      them: export refuses the rope type, naming the scheme.
    * Otherwise the rope type is one vector of per-dimension factors f_i = θ_i / θ'_i over plain RoPE's
      θ_i = b^(−2i/d): stock Transformers' and vLLM's ``longrope`` (``short_factor == long_factor``) and llama.cpp's
      ``rope_freqs`` tensor, with ``init``'s attention scaling. Export computes the factors from ``init``;
      ``factors`` (``(config, rope_parameters, layer_type) -> (factors, attention_scaling)``, or ``None`` to let
      export compute them) gives them in closed form where the scheme knows them exactly (CoPE's f = 1/w over the
      default base, so that the stock export reproduces it bit for bit)."""

    init: Callable[..., Any]
    validate: Callable[..., None]
    dynamic: bool = False
    factors: Callable[..., tuple[Any, float] | None] | None = None


@dataclass(frozen=True)
class AttentionFunctions:
    """An attention implementation a scheme adds, registered under ``name`` with Transformers'
    ``AttentionInterface`` (``forward``) and ``AttentionMaskInterface`` (``mask``; without one a custom
    attention name gets no padding mask)."""

    name: str
    forward: Callable[..., Any]
    mask: Callable[..., Any]


@dataclass(frozen=True)
class Scheme:
    """What one scheme registered: its config class (name, options, install/uninstall, trainable modules), the
    package that defines it (``""`` for a scheme defined in a script or a notebook, whose module is ``__main__``),
    and what it adds to Transformers."""

    config: type[SchemeConfig]
    package: str
    rope_types: Mapping[str, RopeType] = field(default_factory=dict)
    attention: AttentionFunctions | None = None


REGISTRY: dict[str, Scheme] = {}
SCHEMES: dict[str, type[SchemeConfig]] = {}  # name -> config class, the view the rest of the package reads
ROPE_TYPES: dict[str, RopeType] = {}
_LISTENERS: list[Callable[[Scheme], None]] = []


def register_scheme(config: type[SchemeConfig], *, rope_types: Mapping[str, RopeType] | None = None,
                    attention: AttentionFunctions | None = None) -> Scheme:
    """Register a scheme under ``config.name`` (once; registering the same name again is an error naming the
    package that holds it). Call it at the end of the scheme package's ``__init__``."""
    if not (isinstance(config, type) and issubclass(config, SchemeConfig)):
        raise TypeError(f"register_scheme: expected a SchemeConfig subclass, got {config!r}.")
    if not all(isinstance(r, RopeType) for r in (rope_types or {}).values()):
        raise TypeError("register_scheme: rope_types maps each rope type name to a RopeType(init=..., validate=...).")
    if attention is not None and not isinstance(attention, AttentionFunctions):
        raise TypeError("register_scheme: attention must be AttentionFunctions(name=..., forward=..., mask=...).")
    name = config.name
    if name in REGISTRY:
        raise ValueError(f"scheme {name!r} is already registered by {REGISTRY[name].package}; pick another "
                         "ClassVar `name` for the new config class.")
    undeclared = sorted(n for n, r in (rope_types or {}).items() if "dynamic" in n and not r.dynamic)
    if undeclared:
        raise ValueError(f"scheme {name!r}: Transformers recomputes the frequencies of rope type(s) {undeclared} with "
                         "the sequence length (the name contains 'dynamic'); declare RopeType(..., dynamic=True).")
    taken = sorted(set(rope_types or {}) & set(ROPE_TYPES))
    if taken:
        raise ValueError(f"scheme {name!r}: rope type(s) {taken} are already registered by another scheme.")
    # a scheme defined in a script or a notebook (`__main__`) belongs to no package: ""
    package = getattr(sys.modules.get(config.__module__), "__package__", None) or ""
    scheme = Scheme(config=config, package=package, rope_types=dict(rope_types or {}), attention=attention)
    REGISTRY[name] = scheme
    SCHEMES[name] = config
    ROPE_TYPES.update(scheme.rope_types)
    for listener in _LISTENERS:
        listener(scheme)
    return scheme


def on_register(listener: Callable[[Scheme], None]) -> None:
    """Call ``listener`` with every registered scheme, now and at each later :func:`register_scheme` (how the
    layers above learn about schemes without this module importing them)."""
    _LISTENERS.append(listener)
    for scheme in list(REGISTRY.values()):
        listener(scheme)


def register_with_transformers(scheme: Scheme | None = None) -> None:
    """Add a registered scheme's rope types and attention functions to Transformers, or every registered scheme's
    without an argument (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for scheme in REGISTRY.values() if scheme is None else [scheme]:
        ROPE_INIT_FUNCTIONS.update({name: rope.init for name, rope in scheme.rope_types.items()})
        if scheme.attention is not None:
            AttentionInterface.register(scheme.attention.name, scheme.attention.forward)
            AttentionMaskInterface.register(scheme.attention.name, scheme.attention.mask)


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


__all__ = ["RopeType", "AttentionFunctions", "Scheme", "REGISTRY", "SCHEMES", "ROPE_TYPES", "register_scheme",
           "on_register", "register_with_transformers", "make_scheme"]
