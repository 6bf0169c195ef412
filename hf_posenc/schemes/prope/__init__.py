"""p-RoPE (Barbero et al., ``prope-round-and-round-we-go.md`` §6.1, Appendix D ``apply_p_rope``).

Keeps the fraction p of the highest RoPE frequencies and stops the rest from rotating: ``rope_angles = int(p·d // 2)``
frequencies θ_i = b^(−2i/d) for i < rope_angles, and θ_i = 0 above (the timescale padded with +∞ in the paper's code).
p = 1 is RoPE, p = 0 is NoPE. Transformers ships exactly this as the ``proportional`` rope type, which is what the
patched config uses (the test suite checks it against the paper's algorithm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..base import FrequencySchemeConfig, check_type
from ..registry import register_scheme


@dataclass(frozen=True)
class PRoPEConfig(FrequencySchemeConfig):
    """Options of p-RoPE.

    Attributes:
        p: fraction of frequencies kept, in [0, 1] (default 0.75, the paper's best setting in Table 2).
        rope_theta / scaling / factor: base-frequency change first (only ``scaling="linear"`` composes: the
            ``proportional`` type divides every kept frequency by ``factor``).
    """

    name: ClassVar[str] = "prope"
    paper: ClassVar[str] = "Round and Round We Go! What makes Rotary Positional Encodings useful? (Barbero et al.)"
    p: float = 0.75

    def __post_init__(self) -> None:
        super().__post_init__()
        check_type(self.name, "p", self.p, (int, float))
        if not (math.isfinite(self.p) and 0.0 <= self.p <= 1.0):
            raise ValueError(f"prope: p must be in [0, 1] (1 = RoPE, 0 = NoPE), got {self.p}.")
        if self.scaling not in (None, "linear"):
            raise ValueError(
                f"prope: only scaling='linear' composes with p-RoPE (Transformers' 'proportional' type), "
                f"got {self.scaling!r}; use scheme='rope' for {self.scaling} alone."
            )

    def rope_parameters(self, model_params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> dict:
        """``head_dim``: the rotated dimensions. A partial-rotary model (``partial_rotary_factor`` < 1) keeps the
        fraction p of its rotated frequency pairs, ``int(p·r // 2)`` of the r/2 frequencies b^(−2i/r); Transformers'
        ``proportional`` type reads ``partial_rotary_factor`` as p over the whole head, so there the same
        frequencies are written as HardClip of the other pairs (bit-identical zeros, the kept ones unchanged)."""
        base = self.base_rope_parameters(model_params, max_position_embeddings)
        if base["rope_type"] not in ("default", "linear"):
            raise ValueError(
                f"prope: the model's rope type {base['rope_type']!r} cannot be combined with p-RoPE; pass "
                "scaling='linear' (or none) to replace it."
            )
        rotated = base.get("partial_rotary_factor", 1.0)
        if rotated != 1.0:
            return rotated_pairs_kept(base, head_dim, int(self.p * head_dim // 2))
        params = {"rope_type": "proportional", "rope_theta": base["rope_theta"], "partial_rotary_factor": float(self.p)}
        if base["rope_type"] == "linear":
            params["factor"] = base["factor"]
        return params


def rotated_pairs_kept(base: dict[str, Any], rotary_dim: int, keep: int) -> dict[str, Any]:
    """Rope parameters (HardClip over a ``default``/``linear`` base) that keep the first ``keep`` of a partial-rotary
    model's ``rotary_dim // 2`` frequencies and stop the others from rotating; ``partial_rotary_factor`` stays."""
    params = {
        "rope_type": "hardclip", "base_rope_type": base["rope_type"], "clip_low_n": rotary_dim // 2 - keep,
        "rope_theta": base["rope_theta"], "partial_rotary_factor": base["partial_rotary_factor"],
    }
    if base["rope_type"] == "linear":
        params["factor"] = base["factor"]
    return params


register_scheme(PRoPEConfig)
