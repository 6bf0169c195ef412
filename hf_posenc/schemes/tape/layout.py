"""Which decoder layouts TAPE's layer forward (:class:`~.modeling.TapeLayerMixin`) reproduces, and why not."""

from __future__ import annotations

from torch import nn

from ..base import head_dim, layer_rope_parameters, rotary_dim

# Decoder-layer and attention submodules TAPE's layer forward reproduces (Llama-style pre-norm, Gemma sandwich).
LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"}
REQUIRED_LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}
REQUIRED_ATTENTION_CHILDREN = {"q_proj", "k_proj", "v_proj", "o_proj"}


def layout_refusal(model: nn.Module) -> str | None:
    """Why TAPE's layer forward cannot carry the positional state through this model's decoder layers, or None."""
    config = model.config
    if any(rotary_dim(config, params) != head_dim(config) for params in layer_rope_parameters(config)):
        return "partial rotary: TAPE's state covers every head dimension, this family rotates a fraction of them"
    if getattr(config, "no_rope_layers", None) is not None:
        return "layers without positional encoding (no_rope_layers), which TAPE would rotate"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model.model, "rotary_emb"):
        return "no decoder with `layers` and one `rotary_emb` to start the state from"
    q_norm = getattr(getattr(layers[0], "self_attn", None), "q_norm", None)
    norm_width = getattr(getattr(q_norm, "weight", None), "numel", lambda: None)()
    if norm_width is not None and norm_width != head_dim(config):
        return "its q/k norms span every head of the projection (OLMo-style), TAPE's attention normalises per head"
    for layer in layers:
        children = {name for name, _ in layer.named_children()}
        attn = getattr(layer, "self_attn", None)
        attn_children = {name for name, _ in attn.named_children()} if attn is not None else set()
        if not REQUIRED_LAYER_CHILDREN <= children or children - LAYER_CHILDREN:
            return (f"decoder layer {type(layer).__name__} has submodules {sorted(children)}, not the pre-norm "
                    f"layout TAPE's layer forward reproduces ({sorted(REQUIRED_LAYER_CHILDREN)} plus Gemma's "
                    "feed-forward norms)")
        if not REQUIRED_ATTENTION_CHILDREN <= attn_children or attn_children - ATTENTION_CHILDREN:
            return (f"attention {type(attn).__name__} has submodules {sorted(attn_children)}, not the "
                    "q/k/v/o projections (and per-head q/k norms) TAPE's attention forward reproduces")
    return None

