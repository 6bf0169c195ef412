"""TAPE: contextualized equivariant positional encoding for pretrained models (``tape-contextualized-equivariant-pe.md``).

Every token carries a positional state E: one complex number per RoPE frequency per key/value head, stored as
real channels ``[re_0 … re_{F−1}, im_0 … im_{F−1}]`` (F = D/2), initialised from the model's own rotary
frequencies (so TAPE composes with CoPE, p-RoPE or YaRN). In each layer:

* token mixing (eq. 6): queries and keys are multiplied by their token's state, ``q ⊙ z`` in RoPE's rotate-half
  form, so a logit depends on E only through z_i·conj(z_j) (invariant to a common rotation: eq. 4);
* attention-side update (eq. 7): the same softmax mixes the states, Ẽ = P·E. E rides along as extra value
  channels, so the KV cache stores the states of past keys (in the layers that mix them: 1.5× the plain cache
  there). Eager computes P·[V | E] in one call; the fused backends (sdpa, flex, flash) make a second call with the
  same q, k and mask so that O stays bit-identical to the stock model, or, with attention dropout, one call over
  [V | E] so that one dropout mask acts on both (see :func:`mix_values_and_states`); the fused Triton kernel in
  ``hf_posenc.kernels.tape`` does both in one pass. A zero-initialised head-mixing map (query heads → key/value
  heads) adds it back: E ← E + W_att·Ẽ;
* MLP-side update (eq. 8): E ← E + W₂·(silu(W_ψ·m) ⊙ W₁·E), with m the token MLP's output, W₁/W₂ acting on the
  head axis and shared over frequencies and re/im (equivariant, eq. 5); W₂ starts at zero.

With W_att = W₂ = 0 the patched model is bit-identical to the original (§3.3). The states travel between decoder
layers as a second tensor beside the hidden features (:class:`TapeLayerMixin`): gradient checkpointing (reentrant
or not) tracks them, ``output_hidden_states`` returns the hidden features alone, :func:`record_tape_states` reads
the states, and ``output_attentions`` returns the attention maps under eager attention. The last layer (per
rotary layer type in Gemma3) computes no Ẽ: no later layer reads it.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from .base import FrequencySchemeConfig, SchemeConfig, check_type
from .base import head_dim as config_head_dim
from .masks import padding_mask, written_keys

ATTN_NAME = "hf_posenc_tape"


@dataclass(frozen=True)
class TAPEConfig(SchemeConfig):
    """Options of TAPE.

    Attributes:
        hidden: intermediate width I of the MLP-side update (eq. 8); default 4 × the key/value heads, as in the
            authors' code.
        frequencies: a frequency scheme applied first, as a dict ``{"scheme": "cope", "clip_low_n": 10}``
            (any of cope, hardclip, prope, rope with their options); ``None`` keeps the model's frequencies.
        backend: ``"auto"`` runs through the model's attention implementation (eager, sdpa, flex, flash);
            ``"triton"`` uses the fused kernel (O = P·V and Ẽ = P·E in one pass; no sliding windows, soft-capping or
            packed sequences).
        layers: TAPE runs in every layer; must stay ``"all"``.
    """

    name: ClassVar[str] = "tape"
    paper: ClassVar[str] = "Rethinking Addressing in Language Models via Contextualized Equivariant PE (TAPE, eq. 6-8)"
    trainable_modules: ClassVar[tuple[str, ...]] = ("tape",)
    layers: Literal["global", "all"] = "all"
    hidden: int | None = None
    frequencies: dict[str, Any] | None = None
    backend: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_type(self.name, "hidden", self.hidden, (int,), optional=True)
        check_type(self.name, "backend", self.backend, (str,))
        if self.backend not in ("auto", "triton"):
            raise ValueError(f"tape: backend must be 'auto' (the model's attention implementation) or 'triton' "
                             f"(the fused kernel), got {self.backend!r}.")
        check_type(self.name, "frequencies", self.frequencies, (dict,), optional=True)
        if self.layers != "all":
            raise ValueError("tape: TAPE updates positions in every layer; layers must be 'all'.")
        if self.hidden is not None and self.hidden < 1:
            raise ValueError(f"tape: hidden must be >= 1, got {self.hidden}.")
        self.frequency_scheme()  # validates the nested scheme now

    def attention_name(self) -> str | None:
        return ATTN_NAME if self.backend == "triton" else None

    def frequency_scheme(self) -> FrequencySchemeConfig:
        from . import make_scheme
        from .rope import RoPEConfig

        if self.frequencies is None:
            return RoPEConfig()
        options = dict(self.frequencies)
        name = options.pop("scheme", None)
        scheme = make_scheme(name, **options) if isinstance(name, str) else None
        if not isinstance(scheme, FrequencySchemeConfig):
            raise ValueError(
                "tape: frequencies must name a frequency scheme, e.g. {'scheme': 'cope', 'clip_low_n': 10}; "
                f"got {self.frequencies!r}."
            )
        return scheme

    def check_model(self, head_dim: int) -> None:
        self.frequency_scheme().check_model(head_dim)

    def resolved(self, head_dim: int) -> TAPEConfig:
        import dataclasses

        inner = self.frequency_scheme().resolved(head_dim)
        frequencies = None if self.frequencies is None else {"scheme": inner.name, **inner.to_dict()}
        return dataclasses.replace(self, frequencies=frequencies)

    def install(self, model: nn.Module) -> None:
        install_tape(model, self)

    def uninstall(self, model: nn.Module) -> None:
        uninstall_tape(model)


# -- modules ------------------------------------------------------------------------------------------------------
class TapeBlock(nn.Module):
    """The TAPE parameters of one decoder layer (named so PEFT can keep them with ``modules_to_save=["tape"]``).

    attn_mix: W_att, query heads → key/value heads (zero init).  w_psi: ψ, hidden → I.  w1: W₁, heads → I.
    w2: W₂, I → heads (zero init).
    """

    def __init__(self, hidden_size: int, q_heads: int, kv_heads: int, intermediate: int, init_std: float):
        super().__init__()
        self.attn_mix = nn.Linear(q_heads, kv_heads, bias=False)
        self.w_psi = nn.Linear(hidden_size, intermediate, bias=False)
        self.w1 = nn.Linear(kv_heads, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, kv_heads, bias=False)
        nn.init.zeros_(self.attn_mix.weight)
        nn.init.zeros_(self.w2.weight)
        nn.init.normal_(self.w_psi.weight, std=init_std)
        nn.init.normal_(self.w1.weight, std=1.0 / math.sqrt(kv_heads))

    def attention_update(self, e: torch.Tensor, e_tilde: torch.Tensor) -> torch.Tensor:
        """Eq. 7 folded back with a head-mixing residual: E + W_att·Ẽ (e: [B,S,Hkv,D], e_tilde: [B,S,Hq,D]); W_att
        acts on the head axis, shared over the channels (equivariant)."""
        return e + head_map(self.attn_mix) @ e_tilde

    def mlp_update(self, e: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
        """Eq. 8: E + W₂·(silu(W_ψ·m) ⊙ W₁·E), with W₁, W₂ on the head axis, computed as E + (W₂·diag(gate)·W₁)·E:
        a [Hkv, Hkv] map per token, instead of an I-wide intermediate per channel."""
        gate = nn.functional.silu(self.w_psi(mlp_out))  # [B, S, I]
        heads = (head_map(self.w2) * gate.unsqueeze(-2)) @ head_map(self.w1)  # [B, S, Hkv, Hkv]
        return e + heads @ e


def head_map(linear: nn.Module) -> torch.Tensor:
    """The weight matrix of one of a block's head maps (W_att, W₁, W₂), applied directly to the head axis.

    The maps are trained whole (PEFT ``modules_to_save=["tape"]``). An adapter layer wrapped around one (LoRA with
    ``target_modules="all-linear"``) would be bypassed by reading the weight, so it is refused.
    """
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"tape: the head maps of a TapeBlock must stay plain nn.Linear layers, got "
                        f"{type(linear).__name__}; keep them out of LoRA's target_modules (train them whole with "
                        "modules_to_save=['tape'], as hf_posenc.adapters.lora_config does).")
    return linear.weight


# -- the state ------------------------------------------------------------------------------------
def _layer_types(model_config: Any) -> list[str | None]:
    rope = model_config.rope_parameters
    nested = model_config.nested_rope_parameter_keys(rope)
    return sorted(k for k in nested if rope[k] is not None) if nested else [None]


def initial_state(rotary: nn.Module, x: torch.Tensor, position_ids: torch.Tensor, layer_types: list,
                  kv_heads: int) -> torch.Tensor:
    """E₀ from the rotary module: [B, S, T, Hkv, D] with channels [cos_0..cos_{F-1}, sin_0..sin_{F-1}]."""
    states = []
    for layer_type in layer_types:
        cos, sin = rotary(x, position_ids) if layer_type is None else rotary(x, position_ids, layer_type)
        half = cos.shape[-1] // 2
        e = torch.cat([cos[..., :half], sin[..., :half]], dim=-1)
        states.append(e.expand(x.shape[0], -1, -1)[:, :, None, None, :].expand(-1, -1, 1, kv_heads, -1))
    return torch.cat(states, dim=2)


def rotate(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x ⊙ z per head in RoPE's rotate-half form (eq. 6): x [B, S, H, D], e [B, S, Hkv, D] = [re | im].

    H is a multiple of Hkv: query head h reads the state of key/value head h // (H / Hkv), like its keys. The
    products and sums are RoPE's ``x·cos + rotate_half(x)·sin`` term by term, so E₀ reproduces RoPE bit for bit.
    Token-major like the projections, so the rotated tensors keep the memory layout the stock model hands to
    attention (and attention picks the same kernel path).
    """
    half = x.shape[-1] // 2
    xs = x.unflatten(2, (e.shape[2], -1))  # [B, S, Hkv, group, D]
    re, im = e[..., :half].unsqueeze(3), e[..., half:].unsqueeze(3)
    x1, x2 = xs[..., :half], xs[..., half:]
    return torch.cat([x1 * re - x2 * im, x2 * re + x1 * im], dim=-1).flatten(2, 3)


