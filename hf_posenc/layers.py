"""Finding the parts of a loaded causal LM that several layers of hf-posenc need."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (``model.model.layers`` in every supported family), looking through a
    PEFT wrapper; a ``TypeError`` when there are none."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise TypeError(f"{type(base).__name__} has no decoder layers (`.model.layers`); pass a Transformers "
                        "causal LM.")
    return layers
