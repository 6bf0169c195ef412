"""TAPE's token mixing (eq. 6) and attention-side state update (eq. 7) through the model's attention
implementation, or the fused kernel's attention function (``backend="triton"``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...upstream import attn_implementation, family_eager_attention
from ..compiled import attention_call, opaque_op
from ..masks import every_slot, written_keys
from ..precision import autocast_inputs
from .one_map import attend_values_and_states

ATTN_NAME = "hf_posenc_tape"  # the fused kernel's attention function (backend="triton")


def rotation_tables(e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The state E [B, S, Hkv, D] = [re | im] as (re, im), each [B, S, Hkv, 1, D/2]: RoPE's cos and sin halves,
    read once per layer for both the queries and the keys (views, no copy)."""
    half = e.shape[-1] // 2
    return e[..., :half].unsqueeze(3), e[..., half:].unsqueeze(3)


def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x ⊙ z per head (eq. 6): [x₁·re − x₂·im | x₂·re + x₁·im] for x = [x₁ | x₂], x [B, S, H, D], tables from
    :func:`rotation_tables`.

    H is a multiple of Hkv: query head h reads the state of key/value head h // (H / Hkv), like its keys. The
    products and sums are RoPE's ``x·cos + rotate_half(x)·sin`` term by term (x₁·c + (−x₂)·s is x₁·c − x₂·s
    exactly in IEEE arithmetic), so E₀ reproduces RoPE bit for bit. Token-major like the projections, so the
    rotated tensors keep the memory layout the stock model hands to attention (and attention picks the same
    kernel path).
    """
    re, im = tables
    half = x.shape[-1] // 2
    xs = x.unflatten(2, (re.shape[2], -1))  # [B, S, Hkv, group, D]
    x1, x2 = xs[..., :half], xs[..., half:]
    return torch.cat([x1 * re - x2 * im, x2 * re + x1 * im], dim=-1).flatten(2, 3)


def attention_function(attn: nn.Module):
    """The model's attention implementation (its own eager function, or the registered one)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = attn_implementation(attn.config)
    if name != "eager":
        return ALL_ATTENTION_FUNCTIONS[name]
    stock = next(c for c in type(attn).__mro__ if not issubclass(c, TapeAttentionMixin))  # the family's class
    return family_eager_attention(stock.__module__)


