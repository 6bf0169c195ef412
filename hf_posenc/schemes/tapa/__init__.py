"""TAPA: token-aware phase attention (``tapa-token-aware-phase-attention.md`` §3, eq. 12).

Each head dimension D is split into an amplitude part (θD dims) and a phase part ((1−θ)D dims) and the score is

    s(m, n) = (q_A·k_A / √(θD)) · cos(2π · |m − n|^α · q_P·k_P / √((1−θ)D))        (eq. 12)

(``phase="linear"`` is the §4.5 ablation, eq. 16), followed by the causal softmax and P·V. There is no rotation:
the patched rotary module is the identity (Transformers' ``proportional`` type with p = 0 gives cos = 1, sin = 0
exactly) and the attention function is registered with Transformers' ``AttentionInterface`` under
:data:`ATTN_NAME`, with a mask function under the same name so padded batches are masked.

Distances come from position ids, never from indices, so left-padded batches, packed sequences (positions that
restart per document) and cached decoding give the same scores as one full pass.
"""

from __future__ import annotations

from ..masks import padding_mask
from ..registry import AttentionFunctions, register_scheme
from .attention import tapa_attention_forward
from .config import ATTN_NAME, TAPAConfig

register_scheme(TAPAConfig, attention=AttentionFunctions(name=ATTN_NAME, forward=tapa_attention_forward,
                                                         mask=padding_mask))

__all__ = ["TAPAConfig", "ATTN_NAME", "tapa_attention_forward"]