def attention_function(attn: nn.Module):
    """The model's attention implementation (its own eager function, or the registered one)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = attn.config._attn_implementation
    if name != "eager":
        return ALL_ATTENTION_FUNCTIONS[name]
    stock = next(c for c in type(attn).__mro__ if not issubclass(c, TapeAttentionMixin))  # the family's class
    return sys.modules[stock.__module__].eager_attention_forward


def mix_values_and_states(attn: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor,
                          attention_mask, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """O = P·V (eq. 6) and Ẽ = P·E (eq. 7) with one attention map P: returns (O, Ẽ, P or None), O and Ẽ as
    [B, S, Hq, D]. q [B, Hq, S, D]; k, v, e [B, Hkv, L, D] (after the cache).

    * eager, and the fused kernel (``backend="triton"``): one call over [V | E];
    * other implementations (sdpa, flex, flash) pick another kernel for a value wider than the query, so without
      dropout they make two calls with the same q, k and mask, and O stays bit-identical to the stock model;
    * with attention dropout (training), the two calls would draw two masks, while eq. 7 mixes the states with
      the very P that mixes the values: one call then runs over [V | E] with q and k zero-padded to the value's
      width (q·k unchanged, the scale passed explicitly), so a single dropout mask acts on both.
    """
    d = q.shape[-1]
    fn = attention_function(attn)
    name = attn.config._attn_implementation
    if name in ("eager", ATTN_NAME):  # eager's column-wise matmuls keep O bit-identical to P·V alone
        out, weights = fn(attn, q, k, torch.cat([v, e], dim=-1), attention_mask, **kwargs)
        return out[..., :d], out[..., d:], weights
    if kwargs.get("dropout", 0.0):
        def pad(t: torch.Tensor) -> torch.Tensor:
            return nn.functional.pad(t, (0, e.shape[-1]))

        out, weights = fn(attn, pad(q), pad(k), torch.cat([v, e], dim=-1), attention_mask, **kwargs)
        return out[..., :d], out[..., d:], weights
    o, weights = fn(attn, q, k, v, attention_mask, **kwargs)
    e_tilde, _ = fn(attn, q, k, e, attention_mask, **kwargs)
    return o, e_tilde, weights


def tape_attention(attn: nn.Module, hidden: torch.Tensor, e: torch.Tensor, attention_mask, past_key_values,
                   mix_states: bool = True, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Token mixing (eq. 6) and, with ``mix_states``, Ẽ = P·E (eq. 7) through the model's attention implementation.

    e: the state each token carries into this layer, [B, S, Hkv, D]. Returns (attention output after o_proj,
    attention weights or None, Ẽ [B, S, Hq, D] or None). E rides along as extra value channels, so the KV cache
    keeps the states of past keys, in layers that mix states (1.5× the plain cache there: D channels per KV head
    beside V's D); a layer whose update no later layer reads (``mix_states=False``) is plain attention.
    """
    bsz, seq, _ = hidden.shape
    d = attn.head_dim
    shape = (bsz, seq, -1, d)
    q = attn.q_proj(hidden).view(shape)
    k = attn.k_proj(hidden).view(shape)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rotate(q, e).transpose(1, 2), rotate(k, e).transpose(1, 2)
    e_kv = e.transpose(1, 2)  # [B, Hkv, S, D]
    v = attn.v_proj(hidden).view(shape).transpose(1, 2)
    name = attn.config._attn_implementation
    mix_states = mix_states or name == ATTN_NAME  # the fused kernel always takes [V | E]
    if past_key_values is not None:
        k, v = past_key_values.update(k, torch.cat([v, e_kv.to(v.dtype)], dim=-1) if mix_states else v, attn.layer_idx)
        v, e_kv = (v[..., :d], v[..., d:]) if mix_states else (v, None)
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
    if mix_states:
        o, e_tilde, weights = mix_values_and_states(attn, q, k, v, e_kv.to(v.dtype), attention_mask, **common)
    else:
        (o, weights), e_tilde = attention_function(attn)(attn, q, k, v, attention_mask, **common), None
    return attn.o_proj(o.reshape(bsz, seq, -1).contiguous()), weights, e_tilde


