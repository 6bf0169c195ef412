"""``patch_model``: switch a loaded model's positional encoding to a scheme, in place and atomically."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .families import check_scheme, family_for
from .families.base import required_attn_implementation, rope_layer_keys, scheme_rope_parameters
from .record import EXPORT_KEY, RECORD_KEY, SchemeRecord
from .schemes import SchemeConfig, make_scheme
from .schemes.base import head_dim as config_head_dim
from .schemes.base import rotary_dim
from .upstream import name_or_path


def scheme_record(model_or_config: Any) -> SchemeRecord | None:
    """The parsed scheme record of a model or config, or ``None`` for an unpatched one."""
    config = getattr(model_or_config, "config", model_or_config)
    record = getattr(config, RECORD_KEY, None)
    return None if record is None else SchemeRecord.from_dict(record)


def get_scheme(model_or_config: Any) -> SchemeConfig | None:
    """The scheme config a model (or config) carries, or ``None`` if it was never patched."""
    record = scheme_record(model_or_config)
    return None if record is None else record.scheme


def check_patchable(model: Any) -> None:
    """Refuse objects that cannot be patched in place, naming the fix."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        raise TypeError(
            "patch_model got a PEFT-wrapped model. Patch the base model before wrapping it: "
            "`hf_posenc.patch_model(base, ...)` then `peft.get_peft_model(base, lora_config)` (or, for an existing "
            "PeftModel, patch `model.get_base_model()` and make sure the adapter was trained with that scheme)."
        )
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"patch_model needs a Transformers model, got {type(model).__name__}.")
    quant = getattr(model.config, "quantization_config", None)
    method = getattr(quant, "quant_method", None) or (quant.get("quant_method") if isinstance(quant, dict) else None)
    if getattr(model, "hf_quantizer", None) is not None and str(getattr(method, "value", method)) == "gguf":
        raise ValueError(
            "this model was loaded from GGUF and is still marked quantized, so it can be neither saved nor trained. "
            "Load it with `from_pretrained(dir, gguf_file=..., quantization_config=GgufConfig(dequantize=True))` "
            "(or call `model.hf_quantizer.remove_quantization_config(model)`), then patch it."
        )


def _rotary_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child).__name__.endswith("RotaryEmbedding"):
                found.append((parent, name, child))
    if not found:
        raise ValueError(f"no rotary embedding module found in {type(model).__name__}; is it a RoPE model?")
    return found


def _rebuild_rotary(old: nn.Module, config: Any) -> nn.Module:
    new = type(old)(config=config)
    reference = next(iter(old.buffers()), None)
    if reference is not None:
        new = new.to(device=reference.device, dtype=reference.dtype)
    return new


def check_not_an_export(config: Any, scheme: SchemeConfig) -> None:
    """Refuse to patch a stock export of hf-posenc (``export_stock``): its ``rope_parameters`` already carry a
    scheme as stock rope types (CoPE as ``longrope`` factors), so a new scheme would be applied on top of it."""
    export = getattr(config, EXPORT_KEY, None)
    if not isinstance(export, dict):
        return
    where = name_or_path(config) or "this model"
    source = export.get("exported_from")
    raise ValueError(
        f"{where} is a stock export of hf-posenc, written from {source or 'a patched model'} with scheme "
        f"{export.get('scheme')!r} {export.get('options', {})}: its rope_parameters already apply that scheme, so "
        f"patching it with {scheme.name!r} would apply a scheme over it ({export.get('scheme')} twice, if the same). "
        "Load the hf-posenc checkpoint it was exported from (save_pretrained's output) or patch the original base "
        "model; to stack the schemes on purpose, pass compose=True (`hf-posenc patch --compose`, recipe "
        "`scheme.compose: true`)."
    )


@dataclass
class _Patch:
    """What a patch writes into the model, built and validated on a copy of its config before anything changes."""

    rope_parameters: Any
    record: dict[str, Any]
    rotaries: list[tuple[nn.Module, str, nn.Module]]  # (parent, child name, the new rotary module)


def _resolve_for_model(config: Any, scheme: SchemeConfig, original: Any) -> tuple[list[str | None], SchemeConfig]:
    """The rope-parameter keys the scheme applies to (one per layer type; ``None`` for a single set) and the scheme
    resolved for the model's width, after checking it fits every width it acts on. A frequency scheme counts over
    the rotated frequency pairs (partial rotary rotates a fraction of a head); a scheme that splits whole heads
    (SchemeConfig.whole_head: TAPA) over the head width."""
    keys = rope_layer_keys(config, scheme.frequency_scheme().layers)
    dims = [config_head_dim(config)] if scheme.whole_head else [
        rotary_dim(config, original if k is None else original[k]) for k in keys
    ]
    for dim in dict.fromkeys(dims):
        scheme.check_model(dim)
    return keys, scheme.resolved(dims[0])


