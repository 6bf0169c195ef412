"""Finding the parts of a loaded causal LM that several layers of hf-posenc need, and applying its head's logit
transform where hf-posenc computes logits itself."""

from __future__ import annotations

import torch
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


def output_logit_transform(config) -> tuple[float, float | None]:
    """``(scale, softcap)`` of what a causal LM does to ``lm_head``'s output in Transformers: logits =
    softcap·tanh(scale·z / softcap) (no tanh when ``softcap`` is ``None``), where ``scale`` is Cohere's
    ``logit_scale`` divided by Granite's ``logits_scaling`` and ``softcap`` is Gemma2/3's
    ``final_logit_softcapping``. Every path that computes logits itself (chunked losses, chunked perplexity) reads
    them here and applies them with :func:`transform_logits`."""
    scale = 1.0
    logit_scale = getattr(config, "logit_scale", None)
    if logit_scale is not None:
        scale *= float(logit_scale)
    logits_scaling = getattr(config, "logits_scaling", None)
    if logits_scaling is not None:
        scale /= float(logits_scaling)
    softcap = getattr(config, "final_logit_softcapping", None)
    return scale, None if softcap is None else float(softcap)


def transform_logits(logits: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """softcap·tanh(scale·z / softcap), or scale·z when ``softcap`` is ``None``: the transform that
    :func:`output_logit_transform` describes, applied to ``lm_head``'s output ``z``."""
    if scale != 1.0:  # most families: no pass over the [tokens, vocab] logits (x·1.0 = x exactly anyway)
        logits = logits * scale
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)
