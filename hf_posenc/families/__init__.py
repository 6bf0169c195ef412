"""Model families: derived at first use from Transformers' Auto mappings (:mod:`.derive`).

:data:`FAMILIES` maps a stock model type to its family and fills itself on lookup; :func:`family_for` accepts a
stock or patched type. Adding a Transformers family needs no code; what differs per family is :data:`OVERRIDES`
(notes, and the schemes a family cannot take with the reason). Loading a patched checkpoint (model type
``hf_posenc_<type>``) derives its family when Transformers looks the type up (see :func:`install_lookup`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from ..schemes import SchemeConfig
from ..schemes.base import layer_rope_parameters
from ..upstream import extra_config_types, set_extra_config_types
from .base import MODEL_TYPE_PREFIX, Family
from .derive import FamilyRefused, derive, static_refusal
from .table import verified_types

_LAYERS_NOTE = "schemes apply to the global (full-attention) layers unless layers='all' is given"
_NOPE_NOTE = "layers without positional encoding (no_rope_layers) stay without it"
_MLA_NOTE = "multi-head latent attention: schemes act on the decoupled rotary part (qk_rope_head_dim)"
_TAPE_NOPE = "TAPE rotates queries and keys in every layer, but this family has layers without positional encoding"

_TAPE_NOPE_LAYERS = "TAPE rotates queries and keys in every layer, but this family's full-attention layers use none"


EVERY_SCHEME = "*"  # an OVERRIDES refusal for every scheme, those registered from outside the package included


def _every(reason: str) -> dict[str, str]:
    return {EVERY_SCHEME: reason}


# What differs per family, keyed by stock model type: notes for the user and schemes refused with the reason.
# Everything else is derived; the family matrix (tests/test_families.py) finds what needs an entry here.
OVERRIDES: dict[str, dict[str, Any]] = {
    "gemma3_text": {"notes": [_LAYERS_NOTE]},
    "smollm3": {"notes": [_NOPE_NOTE], "refusals": {"tape": _TAPE_NOPE}},
    "llama4_text": {"notes": [_NOPE_NOTE], "refusals": {
        "tape": _TAPE_NOPE,
        "tapa": "chunked local attention (attention_chunk_size), which TAPA's mask function does not build"}},
    "deepseek_v2": {"notes": [_MLA_NOTE]},
    "deepseek_v3": {"notes": [_MLA_NOTE]},
    "exaone_moe": {"refusals": {"tape": _TAPE_NOPE_LAYERS}},
    **{t: {"refusals": {"tape": "it rotates interleaved dimension pairs, not the rotate-half halves TAPE's state "
                                "rotation reproduces"}} for t in ("ernie4_5", "ernie4_5_moe", "helium")},
    "flint": {"refusals": {"tape": _TAPE_NOPE_LAYERS}},
    "nanochat": {"refusals": {"tape": "it normalises queries and keys after the rotation; TAPE's attention "
                                      "normalises them before"}},
    "doge": {"refusals": {"tapa": "its dynamic-mask attention hands TAPA a 4-D mask of its own, which TAPA's "
                                  "attention does not take"}},
    "lfm3": {"refusals": {s: "its stock rope type is 'proportional' over part of each head; replacing it changes "
                             "the rotary width its attention expects" for s in ("rope", "tapa")}},
    "moshi": {"refusals": _every("its cached generation differs from its full forward even unpatched (the "
                                 "depth decoder), so a patched model cannot be checked")},
    "blt": {"refusals": _every("a byte latent transformer: four rotary stacks count positions in bytes (patcher, "
                               "local encoder and decoder) and in patches (global transformer), and its stock cached "
                               "forward fails in this Transformers (BltConfig has no num_hidden_layers)")},
    "mimo_v2_flash": {"refusals": _every("its layer types rotate heads of different widths, which hf-posenc's "
                                         "rope init does not read")},
    "ministral3": {"refusals": {s: "its query scaling reads original_max_position_embeddings, which this scheme's "
                                   "stock export (longrope) must set to max_position_embeddings" for s in
                                ("cope", "hardclip")}},
    "phimoe": {"refusals": _every("its rotary module reads LongRoPE's mscale parameters from the config, which a "
                                  "scheme's rope type does not carry")},
    "zaya": {"refusals": _every("the scheme's frequencies do not reach its attention (the family check saw "
                                "unchanged logits)")},
}


class _Families(Mapping[str, Family]):
    """Stock model type -> family, derived and cached at first lookup. Iterating lists the families built so
    far; :func:`hf_posenc.families.table.verified_types` lists the families the test matrix verified."""

    def __init__(self) -> None:
        self._built: dict[str, Family] = {}

    def __getitem__(self, model_type: str) -> Family:
        if model_type not in self._built:
            if model_type.startswith(MODEL_TYPE_PREFIX):
                raise KeyError(model_type)
            try:
                override = OVERRIDES.get(model_type, {})
                self._built[model_type] = derive(model_type, override.get("notes"), override.get("refusals"))
            except FamilyRefused as exc:
                raise KeyError(model_type) from exc
        return self._built[model_type]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._built))

    def __len__(self) -> int:
        return len(self._built)

    def __contains__(self, model_type: object) -> bool:
        if not isinstance(model_type, str) or model_type.startswith(MODEL_TYPE_PREFIX):
            return False
        return model_type in self._built or static_refusal(model_type) is None


FAMILIES = _Families()


def family_for(model_type: str) -> Family:
    """The family of a stock or patched model type; a type hf-posenc cannot patch is a :class:`FamilyRefused`
    error (a ``ValueError``) that names the reason and the families the test matrix verified."""
    stock = model_type.removeprefix(MODEL_TYPE_PREFIX)
    try:
        return FAMILIES[stock]
    except KeyError:
        reason = static_refusal(stock)
    raise FamilyRefused(
        f"hf-posenc does not support model type {model_type!r}: {reason}. Families verified with every frequency "
        f"scheme: {verified_types('cope')} (see `hf-posenc families`)."
    )


def family_refusal(family: Family, scheme: str) -> str | None:
    """Why every model of ``family`` refuses ``scheme`` (its :data:`OVERRIDES` entry for that scheme, or for
    :data:`EVERY_SCHEME`, which covers schemes registered from outside the package too), or ``None``."""
    return family.refusals.get(scheme, family.refusals.get(EVERY_SCHEME))


def model_refusal(scheme: SchemeConfig, model: Any) -> str | None:
    """Why this loaded ``model`` cannot take ``scheme``, or ``None``: what its config holds (rotary parameters of
    one text position, rope types Transformers knows, one config for every layer), then the scheme's own rules
    (:meth:`~hf_posenc.schemes.SchemeConfig.model_refusal`)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = model.config
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or not rope:
        return "the config has no rope_parameters (not a rotary model)"
    for params in layer_rope_parameters(config):
        if "mrope_section" in params or "mrope_interleaved" in params:
            return "multimodal 3-D rotary positions (mrope_section): no single text position to act on"
        rope_type = params.get("rope_type", "default")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            return f"rope type {rope_type!r} has no entry in Transformers' ROPE_INIT_FUNCTIONS"
    if getattr(config, "is_heterogeneous", False):
        return "per-layer configs (head dims and rotary settings vary by layer), which hf-posenc does not read"
    return scheme.model_refusal(model)