def mix_values_and_states(attn: nn.Module, q: torch.Tensor, k: torch.Tensor, values_and_states: torch.Tensor,
                          attention_mask, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """O = P·V (eq. 6) and Ẽ = P·E (eq. 7) with one attention map P: returns (O, Ẽ, P or None), O and Ẽ as
    [B, S, Hq, D]. q [B, Hq, S, D]; k [B, Hkv, L, D]; values_and_states [V | E] [B, Hkv, L, 2D] (after the cache).

    * eager, and the fused kernel (``backend="triton"``): one call over [V | E];
    * SDPA on CPU in inference (fp32/fp64, nothing requiring a gradient, not under torch.compile): one map for
      both, blocked over query rows (:func:`~.one_map.attend_values_and_states`); the CPU flash kernel refuses a
      value wider than the query, and two calls would compute QKᵀ and the softmax twice (O then rounds unlike
      SDPA's; the model at init still equals the stock one bit for bit, as Ẽ is skipped there while W_att = 0:
      see :func:`tape_attention`);
    * other implementations (sdpa elsewhere, flex, flash) pick another kernel for a value wider than the query, so
      without dropout they make two calls with the same q, k and mask, and O stays bit-identical to the stock
      model;
    * with attention dropout (training), the two calls would draw two masks, while eq. 7 mixes the states with
      the very P that mixes the values: one call then runs over [V | E] with q and k zero-padded to the value's
      width (q·k unchanged, the scale passed explicitly), so a single dropout mask acts on both.
    """
    d = q.shape[-1]
    if values_and_states.shape[-1] != 2 * d:
        raise ValueError(f"mix_values_and_states: values_and_states must be [V | E], 2 x head_dim = {2 * d} channels "
                         f"wide, got {values_and_states.shape[-1]}; pass torch.cat([v, e], dim=-1) (not v and e "
                         "separately)")
    fn = attention_function(attn)
    name = attn_implementation(attn.config)
    if name == "sdpa" and _one_map_on_cpu(attn, q, k, values_and_states, kwargs):
        causal = (q.shape[2] > 1 and attention_mask is None
                  and (kwargs["is_causal"] if kwargs.get("is_causal") is not None else getattr(attn, "is_causal", True)))
        if causal and k.shape[2] > q.shape[2]:  # SDPA's rule too: an empty static cache's prefill reads its own keys
            k, values_and_states = k[:, :, : q.shape[2]], values_and_states[:, :, : q.shape[2]]
        scaling = kwargs.get("scaling")
        out = attend_values_and_states(q, k, values_and_states, attention_mask,
                                       d**-0.5 if scaling is None else scaling, causal)
        return out[..., :d], out[..., d:], None
    one_call = name in ("eager", ATTN_NAME)  # eager's column-wise matmuls keep O bit-identical to P·V alone
    if one_call or kwargs.get("dropout", 0.0):
        if not one_call:  # zero-padded to the value's width: q·k unchanged
            q, k = (nn.functional.pad(t, (0, values_and_states.shape[-1] - d)) for t in (q, k))
        out, weights = fn(attn, q, k, values_and_states, attention_mask, **kwargs)
        return out[..., :d], out[..., d:], weights
    o, weights = fn(attn, q, k, values_and_states[..., :d], attention_mask, **kwargs)
    e_tilde, _ = fn(attn, q, k, values_and_states[..., d:], attention_mask, **kwargs)
    # [B, S, Hq, D]; DeepSpeed's Ulysses wrapper (sequence parallelism) hands back [B, S, Hq·D]
    return o, e_tilde.reshape(*e_tilde.shape[:2], -1, d), weights


def _one_map_on_cpu(attn: nn.Module, q: torch.Tensor, k: torch.Tensor, values_and_states: torch.Tensor,
                    kwargs: dict) -> bool:
    """Whether :func:`~.one_map.attend_values_and_states` stands in for SDPA's two calls: CPU, fp32/fp64, no
    dropout, a module in eval mode with nothing that needs a gradient (training keeps the flash kernels'
    memory-light backward, and the no-grad forward of reentrant checkpointing keeps the registered function, which
    DeepSpeed's sequence-parallel wrapper may have replaced), not under torch.compile (its graph keeps SDPA), and no
    SDPA extra this path does not read (position bias, paged cache)."""
    tensors = (q, k, values_and_states)
    return (not attn.training and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and not kwargs.get("dropout")
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and not torch.compiler.is_compiling()
            and all(kwargs.get(name) is None for name in ("position_bias", "cache", "softcap")))


def tape_attention(attn: nn.Module, hidden: torch.Tensor, e: torch.Tensor, attention_mask, cache,
                   mix_states: bool = True, e_tilde_unread: bool = False, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Token mixing (eq. 6) and, with ``mix_states``, Ẽ = P·E (eq. 7) through the model's attention implementation.

    e: the state each token carries into this layer, [B, S, Hkv, D]. Returns (attention output after o_proj,
    attention weights or None, Ẽ [B, S, Hq, D] or None). E rides along as extra value channels, so the KV cache
    keeps the states of past keys, in layers that mix states (1.5× the plain cache there: D channels per KV head
    beside V's D); a layer whose update no later layer reads (``mix_states=False``) is plain attention.
    ``e_tilde_unread``: W_att = 0 exactly (``TapeBlock.reads_no_e_tilde``), so eq. 7 adds nothing; the cache
    still takes [V | E], attention runs over V alone (as in the stock model) and Ẽ comes back None.
    """
    bsz, seq, _ = hidden.shape
    d = attn.head_dim
    shape = (bsz, seq, -1, d)
    q = attn.q_proj(hidden).view(shape)
    k = attn.k_proj(hidden).view(shape)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    tables = rotation_tables(e)
    q, k = rotate(q, tables).transpose(1, 2), rotate(k, tables).transpose(1, 2)
    e_kv = e.transpose(1, 2)  # [B, Hkv, S, D]
    v = attn.v_proj(hidden).view(shape).transpose(1, 2)
    name = attn_implementation(attn.config)
    mix_states = mix_states or name == ATTN_NAME  # the fused kernel always takes [V | E]
    if mix_states:  # [V | E]: E rides along as extra value channels, in the cache too
        v = torch.cat([v, e_kv.to(v.dtype)], dim=-1)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    extra = {}
    if getattr(attn, "sliding_window", None) is not None:
        extra["sliding_window"] = attn.sliding_window
    if getattr(attn.config, "attn_logit_softcapping", None) is not None:
        extra["softcap"] = attn.config.attn_logit_softcapping
    common = dict(dropout=attn.attention_dropout if attn.training else 0.0, scaling=attn.scaling, **extra, **kwargs)
    if kwargs.get("output_attentions", getattr(attn.config, "output_attentions", False)) and name != "eager":
        raise ValueError(f"tape: output_attentions=True returns the attention maps only with attn_implementation="
                         f"'eager' (and backend='auto'); this model computes attention through {name!r}. Load it "
                         "with attn_implementation='eager' or call model.set_attn_implementation('eager').")
    if mix_states and (not e_tilde_unread or name == ATTN_NAME):  # the fused kernel reads [V | E] in one pass
        o, e_tilde, weights = mix_values_and_states(attn, q, k, v, attention_mask, **common)
        e_tilde = None if e_tilde_unread else e_tilde
    else:
        (o, weights), e_tilde = attention_function(attn)(attn, q, k, v[..., :d], attention_mask, **common), None
    return attn.o_proj(o.reshape(bsz, seq, -1).contiguous()), weights, e_tilde


def tape_fused_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: torch.Tensor | None, scaling: float | None = None,
                                 dropout: float = 0.0, sliding_window: int | None = None,
                                 softcap: float | None = None, position_ids: torch.Tensor | None = None,
                                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` entry for ``backend="triton"``: ``value`` is [V | E]; returns [O | Ẽ]."""
    if sliding_window is not None or softcap is not None:
        raise ValueError("tape: the fused kernel has no sliding window or soft-capping; use backend='auto' for "
                         "this model.")
    if dropout and module.training:
        raise ValueError("tape: the fused kernel has no attention dropout; set config.attention_dropout = 0.")
    attend = attention_call(tape_fused_attend, tape_fused_attend_every_slot, query.shape[2], key.shape[2],
                            attention_mask)
    query, key, value = autocast_inputs(query, key, value)  # as autocast casts SDPA's inputs
    return attend(query, key, value, attention_mask, position_ids, scaling), None


def _attended(query, key, value, attention_mask, position_ids, scaling):
    return value.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])  # [B, Lq, H, D + De]


@opaque_op("tape_fused_attend", _attended)
def tape_fused_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                      scaling: float | None) -> torch.Tensor:
    """[O | Ẽ] (eqs. 6-7) over the written keys through the fused kernel; returns [B, Lq, H, D + De]."""
    return _fused(written_keys, query, key, value, attention_mask, position_ids, scaling)


