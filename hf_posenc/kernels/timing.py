"""Timing a kernel against RoPE attention through SDPA's flash backend: what each kernel package's ``selftest``
module (``tapa/selftest.py``, ``tape/selftest.py``) builds its timing on.

The one implementation behind `benchmarks/tapa_attention.py`, `benchmarks/tape_attention.py` and the
timing part of `hf-posenc selftest`: median time over round-robin repeats (drift hits every candidate
alike), TFLOP/s, and peak CUDA memory.

FLOP convention: the forward's matmul FLOPs (2 per multiply-add), halved for the causal mask, and 3.5× that
for forward + backward (backward ≈ 2.5× forward, as in the FlashAttention papers). TAPA's matmuls equal
standard attention's (θD + (1−θ)D = D, paper eq. 12); TAPE adds Ẽ = P·E (eq. 7), De more columns.

The kernels are looked up when a candidate runs, never at import: on CPU they must be imported after
TRITON_INTERPRET=1 is set (see `environment.py`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

FWD_BWD_FACTOR = 3.5  # backward ≈ 2.5× forward FLOPs
MODES = ("fwd", "fwd_bwd")
ROPE = "RoPE (SDPA flash)"  # the baseline's label in the selftest's timing rows (their vs_rope)



def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 2):
    """Median seconds per call of each function, measured round-robin so drift hits every candidate alike.

    Returns (medians {name: seconds}, samples {name: [seconds, ...]})."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}, samples


def peak_memory(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak CUDA memory one call allocates beyond what was allocated before it (None on CPU)."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def causal_flops(B: int, H: int, L: int, D: int, mode: str, value_dim: int | None = None) -> float:
    """Attention matmul FLOPs (Q·Kᵀ over D, P·V over value_dim, default D), halved for the causal mask;
    ×3.5 for mode "fwd_bwd"."""
    fwd = 2.0 * B * H * L * L * (D + (D if value_dim is None else value_dim)) / 2
    return fwd if mode == "fwd" else fwd * FWD_BWD_FACTOR


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA restricted to the flash backend (GQA through enable_gqa); CPU has its own flash implementation."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=q.shape[1] != k.shape[1])


def rope_tables(L: int, D: int, device: torch.device, dtype: torch.dtype, theta: float = 500_000.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [L, D] of RoPE (base θ, default 500 000; rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    ang = torch.arange(L, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the rotate-half layout: x·cos + rotate_half(x)·sin with cos/sin [L, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
