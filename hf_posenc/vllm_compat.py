"""What vLLM computes differently from Transformers with a stock export, and how ``export_stock`` compensates.

Checked against vLLM 0.32 (CPU backend) by ``scripts/serving/vllm_compare.py`` and ``tests/test_serving_vllm.py``.

* ``longrope`` ``attention_factor``: vLLM ignores it and derives the scale from ``max_position_embeddings /
  original_max_position_embeddings`` (1 in CoPE/HardClip exports). Transformers multiplies cos and sin by the rope
  type's ``attention_scaling`` a (YaRN's 0.1·ln(s) + 1, kept by CoPE/HardClip over a YaRN base), so the rotated query
  and key are both a times larger and q·k is a² times larger (``apply_rotary_pos_emb``). Rotation is linear, so
  multiplying the query and key projections by a (weights and biases; not √a: each side carries a) gives the same
  attention logits up to float rounding with a = 1 left in the config: :func:`fold_attention_factors`. Families that
  normalise q and k after the projection (Qwen3, Gemma3) get the factor in those norms' scales instead, since an
  RMSNorm undoes any scaling of its input.
* ``dynamic`` (NTK): Transformers keeps the trained frequencies up to ``max_position_embeddings`` and raises the
  base past it, as the sequence grows; vLLM computes one base at load time (for a stock config, the trained one) and
  never rescales. Identical within the trained length, different beyond it, and no stock config changes that:
  :func:`warn_vllm_differences` warns at export time.
* ``proportional`` ignores ``factor`` in vLLM; the export writes p-RoPE over PI as ``longrope`` instead
  (``hf_posenc.export``).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from .schemes.base import layer_rope_parameters


def _foldable_factor(config: Any, params: dict[str, Any] | None) -> float | None:
    """The ``attention_factor`` of a ``longrope`` entry whose length ratio is 1 (so vLLM would use scale 1)."""
    if not params or params.get("rope_type") != "longrope":
        return None
    factor = params.get("attention_factor")
    if factor is None or float(factor) == 1.0:
        return None
    if params.get("original_max_position_embeddings") != config.max_position_embeddings:
        return None
    return float(factor)


def _norm_offset(norm: nn.Module) -> float:
    """0 for an RMSNorm that computes ``weight·n(x)``, 1 for Gemma's ``(1 + weight)·n(x)`` (probed, not guessed)."""
    probe = copy.deepcopy(norm).float()
    with torch.no_grad():
        probe.weight.zero_()
        out = probe(torch.ones(1, probe.weight.shape[-1]))
    return 0.0 if out.abs().max().item() == 0.0 else 1.0


def fold_attention_factors(model: nn.Module, stock: Any) -> dict[str, torch.Tensor] | None:
    """Fold ``stock``'s foldable rotary attention factors into ``model``'s query/key weights.

    ``stock`` is the stock config being exported (edited in place: each folded ``attention_factor`` becomes 1.0).
    Returns the state dict to save (``model`` itself is not modified), or ``None`` when nothing needed folding."""
    rope = stock.rope_parameters
    nested = stock.nested_rope_parameter_keys(rope)
    factors = {k: _foldable_factor(stock, rope[k]) for k in nested} if nested else {None: _foldable_factor(stock, rope)}
    if all(f is None for f in factors.values()):
        return None
    layer_types = getattr(stock, "layer_types", None)
    state = dict(model.state_dict())
    folded_layers = 0
    for name, module in model.named_modules():
        if not (hasattr(module, "q_proj") and hasattr(module, "k_proj") and hasattr(module, "layer_idx")):
            continue
        factor = factors.get(layer_types[module.layer_idx] if nested else None)
        if factor is None:
            continue
        for side in ("q", "k"):
            norm = getattr(module, f"{side}_norm", None)
            if norm is not None:
                key = f"{name}.{side}_norm.weight"
                offset = _norm_offset(norm)
                state[key] = ((state[key].double() + offset) * factor - offset).to(state[key].dtype)
                continue
            for kind in ("weight", "bias"):
                key = f"{name}.{side}_proj.{kind}"
                if state.get(key) is not None:
                    state[key] = (state[key].double() * factor).to(state[key].dtype)
        folded_layers += 1
    if folded_layers == 0:
        raise RuntimeError("internal error: no attention module with q_proj/k_proj to fold the attention factor into.")
    for key, factor in factors.items():
        if factor is not None:
            (rope[key] if nested else rope)["attention_factor"] = 1.0
    return state


# Rope types vLLM runs differently from Transformers, and why.
VLLM_DIFFERS = {
    "dynamic": "vLLM fixes dynamic NTK's base at load time and never rescales it, while Transformers raises the base "
               "once a sequence outgrows max_position_embeddings, so their outputs differ beyond the trained length; "
               "use scaling='yarn' (static) for a checkpoint that serves identically",
}


def warn_vllm_differences(stock: Any) -> None:
    """Warn (naming vLLM) for each rope type in the stock config ``stock`` that vLLM computes differently."""
    for params in layer_rope_parameters(stock):
        reason = VLLM_DIFFERS.get(params.get("rope_type"))
        if reason is not None:
            warnings.warn(f"export_stock: rope type {params['rope_type']!r} loads in vLLM but runs differently there: "
                          f"{reason}.", UserWarning, stacklevel=3)
