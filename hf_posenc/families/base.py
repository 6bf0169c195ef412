"""What every model family shares: the patched config/model classes and their registration.

A patched model keeps its family's modeling code. Its config becomes a subclass with its own ``model_type``
(``hf_posenc_<type>``) carrying the scheme record, so that

* ``save_pretrained`` writes the scheme into ``config.json``;
* ``AutoModelForCausalLM.from_pretrained`` rebuilds the patched model after ``import hf_posenc`` (the classes are
  registered with the Auto classes; no ``trust_remote_code``);
* without hf-posenc, Transformers refuses the unknown model type instead of silently loading plain RoPE.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

from huggingface_hub.dataclasses import strict

from ..record import RECORD_KEY, SchemeRecord
from ..schemes import ROPE_TYPES, Scheme, SchemeConfig, on_register
from ..schemes.base import rotary_dim

GLOBAL_LAYER_TYPE = "full_attention"
MODEL_TYPE_PREFIX = "hf_posenc_"


class PosencConfigMixin:
    """Validates the scheme record on construction and teaches rope validation the CoPE/HardClip types."""

    def __post_init__(self, **kwargs: Any) -> None:
        record = getattr(self, RECORD_KEY, None)
        if record is not None:
            SchemeRecord.from_dict(record)
        super().__post_init__(**kwargs)
        self.check_record()

    def check_record(self) -> None:
        """The scheme is written twice in ``config.json``: as the record (``hf_posenc``: scheme, options, original
        rope parameters) and as the ``rope_parameters`` the model runs. They must agree: the ``rope_parameters`` the
        record implies (:func:`scheme_rope_parameters`) must be the config's, and rope types of hf-posenc need the
        record. A copy edited by hand or by a tool is an error naming both values, never a model that runs one
        scheme while ``get_scheme`` and ``hf-posenc info`` report another."""
        record = getattr(self, RECORD_KEY, None)
        rope = getattr(self, "rope_parameters", None)
        if record is None:
            layers = list(rope.values()) if isinstance(rope, dict) and self.nested_rope_parameter_keys(rope) else [rope]
            types = sorted({p.get("rope_type") for p in layers if isinstance(p, dict)} & set(ROPE_TYPES))
            if types:
                raise ValueError(
                    f"config.json has model_type {self.model_type!r} and rope type(s) {types} of hf-posenc, but no "
                    f"{RECORD_KEY!r} entry saying which scheme they come from (deleted or lost in an edit). Restore "
                    f"the entry from the checkpoint as it was saved, or re-patch the original model with "
                    "hf_posenc.patch_model."
                )
            return
        parsed = SchemeRecord.from_dict(record)
        try:
            implied = scheme_rope_parameters(self, parsed.scheme, parsed.original_rope_parameters)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"config.{RECORD_KEY} (scheme {parsed.scheme.name!r}, options "
                             f"{parsed.scheme.to_dict()}) cannot be applied to its own original_rope_parameters: "
                             f"{exc}") from exc
        if implied != rope:
            implied_value, held_value = _difference(implied, rope)
            raise ValueError(
                f"config.json disagrees with itself: its {RECORD_KEY} entry (scheme {parsed.scheme.name!r}, options "
                f"{parsed.scheme.to_dict()}) implies rope_parameters {implied_value}, but "
                f"rope_parameters holds {held_value}. One of them was edited: restore it as it "
                "was saved; to change the scheme, patch the model with hf_posenc.patch_model(model, ..., "
                "replace=True) (or `hf-posenc patch --replace`), which writes both."
            )

    def validate_rope(self) -> None:
        """Transformers' generic rope validation (every registered rope type, hf-posenc's included) once a scheme
        rewrote ``rope_parameters``: a family's own check accepts only its stock types (Phi3 and PhiMoE: longrope),
        and the scheme's parameters were validated by the scheme itself. Unpatched: the family's own check."""
        if getattr(self, RECORD_KEY, None) is None:
            return super().validate_rope()
        from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

        return RotaryEmbeddingConfigMixin.validate_rope(self)


# rope_parameters keys read by a family's attention or rotary module itself, kept when a scheme rewrites the rest.
FAMILY_ROPE_KEYS = ("llama_4_scaling_beta", "original_max_position_embeddings", "short_mscale", "long_mscale")


def rope_layer_keys(config: Any, layers: str) -> list[str | None]:
    """Which entries of ``config.rope_parameters`` a scheme rewrites: ``[None]`` for a flat dict; for configs
    nested per layer type (Gemma3), the global (full-attention) entry, or every entry with ``layers="all"``."""
    nested = config.nested_rope_parameter_keys(config.rope_parameters)
    if not nested:
        return [None]
    if layers == "all":
        return [k for k in nested if config.rope_parameters[k] is not None]
    if config.rope_parameters.get(GLOBAL_LAYER_TYPE) is None:
        raise ValueError(
            f"this {config.model_type.removeprefix(MODEL_TYPE_PREFIX)!r} model sets rotary parameters per layer type "
            f"{sorted(nested)} with no {GLOBAL_LAYER_TYPE!r} entry, so layers='global' names no layers; pass "
            "layers='all'."
        )
    return [GLOBAL_LAYER_TYPE]


def scheme_rope_parameters(config: Any, scheme: SchemeConfig, original: dict[str, Any],
                           keys: list[str | None] | None = None) -> dict[str, Any]:
    """The ``rope_parameters`` a (resolved) scheme writes over a model's ``original`` ones: what ``patch_model``
    sets, and what a loaded config must hold for the record it carries (:meth:`PosencConfigMixin.check_record`).
    ``keys``: the entries rewritten (default: :func:`rope_layer_keys` of ``config`` for the scheme's layers)."""
    frequencies = scheme.frequency_scheme()
    if keys is None:
        probe = copy.copy(config)
        probe.rope_parameters = original
        keys = rope_layer_keys(probe, frequencies.layers)
    rope_parameters = copy.deepcopy(original)
    for key in keys:
        layer = original if key is None else original[key]
        new = frequencies.rope_parameters(layer, rotary_dim(config, layer),
                                          getattr(config, "max_position_embeddings", None))
        # keys a family's own modules read from rope_parameters (Ministral3's query scaling, PhiMoE's mscales)
        new.update({k: layer[k] for k in FAMILY_ROPE_KEYS if k in layer and k not in new})
        if key is None:
            rope_parameters = new
        else:
            rope_parameters[key] = new
    return rope_parameters


def _difference(a: Any, b: Any, path: str = "") -> tuple[str, str]:
    """The first place two rope-parameter dicts differ, as ``("key=value", "key=value")`` strings."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key, _MISSING) != b.get(key, _MISSING):
                return _difference(a.get(key, _MISSING), b.get(key, _MISSING), f"{path}.{key}" if path else str(key))
    show = lambda v: "(missing)" if v is _MISSING else repr(v)  # noqa: E731
    return f"{path or 'rope_parameters'} = {show(a)}", f"{path or 'rope_parameters'} = {show(b)}"


_MISSING = object()


def _learn_rope_types(scheme: Scheme) -> None:
    """Teach the patched configs to validate the rope types a registered scheme adds."""
    for name, rope_type in scheme.rope_types.items():  # a method: the config comes first
        setattr(PosencConfigMixin, f"_validate_{name}_rope_parameters", rope_type.validate)


on_register(_learn_rope_types)


def required_attn_implementation(config: Any) -> str | None:
    """The attention implementation a config's scheme needs (TAPA), or ``None`` if any backend works."""
    record = getattr(config, RECORD_KEY, None)
    return None if record is None else SchemeRecord.from_dict(record).scheme.attention_name()


class PosencModelMixin:
    """Builds the modules a scheme adds (TAPE) when a checkpoint is loaded, and keeps the attention implementation
    a scheme requires (TAPA): loading or ``set_attn_implementation`` picks it, and asking for another one is a
    clear error instead of silently computing plain attention."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        record = getattr(config, RECORD_KEY, None)
        if record is not None:
            SchemeRecord.from_dict(record).scheme.install(self)

    @classmethod
    def is_custom_code(cls) -> bool:
        """Not custom modeling code: the patched class inherits its family's ``_init_weights``, which goes through
        Transformers' guarded init functions. Transformers skips the init of a custom-code module that has no
        parameters of its own, which would leave a model-level init undone (FalconH1's Mamba ``mup_vector``
        stayed uninitialised memory on reload). The same holds where the class came from the remote-code bundle."""
        return False

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """``save_pretrained`` plus the remote code (``auto_map``) that loads the checkpoint without hf-posenc; with
        an adapter added (``model.add_adapter``), Transformers saves that adapter alone, and it gets its adapter
        record instead (``hf_posenc.adapters``), as a ``PeftModel``'s save does.

        When this class itself came from remote code, Transformers copies those files again on its own."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return
        if getattr(self, "_hf_peft_config_loaded", False):  # an adapter folder: no config.json, no model code
            describe = PUBLISHERS.get("adapter_record")
            if describe is not None:
                describe(self, save_directory)
            return
        write = PUBLISHERS.get("remote_code")
        if write is not None:
            write(save_directory, self.config)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Publish with hf-posenc's model card (see ``hf_posenc.hub.push_to_hub`` for the options)."""
        push = PUBLISHERS.get("push_to_hub")
        if push is None:  # loaded through remote code: Transformers' own upload
            return super().push_to_hub(repo_id, **kwargs)
        return push(self, repo_id, **kwargs)

    def _check_and_adjust_attn_implementation(self, attn_implementation: str | None, is_init_check: bool = False,
                                              **kwargs: Any) -> str:
        required = required_attn_implementation(self.config)
        if required is None:
            return super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check, **kwargs)
        if attn_implementation not in (None, required):
            raise ValueError(
                f"this model's positional-encoding scheme computes attention itself through {required!r}; "
                f"attn_implementation={attn_implementation!r} would drop it. Leave attn_implementation unset."
            )
        return required


