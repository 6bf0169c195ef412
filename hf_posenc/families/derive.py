"""Model families derived from Transformers' own tables instead of a file per family.

A model type is derivable when Transformers' Auto mappings give it a config class and a causal-LM class, the config
declares ``rope_parameters`` (so its rotary module is built from ``ROPE_INIT_FUNCTIONS``) and its modeling module
defines a text rotary embedding module. :func:`derive` then builds the patched classes with
:func:`~hf_posenc.families.base.make_family` and registers them, at first use. Everything a family cannot take is a
:class:`FamilyRefused` error that names the reason; what differs per family is the short table in
:mod:`hf_posenc.families` (``OVERRIDES``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

from .base import Family, make_family

# Rotary modules of other modalities (vision towers, audio encoders) never carry the text positions.
NON_TEXT_ROTARY = ("Vision", "Audio", "Visual", "Speech")


class FamilyRefused(ValueError):
    """A model type (or a model type × scheme) hf-posenc cannot patch; the message names the reason."""


def stock_classes(model_type: str) -> tuple[type, type]:
    """The config class and causal-LM class Transformers' Auto mappings give ``model_type``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise FamilyRefused(f"{model_type!r} is not a model type of this Transformers version.")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise FamilyRefused(f"{model_type!r} has no causal-LM class in Transformers' AutoModelForCausalLM mapping.")
    config_class = CONFIG_MAPPING[model_type]
    return config_class, MODEL_FOR_CAUSAL_LM_MAPPING[config_class]


def declares_rope_parameters(config_class: type) -> bool:
    """Whether a config class declares ``rope_parameters`` (what every ``ROPE_INIT_FUNCTIONS`` rotary module reads)."""
    if dataclasses.is_dataclass(config_class):
        return "rope_parameters" in {f.name for f in dataclasses.fields(config_class)}
    return any("rope_parameters" in getattr(c, "__annotations__", {}) for c in config_class.__mro__)


def text_rotary_classes(model_class: type) -> list[type]:
    """The text rotary embedding classes defined in a causal-LM class's modeling module."""
    module = importlib.import_module(model_class.__module__)
    return [
        obj for name, obj in vars(module).items()
        if inspect.isclass(obj) and name.endswith("RotaryEmbedding") and obj.__module__ == module.__name__
        and not any(word in name for word in NON_TEXT_ROTARY)
    ]


def static_refusal(model_type: str) -> str | None:
    """Why ``model_type`` cannot be derived from its classes alone, or ``None`` (it may still be refused per scheme)."""
    try:
        config_class, model_class = stock_classes(model_type)
    except FamilyRefused as exc:
        return str(exc)
    if not declares_rope_parameters(config_class):
        sub = [f.name for f in dataclasses.fields(config_class)] if dataclasses.is_dataclass(config_class) else []
        if "text_config" in sub:
            return (f"multimodal wrapper ({config_class.__name__}) whose rotary settings live in its text config; "
                    "patch the text model's own type instead")
        return f"no rotary position embedding ({config_class.__name__} has no rope_parameters)"
    rotary = text_rotary_classes(model_class)
    if not rotary:
        return f"no text rotary embedding module in {model_class.__module__}"
    if any("mrope" in inspect.getsource(cls) for cls in rotary):  # builds multimodal (3-D) positions
        return "multimodal 3-D rotary positions (mrope): a frequency scheme has no single text position to act on"
    return None


def derive(model_type: str, notes: list[str] | None = None, refusals: dict[str, str] | None = None) -> Family:
    """Build and register the patched classes of a derivable stock model type (raises :class:`FamilyRefused`)."""
    reason = static_refusal(model_type)
    if reason is not None:
        raise FamilyRefused(f"hf-posenc cannot patch model type {model_type!r}: {reason}.")
    config_class, model_class = stock_classes(model_type)
    family = make_family(config_class, model_class, __name__, notes, name_prefix=_prefix(config_class, model_class))
    for cls in (family.config_class, family.model_class):
        globals()[cls.__name__] = cls  # reachable as hf_posenc.families.derive.<name> (pickling, repr)
    family.refusals.update(refusals or {})
    return family


def _prefix(config_class: type, model_class: type) -> str:
    """Class-name prefix: the causal-LM class's (``Llama``), or the config's when several types share that class."""
    if getattr(model_class, "config_class", config_class) is config_class:
        return model_class.__name__.removesuffix("ForCausalLM")
    return config_class.__name__.removesuffix("Config")


def rotary_causal_lm_types() -> list[str]:
    """Every model type with a causal-LM class whose modeling module has a rotary embedding or whose config
    declares rope parameters: the universe the support table covers."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = []
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        config_class, model_class = stock_classes(model_type)
        if declares_rope_parameters(config_class) or any(
            name.endswith("RotaryEmbedding") for name in vars(importlib.import_module(model_class.__module__))
        ):
            found.append(model_type)
    return sorted(found)


__all__ = ["FamilyRefused", "derive", "rotary_causal_lm_types", "static_refusal", "stock_classes"]
