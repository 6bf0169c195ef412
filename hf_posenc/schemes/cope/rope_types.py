"""CoPE/HardClip as Transformers rope types: ``ROPE_INIT_FUNCTIONS`` entries that apply the taper (eq. 10) to
whatever frequencies the base rope type computes, and the config-side validation of their ``rope_parameters``."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from ..base import rotary_dim
from .config import SCHEME_KEYS, STOCK_INF_FACTOR, taper_factors, taper_weights


def clipped_rope_init(
    config: Any, device: torch.device | None = None, seq_len: int | None = None, layer_type: str | None = None,
    *, hard: bool = False,
) -> tuple[torch.Tensor, float]:
    """``ROPE_INIT_FUNCTIONS`` entry: the base type's ``(inv_freq, attention_scaling)`` with the taper applied."""
    params = config.rope_parameters[layer_type] if layer_type is not None else config.rope_parameters
    clip_low_n, base_type = params["clip_low_n"], params["base_rope_type"]
    if base_type == "default":
        dim = rotary_dim(config, params)
        f = taper_factors(dim // 2, clip_low_n, hard).to(device=device, dtype=torch.float32)
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (f * params["rope_theta"] ** exponent), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base_params = {k: v for k, v in params.items() if k not in SCHEME_KEYS}
    base_params["rope_type"] = base_type
    shadow = copy.copy(config)  # a shallow copy whose rope parameters (for layer_type) are the base type's
    shadow.rope_parameters = base_params if layer_type is None else {**config.rope_parameters, layer_type: base_params}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[base_type](shadow, device, seq_len=seq_len, layer_type=layer_type)
    w = taper_weights(inv_freq.shape[-1], clip_low_n, hard).to(device=inv_freq.device, dtype=inv_freq.dtype)
    return inv_freq * w, scaling


def clipped_stock_factors(config: Any, params: dict[str, Any], layer_type: str | None = None, *, hard: bool = False,
                          ) -> tuple[torch.Tensor, float] | None:
    """``RopeType.factors``: over the ``default`` base, the taper's per-dimension factors f_j = 1/w_j (the rotated
    pairs; ``STOCK_INF_FACTOR`` where w_j = 0) and attention scaling 1, which is how :func:`clipped_rope_init`
    computes the frequencies, so LongRoPE with these factors reproduces them bit for bit; over any other base
    ``None`` (export takes the ratios of the computed frequencies)."""
    if params["base_rope_type"] != "default":
        return None
    factors = taper_factors(rotary_dim(config, params) // 2, params["clip_low_n"], hard)
    return factors.clamp(max=STOCK_INF_FACTOR), 1.0


cope_init = functools.partial(clipped_rope_init, hard=False)
hardclip_init = functools.partial(clipped_rope_init, hard=True)
cope_stock_factors = functools.partial(clipped_stock_factors, hard=False)
hardclip_stock_factors = functools.partial(clipped_stock_factors, hard=True)


def validate_clipped_rope_parameters(config: Any, rope_parameters: dict[str, Any], ignore_keys=None) -> None:
    """Config-side validation of a ``cope``/``hardclip`` rope dict, then of its base type's keys."""
    missing = [k for k in SCHEME_KEYS + ("rope_theta",) if k not in rope_parameters]
    if missing:
        raise KeyError(f"rope_parameters of type {rope_parameters['rope_type']!r} miss {missing}.")
    n, n_freq = rope_parameters["clip_low_n"], rotary_dim(config, rope_parameters) // 2
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= n_freq:
        raise ValueError(f"rope_parameters: clip_low_n must be an int in [0, {n_freq}] (the rotated frequency "
                         f"pairs), got {n!r}.")
    base = {k: v for k, v in rope_parameters.items() if k not in SCHEME_KEYS}
    base["rope_type"] = rope_parameters["base_rope_type"]
    validate = getattr(config, f"_validate_{base['rope_type']}_rope_parameters", None)
    if validate is None:
        raise ValueError(f"rope_parameters: unsupported base_rope_type {base['rope_type']!r}.")
    validate(base, ignore_keys=ignore_keys)
