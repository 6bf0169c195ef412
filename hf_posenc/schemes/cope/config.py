"""CoPE and HardClip options, and the taper they apply (``cope-clipped-rope.md`` §4.1–4.2, eq. 10)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..base import STOCK_INF_FACTOR, FrequencySchemeConfig, check_type

# CoPE's reference setting: the last 20 of Llama-3-8B's 64 frequencies (head dim 128).
PAPER_CLIP_LOW_N, PAPER_N_FREQ = 20, 64
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
