"""TAPE's modules: the per-layer parameters (eq. 7–8), the positional state E₀ from the rotary frequencies, the
decoder-layer forward that carries the states, and install/uninstall on a model."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...upstream import layer_cache, no_split_modules, set_no_split_modules
from .attention import TapeAttentionMixin

if TYPE_CHECKING:
    from .config import TAPEConfig


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

    def attention_update(self, e: torch.Tensor, e_tilde: torch.Tensor | None) -> torch.Tensor:
        """Eq. 7 folded back with a head-mixing residual: E + W_att·Ẽ (e: [B,S,Hkv,D], e_tilde: [B,S,Hq,D]); W_att
        acts on the head axis, shared over the channels (equivariant). ``e_tilde`` None: not computed because
        W_att = 0 (:meth:`reads_no_e_tilde`), and E comes back unchanged."""
        return e if e_tilde is None else e + mix_heads(head_map(self.attn_mix), e_tilde)

    def reads_no_e_tilde(self) -> bool:
        """W_att = 0 exactly (as at init) and needs no gradient: eq. 7 adds W_att·Ẽ = 0, so Ẽ need not be computed.

        Read only where it is free: weights on the CPU (on an accelerator the test would stall the host on every
        layer) outside torch.compile (a data-dependent branch). Elsewhere Ẽ is computed and multiplied by zero."""
        weight = head_map(self.attn_mix)
        return (weight.device.type == "cpu" and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and weight.requires_grad) and not bool(weight.any()))

    def mlp_update(self, e: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
        """Eq. 8: E + W₂·(silu(W_ψ·m) ⊙ W₁·E), with W₁, W₂ on the head axis, computed as E + (W₂·diag(gate)·W₁)·E:
        a [Hkv, Hkv] map per token, instead of an I-wide intermediate per channel."""
        gate = nn.functional.silu(self.w_psi(mlp_out))  # [B, S, I]
        heads = (head_map(self.w2) * gate.unsqueeze(-2)) @ head_map(self.w1)  # [B, S, Hkv, Hkv]
        return e + mix_heads(heads, e)


FEW_HEADS = 8  # up to this many source heads, mix_heads multiplies and adds instead of calling matmul


def mix_heads(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``weight @ x`` on the head axis: out[..., k, :] = Σ_j weight[..., k, j] · x[..., j, :] (W_att·Ẽ in eq. 7,
    (W₂·diag(gate)·W₁)·E in eq. 8). weight: [K, J], or one [K, J] map per token [..., K, J]; x: [..., J, D].

    With few source heads in fp32, J broadcast multiply-adds: matmul computes this as thousands of tiny
    [K, J]·[J, D] products (or a GEMM J deep), several times slower on CPU (1024 tokens, 2×2 heads: 1.0 ms against
    0.14 ms). Half-precision inputs keep matmul, which accumulates in fp32 and rounds once."""
    if weight.dim() < 2 or x.dim() < 2 or weight.shape[-1] != x.shape[-2]:
        raise ValueError(f"mix_heads: weight [..., K, J] must have J = x's head axis (x [..., J, D]); got weight "
                         f"{list(weight.shape)} and x {list(x.shape)}")
    if x.shape[-2] > FEW_HEADS or x.dtype != torch.float32:
        return weight @ x
    out = weight[..., :, 0, None] * x[..., 0, None, :]
    for j in range(1, x.shape[-2]):
        out = out.addcmul(weight[..., :, j, None], x[..., j, None, :])
    return out


def head_map(linear: nn.Module) -> torch.Tensor:
    """The weight matrix of one of a block's head maps (W_att, W₁, W₂), applied directly to the head axis.

    The maps are trained whole (PEFT ``modules_to_save=["tape"]``). An adapter layer wrapped around one (LoRA with
    ``target_modules="all-linear"``) would be bypassed by reading the weight, so it is refused."""
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


class TapeLayerMixin:
    """Decoder-layer forward that carries the positional states beside the hidden features.

    A layer returns ``(hidden, states)`` (states [B, S, T, Hkv, D], one per rotary layer type T) while a later
    layer reads them, and the hidden features alone from the last layer. Transformers records element 0 of a
    layer's output as its hidden state, so ``output_hidden_states=True`` returns hidden features only; the states
    are read with :func:`record_tape_states`. ``__call__`` hands both tensors to ``forward`` as positional
    arguments, so gradient checkpointing (reentrant or not) tracks both and every TAPE parameter gets its gradient."""

    def __call__(self, hidden_states, *args, **kwargs):
        if isinstance(hidden_states, tuple):  # (hidden, states) from the previous layer
            return super().__call__(*hidden_states, *args, **kwargs)
        return super().__call__(hidden_states, *args, **kwargs)

    def forward(self, hidden_states: torch.Tensor, tape_states: torch.Tensor | None = None, attention_mask=None,
                position_ids=None, past_key_values=None, use_cache=False, position_embeddings=None, cache=None,
                **kwargs):
        # The KV cache arrives as `cache` (Transformers 5.24+) or `past_key_values` (5.18-5.23): read both, or the
        # states of past keys would silently be missing from attention (upstream.layer_cache).
        cache = layer_cache(past_key_values, cache)
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
                                       cache=cache, mix_states=tape is not None,
                                       e_tilde_unread=tape is not None and tape.reads_no_e_tilde(),
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
    intermediate = scheme.hidden or 4 * kv_heads
    # A plain dict (not a submodule) so the decoder is not registered twice; deepcopy maps it to the copy.
    ctx = {"kv_heads": kv_heads, "layer_types": _layer_types(config), "decoder": decoder}
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
        current = no_split_modules(module)
        if isinstance(current, (set, list, tuple)):
            set_no_split_modules(module, (set(current) - old) | new)


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
