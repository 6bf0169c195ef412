"""TAPE: contextualized equivariant positional encoding for pretrained models (``tape-contextualized-equivariant-pe.md``).

Every token carries a positional state E: one complex number per RoPE frequency per key/value head, stored as
real channels ``[re_0 … re_{F−1}, im_0 … im_{F−1}]`` (F = D/2), initialised from the model's own rotary
frequencies (so TAPE composes with CoPE, p-RoPE or YaRN). In each layer:

* token mixing (eq. 6): queries and keys are multiplied by their token's state, ``q ⊙ z`` in RoPE's rotate-half
  form, so a logit depends on E only through z_i·conj(z_j) (invariant to a common rotation: eq. 4);
* attention-side update (eq. 7): the same softmax mixes the states, Ẽ = P·E. E rides along as extra value
  channels, so the KV cache stores the states of past keys; eager computes P·[V | E] in one call, the fused
  backends (sdpa, flex, flash) make a second call with the same q, k and mask so that O stays bit-identical to
  the stock model (the fused Triton kernel in ``hf_posenc.kernels.tape`` does both in one pass); a
  zero-initialised head-mixing map (query heads → key/value heads) adds it back: E ← E + W_att·Ẽ;
* MLP-side update (eq. 8): E ← E + W₂·(silu(W_ψ·m) ⊙ W₁·E), with m the token MLP's output, W₁/W₂ acting on the
  head axis and shared over frequencies and re/im (equivariant, eq. 5); W₂ starts at zero.

With W_att = W₂ = 0 the patched model is bit-identical to the original (§3.3). The state travels between decoder
layers packed after the hidden features of the layer input, so gradient checkpointing (reentrant or not) passes
it as a tensor argument and every TAPE parameter gets its gradient; the last layer drops it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from .base import FrequencySchemeConfig, SchemeConfig, check_type
from .tapa import tapa_mask, written_keys

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

    @staticmethod
    def _over_heads(linear: nn.Linear, e: torch.Tensor) -> torch.Tensor:
        """Apply ``linear`` along the head axis of [..., heads, channels] (shared over channels: equivariant)."""
        return linear(e.transpose(-1, -2)).transpose(-1, -2)

    def attention_update(self, e: torch.Tensor, e_tilde: torch.Tensor) -> torch.Tensor:
        """Eq. 7 folded back with a head-mixing residual: E + W_att·Ẽ (e: [B,S,Hkv,D], e_tilde: [B,S,Hq,D])."""
        return e + self._over_heads(self.attn_mix, e_tilde)

    def mlp_update(self, e: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
        """Eq. 8: E + W₂·(silu(W_ψ·m) ⊙ W₁·E)."""
        gate = nn.functional.silu(self.w_psi(mlp_out)).unsqueeze(-2)  # [B, S, 1, I]
        inner = self.w1(e.transpose(-1, -2)) * gate  # [B, S, D, I]
        return e + self.w2(inner).transpose(-1, -2)


# -- the state and its packing ------------------------------------------------------------------------------------
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
    """x ⊙ z in rotate-half form, per head: x [B,H,S,D], e [B,H,S,D] = [re | im] (RoPE's formula, eq. 6)."""
    half = x.shape[-1] // 2
    cos = torch.cat([e[..., :half], e[..., :half]], dim=-1)
    sin = torch.cat([e[..., half:], e[..., half:]], dim=-1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos) + (rotated * sin)


def tape_attention(attn: nn.Module, hidden: torch.Tensor, e: torch.Tensor, attention_mask, past_key_values,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Token mixing (eq. 6) and Ẽ = P·E (eq. 7) in one attention call of the model's own implementation."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    bsz, seq, _ = hidden.shape
    d = attn.head_dim
    shape = (bsz, seq, -1, d)
    q = attn.q_proj(hidden).view(shape)
    k = attn.k_proj(hidden).view(shape)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = attn.v_proj(hidden).view(shape).transpose(1, 2)
    e_kv = e.transpose(1, 2)  # [B, Hkv, S, D]
    groups = q.shape[1] // k.shape[1]
    q = rotate(q, e_kv.repeat_interleave(groups, dim=1))
    k = rotate(k, e_kv)
    v = torch.cat([v, e_kv.to(v.dtype)], dim=-1)  # E rides along as value channels (and into the KV cache)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, attn.layer_idx)
    name = attn.config._attn_implementation
    fn = sys.modules[type(attn).__module__].eager_attention_forward if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]
    extra = {}
    if getattr(attn, "sliding_window", None) is not None:
        extra["sliding_window"] = attn.sliding_window
    if getattr(attn.config, "attn_logit_softcapping", None) is not None:
        extra["softcap"] = attn.config.attn_logit_softcapping
    common = dict(dropout=attn.attention_dropout if attn.training else 0.0, scaling=attn.scaling, **extra, **kwargs)
    if name in ("eager", ATTN_NAME):  # one call: P·[V | E] (eager's column-wise matmuls keep O bit-identical)
        out, _ = fn(attn, q, k, v, attention_mask, **common)
        o, e_tilde = out[..., :d], out[..., d:]
    else:  # fused backends pick other kernels for a wider value: two calls with the same P keep O exact
        o, _ = fn(attn, q, k, v[..., :d], attention_mask, **common)
        e_tilde, _ = fn(attn, q, k, v[..., d:], attention_mask, **common)
    return attn.o_proj(o.reshape(bsz, seq, -1).contiguous()), e_tilde


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
    key, value, key_padding = written_keys(key, value, attention_mask)  # static caches: written slots only
    if position_ids is not None and query.shape[2] == key.shape[2] and position_ids.shape[-1] > 1:
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
    AttentionMaskInterface.register(ATTN_NAME, tapa_mask)


class TapeLayerMixin:
    """Decoder-layer forward with the TAPE state packed after the hidden features (see module docstring)."""

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False, position_embeddings=None, **kwargs):
        ctx = self._tape_ctx
        size = ctx["hidden_size"]
        kv_heads, d, types = ctx["kv_heads"], ctx["head_dim"], ctx["layer_types"]
        x = hidden_states[..., :size]
        if hidden_states.shape[-1] == size:  # first layer: E₀ from the model's rotary frequencies
            if position_ids is None:
                position_ids = torch.arange(x.shape[1], device=x.device)[None]
            states = initial_state(ctx["decoder"].rotary_emb, x, position_ids, types, kv_heads).to(x.dtype)
        else:
            states = hidden_states[..., size:].unflatten(-1, (len(types), kv_heads, d))
        t = _state_index(self.self_attn.config, types, self.self_attn.layer_idx)
        e = states[:, :, t]

        residual = x
        h = self.input_layernorm(x)
        h, e_tilde = tape_attention(self.self_attn, h, e, attention_mask, past_key_values, position_ids=position_ids,
                                    use_cache=use_cache, **kwargs)
        if hasattr(self, "pre_feedforward_layernorm"):  # Gemma2/Gemma3 sandwich norms
            h = self.post_attention_layernorm(h)
            x = residual + h
            m = self.mlp(self.pre_feedforward_layernorm(x))
            x = x + self.post_feedforward_layernorm(m)
        else:
            x = residual + h
            m = self.mlp(self.post_attention_layernorm(x))
            x = x + m
        tape = getattr(self, "tape", None)
        if tape is None:  # no later layer reads this state (the last layer, or the last of its type)
            return x if self is ctx["decoder"].layers[-1] else torch.cat([x, states.flatten(2)], dim=-1)
        e = tape.mlp_update(tape.attention_update(e, e_tilde), m)
        states = torch.cat([states[:, :, :t], e[:, :, None], states[:, :, t + 1 :]], dim=2)
        return torch.cat([x, states.flatten(2)], dim=-1)