def _carries_it_already(current: SchemeRecord | None, scheme: SchemeConfig, replace: bool) -> bool:
    """Whether the model already carries exactly ``scheme`` (patching again changes nothing); refuses a model that
    carries another scheme unless ``replace``."""
    if current is None:
        return False
    if current.scheme == scheme:
        return True
    if not replace:
        raise ValueError(
            f"the model already carries scheme {current.scheme.name!r} ({current.scheme.to_dict()}); to switch "
            f"it to {scheme.name!r} with options {scheme.to_dict()}, pass replace=True "
            "(`hf-posenc patch --replace`, recipe `scheme.replace: true`)."
        )
    return False


def _dry_run(model: nn.Module, family: Any, scheme: SchemeConfig, original: Any, keys: list[str | None]) -> _Patch:
    """The new rope parameters, scheme record and rotary modules, validated on a copy of the config: everything
    that can fail, before the model is touched."""
    config = model.config
    rope_parameters = scheme_rope_parameters(config, scheme, original, keys)
    record = SchemeRecord(scheme, family.stock_model_type, original).to_dict()
    candidate = copy.deepcopy(config)
    candidate.__class__ = family.config_class
    candidate.rope_parameters = rope_parameters
    setattr(candidate, RECORD_KEY, record)
    candidate.validate_rope()
    with torch.no_grad():
        rotaries = [(parent, name, _rebuild_rotary(old, candidate)) for parent, name, old in _rotary_modules(model)]
    return _Patch(rope_parameters, record, rotaries)


def _apply(model: nn.Module, family: Any, patch: _Patch, current: SchemeRecord | None, scheme: SchemeConfig) -> None:
    """Write a dry-run patch into the model: its config (class, rope parameters, record), the rotary modules, the
    model's class, the scheme's own modules (the previous scheme's taken out first) and its attention."""
    config = model.config
    previous_attn = required_attn_implementation(config)
    config.__class__ = family.config_class
    config.rope_parameters = patch.rope_parameters
    setattr(config, RECORD_KEY, patch.record)
    for parent, name, module in patch.rotaries:
        module.config = config
        setattr(parent, name, module)
    if type(model) is family.stock_model_class:
        model.__class__ = family.model_class
    if current is not None:
        current.scheme.uninstall(model)
    scheme.install(model)
    if scheme.attention_name() is not None:
        model.set_attn_implementation(scheme.attention_name())
    elif previous_attn is not None:
        model.set_attn_implementation(None)


def patch_model(model: Any, scheme: str | SchemeConfig = "cope", *, replace: bool = False, compose: bool = False,
                **options: Any) -> Any:
    """Switch ``model``'s positional encoding to ``scheme`` in place and return it.

    Args:
        model: a loaded causal LM whose rotary embedding Transformers builds from ``ROPE_INIT_FUNCTIONS``: Llama,
            Mistral, Qwen2, Qwen3, Gemma 1-3, Phi-3, OLMo, Granite, Cohere, DeepSeek and the other rotary model
            types of the installed Transformers. Which schemes each model type takes (verified by the tests, or
            refused with the reason) is the table in docs/families.md (``hf-posenc families`` prints it).
        scheme: a scheme name from the registry (``hf_posenc.SCHEMES``): ``"cope"``, ``"hardclip"``, ``"prope"``,
            ``"rope"`` (with PI, NTK, YaRN or ABF options), ``"tapa"``, ``"tape"``, or one registered with
            ``register_scheme``; or a scheme config (``CoPEConfig(...)``, ...).
        replace: allow replacing a different scheme the model already carries (the new one is applied to the
            model's original frequencies, not on top of the old scheme).
        compose: allow patching a stock export of hf-posenc (``export_stock``'s output, refused by default), whose
            frequencies already carry a scheme: the new scheme is then applied on top of them.
        **options: the scheme's options when ``scheme`` is a name, e.g. ``clip_low_n=10`` or ``p=0.25``.

    The scheme is recorded in ``model.config`` (its class becomes the family's patched config, with model type
    ``hf_posenc_<type>``), so ``save_pretrained``/``from_pretrained`` restore it. Every check runs before anything
    changes: a failed call leaves the model as it was."""
    config_scheme = make_scheme(scheme, **options)
    check_patchable(model)
    config = model.config
    if not compose:
        check_not_an_export(config, config_scheme)
    family = family_for(config.model_type)
    check_scheme(family, config_scheme, model)
    current = scheme_record(config)
    original = copy.deepcopy(config.rope_parameters) if current is None else current.original_rope_parameters
    keys, config_scheme = _resolve_for_model(config, config_scheme, original)
    if _carries_it_already(current, config_scheme, replace):
        return model
    patch = _dry_run(model, family, config_scheme, original, keys)
    _apply(model, family, patch, current, config_scheme)
    replaces_attention = config_scheme.attention_name() is not None and config_scheme.attn_implementation is not None
    if current is None and replaces_attention:
        warnings.warn(
            f"{config_scheme.name} replaces how attention scores are computed, so a model pretrained with RoPE "
            "needs training before it is useful again (the paper trains with it); see recipes/ for continued "
            "training with `hf-posenc train`.",
            stacklevel=2,
        )
    return model