# What the model classes publish beyond Transformers' own files, provided by the io layer, which registers it when
# imported (``import hf_posenc`` imports ``hf_posenc.remote_code`` and ``hf_posenc.hub``), so this core module
# never imports upwards: "remote_code" (directory, config) writes the remote-code files, "push_to_hub" (model,
# repo_id, **options) publishes with the model card, "adapter_record" (model, directory) describes an adapter that
# Transformers saved from a patched model (``hf_posenc.adapters``, imported with PEFT). A checkpoint's remote code has
# no io layer and leaves them unset: its save_pretrained writes the checkpoint alone and push_to_hub is Transformers'.
PUBLISHERS: dict[str, Callable[..., Any]] = {}


def register_publisher(name: str, fn: Callable[..., Any]) -> None:
    """Provide one of the :data:`PUBLISHERS` (called by the io layer at import)."""
    if name not in ("remote_code", "push_to_hub", "adapter_record"):
        raise ValueError(f"unknown publisher {name!r}; expected 'remote_code', 'push_to_hub' or 'adapter_record'")
    PUBLISHERS[name] = fn


@dataclass
class Family:
    """One supported model family: its stock classes, its patched classes, and what differs.

    Attributes:
        stock_config_class / stock_model_class: the family's Transformers classes.
        config_class / model_class: the patched subclasses (built by :func:`make_family`).
        notes: anything family-specific worth telling the user (shown by ``hf-posenc info``).
        refusals: scheme name -> why this family cannot take that scheme (``patch_model`` raises it).
    """

    stock_config_class: type
    stock_model_class: type
    config_class: type
    model_class: type
    notes: list[str] = field(default_factory=list)
    refusals: dict[str, str] = field(default_factory=dict)

    @property
    def stock_model_type(self) -> str:
        return self.stock_config_class.model_type


def make_family(stock_config_class: type, stock_model_class: type, module: str, notes: list[str] | None = None, *,
                name_prefix: str):
    """Create the patched config and causal-LM classes of one family and register them with the Auto classes,
    named ``<name_prefix>PosencConfig`` / ``<name_prefix>PosencForCausalLM``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    stock_type = stock_config_class.model_type
    config_class = strict(
        type(
            f"{name_prefix}PosencConfig",
            (PosencConfigMixin, stock_config_class),
            {
                "model_type": MODEL_TYPE_PREFIX + stock_type,
                "__annotations__": {RECORD_KEY: dict | None},
                RECORD_KEY: None,
                "__module__": module,
                "__doc__": f"{stock_config_class.__name__} with an hf-posenc positional-encoding scheme.",
            },
        )
    )
    model_class = type(
        f"{name_prefix}PosencForCausalLM",
        (PosencModelMixin, stock_model_class),
        {
            "config_class": config_class,
            "__module__": module,
            "__doc__": f"{stock_model_class.__name__} whose positional encoding is set by `config.{RECORD_KEY}`.",
        },
    )
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
    return Family(stock_config_class, stock_model_class, config_class, model_class, notes or [])
