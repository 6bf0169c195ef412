"""``export_stock``: write a patched frequency-scheme model as a checkpoint that stock Transformers loads.

* p-RoPE is already Transformers' ``proportional`` type, and plain RoPE/ABF/PI/YaRN/Llama-3 are stock types.
* CoPE/HardClip become ``longrope`` with per-dimension factors f_j = 1/w_j, an explicit ``attention_factor`` and
  ``short_factor == long_factor`` (so the short/long switch changes nothing). Over the ``default`` base this is
  exactly how hf-posenc computes them, so logits are bitwise identical; over linear/YaRN/Llama-3 bases the factors
  are the ratios of the default frequencies to the patched ones, equal up to float rounding.
* CoPE/HardClip over dynamic NTK has no stock equivalent (its frequencies change with the sequence length) and is
  refused, as are schemes that change attention itself.

vLLM: it reads ``proportional`` and ``longrope``; for ``longrope`` it ignores ``attention_factor`` and derives the
attention scale from ``max_position_embeddings / original_max_position_embeddings``, which the export keeps equal
(scale 1). CoPE over YaRN (attention scale ≠ 1) therefore loads in vLLM with a different attention scale.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from .io_atomic import atomic_dir
from .patches import adapter_for
from .patching import check_patchable, scheme_record
from .record import RECORD_KEY
from .schemes.base import FrequencySchemeConfig
from .schemes.cope import STOCK_INF_FACTOR, clipped_rope_init, taper_factors

CLIPPED = ("cope", "hardclip")


def _stock_layer_params(config: Any, params: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    rope_type = params["rope_type"]
    if rope_type not in CLIPPED:
        if rope_type.endswith("_dynamic") and rope_type.removesuffix("_dynamic") in CLIPPED:
            raise ValueError(
                f"{rope_type}: CoPE/HardClip over dynamic NTK has no stock Transformers equivalent (its frequencies "
                "change with the sequence length); patch with a static base (e.g. scaling='yarn') to export it."
            )
        return dict(params)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    theta = params["rope_theta"]
    if params["base_rope_type"] == "default":
        factors = taper_factors(head_dim // 2, params["clip_low_n"], rope_type == "hardclip")
        attention_factor = 1.0
    else:
        inv_freq, attention_factor = clipped_rope_init(config, None, None, layer_type, hard=rope_type == "hardclip")
        default = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        inv = inv_freq.double()
        factors = torch.where(inv > 0, default / inv.clamp_min(1e-300), torch.full_like(inv, float("inf")))
    factors = factors.clamp(max=STOCK_INF_FACTOR).tolist()
    return {
        "rope_type": "longrope",
        "rope_theta": theta,
        "short_factor": factors,
        "long_factor": factors,
        "factor": 1.0,
        "attention_factor": float(attention_factor),
        "original_max_position_embeddings": config.max_position_embeddings,
    }


def stock_config(model_or_config: Any) -> Any:
    """The stock Transformers config equivalent to a patched model's config (see the module docstring)."""
    config = getattr(model_or_config, "config", model_or_config)
    record = scheme_record(config)
    if record is None:
        raise ValueError("this model carries no hf-posenc scheme; save it with `save_pretrained` instead.")
    if not isinstance(record.scheme, FrequencySchemeConfig):
        raise ValueError(
            f"scheme {record.scheme.name!r} changes attention itself and has no stock Transformers equivalent; "
            "publish it with `save_pretrained` (loads with hf-posenc installed)."
        )
    adapter = adapter_for(config.model_type)
    rope = config.rope_parameters
    nested = config.nested_rope_parameter_keys(rope)
    if nested:
        rope = {k: (None if rope[k] is None else _stock_layer_params(config, rope[k], k)) for k in nested}
    else:
        rope = _stock_layer_params(config, rope, None)
    values = config.to_dict()
    for key in (RECORD_KEY, "model_type", "transformers_version", "architectures", "auto_map"):
        values.pop(key, None)
    values["rope_parameters"] = rope
    stock = adapter.stock_config_class.from_dict(values)
    stock.architectures = [adapter.stock_model_class.__name__]
    return stock


def export_stock(model: Any, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """Write ``model`` (patched with a frequency scheme) to ``path`` as a stock Transformers checkpoint.

    A Python with Transformers but without hf-posenc loads it with ``from_pretrained`` and gets the same logits.
    ``path`` must be missing or empty unless ``overwrite`` (then it is replaced as a whole). Nothing changes at
    ``path`` unless the whole export succeeds (see :mod:`hf_posenc.io_atomic`).
    """
    check_patchable(model)
    stock = stock_config(model)
    with atomic_dir(path, overwrite=overwrite) as tmp:
        PreTrainedModel.save_pretrained(model, tmp)  # Transformers' own: none of the patched class's remote code
        stock.to_json_file(os.path.join(tmp, "config.json"))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            if RECORD_KEY in json.load(f):
                raise RuntimeError("internal error: the stock config still carries the hf-posenc record.")
    return Path(path)
