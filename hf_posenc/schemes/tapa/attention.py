"""TAPA as a Transformers attention function (eq. 12 through ``AttentionInterface``): positions from position
ids (left padding, packed documents, static and dynamic caches), then the op of the configured backend."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..compiled import attention_call, opaque_op
from ..masks import every_slot, written_keys
from ..precision import autocast_inputs


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
    if key_padding is None:  # every key real: key j is kv_len − 1 − j positions before the last query (2 ops)
        return q_pos, q_pos[:, -1:] + torch.arange(1 - kv_len, 1, device=device)
    after = key_padding.flip(-1).long().cumsum(-1).flip(-1) - key_padding.long()  # real keys strictly after each
    return q_pos, q_pos[:, -1:] - after


def tapa_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    position_ids: torch.Tensor | None = None, sliding_window: int | None = None, softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` entry: eq. 12 on [B, H, L, D] query and [B, Hkv, L, D] key/value (not repeated)."""
    options = module.config.hf_posenc["options"]
    if dropout and module.training:
        raise ValueError("tapa: attention dropout is not supported; set config.attention_dropout = 0.")
    if softcap is not None:
        raise ValueError("tapa: attention-logit soft-capping (Gemma2) does not apply to TAPA scores; set "
                         "config.attn_logit_softcapping = None before patching.")
    every = None if options["backend"] == "chunked" else tapa_attend_every_slot  # the chunked path reads the host
    attend = attention_call(tapa_attend, every, query.shape[2], key.shape[2], attention_mask, sliding_window)
    query, key, value = autocast_inputs(query, key, value)  # as autocast casts SDPA's inputs
    out = attend(query, key, value, attention_mask, position_ids, float(options["alpha"]), float(options["theta"]),
                 options["phase"], options["backend"], sliding_window)
    return out, None


def _attended(query, key, value, attention_mask, position_ids, alpha, theta, phase, backend, sliding_window):
    return query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])  # [B, Lq, H, D]


@opaque_op("tapa_attend", _attended)
def tapa_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None, alpha: float, theta: float, phase: str, backend: str,
                sliding_window: int | None) -> torch.Tensor:
    """Eq. 12 over the written keys, with positions from the position ids; returns [B, Lq, H, D]."""
    return _attend(written_keys(key, value, attention_mask), query, attention_mask, position_ids, alpha, theta,
                   phase, backend, sliding_window)


@opaque_op("tapa_attend_every_slot", _attended, graph_safe=True)
def tapa_attend_every_slot(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None, alpha: float,
                           theta: float, phase: str, backend: str, sliding_window: int | None) -> torch.Tensor:
    """:func:`tapa_attend` over :func:`~..masks.every_slot` (``reads_every_slot``): no host read."""
    return _attend(every_slot(key, value, attention_mask), query, attention_mask, position_ids, alpha, theta,
                   phase, backend, sliding_window)


def _attend(keys, query, attention_mask, position_ids, alpha, theta, phase, backend, sliding_window):
    from transformers.masking_utils import find_packed_sequence_indices

    key, value, key_padding = keys
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    q_pos, k_pos = _positions(position_ids, key_padding, batch, q_len, kv_len, query.device)
    packed = attention_mask is None and q_len == kv_len and position_ids is not None  # Transformers' rule
    segments = find_packed_sequence_indices(q_pos) if packed else None
    extra = {} if sliding_window is None else {"sliding_window": sliding_window}
    out = _op(backend)(
        query, key, value, alpha=alpha, theta=theta, phase=phase, causal=True, q_positions=q_pos, k_positions=k_pos,
        key_padding_mask=key_padding, q_segment_ids=segments, k_segment_ids=segments, **extra,
    )
    return out.transpose(1, 2).contiguous()


@functools.cache  # imported once per backend, not in every layer's forward
def _op(backend: str):
    """The TAPA op of a backend, from the one TAPA dispatcher (:func:`~...kernels.tapa.dispatch.tapa_function`),
    which checkpoint remote code carries too (with the reference and the chunked path, not the Triton kernels)."""
    from ...kernels.tapa.dispatch import tapa_function

    return tapa_function(backend)
