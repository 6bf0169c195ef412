"""O = P·V (eq. 6) and Ẽ = P·E (eq. 7) from ONE attention map P on CPU, for models that run attention through SDPA.

PyTorch's CPU flash kernel refuses a value wider than the query ("Q/K/V should have the same head size") and SDPA
then takes its math path, materialising every score. Two flash calls (one for V, one for E) compute QKᵀ and the
softmax twice. This computes them once per block of query rows: scores for the block, the mask, a softmax, then
P·[V | E] in one matrix product, so E rides along as extra value channels as in the paper. A causal block never
computes keys past its last query, a masked block none past the last key any of its rows attends (left-padded
batches). Memory stays linear in the sequence: one block's scores at a time (at most :data:`MAX_SCORES`).

The readable specification is eager attention, ``softmax(QKᵀ·scale + mask)·[V | E]``; tests compare the two.
"""

from __future__ import annotations

import math

import torch

BLOCK_ROWS = 96  # query rows per block: the fastest of 32-256 at 1k tokens on 2 cores (fewer masked scores)
MAX_SCORES = 1 << 22  # elements of one block's scores [B, Hq, rows, keys] (16 MB in fp32); fewer rows past that


def attend_values_and_states(query: torch.Tensor, key: torch.Tensor, values_and_states: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float, causal: bool) -> torch.Tensor:
    """``softmax(QKᵀ·scaling + mask)·[V | E]`` (eqs. 6-7 with one map), blocked over query rows.

    query [B, Hq, Lq, D]; key [B, Hkv, Lk, D]; values_and_states [V | E] [B, Hkv, Lk, Dv], Hq a multiple of Hkv (query
    head h reads key/value head h // (Hq / Hkv)). attention_mask: None, boolean (True = attend) or additive,
    broadcastable to [B, Hq, Lq, Lk]. ``causal`` (only without a mask): query i attends keys 0..i, Lq == Lk. Rows that
    attend no key come out zero, as from SDPA. Returns [B, Lq, Hq, Dv], the layout of an attention function's output."""
    b, hq, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    if hq % hkv or values_and_states.shape[:3] != key.shape[:3] or key.shape[-1] != d:
        raise ValueError(f"attend_values_and_states: query [B, Hq, Lq, D], key [B, Hkv, Lk, D] and values "
                         f"[B, Hkv, Lk, Dv] with Hq a multiple of Hkv; got {list(query.shape)}, {list(key.shape)}, "
                         f"{list(values_and_states.shape)}")
    if causal and (attention_mask is not None or lq != lk):
        raise ValueError("attend_values_and_states: causal=True takes no mask and as many keys as queries")
    group, dv = hq // hkv, values_and_states.shape[-1]
    rows = max(1, min(BLOCK_ROWS, MAX_SCORES // max(1, b * hq * lk)))
    # Score rows ordered (query, head within the group): a block of queries is one contiguous [rows·group, D]
    # matrix per key/value head, and the scale sits on the queries (one pass over Lq·D, not over the scores).
    rows_q = (query * scaling).unflatten(1, (hkv, group)).transpose(2, 3).contiguous().view(b, hkv, lq * group, d)
    key_t = key.transpose(-1, -2)
    mask = reach = diagonal = None
    if attention_mask is not None:
        mask = _additive(attention_mask, hkv, group, lq, lk, query.dtype)
        # keys a query row may attend are 0 .. reach-1: a block skips masked keys past its rows' last attended one
        attended = (mask != -math.inf).flatten(0, 1).any(0).any(1)  # [Lq, Lk]
        reach = (attended * torch.arange(1, lk + 1, device=attended.device)).amax(-1).tolist()
    if causal:  # within the diagonal block, key j > query i is masked; keys past the block are never computed
        above = torch.ones(rows, rows, dtype=torch.bool, device=query.device).triu_(1).unsqueeze(1)
        diagonal = torch.zeros(rows, group, rows, dtype=query.dtype, device=query.device).masked_fill_(above, -math.inf)
    out = values_and_states.new_empty(b, lq, hkv, group, dv)
    for start in range(0, lq, rows):
        stop = min(lq, start + rows)
        n = stop - start
        keys = stop if causal else lk if reach is None else max(1, max(reach[start:stop]))
        scores = rows_q[:, :, start * group : stop * group] @ key_t[..., :keys]  # [B, Hkv, n·group, keys]
        if diagonal is not None:
            scores[..., start:].add_((diagonal if n == rows else diagonal[:n, :, :n]).reshape(n * group, n))
        if mask is not None:
            scores.view(b, hkv, n, group, keys).add_(mask[:, :, start:stop, :, :keys])
        probs = torch.softmax(scores, dim=-1)
        if mask is not None:  # a row with no key to attend: softmax gives NaN, SDPA gives 0
            probs.masked_fill_(scores.amax(dim=-1, keepdim=True) == -math.inf, 0.0)
        mixed = probs @ values_and_states[:, :, :keys]  # [B, Hkv, n·group, Dv]
        out[:, start:stop] = mixed.view(b, hkv, n, group, dv).transpose(1, 2)
    return out.view(b, lq, hq, dv)


def _additive(mask: torch.Tensor, hkv: int, group: int, lq: int, lk: int, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as additive scores laid out like the score rows: [B or 1, Hkv or 1, Lq, group or 1, Lk]."""
    if mask.dim() != 4 or mask.shape[1] not in (1, hkv * group) or mask.shape[2] not in (1, lq) or mask.shape[3] != lk:
        raise ValueError(f"attend_values_and_states: attention_mask must be [B, 1 or Hq, 1 or Lq, Lk] with Lq = {lq}, "
                         f"Lk = {lk}; got {list(mask.shape)}")
    mask = mask.expand(-1, -1, lq, -1)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)
    if mask.shape[1] == 1:
        return mask.unsqueeze(3)  # [B, 1, Lq, 1, Lk]
    return mask.unflatten(1, (hkv, group)).transpose(2, 3)  # [B, Hkv, Lq, group, Lk]
