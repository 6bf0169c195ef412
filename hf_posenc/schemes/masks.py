"""The mask function of the attention schemes that build causality, windows and packing inside their own
attention (TAPA, TAPE's fused kernel): Transformers hands them only the 2-D key padding mask of the written keys.

:func:`padding_mask` is registered with ``AttentionMaskInterface`` under each such scheme's attention name;
:func:`written_keys` is what their attention functions call first.
"""

from __future__ import annotations

from typing import Any

import torch


def padding_mask(
    batch_size: int, q_length: int, kv_length: int, q_offset: int | torch.Tensor | None = None, kv_offset: int = 0,
    mask_function=None, attention_mask: torch.Tensor | None = None, device: torch.device | str = "cpu",
    **kwargs: Any,
) -> torch.Tensor | None:
    """``AttentionMaskInterface`` entry for kernels that take the 2-D key padding mask (TAPA, fused TAPE).

    Causality, sliding windows and packed documents are handled in the attention function; this returns the key
    padding mask [B, written keys] (True = attend) of the caller's mask, or ``None`` when the caller passed none
    and every key is written. As in Transformers, the attention reads jumps in the position ids as packed
    documents only when there is no mask. (Stock attention also ignores jumps when a cache is passed, which a mask
    function cannot see: without a mask, TAPA packs by position ids with or without a cache.)

    A static cache hands attention all of its preallocated slots (``kv_length``), of which only the first
    ``q_offset − kv_offset + q_length`` hold keys: the past ones and the current queries'. The mask then always
    exists and covers only those written keys; :func:`written_keys` drops the rest, so the queries sit at the end
    of the keys exactly as with a dynamic cache.
    """
    if q_offset is None:  # Transformers passes it since 5.18 (where the query sits in the cache)
        raise RuntimeError("padding_mask: Transformers did not pass q_offset; this Transformers version is not "
                           "supported by hf-posenc's TAPA/TAPE attention (install the version in its requirements).")
    written = int(q_offset) - kv_offset + q_length
    if attention_mask is None:
        return None if written >= kv_length else torch.ones(batch_size, written, dtype=torch.bool, device=device)
    if attention_mask.shape[-1] < kv_offset + written:
        raise ValueError(
            f"attention_mask covers {attention_mask.shape[-1]} tokens but the cache and the input hold "
            f"{kv_offset + written}; pass the mask of every past and current token."
        )
    # kept even when every key is real: a caller's mask says "one sequence", so position jumps are not read as
    # packed documents (Transformers' rule: packing is inferred only without a mask)
    return attention_mask[:, kv_offset : kv_offset + written].bool()


def written_keys(key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keys and values an attention function may read, and their padding mask (``None``: no padding).

    ``attention_mask`` comes from :func:`padding_mask`. When it is shorter than the keys, the cache is static and the
    slots after the mask are not written yet: they are dropped, so the queries are the last keys again.
    """
    if attention_mask is None:
        return key, value, None
    if attention_mask.dim() != 2:
        raise ValueError("got a 4-D attention mask; this attention builds its own mask from the 2-D padding mask.")
    written = attention_mask.shape[-1]
    if written > key.shape[2]:
        raise ValueError(f"the padding mask covers {written} keys but attention received {key.shape[2]}.")
    key, value = key[:, :, :written], value[:, :, :written]
    return key, value, None if bool(attention_mask.all()) else attention_mask