def _state_index(config: Any, layer_types: list, layer_idx: int) -> int:
    """Which positional state a layer reads: one per rotary layer type (Gemma3 keeps sliding and global apart)."""
    return layer_types.index(config.layer_types[layer_idx]) if len(layer_types) > 1 else 0


_LAYER_CLASSES: dict[type, type] = {}


def _tape_layer_class(cls: type) -> type:
    if cls not in _LAYER_CLASSES:
        _LAYER_CLASSES[cls] = type(f"Tape{cls.__name__}", (TapeLayerMixin, cls), {"__module__": __name__})
    return _LAYER_CLASSES[cls]


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
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
    intermediate = scheme.hidden or 4 * kv_heads
    # A plain dict (not a submodule) so the decoder is not registered twice; deepcopy maps it to the copy.
    ctx = {
        "hidden_size": config.hidden_size, "kv_heads": kv_heads, "head_dim": head_dim,
        "layer_types": _layer_types(config), "decoder": decoder,
    }
    layers = decoder.layers
    kinds = [_state_index(config, ctx["layer_types"], i) for i in range(len(layers))]
    for i, layer in enumerate(layers):
        if kinds[i] in kinds[i + 1 :] and not hasattr(layer, "tape"):  # its update reaches a later layer
            ref = next(layer.parameters())
            layer.tape = TapeBlock(config.hidden_size, q_heads, kv_heads, intermediate,
                                   getattr(config, "initializer_range", 0.02)).to(device=ref.device, dtype=ref.dtype)
        layer.__class__ = _tape_layer_class(type(layer))
        layer._tape_ctx = ctx


def uninstall_tape(model: nn.Module) -> None:
    for layer in _decoder(model).layers:
        if isinstance(layer, TapeLayerMixin):
            layer.__class__ = type(layer).__mro__[2]
        for name in ("tape", "_tape_ctx"):
            if hasattr(layer, name):
                delattr(layer, name)
