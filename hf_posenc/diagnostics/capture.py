"""Getting pre-rotation queries, keys and values, and the rotary frequencies, out of a Transformers 5.x model.

Only public conventions of the supported families are used: the decoder layers at ``model.model.layers`` (or
``get_decoder().layers``), each with ``self_attn.q_proj``/``k_proj``/``v_proj`` (plus ``q_norm``/``k_norm`` on
Qwen3/Gemma3, applied per head before the rotation), ``self_attn.scaling`` (the softmax scale), optional
``sliding_window``/``attn_logit_softcapping``, and the rotary module's ``inv_freq``/``attention_scaling`` buffers
(``{layer_type}_inv_freq``/``{layer_type}_attention_scaling`` on Gemma3, keyed by ``config.layer_types``).

Projections are captured with forward hooks, reshaped to ``[batch, heads, seq, head_dim]`` and kept only for the
layers and heads asked for. Keys and values are *aligned* with the selected query heads: with grouped-query
attention, query head ``h`` reads key/value head ``h // (num_heads // num_kv_heads)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..decoder_layers import decoder_layers

KINDS = ("q", "k", "v")


@dataclass(frozen=True)
class AttentionGeometry:
    """Head counts and sizes of a model's attention."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def geometry(model: nn.Module) -> AttentionGeometry:
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return AttentionGeometry(len(decoder_layers(model)), heads, kv, head_dim)


def _check_selection(values: Sequence[int] | None, n: int, noun: str, has: str, negative: bool) -> list[int]:
    """Sorted distinct indices of ``values`` into ``n`` items (``None`` = all; negative ones count from the end when
    ``negative``), with errors naming ``noun`` and what the model ``has``."""
    if values is None:
        return list(range(n))
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{noun}s must be integers, got {value!r}.")
        if not (-n if negative else 0) <= value < n:
            valid = f"0..{n - 1} or -{n}..-1" if negative else f"0..{n - 1}"
            raise ValueError(f"{noun} {value} does not exist: the model has {n} {has} (valid: {valid}).")
        out.append(value % n)
    if not out:
        raise ValueError(f"the {noun} selection is empty; pass at least one {noun} or None for all.")
    return sorted(set(out))


def check_layers(model: nn.Module, layers: Sequence[int] | None) -> list[int]:
    """Validate a layer selection (``None`` = every layer; negative indices count from the end)."""
    return _check_selection(layers, geometry(model).num_layers, "layer", "layers", negative=True)


def check_heads(model: nn.Module, heads: Sequence[int] | None) -> list[int]:
    """Validate a query-head selection (``None`` = every head)."""
    return _check_selection(heads, geometry(model).num_heads, "head", "query heads", negative=False)


def _rotary_module(model: nn.Module) -> nn.Module:
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    rotary = getattr(base, "rotary_emb", None)
    if rotary is not None:
        return rotary
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            return module
    raise ValueError(f"no rotary embedding found in {type(model).__name__}; the diagnostics need a RoPE-family model.")


def layer_frequencies(model: nn.Module, layer: int) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_scaling)`` the rotary module uses for ``layer`` (float64 inverse frequencies).

    The frequencies are whatever the model's scheme computes (RoPE, YaRN, CoPE, HardClip, p-RoPE…); they are read
    from the module's buffers, so dynamic types reflect the latest forward pass."""
    rotary = _rotary_module(model)
    types = getattr(model.config, "layer_types", None)
    prefix = "" if types is None else f"{types[layer]}_"  # Gemma3's buffers per layer type
    if getattr(rotary, f"{prefix}inv_freq", None) is None:
        prefix = ""  # one set for every layer
    inv_freq = getattr(rotary, f"{prefix}inv_freq", None)
    scaling = getattr(rotary, f"{prefix}attention_scaling", None)
    if inv_freq is None:
        raise ValueError(f"the rotary module {type(rotary).__name__} has no `inv_freq` buffer.")
    head_dim = geometry(model).head_dim
    if inv_freq.numel() != head_dim // 2:
        raise ValueError(
            f"layer {layer} rotates {2 * inv_freq.numel()} of {head_dim} head dims (partial rotary); the diagnostics "
            "need one frequency per 2-D chunk of the head (rotate_half layout)."
        )
    return inv_freq.detach().to("cpu", torch.float64), float(1.0 if scaling is None else scaling)


