"""Readable PyTorch reference for the TAPE attention op (the specification the fast paths are tested against): the
equations only; the options, their checks and the op's signature are in ``args.py``.

TAPE (paper §3.2) shares ONE attention map between token mixing and position contextualisation:

    S = scale · q kᵀ + masks                       (eq. 6 with φ = identity; q and k were already rotated
                                                    by the positional state outside this op)
    P = softmax(S)                                 (row-wise over keys)
    O = P · V                                      (token mixing, eq. 6)
    Ẽ = P · E                                      (position contextualisation, eq. 7)

E is a real tensor of positional channels: a complex number per frequency stored as (re, im) channels,
so its width De = 2F is independent of the head width D (Appendix B, Fig. 4).

Conventions shared with the SDPA fold and the Triton kernel:
- q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D]; e: [B, Hkv, Lk, De]; Hq % Hkv == 0 (grouped-query
  attention: query head h reads kv head h // (Hq // Hkv); E is stored per KV head like the cache).
- Outputs: o [B, Hq, Lq, D], e_out [B, Hq, Lq, De].
- Queries are the LAST Lq positions of the key sequence (decode against a KV cache), so causal
  means key j is visible to query i iff j <= i + (Lk − Lq).
- key_padding_mask [B, Lk] bool, True = attend. A query row with no visible key returns zeros.
- scale defaults to D ** -0.5. Everything accumulates in fp32 (float64 inputs stay float64) and the
  outputs are cast back to the input dtype.
"""

from __future__ import annotations

import torch

from .args import TapeArgs, tape_op


def tape_visibility(args: TapeArgs, device: torch.device) -> torch.Tensor:
    """Bool mask [B or 1, 1, Lq, Lk]: True where query i may attend key j (causal offset Lk − Lq, padding)."""
    vis = torch.ones(1, 1, args.q_len, args.k_len, dtype=torch.bool, device=device)
    if args.causal:
        i = torch.arange(args.q_len, device=device)[:, None] + (args.k_len - args.q_len)  # query i is key i + Lk − Lq
        j = torch.arange(args.k_len, device=device)[None, :]
        vis = vis & (j <= i)
    if args.key_padding_mask is not None:
        vis = vis & args.key_padding_mask[:, None, None, :]
    return vis


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv, L, C] -> [B, Hkv·group, L, C], query head h reading kv head h // group (reference only)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


@tape_op
def tape_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, args: TapeArgs
) -> tuple[torch.Tensor, torch.Tensor]:
    """TAPE attention, eq. 6–7: one softmax P mixes the values (O = P·V) and the positional states (Ẽ = P·E).

    Plain differentiable PyTorch (fp32 accumulation); returns (o [B, Hq, Lq, D], e_out [B, Hq, Lq, De]).
    Options: :func:`validate_tape_args`.
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kk, vv, ee = (repeat_kv(t.to(acc), args.group) for t in (k, v, e))
    scores = torch.matmul(q.to(acc), kk.transpose(-1, -2)) * args.scale
    vis = tape_visibility(args, q.device)
    scores = scores.masked_fill(~vis, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    p = torch.exp(scores - row_max)  # exactly 0 where masked
    denom = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))  # empty rows stay all-zero
    o = torch.matmul(p, vv)
    e_out = torch.matmul(p, ee)
    return o.to(q.dtype), e_out.to(q.dtype)
