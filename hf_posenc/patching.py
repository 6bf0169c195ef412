"""``patch_model``: switch a loaded model's positional encoding to a scheme, in place and atomically."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from .upstream import supports_attention_backend
from .patches import family_for, check_scheme
from .patches.base import Family, required_attn_implementation, rope_layer_keys, scheme_rope_parameters
from .patches.derive import FamilyRefused
from .record import EXPORT_KEY, RECORD_KEY, SchemeRecord
from .schemes import SchemeConfig, make_scheme
from .schemes.base import head_dim as config_head_dim
from .schemes.cope import rotary_dim

# Decoder-layer and attention submodules TAPE's layer forward reproduces (Llama-style pre-norm, Gemma sandwich).
TAPE_LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                       "post_feedforward_layernorm"}
TAPE_ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}


def _tape_refusal(model: nn.Module, config: Any) -> str | None:
    """Why TAPE's layer forward cannot carry the positional state through this model's decoder layers, or None."""
    if any(rotary_dim(config, params) != config_head_dim(config) for params in layer_rope_parameters(config)):
        return "partial rotary: TAPE's state covers every head dimension, this family rotates a fraction of them"
    if getattr(config, "no_rope_layers", None) is not None:
        return "layers without positional encoding (no_rope_layers), which TAPE would rotate"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model.model, "rotary_emb"):
        return "no decoder with `layers` and one `rotary_emb` to start the state from"
    attn = getattr(layers[0], "self_attn", None)
    q_norm = getattr(attn, "q_norm", None)
    norm_width = getattr(getattr(q_norm, "weight", None), "numel", lambda: None)()
    if norm_width is not None and norm_width != config_head_dim(config):
        return "its q/k norms span every head of the projection (OLMo-style), TAPE's attention normalises per head"
    for layer in layers:
        children = {name for name, _ in layer.named_children()}
        attn = getattr(layer, "self_attn", None)
        attn_children = {name for name, _ in attn.named_children()} if attn is not None else set()
        required = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
        if not required <= children or children - TAPE_LAYER_CHILDREN:
            return (f"decoder layer {type(layer).__name__} has submodules {sorted(children)}, not the pre-norm "
                    f"layout TAPE's layer forward reproduces ({sorted(required)} plus Gemma's feed-forward norms)")
        if not {"q_proj", "k_proj", "v_proj", "o_proj"} <= attn_children or attn_children - TAPE_ATTENTION_CHILDREN:
            return (f"attention {type(attn).__name__} has submodules {sorted(attn_children)}, not the "
                    "q/k/v/o projections (and per-head q/k norms) TAPE's attention forward reproduces")
    return None


def layer_rope_parameters(config: Any) -> list[dict[str, Any]]:
    """The rope parameters of each layer type of a config (one dict, or one per nested layer type)."""
    rope = config.rope_parameters
    nested = config.nested_rope_parameter_keys(rope)
    return [rope[k] for k in nested if rope[k] is not None] if nested else [rope]


def family_refusal(family: Family, model: nn.Module, scheme: SchemeConfig) -> str | None:
    """Why ``model`` (of ``family``) cannot take ``scheme``, or ``None``. Checks the rope parameters of
    the loaded config (the class-level checks ran when the family was derived)."""
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
    if scheme.name == "tapa" and not supports_attention_backend(type(model)):
        return "its attention does not go through Transformers' attention interface, which TAPA replaces"
    if scheme.name == "tapa" and getattr(config, "attn_logit_softcapping", None) is not None:
        return ("attention-logit soft-capping does not apply to TAPA scores; set config.attn_logit_softcapping = "
                "None before patching")
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    attn = getattr(layers[0], "self_attn", None) if len(layers) else None
    own = [name for name, _ in attn.named_parameters(recurse=False)] if attn is not None else []
    if scheme.name in ("tapa", "tape") and own:
        return (f"its attention has parameters of its own ({', '.join(own)}: attention sinks or gates) that "
                f"{scheme.name.upper()}'s attention would ignore")
    v_dim = getattr(config, "v_head_dim", None)
    qk_dim = getattr(config, "qk_head_dim", None) or (
        (getattr(config, "qk_nope_head_dim", None) or 0) + (getattr(config, "qk_rope_head_dim", None) or 0)
    ) or config_head_dim(config)
    if scheme.name in ("tapa", "tape") and v_dim is not None and v_dim != qk_dim:
        return (f"its values are {v_dim} wide and its queries/keys {qk_dim} (multi-head latent attention); "
                f"{scheme.name.upper()} splits one head width across queries, keys and values")
    if scheme.name == "tape":
        return _tape_refusal(model, config)
    return None


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
    where = getattr(config, "_name_or_path", "") or "this model"
    source = export.get("exported_from")
    raise ValueError(
        f"{where} is a stock export of hf-posenc, written from {source or 'a patched model'} with scheme "
        f"{export.get('scheme')!r} {export.get('options', {})}: its rope_parameters already apply that scheme, so "
        f"patching it with {scheme.name!r} would apply a scheme over it ({export.get('scheme')} twice, if the same). "
        "Load the hf-posenc checkpoint it was exported from (save_pretrained's output) or patch the original base "
        "model; to stack the schemes on purpose, pass compose=True (`hf-posenc patch --compose`, recipe "
        "`scheme.compose: true`)."
    )


def patch_model(model: Any, scheme: str | SchemeConfig = "cope", *, replace: bool = False, compose: bool = False,
                **options: Any) -> Any:
    """Switch ``model``'s positional encoding to ``scheme`` in place and return it.

    Args:
        model: a loaded causal LM of a supported family (Llama, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 text).
        scheme: a scheme name (``"cope"``, ``"hardclip"``, ``"prope"``, ``"rope"``) or a scheme config
            (``CoPEConfig(...)``, ...).
        replace: allow replacing a different scheme the model already carries (the new one is applied to the
            model's original frequencies, not on top of the old scheme).
        compose: allow patching a stock export of hf-posenc (``export_stock``'s output, refused by default), whose
            frequencies already carry a scheme: the new scheme is then applied on top of them.
        **options: the scheme's options when ``scheme`` is a name, e.g. ``clip_low_n=10`` or ``p=0.25``.

    The scheme is recorded in ``model.config`` (its class becomes the family's patched config, with model type
    ``hf_posenc_<type>``), so ``save_pretrained``/``from_pretrained`` restore it. Every check runs before anything
    changes: a failed call leaves the model as it was.
    """
    config_scheme = make_scheme(scheme, **options)
    check_patchable(model)
    config = model.config
    if not compose:
        check_not_an_export(config, config_scheme)
    family = family_for(config.model_type)
    check_scheme(family, config_scheme.name)
    reason = family_refusal(family, model, config_scheme)
    if reason is not None:
        raise FamilyRefused(
            f"{config_scheme.name} cannot be applied to this {family.stock_model_type!r} model: {reason}. See "
            "`hf-posenc families` for the families and schemes verified."
        )
    # CoPE's and p-RoPE's counts are over the rotated frequency pairs (partial rotary rotates a fraction of a
    # head); TAPA splits whole heads.
    current = scheme_record(config)
    original = copy.deepcopy(config.rope_parameters) if current is None else current.original_rope_parameters
    keys = rope_layer_keys(config, config_scheme.frequency_scheme().layers)
    dims = [config_head_dim(config)] if config_scheme.name == "tapa" else [
        rotary_dim(config, original if k is None else original[k]) for k in keys
    ]
    for dim in dict.fromkeys(dims):
        config_scheme.check_model(dim)
    config_scheme = config_scheme.resolved(dims[0])

    if current is not None:
        if current.scheme == config_scheme:
            return model
        if not replace:
            raise ValueError(
                f"the model already carries scheme {current.scheme.name!r} ({current.scheme.to_dict()}); pass "
                f"replace=True (in a training recipe: scheme.replace: true) to switch it to {config_scheme.name!r} "
                f"with options {config_scheme.to_dict()}."
            )

    rope_parameters = scheme_rope_parameters(config, config_scheme, original, keys)
    record = SchemeRecord(config_scheme, family.stock_model_type, original).to_dict()

    # Dry run on a copy: validation and the new rotary modules must succeed before the model is touched.
    candidate = copy.deepcopy(config)
    candidate.__class__ = family.config_class
    candidate.rope_parameters = rope_parameters
    setattr(candidate, RECORD_KEY, record)
    candidate.validate_rope()
    with torch.no_grad():
        rotaries = [(parent, name, _rebuild_rotary(old, candidate)) for parent, name, old in _rotary_modules(model)]

    previous_attn = required_attn_implementation(config)
    config.__class__ = family.config_class
    config.rope_parameters = rope_parameters
    setattr(config, RECORD_KEY, record)
    for parent, name, module in rotaries:
        module.config = config
        setattr(parent, name, module)
    if type(model) is family.stock_model_class:
        model.__class__ = family.model_class
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