@opaque_op("tape_fused_attend_every_slot", _attended, graph_safe=True)
def tape_fused_attend_every_slot(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                                 scaling: float | None) -> torch.Tensor:
    """:func:`tape_fused_attend` over :func:`~..masks.every_slot` (``reads_every_slot``): no host read."""
    return _fused(every_slot, query, key, value, attention_mask, position_ids, scaling)


def _fused(keys, query, key, value, attention_mask, position_ids, scaling):
    try:  # remote code bundles no Triton kernels: it runs without this import
        from ...kernels.tape import tape_attention as fused
    except ImportError as exc:
        raise ImportError("tape: backend='triton' needs hf-posenc installed (`pip install hf-posenc[triton]`); "
                          "or patch with backend='auto'.") from exc
    packed = attention_mask is None  # Transformers' rule: jumps in position ids mean packed documents only then
    key, value, key_padding = keys(key, value, attention_mask)
    if packed and position_ids is not None and query.shape[2] == key.shape[2] and position_ids.shape[-1] > 1:
        pos = position_ids.expand(query.shape[0], -1)
        steps = pos[:, 1:] - pos[:, :-1]
        real = torch.ones_like(pos, dtype=torch.bool) if key_padding is None else key_padding
        if bool(((steps != 1) & real[:, 1:] & real[:, :-1]).any()):
            raise ValueError("tape: the fused kernel does not mask packed sequences; use backend='auto' for them.")
    d = query.shape[-1]
    # V and E as views of the [V | E] rows (unit last stride: the kernel reads them in place, no copy of the cache)
    o, e = fused(query, key, value[..., :d], value[..., d:], scale=scaling,
                 causal=True, key_padding_mask=key_padding)
    return torch.cat([o, e.to(o.dtype)], dim=-1).transpose(1, 2).contiguous()


class TapeAttentionMixin:
    """Attention forward of a TAPE layer (:func:`tape_attention`). The layer calls the attention module itself, so
    Transformers' output hooks record its attention maps (``output_attentions=True``) as for the stock model."""

    def forward(self, hidden_states: torch.Tensor, tape_state: torch.Tensor, attention_mask=None,
                cache=None, mix_states: bool = True, e_tilde_unread: bool = False, **kwargs):
        """Called by :class:`~.modeling.TapeLayerMixin` with the cache it resolved from either keyword."""
        return tape_attention(self, hidden_states, tape_state, attention_mask, cache, mix_states=mix_states,
                              e_tilde_unread=e_tilde_unread, **kwargs)
