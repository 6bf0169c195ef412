"""CoPE (soft-clipped RoPE) and the HardClip baseline (``cope-clipped-rope.md`` §4).

CoPE multiplies the RoPE inverse frequencies by a cosine taper over the lowest ``clip_low_n`` frequency indices
(§4.2 eq. 10, in the index form of the authors' reference code):

    w_j = 1                                              for j < n − c
    w_j = ½·(1 + cos(π·(j − (n − c)) / (c − 1)))          for n − c ≤ j < n   (``linspace(0, π, c)``)

so w = 1 at the onset index and w = 0 exactly at the lowest frequency. HardClip sets the same indices to zero
(the binary mask 𝟏[θ > θ_c] of §4.1). The taper multiplies whatever frequencies the model's rope type computes
(default, linear/PI, dynamic NTK, YaRN, Llama-3, LongRoPE), keeping that type's attention scaling, so the paper's
CoPE + ABF + YaRN setup is ``CoPEConfig(clip_low_n=20, rope_theta=1e7, scaling="yarn", factor=4)``.

They are registered as Transformers rope types (``cope``, ``hardclip`` and ``*_dynamic`` for a dynamic-NTK base,
whose frequencies Transformers recomputes as the sequence grows). Over the plain ``default`` base the taper is
applied in LongRoPE's form ``1 / (f_j · b^(2j/d))`` with f_j = 1/w_j, so :func:`hf_posenc.export_stock` can write
it as a stock ``longrope`` config that reproduces it bit for bit. Over ``longrope`` the taper is folded into the
factor lists, which keeps Transformers' short/long switching.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import FrequencySchemeConfig, check_type
from .base import head_dim as config_head_dim

# CoPE's reference setting: the last 20 of Llama-3-8B's 64 frequencies (head dim 128).
PAPER_CLIP_LOW_N, PAPER_N_FREQ = 20, 64
# A finite stand-in for an infinite LongRoPE factor (w = 0): JSON cannot hold inf, and f·b^(2j/d) overflows fp32
# to inf for every j > 0 of any practical base, giving exactly 0.
STOCK_INF_FACTOR = 3.0e38
SCHEME_KEYS = ("base_rope_type", "clip_low_n")


def taper_weights(n_freq: int, clip_low_n: int, hard: bool = False) -> torch.Tensor:
    """Per-frequency multipliers w_j (float64): cosine taper (eq. 10) or hard zeros over the last ``clip_low_n``."""
    if not 0 <= clip_low_n <= n_freq:
        raise ValueError(f"clip_low_n must be in [0, {n_freq}], got {clip_low_n}.")
    w = torch.ones(n_freq, dtype=torch.float64)
    if clip_low_n:
        if hard:
            w[n_freq - clip_low_n :] = 0.0
        else:
            w[n_freq - clip_low_n :] = 0.5 * (1.0 + torch.cos(torch.linspace(0.0, math.pi, clip_low_n, dtype=torch.float64)))
    return w


def taper_factors(n_freq: int, clip_low_n: int, hard: bool = False) -> torch.Tensor:
    """LongRoPE-style factors f_j = 1/w_j (float64, +inf where w_j = 0)."""
    w = taper_weights(n_freq, clip_low_n, hard)
    return torch.where(w > 0, 1.0 / w, torch.full_like(w, math.inf))


@dataclass(frozen=True)
class CoPEConfig(FrequencySchemeConfig):
    """Options of CoPE.

    Attributes:
        clip_low_n: how many of the lowest frequencies the taper covers; ``None`` scales the paper's Llama-3-8B
            setting (20 of 64) to the model's head dim (10 of 32 for head dim 64). 0 clips nothing.
        rope_theta / scaling / factor / ...: base-frequency change applied first (see ``FrequencySchemeConfig``).
    """

    name: ClassVar[str] = "cope"
    paper: ClassVar[str] = "CoPE: Clipped RoPE as A Scalable Free Lunch (cope-clipped-rope, eq. 10)"
    hard: ClassVar[bool] = False
    clip_low_n: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_type(self.name, "clip_low_n", self.clip_low_n, (int,), optional=True)
        if self.clip_low_n is not None and self.clip_low_n < 0:
            raise ValueError(f"{self.name}: clip_low_n must be >= 0, got {self.clip_low_n}.")

    def check_model(self, head_dim: int) -> None:
        """``head_dim``: the rotated dimensions of a head (all of it, or its ``partial_rotary_factor`` fraction)."""
        n_freq = head_dim // 2
        if self.clip_low_n is not None and self.clip_low_n > n_freq:
            raise ValueError(
                f"{self.name}: clip_low_n={self.clip_low_n} exceeds the model's {n_freq} RoPE frequencies "
                f"(rotated frequency pairs of {head_dim} rotated head dimensions); use a value in [0, {n_freq}]."
            )

    def resolved(self, head_dim: int) -> CoPEConfig:
        if self.clip_low_n is not None:
            return self
        n_freq = head_dim // 2
        return dataclasses.replace(self, clip_low_n=round(PAPER_CLIP_LOW_N * n_freq / PAPER_N_FREQ))

    def rope_parameters(self, model_params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> dict:
        """``head_dim``: the rotated dimensions (partial rotary models rotate a fraction of each head)."""
        base = self.base_rope_parameters(model_params, max_position_embeddings)
        if base["rope_type"] == "proportional":
            raise ValueError(
                f"{self.name}: the model's rope type is already 'proportional' (p-RoPE, zero frequencies above its "
                "fraction), so its lowest frequencies are not RoPE's; pass scaling='linear' (or another scaling) to "
                "replace it, or use scheme='prope'."
            )
        n = self.clip_low_n
        if base["rope_type"] == "longrope":
            f = taper_factors(head_dim // 2, n, self.hard).clamp(max=STOCK_INF_FACTOR)
            out = dict(base)
            for key in ("short_factor", "long_factor"):
                out[key] = [float(a * b) for a, b in zip(base[key], f.tolist())]
            return out
        name = self.name + ("_dynamic" if base["rope_type"] == "dynamic" else "")
        rest = {k: v for k, v in base.items() if k != "rope_type"}
        return {"rope_type": name, "base_rope_type": base["rope_type"], "clip_low_n": n, **rest}


@dataclass(frozen=True)
class HardClipConfig(CoPEConfig):
    """HardClip: the same lowest ``clip_low_n`` frequencies set to zero (the paper's baseline, §4.1)."""

    name: ClassVar[str] = "hardclip"
    paper: ClassVar[str] = "CoPE paper's HardClip baseline (Barbero et al. 2025 truncation; cope-clipped-rope §4.1)"
    hard: ClassVar[bool] = True


# -- Transformers rope types -------------------------------------------------------------------------------------
def _layer_params(config: Any, layer_type: str | None) -> dict[str, Any]:
    return config.rope_parameters[layer_type] if layer_type is not None else config.rope_parameters


def _shadow_config(config: Any, layer_type: str | None, params: dict[str, Any]) -> Any:
    """A shallow copy of ``config`` whose rope parameters (for ``layer_type``) are ``params``."""
    shadow = copy.copy(config)
    if layer_type is None:
        shadow.rope_parameters = dict(params)
    else:
        nested = dict(config.rope_parameters)
        nested[layer_type] = dict(params)
        shadow.rope_parameters = nested
    return shadow


def rotary_dim(config: Any, params: dict[str, Any]) -> int:
    """The rotated head dimensions, as Transformers' rope init functions compute them:
    ``int(head_dim · partial_rotary_factor)``."""
    return int(config_head_dim(config) * params.get("partial_rotary_factor", 1.0))


def clipped_rope_init(
    config: Any, device: torch.device | None = None, seq_len: int | None = None, layer_type: str | None = None,
    *, hard: bool = False,
) -> tuple[torch.Tensor, float]:
    """``ROPE_INIT_FUNCTIONS`` entry: the base type's ``(inv_freq, attention_scaling)`` with the taper applied."""
    params = _layer_params(config, layer_type)
    clip_low_n, base_type = params["clip_low_n"], params["base_rope_type"]
    if base_type == "default":
        dim = rotary_dim(config, params)
        f = taper_factors(dim // 2, clip_low_n, hard).to(device=device, dtype=torch.float32)
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (f * params["rope_theta"] ** exponent), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base_params = {k: v for k, v in params.items() if k not in SCHEME_KEYS}
    base_params["rope_type"] = base_type
    shadow = _shadow_config(config, layer_type, base_params)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[base_type](shadow, device, seq_len=seq_len, layer_type=layer_type)
    w = taper_weights(inv_freq.shape[-1], clip_low_n, hard).to(device=inv_freq.device, dtype=inv_freq.dtype)
    return inv_freq * w, scaling


def _cope_init(config, device=None, seq_len=None, layer_type=None):
    return clipped_rope_init(config, device, seq_len, layer_type, hard=False)


def _hardclip_init(config, device=None, seq_len=None, layer_type=None):
    return clipped_rope_init(config, device, seq_len, layer_type, hard=True)


CLIPPED_ROPE_TYPES = {
    "cope": _cope_init,
    "cope_dynamic": _cope_init,
    "hardclip": _hardclip_init,
    "hardclip_dynamic": _hardclip_init,
}


def register_rope_types() -> None:
    """Add CoPE/HardClip to Transformers' ``ROPE_INIT_FUNCTIONS`` (idempotent)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ROPE_INIT_FUNCTIONS.update(CLIPPED_ROPE_TYPES)


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
