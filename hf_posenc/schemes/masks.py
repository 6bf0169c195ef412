"""The mask function of the attention schemes that build causality, windows and packing inside their own
attention (TAPA, TAPE's fused kernel): Transformers hands them only the 2-D key padding mask of the written keys.

:func:`padding_mask` is registered with ``AttentionMaskInterface`` under each such scheme's attention name;
:func:`written_keys` (or, in a compiled decoding step, :func:`every_slot`) is what their attention functions call
first.
"""

from __future__ import annotations

from typing import Any

import torch

# Key states of a static cache's mask (int8): what each preallocated slot holds
KEY_REAL, KEY_PADDING, KEY_UNWRITTEN = 1, 0, -1


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
    ``q_offset − kv_offset + q_length`` hold keys: the past ones and the current queries'. Its layers pass
    ``q_offset`` as a tensor, so that a compiled forward has the same shapes at every step; the mask is then an
    int8 tensor [B, kv_length] of key states (:data:`KEY_REAL`, :data:`KEY_PADDING`, :data:`KEY_UNWRITTEN`) built
    with tensor operations only (no host read, no recompilation per step), and :func:`written_keys` keeps the
    written slots, so the queries sit at the end of the keys exactly as with a dynamic cache.
    """
    if q_offset is None:  # Transformers passes it since 5.18 (where the query sits in the cache)
        raise RuntimeError("padding_mask: Transformers did not pass q_offset; this Transformers version is not "
                           "supported by hf-posenc's TAPA/TAPE attention (install the version in its requirements).")
    if isinstance(q_offset, torch.Tensor):
        return _static_key_states(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask, device)
    written = q_offset - kv_offset + q_length
    if attention_mask is None:
        return None if written >= kv_length else torch.ones(batch_size, written, dtype=torch.bool, device=device)
    _check_mask_covers(attention_mask, kv_offset + written)
    # kept even when every key is real: a caller's mask says "one sequence", so position jumps are not read as
    # packed documents (Transformers' rule: packing is inferred only without a mask)
    return attention_mask[:, kv_offset : kv_offset + written].bool()


def _check_mask_covers(attention_mask: torch.Tensor, tokens: int) -> None:
    if attention_mask.shape[-1] < tokens:
        raise ValueError(
            f"attention_mask covers {attention_mask.shape[-1]} tokens but the cache and the input hold "
            f"{tokens}; pass the mask of every past and current token."
        )


def _static_key_states(batch_size: int, q_length: int, kv_length: int, q_offset: torch.Tensor, kv_offset: int,
                       attention_mask: torch.Tensor | None, device) -> torch.Tensor:
    """int8 key states [B, kv_length] of a static cache's slots (:func:`padding_mask`)."""
    end = q_offset.to(device) + q_length  # tokens written once the current queries are: past and current
    slots = torch.arange(kv_offset, kv_offset + kv_length, device=device)
    written = (slots < end)[None].expand(batch_size, -1)
    if attention_mask is None:
        real = written
    else:
        if not torch.compiler.is_compiling():  # eager: the host may read the offset (a compiled step may not)
            _check_mask_covers(attention_mask, int(end))
        short = kv_offset + kv_length - attention_mask.shape[-1]
        real = torch.nn.functional.pad(attention_mask.bool(), (0, max(short, 0)))[:, kv_offset : kv_offset + kv_length]
    states = torch.where(real, KEY_REAL, KEY_PADDING).to(torch.int8)
    return states.masked_fill(~written, KEY_UNWRITTEN)


def written_keys(key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keys and values an attention function may read, and their padding mask (``None``: no padding).

    ``attention_mask`` comes from :func:`padding_mask`: a bool mask of the written keys (a dynamic cache, or a
    static sliding-window layer, whose offset is an int), or a static cache's int8 key states, whose unwritten
    slots are dropped here. Either way the host reads one small tensor (how many keys are written, whether any
    is padding: :func:`read_once`), so the queries are the last keys again.
    """
    if attention_mask is None:
        return key, value, None
    written, padded = read_once(_two_d(attention_mask))
    if attention_mask.dtype == torch.int8:  # a static cache's key states; unwritten slots are never padding
        attention_mask = attention_mask[:, :written] == KEY_REAL
    key, value = _first(written, key, value)
    return key, value, attention_mask if padded else None


def reads_every_slot(q_len: int, kv_len: int, attention_mask: torch.Tensor | None,
                     sliding_window: int | None = None) -> bool:
    """True where :func:`every_slot` gives the keys :func:`written_keys` gives, up to unwritten slots masked as
    padding, with no host read: a decoding step (one query) of a static cache's key states (without a sliding
    window: its indices would count the unwritten slots), any bool mask, and no mask with a cache (without one,
    the attention looks for packed documents in the position ids on the host)."""
    if attention_mask is None:
        return q_len < kv_len
    return attention_mask.dtype != torch.int8 or (q_len == 1 and sliding_window is None)


def every_slot(key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`written_keys` without reading the host (a CUDA graph captures it), where :func:`reads_every_slot`:
    a static cache's slots all, the unwritten ones masked as padding (the one query is the last written key and
    causality by index hides nothing written from it); a bool mask kept whether or not it masks any key."""
    if attention_mask is None:
        return key, value, None
    if _two_d(attention_mask).dtype == torch.int8:
        return key, value, attention_mask == KEY_REAL
    return *_first(attention_mask.shape[-1], key, value), attention_mask


def _first(written: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if written > key.shape[2]:
        raise ValueError(f"the padding mask covers {written} keys but attention received {key.shape[2]}.")
    return key[:, :, :written], value[:, :, :written]


def _two_d(attention_mask: torch.Tensor) -> torch.Tensor:
    if attention_mask.dim() != 2:
        raise ValueError("got a 4-D attention mask; this attention builds its own mask from the 2-D padding mask.")
    return attention_mask


def read_once(attention_mask: torch.Tensor) -> tuple[int, bool]:
    """(keys written, any of them padding) of a :func:`padding_mask` mask, read on the host once per mask object
    (kept on it: a fresh tensor or view per forward, which every layer shares). A host read waits for the device:
    per layer it stalls every layer of every decode step; per forward it is free (``generate`` syncs each step)."""
    known = getattr(attention_mask, "_hf_posenc_read", None)
    if known is None:
        if attention_mask.dtype == torch.int8:  # a static cache's key states
            written, padded = torch.stack([(attention_mask[0] != KEY_UNWRITTEN).sum(),
                                           (attention_mask == KEY_PADDING).any()]).tolist()
        else:
            written, padded = attention_mask.shape[-1], not bool(attention_mask.all())
        known = attention_mask._hf_posenc_read = (int(written), bool(padded))
    return known
