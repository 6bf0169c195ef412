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

from ..registry import RopeType, register_scheme
from .config import (
    PAPER_CLIP_LOW_N, PAPER_N_FREQ, STOCK_INF_FACTOR, CoPEConfig, HardClipConfig, taper_factors, taper_weights,
)
from .rope_types import (
    clipped_rope_init, cope_init, cope_stock_factors, hardclip_init, hardclip_stock_factors,
    validate_clipped_rope_parameters,
)

for _config, _init, _factors in ((CoPEConfig, cope_init, cope_stock_factors),
                                 (HardClipConfig, hardclip_init, hardclip_stock_factors)):
    # over a static base: per-dimension factors (1/w exactly over the default base); over dynamic NTK: dynamic
    _static = RopeType(init=_init, validate=validate_clipped_rope_parameters, factors=_factors)
    _dynamic = RopeType(init=_init, validate=validate_clipped_rope_parameters, dynamic=True)
    register_scheme(_config, rope_types={_config.name: _static, f"{_config.name}_dynamic": _dynamic})

__all__ = [
    "CoPEConfig", "HardClipConfig", "taper_weights", "taper_factors", "clipped_rope_init",
    "validate_clipped_rope_parameters", "PAPER_CLIP_LOW_N", "PAPER_N_FREQ", "STOCK_INF_FACTOR",
]
