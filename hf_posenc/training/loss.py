"""Causal-LM cross-entropy without materialising the full [L, vocab] logits.

The loss of a window is Σ_t −log softmax(W·h_t + b)[y_{t+1}] over the final hidden states h_t (after the last
norm) and the output head W. At 64k tokens and a 128k vocabulary the logits alone are 32 GB in fp32, so
:func:`chunked_linear_cross_entropy` walks the tokens in chunks of ``chunk_size``: for each chunk it forms the
logits, the loss and — in the same pass, as Liger-Kernel's fused linear cross-entropy does — the gradients with
respect to h and W (softmax − one-hot, eq. of the standard softmax cross-entropy derivative), then drops the chunk.
Peak extra memory is one chunk of logits; backward only rescales the stored gradients.

The family's logit transform is applied per chunk: a scale s (Cohere's ``logit_scale``, Granite's
``logits_scaling``), then Gemma2/3's final soft-capping c·tanh(s·z/c), with its derivative s·(1 − tanh²)
(read from the config by :func:`hf_posenc.decoder_layers.output_logit_transform`, applied by ``transform_logits``).
:func:`full_linear_cross_entropy` is the readable reference (one matmul, ``F.cross_entropy``); tests compare both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..decoder_layers import transform_logits

IGNORE_INDEX = -100


def full_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                              bias: torch.Tensor | None = None, softcap: float | None = None,
                              scale: float = 1.0) -> torch.Tensor:
    """Reference: summed cross-entropy of ``hidden`` [N, H] through ``weight`` [V, H] against ``labels`` [N]
    (``-100`` ignored), computed from the full fp32 logits (times ``scale``, then soft-capped)."""
    logits = transform_logits(F.linear(hidden, weight, bias).to(torch.promote_types(hidden.dtype, torch.float32)),
                              scale, softcap)
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size, softcap, scale):  # type: ignore[override]
        need_h, need_w = hidden.requires_grad, weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 accumulation (fp64 stays fp64)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            y = labels[start : start + chunk_size]
            logits = transform_logits(F.linear(h, weight, bias).to(acc), scale, softcap)
            valid = y != IGNORE_INDEX
            target = y.clamp(min=0)
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, target[:, None])[:, 0]
            total += torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            if not (need_h or need_w or need_b):
                continue
            g = torch.softmax(logits, dim=-1)  # d loss / d logits = softmax − one-hot (masked rows zero)
            g.scatter_add_(1, target[:, None], -torch.ones_like(picked)[:, None])
            g.mul_(valid[:, None])
            if softcap is not None:
                g.mul_(1 - (logits / softcap) ** 2)  # tanh' of the capped logits softcap·tanh(·)
            if scale != 1.0:
                g.mul_(scale)
            if need_b:
                grad_b += g.sum(0)
            g = g.to(h.dtype)
            if need_h:
                grad_h[start : start + chunk_size] = g @ weight
            if need_w:
                grad_w.addmm_(g.t().to(acc), h.to(acc))
        ctx.save_for_backward(grad_h, grad_w, grad_b)  # None where that input needs no gradient
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        return (
            None if grad_h is None else grad_h * grad_out.to(grad_h.dtype),
            None if grad_w is None else (grad_w * grad_out).to(w_dtype),
            None if grad_b is None else (grad_b * grad_out).to(b_dtype),
            None, None, None, None,
        )


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                 bias: torch.Tensor | None = None, softcap: float | None = None,
                                 chunk_size: int = 1024, scale: float = 1.0) -> torch.Tensor:
    """Summed cross-entropy like :func:`full_linear_cross_entropy`, holding at most ``chunk_size`` rows of logits.

    Args:
        hidden: [N, H] final hidden states.
        weight: [V, H] output head. bias: [V] or ``None``.
        labels: [N] target ids, ``-100`` ignored.
        softcap: final logit soft-capping value (Gemma2/3) or ``None``.
        chunk_size: rows per chunk.
        scale: logit scale applied before the soft-capping (Cohere, Granite; 1 elsewhere).
    """
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be [N, H] and labels [N]; got {tuple(hidden.shape)} and {tuple(labels.shape)}.")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, int(chunk_size), softcap, float(scale))


def shift_for_causal_lm(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair h_t with y_{t+1}: [B, L, H], [B, L] → [B(L−1), H], [B(L−1)]."""
    return hidden[:, :-1].reshape(-1, hidden.shape[-1]), labels[:, 1:].reshape(-1)


def liger_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               bias: torch.Tensor | None = None, softcap: float | None = None,
                               scale: float = 1.0) -> torch.Tensor:
    """Summed cross-entropy with Liger-Kernel's fused linear cross-entropy (CUDA; needs ``liger_kernel``); a
    ``scale`` other than 1 scales the head (Liger has no logit scale of its own)."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as exc:
        raise ImportError(
            "loss.implementation=liger needs the liger_kernel package (`pip install liger-kernel`); "
            "loss.implementation=chunked needs nothing and also avoids the full logits."
        ) from exc
    loss_fn = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum", softcap=softcap)
    if scale != 1.0:
        weight, bias = weight * scale, None if bias is None else bias * scale
    return loss_fn(weight, hidden, labels, bias)
