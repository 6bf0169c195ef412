"""``export_stock``: write a patched frequency-scheme model as a checkpoint that stock Transformers loads.

What needs converting is read from the scheme registry, never from a scheme's name
(:class:`hf_posenc.schemes.RopeType`):

* Transformers' own rope types (plain RoPE, ABF, PI, YaRN, Llama-3, dynamic NTK, LongRoPE, p-RoPE's
  ``proportional``) are written as they are.
* A rope type a scheme registered (CoPE, HardClip, or one registered from outside the package) that is static becomes
  ``longrope`` with per-dimension factors f_j = θ_j/θ'_j, an explicit ``attention_factor`` and
  ``short_factor == long_factor`` (so the short/long switch changes nothing). The factors are the rope type's own
  closed form where it declares one (CoPE/HardClip over the ``default`` base: f_j = 1/w_j, exactly how hf-posenc
  computes them, so logits are bitwise identical), else the ratios of Transformers' default frequencies to the
  patched ones (equal up to float rounding; exact where the scheme multiplies the frequencies by a power of two).
* A registered rope type declared ``dynamic`` (CoPE/HardClip over dynamic NTK: its frequencies change with the
  sequence length) has no stock equivalent and is refused, naming the scheme, as are schemes that change attention
  itself.

vLLM: it reads ``proportional`` and ``longrope``; for ``longrope`` it ignores ``attention_factor`` and derives the
attention scale from ``max_position_embeddings / original_max_position_embeddings``, which the export keeps equal
(scale 1). So the written files carry a ``longrope`` attention factor ≠ 1 (CoPE/HardClip over YaRN) in the query/key
weights instead, with ``attention_factor`` 1; vLLM's ``proportional`` ignores ``factor``, so p-RoPE over PI is written
as ``longrope``; what vLLM still computes differently (dynamic NTK) is a warning at export time
(:mod:`hf_posenc.vllm_compat`; measured by ``scripts/serving/vllm_compare.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # the schemes' rope types are registered there

from .io_atomic import atomic_dir
from .families import family_for
from .patching import check_patchable, scheme_record
from .record import EXPORT_KEY, LIBRARY_VERSION, RECORD_KEY
from .schemes import ROPE_TYPES
from .schemes.base import STOCK_INF_FACTOR, FrequencySchemeConfig
from .schemes.base import head_dim as config_head_dim
from .upstream import name_or_path
from .vllm_compat import fold_attention_factors, warn_vllm_differences


def frequency_factors(inv_freq: torch.Tensor, theta: float, head_dim: int) -> torch.Tensor:
    """Per-dimension factors f_i = θ_i / θ'_i that turn RoPE's θ_i = theta^(−2i/d) into ``inv_freq`` θ'
    (LongRoPE's and llama.cpp's ``rope_freqs`` form); float64, ``STOCK_INF_FACTOR`` where θ'_i = 0.

    θ_i is computed as Transformers' default and ``longrope`` rope types compute it (float32), so a scheme that scales
    a frequency by a power of two gets that factor exactly and LongRoPE reproduces its frequency bit for bit."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    default = (1.0 / (theta ** exponent)).double()
    inv = inv_freq.double()
    return (default / inv.clamp_min(1e-300)).clamp(max=STOCK_INF_FACTOR)  # θ'_i = 0 lands on the clamp too