def attention_module(model: nn.Module, layer: int) -> nn.Module:
    return decoder_layers(model)[layer].self_attn


def softmax_scale(model: nn.Module, layer: int) -> float:
    """The factor the logits are multiplied by before the softmax (``self_attn.scaling``)."""
    attn = attention_module(model, layer)
    scale = getattr(attn, "scaling", None)
    return float(scale) if scale is not None else geometry(model).head_dim ** -0.5


class QKVCapture:
    """Context manager that records the pre-rotation q/k/v of chosen layers and heads on every forward pass.

    After a forward, ``captured[layer][kind]`` is a float32 CPU tensor ``[batch, len(heads), seq, head_dim]``
    (the latest pass only: each pass overwrites the previous, so long texts can be streamed window by window)."""

    def __init__(
        self, model: nn.Module, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
        kinds: Sequence[str] = KINDS,
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {list(kinds)}.")
        self.model = model
        self.layers = check_layers(model, layers)
        self.heads = check_heads(model, heads)
        self.kinds = tuple(kinds)
        self.geometry = geometry(model)
        self.captured: dict[int, dict[str, torch.Tensor]] = {}
        self._handles: list = []

    def _hook(self, layer: int, kind: str, attn: nn.Module):
        g = self.geometry
        index = torch.tensor(self.heads if kind == "q" else [h // g.group for h in self.heads])
        norm = getattr(attn, f"{kind}_norm", None) if kind in ("q", "k") else None

        def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            x = output.view(*output.shape[:-1], -1, g.head_dim)  # [B, S, H, D]
            if norm is not None:
                x = norm(x)  # RMSNorm over head_dim: independent of the layout
            x = x.transpose(1, 2).index_select(1, index.to(x.device))
            self.captured.setdefault(layer, {})[kind] = x.detach().float().cpu()

        return hook

    def __enter__(self) -> QKVCapture:
        for layer in self.layers:
            attn = attention_module(self.model, layer)
            for kind in self.kinds:
                proj = getattr(attn, f"{kind}_proj", None)
                if proj is None:
                    raise TypeError(f"layer {layer}'s attention has no `{kind}_proj`; fused projections are unsupported.")
                self._handles.append(proj.register_forward_hook(self._hook(layer, kind, attn)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def forward(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """``model(input_ids)`` ([1, S]) on the model's device, without a cache. Explicit ``position_ids`` come with an
    all-ones attention mask: without it Transformers reads jumps in position ids as packed documents and would split
    attention into blocks."""
    device = next(model.parameters()).device
    if position_ids is not None:
        kwargs.update(position_ids=position_ids.to(device), attention_mask=torch.ones_like(input_ids).to(device))
    return model(input_ids=input_ids.to(device), use_cache=False, **kwargs)


def check_ids(input_ids: torch.Tensor, min_length: int, what: str) -> torch.Tensor:
    """Token ids as a ``[1, S]`` long tensor; raises if the text is shorter than ``min_length`` tokens."""
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one sequence of token ids ([S] or [1, S]), got shape {tuple(input_ids.shape)}.")
    if input_ids.shape[1] < min_length:
        raise ValueError(
            f"{what} needs at least {min_length} tokens but the text has {input_ids.shape[1]}; "
            "use a longer text or smaller lengths/distances."
        )
    return input_ids.long()


def windows(length: int, window: int) -> Iterator[tuple[int, int]]:
    """Non-overlapping ``[start, end)`` windows covering ``length`` tokens (the last one may be shorter)."""
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}.")
    for start in range(0, length, window):
        end = min(length, start + window)
        if end - start >= 2:
            yield start, end


@torch.no_grad()
def capture_window(
    model: nn.Module, input_ids: torch.Tensor, layers: Sequence[int] | None, heads: Sequence[int] | None,
    kinds: Sequence[str] = ("q", "k"), position_ids: torch.Tensor | None = None,
) -> dict[int, dict[str, torch.Tensor]]:
    """One forward pass over ``input_ids`` ([1, S]) returning the captured q/k/v (see :class:`QKVCapture`)."""
    with QKVCapture(model, layers, heads, kinds) as cap:
        kwargs = {"logits_to_keep": 1} if hasattr(model, "lm_head") else {}  # the logits are never used
        forward(model, input_ids, position_ids, **kwargs)
    return cap.captured