def tape_fused_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: torch.Tensor | None, scaling: float | None = None,
                                 dropout: float = 0.0, sliding_window: int | None = None,
                                 softcap: float | None = None, position_ids: torch.Tensor | None = None,
                                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` entry for ``backend="triton"``: ``value`` is [V | E]; returns [O | Ẽ]."""
    import importlib

    try:
        tape_attention = importlib.import_module("hf_posenc.kernels.tape").tape_attention
    except ImportError as exc:
        raise ImportError("tape: backend='triton' needs hf-posenc installed (`pip install hf-posenc[triton]`); "
                          "or patch with backend='auto'.") from exc
    if sliding_window is not None or softcap is not None:
        raise ValueError("tape: the fused kernel has no sliding window or soft-capping; use backend='auto' for "
                         "this model.")
    if dropout and module.training:
        raise ValueError("tape: the fused kernel has no attention dropout; set config.attention_dropout = 0.")
    packed = attention_mask is None  # Transformers' rule: jumps in position ids mean packed documents only then
    key, value, key_padding = written_keys(key, value, attention_mask)  # static caches: written slots only
    if packed and position_ids is not None and query.shape[2] == key.shape[2] and position_ids.shape[-1] > 1:
        pos = position_ids.expand(query.shape[0], -1)
        steps = pos[:, 1:] - pos[:, :-1]
        real = torch.ones_like(pos, dtype=torch.bool) if key_padding is None else key_padding
        if bool(((steps != 1) & real[:, 1:] & real[:, :-1]).any()):
            raise ValueError("tape: the fused kernel does not mask packed sequences; use backend='auto' for them.")
    d = query.shape[-1]
    o, e = tape_attention(query, key, value[..., :d].contiguous(), value[..., d:].contiguous(), scale=scaling,
                          causal=True, key_padding_mask=key_padding)
    return torch.cat([o, e.to(o.dtype)], dim=-1).transpose(1, 2).contiguous(), None


def register_tape_attention() -> None:
    """Register the fused kernel's attention and (2-D padding) mask functions under :data:`ATTN_NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, tape_fused_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, padding_mask)