def rope_factors(config: Any, params: dict[str, Any], layer_type: str | None, rotary: int,
                 ) -> tuple[torch.Tensor, float]:
    """``(factors, attention_scaling)`` of a static rope type over plain RoPE (``rotary``: the rotated dimensions):
    the registered rope type's closed form where it declares one (:class:`hf_posenc.schemes.RopeType` ``factors``),
    else the ratios of the frequencies its init function computes. Raises ``ValueError`` when that function does not
    give one frequency per rotated pair."""
    rope_type = params["rope_type"]
    registered = ROPE_TYPES.get(rope_type)
    exact = registered.factors(config, params, layer_type) if registered and registered.factors else None
    if exact is not None:
        factors, attention_factor = exact
        return factors.double(), float(attention_factor)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, None, None, layer_type)
    if inv_freq.shape != (rotary // 2,):
        raise ValueError(f"rope type {rope_type!r} gives {tuple(inv_freq.shape)} frequencies for {rotary // 2} "
                         "rotated pairs; per-dimension factors cannot express it.")
    return frequency_factors(inv_freq, params["rope_theta"], rotary), float(attention_factor)


def dynamic_refusal(scheme: str, rope_type: str) -> str | None:
    """Why a rope type a scheme registered has no fixed per-dimension factors (it is declared ``dynamic``), or
    ``None`` (static, or one of Transformers' own types)."""
    registered = ROPE_TYPES.get(rope_type)
    if registered is None or not registered.dynamic:
        return None
    return (f"scheme {scheme!r} uses rope type {rope_type!r}, whose frequencies change with the sequence length "
            "(declared dynamic: over dynamic NTK), so no fixed per-dimension factors express them")


def _stock_layer_params(config: Any, params: dict[str, Any], layer_type: str | None, scheme: str) -> dict[str, Any]:
    rope_type = params["rope_type"]
    # vLLM's `proportional` ignores `factor`: p-RoPE over PI is written as the same frequencies in `longrope`
    scaled_prope = rope_type == "proportional" and params.get("factor", 1.0) != 1.0
    if rope_type not in ROPE_TYPES and not scaled_prope:  # Transformers' own rope type: stock Transformers has it
        return dict(params)
    refusal = dynamic_refusal(scheme, rope_type)
    if refusal is not None:
        raise ValueError(f"{refusal}; it has no stock Transformers equivalent. Patch with a static base (e.g. "
                         "scaling='yarn') to export it.")
    if "llama_4_scaling_beta" in params and params.get("original_max_position_embeddings") != getattr(
            config, "max_position_embeddings", None):
        raise ValueError(
            f"{rope_type}: this model scales its queries with original_max_position_embeddings (Llama-4-style "
            "attention scaling), which the stock form of this scheme (longrope) must set to max_position_embeddings; "
            "it has no stock equivalent. Keep the patched checkpoint (save_pretrained) instead."
        )
    head_dim = config_head_dim(config)
    # Phi, GLM, StableLM...: the factors cover the rotated pairs (for `proportional`, the key is p-RoPE's p instead)
    rotated = params.get("partial_rotary_factor") if rope_type != "proportional" else None
    head_dim = int(head_dim * rotated) if rotated is not None else head_dim
    theta = params["rope_theta"]
    factors, attention_factor = rope_factors(config, params, layer_type, head_dim)
    factors = factors.tolist()
    return {
        "rope_type": "longrope",
        "rope_theta": theta,
        "short_factor": factors,
        "long_factor": factors,
        "factor": 1.0,
        "attention_factor": float(attention_factor),
        "original_max_position_embeddings": config.max_position_embeddings,
        **({"partial_rotary_factor": rotated} if rotated is not None else {}),
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
    family = family_for(config.model_type)
    rope = config.rope_parameters
    nested = config.nested_rope_parameter_keys(rope)
    name = record.scheme.name
    if nested:
        rope = {k: (None if rope[k] is None else _stock_layer_params(config, rope[k], k, name)) for k in nested}
    else:
        rope = _stock_layer_params(config, rope, None, name)
    values = config.to_dict()
    for key in (RECORD_KEY, "model_type", "transformers_version", "architectures", "auto_map"):
        values.pop(key, None)
    values["rope_parameters"] = rope
    values[EXPORT_KEY] = {"scheme": record.scheme.name, "options": record.scheme.to_dict(),
                          "exported_from": name_or_path(config),
                          "library_version": LIBRARY_VERSION}
    stock = family.stock_config_class.from_dict(values)
    stock.architectures = [family.stock_model_class.__name__]
    return stock


def save_stock(model: Any, stock: Any, directory: str | os.PathLike, tokenizer: Any = None,
               state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Transformers' own save of ``model`` (none of the patched class's remote code) with the config ``stock``."""
    PreTrainedModel.save_pretrained(model, directory, state_dict=state_dict)
    stock.to_json_file(os.path.join(directory, "config.json"))
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def export_stock(model: Any, path: str | os.PathLike, tokenizer: Any = None, overwrite: bool = False) -> Path:
    """Write ``model`` (patched with a frequency scheme) to ``path`` as a stock Transformers checkpoint.

    A Python with Transformers but without hf-posenc loads it with ``from_pretrained`` and gets the same logits.
    ``path`` must be missing or empty unless ``overwrite`` (then it is replaced as a whole). Nothing changes at
    ``path`` unless the whole export succeeds (see :mod:`hf_posenc.io_atomic`)."""
    check_patchable(model)
    stock = stock_config(model)
    warn_vllm_differences(stock)
    state_dict = fold_attention_factors(model, stock)  # None when there is nothing to fold (see the docstring)
    with atomic_dir(path, overwrite=overwrite) as tmp:
        save_stock(model, stock, tmp, tokenizer, state_dict)
    return Path(path)
