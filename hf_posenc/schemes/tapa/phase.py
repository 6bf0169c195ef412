"""TAPA's phase regime: how far the phase term of eq. 12 turns at distance 1, and a from-scratch start in the
paper's regime at any width.

In eq. 12 the score of a query at m and a key at n is ``c_A·q_A·k_A · cos(2π·|m − n|^α·c_P·φ)`` with
``φ = q_P·k_P`` (eq. 16, the linear ablation: ``φ = Σ q_P + Σ k_P``) and ``c_P = 1/√((1−θ)D)``. At distance 1,
``|m − n|^α = 1`` whatever α, so the phase is ``2π·c_P·φ`` radians: :func:`phase_at_distance_1`.

With weights drawn from normal(0, σ) and unit-variance inputs of width d, each component of q and k has variance
about d·σ², and the phase at distance 1 a standard deviation of about 2π·d·σ²: its median magnitude is about 0.11
rad for d = 64, σ = 0.02, and about 7 rad at LLaMA-3 7B's width with the same σ. Near 0 rad the cosine is about
1 and flat: the phase dimensions get almost no gradient and TAPA starts as position-free matching on half of each
head. :func:`start_phase_regime` rescales the phase half of every layer's query and key projections of a freshly
initialised model (a scale folded into the weights, nothing added to the model) so that the median phase at
distance 1 with unit-variance Gaussian inputs (:func:`initial_phase_medians`, what the layers see at init after
their RMSNorm) equals a target, such as the paper's width gives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def phase_at_distance_1(q: torch.Tensor, k: torch.Tensor, amp_dims: int, phase: str = "quadratic") -> torch.Tensor:
    """``|2π·c_P·φ|`` (radians) for aligned query / key pairs ``q``, ``k`` ``[..., D]`` (eq. 12 at |m − n| = 1):
    ``φ = q_P·k_P`` (``"quadratic"``) or ``Σ q_P + Σ k_P`` (``"linear"``, eq. 16), ``c_P = 1/√((1−θ)D)``, the
    phase part being the dims from ``amp_dims`` on."""
    q_p, k_p = q[..., amp_dims:].double(), k[..., amp_dims:].double()
    c_p = 1.0 / math.sqrt(q_p.shape[-1])
    phi = (q_p * k_p).sum(-1) if phase == "quadratic" else q_p.sum(-1) + k_p.sum(-1)
    return (2.0 * math.pi * c_p * phi).abs()


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every layer's attention module (one with ``q_proj`` and ``k_proj``), in order."""
    found = [m for m in model.modules() if isinstance(getattr(m, "q_proj", None), nn.Linear)
             and isinstance(getattr(m, "k_proj", None), nn.Linear)]
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention module with q_proj and k_proj (fused "
                         "projections are not supported)")
    return found


def _heads(config: Any) -> tuple[int, int, int]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return heads, getattr(text, "num_key_value_heads", None) or heads, head_dim


def _projected(attn: nn.Module, x: torch.Tensor, kind: str, heads: int, head_dim: int) -> torch.Tensor:
    """``x`` [N, hidden] through the ``kind`` projection (and its per-head norm, Qwen3 / Gemma3): [N, heads, D]."""
    out = getattr(attn, f"{kind}_proj")(x).view(x.shape[0], heads, head_dim)
    norm = getattr(attn, f"{kind}_norm", None)
    return out if norm is None else norm(out)