class TapeAttentionMixin:
    """Attention forward of a TAPE layer (:func:`tape_attention`). The layer calls the attention module itself, so
    Transformers' output hooks record its attention maps (``output_attentions=True``) as for the stock model."""

    def forward(self, hidden_states: torch.Tensor, tape_state: torch.Tensor, attention_mask=None,
                past_key_values=None, mix_states: bool = True, **kwargs):
        return tape_attention(self, hidden_states, tape_state, attention_mask, past_key_values,
                              mix_states=mix_states, **kwargs)


class TapeLayerMixin:
    """Decoder-layer forward that carries the positional states beside the hidden features.

    A layer returns ``(hidden, states)`` (states [B, S, T, Hkv, D], one per rotary layer type T) while a later
    layer reads them, and the hidden features alone from the last layer. Transformers records element 0 of a
    layer's output as its hidden state, so ``output_hidden_states=True`` returns hidden features only; the states
    are read with :func:`record_tape_states`. ``__call__`` hands both tensors to ``forward`` as positional
    arguments, so gradient checkpointing (reentrant or not) tracks both and every TAPE parameter gets its gradient.
    """

    def __call__(self, hidden_states, *args, **kwargs):
        if isinstance(hidden_states, tuple):  # (hidden, states) from the previous layer
            return super().__call__(*hidden_states, *args, **kwargs)
        return super().__call__(hidden_states, *args, **kwargs)

    def forward(self, hidden_states: torch.Tensor, tape_states: torch.Tensor | None = None, attention_mask=None,
                position_ids=None, past_key_values=None, use_cache=False, position_embeddings=None, **kwargs):
        ctx = self._tape_ctx
        x, states = hidden_states, tape_states
        if states is None:  # first layer: E₀ from the model's rotary frequencies
            if position_ids is None:
                position_ids = torch.arange(x.shape[1], device=x.device)[None]
            states = initial_state(ctx["decoder"].rotary_emb, x, position_ids, ctx["layer_types"],
                                   ctx["kv_heads"]).to(x.dtype)
        t = _state_index(self.self_attn.config, ctx["layer_types"], self.self_attn.layer_idx)
        e = states[:, :, t]
        if ctx.get("recorder") is not None:
            ctx["recorder"].append(e)
        tape = getattr(self, "tape", None)  # None: no later layer reads this layer's update

        residual = x
        h, _, e_tilde = self.self_attn(self.input_layernorm(x), e, attention_mask=attention_mask,
                                       past_key_values=past_key_values, mix_states=tape is not None,
                                       position_ids=position_ids, use_cache=use_cache, **kwargs)
        if hasattr(self, "pre_feedforward_layernorm"):  # Gemma2/Gemma3 sandwich norms
            h = self.post_attention_layernorm(h)
            x = residual + h
            m = self.mlp(self.pre_feedforward_layernorm(x))
            x = x + self.post_feedforward_layernorm(m)
        else:
            x = residual + h
            m = self.mlp(self.post_attention_layernorm(x))
            x = x + m
        if tape is None:  # the last layer, or the last of its type (Gemma3)
            return x if self is ctx["decoder"].layers[-1] else (x, states)
        e = tape.mlp_update(tape.attention_update(e, e_tilde), m)
        states = torch.cat([states[:, :, :t], e[:, :, None], states[:, :, t + 1 :]], dim=2)
        return x, states