def check_scheme(family: Family, scheme: str | SchemeConfig, model: Any = None) -> None:
    """The one answer to "can this family (and this loaded model) take this scheme?": raise :class:`FamilyRefused`
    naming the reason (:func:`family_refusal`, then with a model :func:`model_refusal`) and where to look."""
    name = scheme if isinstance(scheme, str) else scheme.name
    reason = family_refusal(family, name)
    if reason is not None:
        raise FamilyRefused(
            f"{name} cannot be applied to model type {family.stock_model_type!r}: {reason}. Families verified "
            f"with {name}: {verified_types(name)} (see `hf-posenc families`)."
        )
    reason = None if model is None or isinstance(scheme, str) else model_refusal(scheme, model)
    if reason is not None:
        raise FamilyRefused(
            f"{name} cannot be applied to this {family.stock_model_type!r} model: {reason}. See "
            "`hf-posenc families` for the families and schemes verified."
        )


class _DerivingContent(dict):
    """``CONFIG_MAPPING``'s registry of extra types, which derives a patched family the first time Transformers
    looks up its ``hf_posenc_<type>`` (``AutoConfig.from_pretrained`` of a patched checkpoint)."""

    def _derive(self, key: object) -> bool:
        if isinstance(key, str) and key.startswith(MODEL_TYPE_PREFIX) and not dict.__contains__(self, key):
            with contextlib.suppress(FamilyRefused):
                family_for(key)  # registers the family (and with it this key)
        return dict.__contains__(self, key)

    def __contains__(self, key: object) -> bool:
        return self._derive(key)

    def __getitem__(self, key: str) -> Any:
        self._derive(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if self._derive(key) else default


def install_lookup() -> None:
    """Let Transformers' ``CONFIG_MAPPING`` derive patched families on lookup (idempotent)."""
    if not isinstance(extra_config_types(), _DerivingContent):
        set_extra_config_types(_DerivingContent(extra_config_types()))


install_lookup()

__all__ = ["EVERY_SCHEME", "FAMILIES", "OVERRIDES", "Family", "FamilyRefused", "check_scheme", "family_for",
           "family_refusal", "model_refusal"]