@torch.no_grad()
def initial_phase_medians(model: nn.Module, amp_dims: int, phase: str = "quadratic", samples: int = 1024,
                          seed: int = 0) -> list[float]:
    """Per layer, the median phase at distance 1 (radians, :func:`phase_at_distance_1`) of every head for
    ``samples`` query / key pairs of independent unit-variance Gaussian inputs (what the projections see at init,
    after RMSNorm), a fixed generator: the same weights give the same medians."""
    heads, kv_heads, head_dim = _heads(model.config)
    group = heads // kv_heads
    generator = torch.Generator().manual_seed(seed)
    out = []
    for attn in attention_modules(model):
        weight = attn.q_proj.weight
        x = torch.randn(2, samples, weight.shape[1], generator=generator, dtype=torch.float64)
        x = x.to(weight.device, weight.dtype)
        q = _projected(attn, x[0], "q", heads, head_dim)
        k = _projected(attn, x[1], "k", kv_heads, head_dim).repeat_interleave(group, dim=1)
        out.append(float(phase_at_distance_1(q, k, amp_dims, phase).median()))
    return out


def _phase_rows(heads: int, head_dim: int, amp_dims: int) -> torch.Tensor:
    """Output rows of a ``[heads × head_dim]`` projection that hold the phase part of each head."""
    return (torch.arange(heads)[:, None] * head_dim + torch.arange(amp_dims, head_dim)[None]).flatten()


@torch.no_grad()
def _scale_phase_half(attn: nn.Module, kind: str, heads: int, head_dim: int, amp_dims: int, factor: float) -> None:
    """Multiply the phase part of the ``kind`` projection's output by ``factor``: on the per-head norm's weight
    where the family has one (the projection's scale would be normalised away), else on the projection's rows."""
    norm = getattr(attn, f"{kind}_norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None:
        norm.weight[amp_dims:] *= factor
        return
    proj = getattr(attn, f"{kind}_proj")
    rows = _phase_rows(heads, head_dim, amp_dims).to(proj.weight.device)
    proj.weight[rows] *= factor
    if proj.bias is not None:
        proj.bias[rows] *= factor


def start_phase_regime(model: nn.Module, target: float, amp_dims: int, phase: str = "quadratic",
                       samples: int = 1024, seed: int = 0) -> dict[str, Any]:
    """Rescale the phase half of every layer's query and key projections so that the layer's median phase at
    distance 1 with Gaussian inputs (:func:`initial_phase_medians`) is ``target`` radians: by ``√(target/median)``
    on each of q and k for the quadratic phase (φ = q_P·k_P is bilinear), by ``target/median`` for the linear one.
    Returns ``{"target", "before", "after"}`` (per-layer medians, radians)."""
    if not (isinstance(target, (int, float)) and not isinstance(target, bool) and math.isfinite(target)
            and target > 0):
        raise ValueError(f"tapa: scheme.init phase_at_distance_1 must be a number of radians > 0 (the paper's "
                         f"regime is several radians), got {target!r}")
    heads, kv_heads, head_dim = _heads(model.config)
    before = initial_phase_medians(model, amp_dims, phase, samples, seed)
    for attn, median in zip(attention_modules(model), before):
        if median <= 0:
            raise ValueError("tapa: a layer's phase at distance 1 is 0 at init (zero query or key weights), so no "
                             "scale reaches the target; initialise the projections randomly")
        ratio = target / median
        factor = math.sqrt(ratio) if phase == "quadratic" else ratio
        _scale_phase_half(attn, "q", heads, head_dim, amp_dims, factor)
        _scale_phase_half(attn, "k", kv_heads, head_dim, amp_dims, factor)
    after = initial_phase_medians(model, amp_dims, phase, samples, seed)
    return {"target": float(target), "before": before, "after": after}


def phase_pairs(captured: dict[int, dict[str, torch.Tensor]], amp_dims: int, phase: str = "quadratic"
                ) -> Iterator[tuple[int, torch.Tensor]]:
    """Per captured layer (``{layer: {"q", "k"}}``, ``[B, H, S, D]`` aligned heads), the phase at distance 1 of
    every adjacent pair of the text (query at m, key at m − 1): ``(layer, [B, H, S − 1])``."""
    for layer, kinds in sorted(captured.items()):
        q, k = kinds["q"], kinds["k"]
        yield layer, phase_at_distance_1(q[:, :, 1:], k[:, :, :-1], amp_dims, phase)