@contextlib.contextmanager
def record_tape_states(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect the positional state each decoder layer reads, during the forward passes run inside the block.

    Yields a list that receives one tensor per layer and pass, in layer order: E [B, S, Hkv, D] with channels
    ``[re_0 … re_{F−1}, im_0 … im_{F−1}]`` (eq. 6–8; the first layer's is E₀ from the rotary frequencies)::

        with record_tape_states(model) as states:
            model(input_ids)
    """
    layers = [layer for layer in _decoder(model).layers if isinstance(layer, TapeLayerMixin)]
    if not layers:
        raise ValueError("record_tape_states: the model has no TAPE layers; patch it first with "
                         "hf_posenc.patch_model(model, 'tape').")
    ctx = layers[0]._tape_ctx
    if ctx.get("recorder") is not None:
        raise RuntimeError("record_tape_states: already recording this model's states; do not nest the blocks.")
    ctx["recorder"] = states = []
    try:
        yield states
    finally:
        ctx["recorder"] = None


def _state_index(config: Any, layer_types: list, layer_idx: int) -> int:
    """Which positional state a layer reads: one per rotary layer type (Gemma3 keeps sliding and global apart)."""
    return layer_types.index(config.layer_types[layer_idx]) if len(layer_types) > 1 else 0


_CLASSES: dict[tuple[type, type], type] = {}


def _tape_class(mixin: type, cls: type) -> type:
    """``cls`` with the TAPE forward of ``mixin`` (one class per stock class, so isinstance checks still hold)."""
    if (mixin, cls) not in _CLASSES:
        _CLASSES[mixin, cls] = type(f"Tape{cls.__name__}", (mixin, cls), {"__module__": __name__})
    return _CLASSES[mixin, cls]


def _decoder(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        raise ValueError(f"tape: cannot find the decoder layers of {type(model).__name__}.")
    return inner


def install_tape(model: nn.Module, scheme: TAPEConfig) -> None:
    """Add a :class:`TapeBlock` to every decoder layer whose updated state a later layer reads (all but the last;
    per layer type in Gemma3) and switch the layers to the TAPE forward."""
    config = model.config
    decoder = _decoder(model)
    kv_heads, q_heads = config.num_key_value_heads, config.num_attention_heads
    head_dim = config_head_dim(config)
    intermediate = scheme.hidden or 4 * kv_heads
    # A plain dict (not a submodule) so the decoder is not registered twice; deepcopy maps it to the copy.
    ctx = {
        "hidden_size": config.hidden_size, "kv_heads": kv_heads, "head_dim": head_dim,
        "layer_types": _layer_types(config), "decoder": decoder,
    }
    layers = decoder.layers
    kinds = [_state_index(config, ctx["layer_types"], i) for i in range(len(layers))]
    stock_names = {type(layer).__name__ for layer in layers if not isinstance(layer, TapeLayerMixin)}
    for i, layer in enumerate(layers):
        if kinds[i] in kinds[i + 1 :] and not hasattr(layer, "tape"):  # its update reaches a later layer
            ref = next(layer.parameters())
            layer.tape = TapeBlock(config.hidden_size, q_heads, kv_heads, intermediate,
                                   getattr(config, "initializer_range", 0.02)).to(device=ref.device, dtype=ref.dtype)
        if not isinstance(layer, TapeLayerMixin):
            layer.__class__ = _tape_class(TapeLayerMixin, type(layer))
            layer.self_attn.__class__ = _tape_class(TapeAttentionMixin, type(layer.self_attn))
        layer._tape_ctx = ctx
    _rename_no_split(model, stock_names, {type(layer).__name__ for layer in layers})


def _rename_no_split(model: nn.Module, old: set[str], new: set[str]) -> None:
    """Replace the decoder-layer class names ``old`` by ``new`` in ``_no_split_modules``: FSDP's transformer wrap
    policy (accelerate: every listed class must exist in the model) and ``device_map="auto"`` find decoder layers
    by class name, and a TAPE layer's class is new."""
    for module in model.modules():
        current = getattr(module, "_no_split_modules", None)
        if isinstance(current, (set, list, tuple)) and "_no_split_modules" in vars(module):
            module._no_split_modules = (set(current) - old) | new


def uninstall_tape(model: nn.Module) -> None:
    tape_layers = [layer for layer in _decoder(model).layers if isinstance(layer, TapeLayerMixin)]
    _rename_no_split(model, {type(layer).__name__ for layer in tape_layers},
                     {type(layer).__mro__[2].__name__ for layer in tape_layers})
    for layer in _decoder(model).layers:
        for module, mixin in ((layer, TapeLayerMixin), (layer.self_attn, TapeAttentionMixin)):
            if isinstance(module, mixin):
                module.__class__ = type(module).__mro__[2]
        for name in ("tape", "_tape_ctx"):
            if hasattr(layer, name):
                delattr(layer, name)
