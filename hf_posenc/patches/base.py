"""What every model family shares: the patched config/model classes and their registration.

A patched model keeps its family's modeling code. Its config becomes a subclass with its own ``model_type``
(``hf_posenc_<type>``) carrying the scheme record, so that

* ``save_pretrained`` writes the scheme into ``config.json``;
* ``AutoModelForCausalLM.from_pretrained`` rebuilds the patched model after ``import hf_posenc`` (the classes are
  registered with the Auto classes; no ``trust_remote_code``);
* without hf-posenc, Transformers refuses the unknown model type instead of silently loading plain RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from huggingface_hub.dataclasses import strict

from ..record import RECORD_KEY, SchemeRecord
from ..schemes import Scheme, on_register

GLOBAL_LAYER_TYPE = "full_attention"
MODEL_TYPE_PREFIX = "hf_posenc_"


class PosencConfigMixin:
    """Validates the scheme record on construction and teaches rope validation the CoPE/HardClip types."""

    def __post_init__(self, **kwargs: Any) -> None:
        record = getattr(self, RECORD_KEY, None)
        if record is not None:
            SchemeRecord.from_dict(record)
        super().__post_init__(**kwargs)

    def validate_rope(self) -> None:
        """Transformers' generic rope validation (every registered rope type, hf-posenc's included) once a scheme
        rewrote ``rope_parameters``: a family's own check accepts only its stock types (Phi3 and PhiMoE: longrope),
        and the scheme's parameters were validated by the scheme itself. Unpatched: the family's own check."""
        if getattr(self, RECORD_KEY, None) is None:
            return super().validate_rope()
        from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

        return RotaryEmbeddingConfigMixin.validate_rope(self)


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
        """``save_pretrained`` plus the remote code (``auto_map``) that loads the checkpoint without hf-posenc.

        When this class itself came from remote code, Transformers copies those files again on its own."""
        super().save_pretrained(save_directory, *args, **kwargs)
        write = PUBLISHERS.get("remote_code")
        if write is not None and kwargs.get("is_main_process", True):
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
# repo_id, **options) publishes with the model card. A checkpoint's remote code has no io layer and leaves both
# unset: its save_pretrained writes the checkpoint alone and push_to_hub is Transformers'.
PUBLISHERS: dict[str, Callable[..., Any]] = {}


def register_publisher(name: str, fn: Callable[..., Any]) -> None:
    """Provide one of the :data:`PUBLISHERS` (called by the io layer at import)."""
    if name not in ("remote_code", "push_to_hub"):
        raise ValueError(f"unknown publisher {name!r}; expected 'remote_code' or 'push_to_hub'")
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

    def rope_layer_keys(self, config: Any, layers: str) -> list[str | None]:
        """Which entries of ``config.rope_parameters`` a scheme rewrites: ``[None]`` for a flat dict; for configs
        nested per layer type (Gemma3), the global (full-attention) entry, or every entry with ``layers="all"``."""
        nested = config.nested_rope_parameter_keys(config.rope_parameters)
        if not nested:
            return [None]
        if layers == "all":
            return [k for k in nested if config.rope_parameters[k] is not None]
        if config.rope_parameters.get(GLOBAL_LAYER_TYPE) is None:
            raise ValueError(
                f"this {self.stock_model_type!r} model sets rotary parameters per layer type {sorted(nested)} with no "
                f"{GLOBAL_LAYER_TYPE!r} entry, so layers='global' names no layers; pass layers='all'."
            )
        return [GLOBAL_LAYER_TYPE]


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
