"""``patch_model``: switch a loaded model's positional encoding to a scheme, in place and atomically."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from .patches import adapter_for
from .patches.base import required_attn_implementation
from .record import RECORD_KEY, SchemeRecord
from .schemes import SchemeConfig, make_scheme


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


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


def patch_model(model: Any, scheme: str | SchemeConfig = "cope", *, replace: bool = False, **options: Any) -> Any:
    """Switch ``model``'s positional encoding to ``scheme`` in place and return it.

    Args:
        model: a loaded causal LM of a supported family (Llama, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 text).
        scheme: a scheme name (``"cope"``, ``"hardclip"``, ``"prope"``, ``"rope"``) or a scheme config
            (``CoPEConfig(...)``, ...).
        replace: allow replacing a different scheme the model already carries (the new one is applied to the
            model's original frequencies, not on top of the old scheme).
        **options: the scheme's options when ``scheme`` is a name, e.g. ``clip_low_n=10`` or ``p=0.25``.

    The scheme is recorded in ``model.config`` (its class becomes the family's patched config, with model type
    ``hf_posenc_<type>``), so ``save_pretrained``/``from_pretrained`` restore it. Every check runs before anything
    changes: a failed call leaves the model as it was.
    """
    config_scheme = make_scheme(scheme, **options)
    check_patchable(model)
    config = model.config
    adapter = adapter_for(config.model_type)
    head_dim = _head_dim(config)
    config_scheme.check_model(head_dim)
    config_scheme = config_scheme.resolved(head_dim)

    current = scheme_record(config)
    if current is not None:
        if current.scheme == config_scheme:
            return model
        if not replace:
            raise ValueError(
                f"the model already carries scheme {current.scheme.name!r} ({current.scheme.to_dict()}); pass "
                f"replace=True to switch it to {config_scheme.name!r}."
            )
        original = current.original_rope_parameters
    else:
        original = copy.deepcopy(config.rope_parameters)

    frequencies = config_scheme.frequency_scheme()
    rope_parameters = copy.deepcopy(original)
    for key in adapter.rope_layer_keys(config, frequencies.layers):
        layer = original if key is None else original[key]
        new = frequencies.rope_parameters(layer, head_dim, config.max_position_embeddings)
        if key is None:
            rope_parameters = new
        else:
            rope_parameters[key] = new
    record = SchemeRecord(config_scheme, adapter.stock_model_type, original).to_dict()

    # Dry run on a copy: validation and the new rotary modules must succeed before the model is touched.
    candidate = copy.deepcopy(config)
    candidate.__class__ = adapter.config_class
    candidate.rope_parameters = rope_parameters
    setattr(candidate, RECORD_KEY, record)
    candidate.validate_rope()
    with torch.no_grad():
        rotaries = [(parent, name, _rebuild_rotary(old, candidate)) for parent, name, old in _rotary_modules(model)]

    previous_attn = required_attn_implementation(config)
    config.__class__ = adapter.config_class
    config.rope_parameters = rope_parameters
    setattr(config, RECORD_KEY, record)
    for parent, name, module in rotaries:
        module.config = config
        setattr(parent, name, module)
    if type(model) is adapter.stock_model_class:
        model.__class__ = adapter.model_class
    if current is not None:
        current.scheme.uninstall(model)
    config_scheme.install(model)
    if config_scheme.attention_name() is not None:
        model.set_attn_implementation(config_scheme.attention_name())
        if current is None and config_scheme.attn_implementation is not None:
            warnings.warn(
                f"{config_scheme.name} replaces how attention scores are computed, so a model pretrained with RoPE "
                "needs training before it is useful again (the paper trains with it); see recipes/ for continued "
                "training with `hf-posenc train`.",
                stacklevel=2,
            )
    elif previous_attn is not None:
        model.set_attn_implementation(None)
    return model
