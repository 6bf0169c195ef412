"""Plain RoPE with a new base (ABF) and/or a standard scaling: the baselines every recipe compares against.

RoPE (Su et al. 2024): chunk i of a query/key is rotated by the angle n·θ_i with θ_i = b^(−2i/d)
(``cope-clipped-rope.md`` eq. 1). PI, NTK (dynamic), YaRN and Llama-3 scalings rescale θ_i per frequency
(same paper, eq. 5); they are Transformers' own rope types and are used as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import FrequencySchemeConfig
from ..registry import register_scheme


@dataclass(frozen=True)
class RoPEConfig(FrequencySchemeConfig):
    """Standard RoPE, optionally with a new base θ and/or a standard scaling (see :class:`FrequencySchemeConfig`).

    Without any option it keeps the model's frequencies exactly (useful as the recorded baseline)."""

    name: ClassVar[str] = "rope"
    paper: ClassVar[str] = "RoFormer (Su et al., 2024); PI, NTK, YaRN, ABF baselines"


register_scheme(RoPEConfig)
