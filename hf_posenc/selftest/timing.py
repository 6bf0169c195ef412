"""TAPA and TAPE attention timed against RoPE attention through SDPA's flash backend.

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


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# TAPA (paper eq. 12): fused kernel vs eager reference vs RoPE + SDPA flash
# --------------------------------------------------------------------------------------------------

TAPA_CANDIDATES = ("tapa_kernel", "sdpa_flash_rope", "tapa_eager")


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


def make_runner(kind: str, mode: str, q, k, v, rope) -> Callable[[], object]:
    """A closure running one TAPA-benchmark candidate once (forward only, or forward + backward)."""
    from ..kernels import tapa

    cos, sin = rope

    def forward():
        if kind == "tapa_kernel":
            return tapa.tapa_attention_triton(q, k, v)
        if kind == "tapa_eager":
            return tapa.tapa_attention_reference(q, k, v)
        if kind == "sdpa_flash_rope":
            return sdpa_flash(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=q.shape[2] > 1)
        raise ValueError(f"unknown TAPA benchmark candidate {kind!r}; pick from {TAPA_CANDIDATES}")

    if mode == "fwd":
        def run():
            with torch.no_grad():
                return forward()
        return run

    def run_bwd():
        out = forward()
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return run_bwd


def eager_fits(B: int, H: int, L: int, mode: str, device: torch.device) -> tuple[bool, str]:
    """The eager reference materialises several fp32 [B, H, L, L] tensors; (False, why) when they cannot fit."""
    need = B * H * L * L * 4 * (8 if mode == "fwd" else 16)
    if device.type != "cuda":
        return True, ""
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.8 * free:
        return False, f"needs ~{need / 2**30:.1f} GiB of [B,H,L,L] fp32 temporaries, {free / 2**30:.1f} GiB free"
    return True, ""


def bench_prefill(B, H, L, D, mode, dtype, device, repeats, group=1, candidates=TAPA_CANDIDATES,
                  warmup: int = 2) -> dict:
    """TAPA prefill (Lq = Lk = L, causal): median ms, TFLOP/s and peak memory per candidate, and the ratios
    kernel/SDPA and eager/kernel (time)."""
    g = torch.Generator(device=device).manual_seed(L + D)
    grad = mode == "fwd_bwd"
    q = torch.randn(B, H, L, D, device=device, dtype=dtype, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H // group, L, D, device=device, dtype=dtype, generator=g).requires_grad_(grad)
            for _ in range(2))
    rope = rope_tables(L, D, device, dtype)
    kinds = list(candidates)
    skipped = {}
    if "tapa_eager" in kinds:
        ok, why = eager_fits(B, H, L, mode, device)
        if not ok:
            kinds.remove("tapa_eager")
            skipped["tapa_eager"] = why
    runners = {kname: make_runner(kname, mode, q, k, v, rope) for kname in kinds}
    medians, _ = time_interleaved(runners, device, repeats, warmup)
    flops = causal_flops(B, H, L, D, mode)
    rows = {kname: {"median_ms": t * 1e3, "tflops": flops / t / 1e12,
                    "peak_mem_bytes": peak_memory(runners[kname], device)} for kname, t in medians.items()}
    rows.update({kname: {"skipped": why} for kname, why in skipped.items()})
    ratios = {}
    if "tapa_kernel" in medians and "sdpa_flash_rope" in medians:
        ratios["kernel_over_sdpa"] = medians["tapa_kernel"] / medians["sdpa_flash_rope"]
    if "tapa_eager" in medians and "tapa_kernel" in medians:
        ratios["eager_over_kernel"] = medians["tapa_eager"] / medians["tapa_kernel"]
    return {"B": B, "H": H, "Hkv": H // group, "L": L, "D": D, "mode": mode, "results": rows, "ratios": ratios}


def bench_decode(B, H, L, D, dtype, device, repeats, group=1, warmup: int = 2) -> dict:
    """TAPA decode (one query against an L-token cache): tokens/s of the kernel vs RoPE + SDPA flash (the
    RoPE cache holds rotated keys, so only the new query is rotated per step)."""
    from ..kernels import tapa

    g = torch.Generator(device=device).manual_seed(7 * L + D)
    q = torch.randn(B, H, 1, D, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, H // group, L, D, device=device, dtype=dtype, generator=g) for _ in range(2))
    rope = rope_tables(L, D, device, dtype)
    cos1, sin1 = rope[0][-1:], rope[1][-1:]
    kr = apply_rope(k, *rope)
    runners = {
        "tapa_kernel": lambda: tapa.tapa_attention_triton(q, k, v),
        "sdpa_flash_rope": lambda: sdpa_flash(apply_rope(q, cos1, sin1), kr, v, causal=False),
    }
    with torch.no_grad():
        medians, _ = time_interleaved(runners, device, repeats, warmup)
        mems = {n: peak_memory(fn, device) for n, fn in runners.items()}
    rows = {n: {"median_ms": t * 1e3, "tokens_per_s": B / t, "peak_mem_bytes": mems[n]} for n, t in medians.items()}
    return {"B": B, "H": H, "Hkv": H // group, "L": L, "D": D, "mode": "decode", "results": rows,
            "ratios": {"kernel_over_sdpa": medians["tapa_kernel"] / medians["sdpa_flash_rope"]}}


# --------------------------------------------------------------------------------------------------
# TAPE (paper eq. 6–7): fused kernel vs SDPA fold vs eager reference vs RoPE + SDPA flash
# --------------------------------------------------------------------------------------------------

TAPE_CANDIDATES = ("rope", "fused", "sdpa_fold", "reference")
TAPE_TARGET_RATIO = 1.3  # fused TAPE within 1.3× of RoPE attention


@dataclass(frozen=True)
class TapeBenchShape:
    """Shapes and scope of one TAPE benchmark. scope "layer" times the q/k rotation plus the attention core
    (needs e_dim == head_dim: q/k are rotated by E), "op" the attention core alone on pre-rotated q/k."""

    batch: int = 1
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    e_dim: int = 128
    scope: str = "layer"
    reference_max: int = 4096  # longest length for the eager reference (it materialises L×L in fp32)

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (complex pairs)")
        if self.scope not in ("layer", "op"):
            raise ValueError(f"scope must be 'layer' or 'op', got {self.scope!r}")
        if self.scope == "layer" and self.e_dim != self.head_dim:
            raise ValueError("scope 'layer' rotates q/k by E, which needs e_dim == head_dim (De = 2F, F = D/2)")


def tape_rotate(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Multiply each frequency pair of x [B, H, L, D] by the complex positional state e [B, Hkv, L, D]
    (re = e[..., :F], im = e[..., F:]), broadcast over the query heads of a GQA group (eq. 6, φ = id)."""
    b, h, length, d = x.shape
    hkv = e.shape[1]
    xs = x.view(b, hkv, h // hkv, length, d)
    f = d // 2
    re, im = e[..., :f].unsqueeze(2), e[..., f:].unsqueeze(2)
    x1, x2 = xs[..., :f], xs[..., f:]
    out = torch.cat([x1 * re - x2 * im, x1 * im + x2 * re], dim=-1)
    return out.view(b, h, length, d)


def build_tape_cases(shape: TapeBenchShape, length: int, device: torch.device, dtype: torch.dtype, backward: bool,
                     candidates=TAPE_CANDIDATES) -> dict[str, Callable[[], None]]:
    """{candidate: callable} running forward (and backward when asked) on fresh tensors of this length; the
    eager reference only up to shape.reference_max."""
    from ..kernels import tape

    B, H, Hkv, D, De = shape.batch, shape.heads, shape.kv_heads, shape.head_dim, shape.e_dim
    gen = dict(device=device, dtype=dtype, requires_grad=backward)
    q = torch.randn(B, H, length, D, **gen)
    k, v = (torch.randn(B, Hkv, length, D, **gen) for _ in range(2))
    cos32, sin32 = rope_tables(length, D, device, torch.float32, theta=10_000.0)
    cos, sin = cos32.to(dtype), sin32.to(dtype)
    # positional state: RoPE-initialised (Appendix B) and perturbed per head, as after a TAPE update
    if De == D:
        e0 = torch.cat([cos32[:, : D // 2], sin32[:, : D // 2]], -1).expand(B, Hkv, length, De)
    else:  # scope "op" with a free positional width: no rotation, any state will do
        e0 = torch.zeros(B, Hkv, length, De, device=device)
    e = (e0 + 0.1 * torch.randn(B, Hkv, length, De, device=device)).to(dtype).requires_grad_(backward)
    go = torch.randn(B, H, length, D, device=device, dtype=dtype)
    ge = torch.randn(B, H, length, De, device=device, dtype=dtype)
    layer = shape.scope == "layer"

    def rope():
        qq, kk = (apply_rope(q, cos, sin), apply_rope(k, cos, sin)) if layer else (q, k)
        o = sdpa_flash(qq, kk, v, causal=True)
        if backward:
            torch.autograd.backward([o], [go])

    def run_tape(name: str) -> Callable[[], None]:
        def run():
            fn = getattr(tape, name)  # looked up per call, so a patched kernel is the one timed
            qq, kk = (tape_rotate(q, e), tape_rotate(k, e)) if layer else (q, k)
            o, eo = fn(qq, kk, v, e, causal=True)
            if backward:
                torch.autograd.backward([o, eo], [go, ge])
        return run

    every = {"rope": rope, "fused": run_tape("tape_attention_triton"), "sdpa_fold": run_tape("tape_attention_sdpa"),
             "reference": run_tape("tape_attention_reference")}
    unknown = set(candidates) - set(every)
    if unknown:
        raise ValueError(f"unknown TAPE benchmark candidates {sorted(unknown)}; pick from {TAPE_CANDIDATES}")
    cases = {n: every[n] for n in candidates}
    if length > shape.reference_max:
        cases.pop("reference", None)
    return cases


def bench_tape_length(shape: TapeBenchShape, length: int, device: torch.device, dtype: torch.dtype, repeats: int,
                      modes=MODES, warmup: int = 3, candidates=TAPE_CANDIDATES) -> dict:
    """One length, causal Lq = Lk: per mode {candidate: median_ms, ratio_vs_rope, tflops, peak_mem_bytes}
    and whether fused meets the 1.3× target. Out-of-memory is recorded in the row as {"error": ...}."""
    row: dict = {"length": length}
    for mode in modes:
        backward = mode == "fwd_bwd"
        cases = build_tape_cases(shape, length, device, dtype, backward, candidates)
        grad_ctx = torch.enable_grad() if backward else torch.inference_mode()
        try:
            with grad_ctx:
                medians, _ = time_interleaved(cases, device, repeats, warmup=warmup)
                mems = {n: peak_memory(fn, device) for n, fn in cases.items()}
        except torch.cuda.OutOfMemoryError as exc:  # recorded in the JSON, not hidden
            row[mode] = {"error": f"out of memory: {exc}".splitlines()[0]}
            continue
        finally:
            del cases
            if device.type == "cuda":
                torch.cuda.empty_cache()
        base = medians.get("rope")
        entry: dict = {}
        for name, t in medians.items():
            width = shape.head_dim if name == "rope" else shape.head_dim + shape.e_dim  # P·V (and P·E)
            flops = causal_flops(shape.batch, shape.heads, length, shape.head_dim, mode, value_dim=width)
            entry[name] = {"median_ms": t * 1e3, "ratio_vs_rope": None if base is None else t / base,
                           "tflops": flops / t / 1e12, "peak_mem_bytes": mems[name]}
        if base is not None and "fused" in medians:
            entry["fused_meets_target"] = medians["fused"] / base <= TAPE_TARGET_RATIO
        row[mode] = entry
    return row
