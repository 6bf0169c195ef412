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

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from .base import SchemeConfig, check_type
from .masks import padding_mask, written_keys

ATTN_NAME = "hf_posenc_tapa"


@dataclass(frozen=True)
class TAPAConfig(SchemeConfig):
    """Options of TAPA.

    Attributes:
        alpha: distance exponent α > 0 in |m − n|^α (default 0.1, the paper's).
        theta: fraction θ of each head's dims used for the amplitude (default 0.5); θD and (1−θ)D must be
            positive integers.
        phase: ``"quadratic"`` (eq. 12) or ``"linear"`` (§4.5 ablation, eq. 16).
        backend: ``"auto"`` (Triton kernel on CUDA or under TRITON_INTERPRET=1, the chunked O(N)-memory path on
            CPU, else the reference), ``"triton"``, ``"chunked"`` or ``"reference"``.
        layers: TAPA replaces attention in every layer, so this must stay ``"all"``.
    """

    name: ClassVar[str] = "tapa"
    paper: ClassVar[str] = "Token-Aware Phase Attention (tapa-token-aware-phase-attention, eq. 12)"
    attn_implementation: ClassVar[str | None] = ATTN_NAME
    layers: Literal["global", "all"] = "all"
    alpha: float = 0.1
    theta: float = 0.5
    phase: str = "quadratic"
    backend: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_type(self.name, "alpha", self.alpha, (int, float))
        check_type(self.name, "theta", self.theta, (int, float))
        check_type(self.name, "phase", self.phase, (str,))
        check_type(self.name, "backend", self.backend, (str,))
        if self.layers != "all":
            raise ValueError("tapa: TAPA replaces attention in every layer; layers must be 'all'.")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"tapa: alpha must be a finite number > 0 (paper: 0.1), got {self.alpha}.")
        if not 0 < self.theta < 1:
            raise ValueError(f"tapa: theta must be in (0, 1) (paper: 0.5), got {self.theta}.")
        if self.phase not in ("quadratic", "linear"):
            raise ValueError(f"tapa: phase must be 'quadratic' or 'linear', got {self.phase!r}.")
        if self.backend not in ("auto", "triton", "chunked", "reference"):
            raise ValueError(
                f"tapa: backend must be 'auto', 'triton', 'chunked' or 'reference', got {self.backend!r}.")

    def check_model(self, head_dim: int) -> None:
        from ..kernels.tapa.naive import tapa_split

        tapa_split(head_dim, self.theta)

    def rope_parameters(self, model_params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> dict:
        """No rotation. ``head_dim``: the rotated dimensions; a partial-rotary model keeps its rotated width (zero
        frequencies on its rotated pairs), since ``proportional`` would widen the rotation to the whole head."""
        if model_params.get("partial_rotary_factor", 1.0) != 1.0:
            from .prope import rotated_pairs_kept

            return rotated_pairs_kept({**model_params, "rope_type": "default"}, head_dim, 0)
        return {"rope_type": "proportional", "rope_theta": model_params["rope_theta"], "partial_rotary_factor": 0.0}


def _positions(position_ids: torch.Tensor | None, key_padding: torch.Tensor | None, batch: int, q_len: int,
               kv_len: int, device: torch.device):
    """Query and key positions. Without a cache the keys are the queries. With a cache, each key's position is
    counted back from the last query over the real (unpadded) keys after it, which matches both the positions
    ``generate`` assigns to left-padded rows and plain index positions."""
    if position_ids is None:
        position_ids = torch.arange(kv_len - q_len, kv_len, device=device)[None]
    q_pos = position_ids.expand(batch, q_len).to(device)
    if q_len == kv_len:
        return q_pos, q_pos
    real = key_padding if key_padding is not None else torch.ones(batch, kv_len, dtype=torch.bool, device=device)
    after = real.flip(-1).long().cumsum(-1).flip(-1) - real.long()  # real keys strictly after each key
    k_pos = q_pos[:, -1:] - after
    return q_pos, k_pos


def tapa_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    position_ids: torch.Tensor | None = None, sliding_window: int | None = None, softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` entry: eq. 12 on [B, H, L, D] query and [B, Hkv, L, D] key/value (not repeated)."""
    from transformers.masking_utils import find_packed_sequence_indices

    options = module.config.hf_posenc["options"]
    if dropout and module.training:
        raise ValueError("tapa: attention dropout is not supported; set config.attention_dropout = 0.")
    if softcap is not None:
        raise ValueError("tapa: attention-logit soft-capping (Gemma2) does not apply to TAPA scores; set "
                         "config.attn_logit_softcapping = None before patching.")
    key, value, key_padding = written_keys(key, value, attention_mask)
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    q_pos, k_pos = _positions(position_ids, key_padding, batch, q_len, kv_len, query.device)
    packed = attention_mask is None and q_len == kv_len and position_ids is not None  # Transformers' rule
    segments = find_packed_sequence_indices(q_pos) if packed else None
    fn = tapa_function(options["backend"])
    extra = {} if sliding_window is None else {"sliding_window": sliding_window}
    out = fn(
        query, key, value, alpha=options["alpha"], theta=options["theta"], phase=options["phase"], causal=True,
        q_positions=q_pos, k_positions=k_pos, key_padding_mask=key_padding, q_segment_ids=segments,
        k_segment_ids=segments, **extra,
    )
    return out.transpose(1, 2).contiguous(), None


@functools.cache  # runs once per backend, not in every layer's forward
def tapa_function(backend: str):
    """The TAPA op for a backend: the dispatcher (``auto``), the Triton kernel, the chunked CPU path or the
    reference. Checkpoint remote code carries the reference and the chunked path (not the Triton kernels):
    there ``auto`` runs the chunked path on CPU and the reference elsewhere, and ``triton`` is a clear error."""
    import importlib

    from ..kernels.tapa.chunked import tapa_attention_chunked
    from ..kernels.tapa.naive import tapa_attention_reference

    if backend == "reference":
        return tapa_attention_reference
    if backend == "chunked":
        return tapa_attention_chunked
    try:
        kernels = importlib.import_module("hf_posenc.kernels.tapa")
    except ImportError as exc:
        if backend == "triton":
            raise ImportError("tapa: backend='triton' needs hf-posenc installed (`pip install hf-posenc[triton]`)."
                              ) from exc

        def bundled(q, k, v, **kwargs):
            fn = tapa_attention_chunked if q.device.type == "cpu" else tapa_attention_reference
            return fn(q, k, v, **kwargs)

        return bundled
    return {"auto": kernels.tapa_attention, "triton": kernels.tapa_attention_triton}[backend]


def register_tapa_attention() -> None:
    """Register the attention and mask functions under :data:`ATTN_NAME` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, tapa_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, padding_mask)
