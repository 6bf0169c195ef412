"""TAPE attention (eq. 6–7) through one `scaled_dot_product_attention` call: E folded into extra value channels.

Because the same softmax P mixes the values and the positional states (eq. 7 reuses the attention map of
eq. 6), [O | Ẽ] = P · [V | E]. Concatenating V and E along the channel axis gives a value tensor of
width D + De; one SDPA call then returns both outputs, which are split afterwards. This is the unfused
baseline: it materialises [V | E] (and repeats K / [V | E] over the query heads of a GQA group), and
since the value width differs from the query width, SDPA cannot use its flash backend for it.

Mask handling: `is_causal` in SDPA aligns the causal triangle to the top-left corner, while TAPE's
queries are the last Lq positions (key j visible to query i iff j <= i + Lk − Lq), so a boolean mask
is built whenever Lq != Lk or padding is present. Rows with no visible key are given a dummy
all-visible row (no NaN in the forward or backward) and zeroed afterwards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .args import TapeArgs, tape_op
from .naive import repeat_kv, tape_visibility


@tape_op
def tape_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, args: TapeArgs
) -> tuple[torch.Tensor, torch.Tensor]:
    """TAPE attention, eq. 6–7, as SDPA over [V | E]; returns (o [B, Hq, Lq, D], e_out [B, Hq, Lq, De])."""
    ve = torch.cat([v, e], dim=-1)
    kk, ve = repeat_kv(k, args.group), repeat_kv(ve, args.group)
    if args.key_padding_mask is None and (not args.causal or args.q_len == args.k_len):
        out = F.scaled_dot_product_attention(q, kk, ve, is_causal=args.causal, scale=args.scale)
    else:
        vis = tape_visibility(args, q.device)  # [B|1, 1, Lq, Lk]
        empty_rows = ~vis.any(dim=-1, keepdim=True)  # [B|1, 1, Lq, 1]
        out = F.scaled_dot_product_attention(q, kk, ve, attn_mask=vis | empty_rows, scale=args.scale)
        out = out.masked_fill(empty_rows, 0.0)
    return out[..., : args.head_dim], out[..., args.head_dim :]
