"""RoPE arithmetic in the rotate_half layout used by Transformers: chunk ``j`` pairs dims ``j`` and ``j + D/2``.

For a query ``q`` at position ``m`` and a key ``k`` at position ``n`` (pre-rotation), with ``d = m − n``:

    ⟨R_m q, R_n k⟩ = Σ_j (q_j k_j + q_j' k_j') cos(d θ_j) + (q_j k_j' − q_j' k_j) sin(d θ_j),   j' = j + D/2

(the NUDFT form of cope-clipped-rope eq. 8). :func:`fake_distance_logits` evaluates it at any distance ``d``
(position-generalization-mechanism §3.2); :func:`rotate` is the plain rotation used as its reference.
"""

from __future__ import annotations

import torch


def split_chunks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two coordinates of every 2-D RoPE chunk: ``x[..., :D/2]`` and ``x[..., D/2:]``."""
    half = x.shape[-1] // 2
    if x.shape[-1] != 2 * half:
        raise ValueError(f"head_dim must be even, got {x.shape[-1]}.")
    return x[..., :half], x[..., half:]


def chunk_norms(x: torch.Tensor) -> torch.Tensor:
    """2-norm of every 2-D chunk: ``[..., D] -> [..., D/2]`` (prope-round-and-round-we-go §4)."""
    a, b = split_chunks(x)
    return torch.sqrt(a * a + b * b)


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Apply RoPE at ``positions`` (``[S]``) to ``x`` (``[..., S, D]``), as Transformers' ``apply_rotary_pos_emb``."""
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None]  # [S, D/2]
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    a, b = split_chunks(x)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def chunk_products(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-chunk cosine and sine coefficients of ⟨R_d q, k⟩ for broadcastable ``q``, ``k`` (``[..., D] -> [..., D/2]``)."""
    q1, q2 = split_chunks(q)
    k1, k2 = split_chunks(k)
    return q1 * k1 + q2 * k2, q1 * k2 - q2 * k1


def fake_distance_logits(
    q: torch.Tensor, keys: torch.Tensor, distances: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0,
) -> torch.Tensor:
    """``W'[..., d, j] = scale · ⟨R_{d} q, k_j⟩`` for one query per leading index (position-generalization eq. 4 setup).

    Args:
        q: ``[..., D]`` pre-rotation queries (one per head).
        keys: ``[..., N, D]`` pre-rotation keys.
        distances: ``[M]`` fake relative distances ``d`` replacing the real ``i − j``.
        inv_freq: ``[D/2]`` the model's inverse frequencies.
        scale: softmax scale × attention_scaling² (Transformers multiplies cos/sin by attention_scaling).

    Returns ``[..., M, N]`` (float64)."""
    c, s = chunk_products(q[..., None, :].double(), keys.double())  # [..., N, D/2]
    angles = distances.double()[:, None] * inv_freq.double()[None]  # [M, D/2]
    return scale * (torch.einsum("...nj,mj->...mn", c, torch.cos(angles)) + torch.einsum("...nj,mj->...mn", s, torch.sin(angles)))


def pair_logits(
    q: torch.Tensor, k: torch.Tensor, distances: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0,
) -> torch.Tensor:
    """``scale · ⟨R_{d_p} q_p, k_p⟩`` for paired rows: ``q, k [..., P, D]``, ``distances [P]`` -> ``[..., P]``."""
    c, s = chunk_products(q.double(), k.double())
    angles = distances.double()[:, None] * inv_freq.double()[None]
    return scale * (c * torch.cos(angles) + s * torch.sin(angles)).sum(-1)


def causal_attention_rows(
    q_rot: torch.Tensor, k_rot: torch.Tensor, rows: torch.Tensor, scale: float, sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Softmax attention of query ``rows`` over all keys with the causal (and sliding-window) mask.

    ``q_rot [H, R, D]`` are the rotated queries of ``rows`` (absolute positions ``[R]``), ``k_rot [H, S, D]`` the
    rotated keys at positions ``0..S-1``. Returns ``[H, R, S]`` probabilities (float32)."""
    logits = torch.einsum("hrd,hsd->hrs", q_rot.float(), k_rot.float()) * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    cols = torch.arange(k_rot.shape[-2])
    masked = cols[None] > rows[:, None]
    if sliding_window:
        masked |= (rows[:, None] - cols[None]) >= sliding_window
    logits = logits.masked_fill(masked[None], float("-inf"))
    return torch.softmax(logits, dim=-1)
