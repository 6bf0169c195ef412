"""TAPA attention (paper eq. 12): fused Triton kernel vs the eager TAPA reference vs RoPE attention
through SDPA's flash backend.

For each head dim and length: forward and forward+backward, causal, bf16 — median time, TFLOP/s
(causal FLOPs = standard attention's halved: 2·B·H·L²·D forward, ×3.5 for forward+backward), peak
memory. Then decode (one query against an L-token cache): tokens/s of the kernel vs SDPA. Ratios
kernel/SDPA (time) and eager/kernel (time). Results go to benchmarks/results/tapa_attention-<device>.json.

Usage:
  python benchmarks/tapa_attention.py [--lengths 1024 2048 ... 32768] [--head-dims 64 128]
  python benchmarks/tapa_attention.py --smoke   # CPU, Triton interpreter, tiny fp32 case, same code paths
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable

import torch

if "--smoke" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the kernel import

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, device_name, slug, sync, time_interleaved  # noqa: E402

from hf_posenc.kernels.tapa import tapa_attention_reference, tapa_attention_triton  # noqa: E402

FWD_BWD_FACTOR = 3.5  # backward ≈ 2.5× forward FLOPs, as in the FlashAttention papers


def causal_flops(B: int, H: int, L: int, D: int, mode: str) -> float:
    """Standard attention FLOPs (QKᵀ and PV, 2 flops per MAC) halved for the causal mask."""
    fwd = 4.0 * B * H * L * L * D / 2
    return fwd if mode == "fwd" else fwd * FWD_BWD_FACTOR


def rope_tables(L: int, D: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500_000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    ang = torch.arange(L, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def sdpa_flash(q, k, v, causal: bool) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def make_runner(kind: str, mode: str, q, k, v, rope) -> Callable[[], object]:
    """A closure running one candidate once (forward only, or forward + backward)."""
    cos, sin = rope

    def forward():
        if kind == "tapa_kernel":
            return tapa_attention_triton(q, k, v)
        if kind == "tapa_eager":
            return tapa_attention_reference(q, k, v)
        return sdpa_flash(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=q.shape[2] > 1)

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
    """The eager reference materialises several fp32 [B, H, L, L] tensors; skip when they cannot fit."""
    need = B * H * L * L * 4 * (8 if mode == "fwd" else 16)
    if device.type != "cuda":
        return True, ""
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.8 * free:
        return False, f"needs ~{need / 2**30:.1f} GiB of [B,H,L,L] fp32 temporaries, {free / 2**30:.1f} GiB free"
    return True, ""


def peak_memory(fn: Callable[[], object], device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def bench_prefill(B, H, L, D, mode, dtype, device, repeats, group=1) -> dict:
    g = torch.Generator(device=device).manual_seed(L + D)
    grad = mode == "fwd_bwd"
    q = torch.randn(B, H, L, D, device=device, dtype=dtype, generator=g).requires_grad_(grad)
    k, v = (torch.randn(B, H // group, L, D, device=device, dtype=dtype, generator=g).requires_grad_(grad)
            for _ in range(2))
    rope = rope_tables(L, D, device, dtype)
    kinds = ["tapa_kernel", "sdpa_flash_rope", "tapa_eager"]
    skipped = {}
    ok, why = eager_fits(B, H, L, mode, device)
    if not ok:
        kinds.remove("tapa_eager")
        skipped["tapa_eager"] = why
    runners = {kname: make_runner(kname, mode, q, k, v, rope) for kname in kinds}
    medians, _ = time_interleaved(runners, device, repeats)
    flops = causal_flops(B, H, L, D, "fwd" if mode == "fwd" else "fwd_bwd")
    rows = {}
    for kname, t in medians.items():
        rows[kname] = {
            "median_ms": t * 1e3,
            "tflops": flops / t / 1e12,
            "peak_mem_bytes": peak_memory(runners[kname], device),
        }
    for kname, why in skipped.items():
        rows[kname] = {"skipped": why}
    kt = medians["tapa_kernel"]
    ratios = {"kernel_over_sdpa": kt / medians["sdpa_flash_rope"]}
    if "tapa_eager" in medians:
        ratios["eager_over_kernel"] = medians["tapa_eager"] / kt
    return {"B": B, "H": H, "Hkv": H // group, "L": L, "D": D, "mode": mode, "results": rows, "ratios": ratios}


def bench_decode(B, H, L, D, dtype, device, repeats, group=1) -> dict:
    g = torch.Generator(device=device).manual_seed(7 * L + D)
    q = torch.randn(B, H, 1, D, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, H // group, L, D, device=device, dtype=dtype, generator=g) for _ in range(2))
    rope = rope_tables(L, D, device, dtype)
    cos1, sin1 = rope[0][-1:], rope[1][-1:]
    kr = apply_rope(k, *rope)  # a RoPE cache stores rotated keys; only the new query is rotated per step
    runners = {
        "tapa_kernel": lambda: tapa_attention_triton(q, k, v),
        "sdpa_flash_rope": lambda: sdpa_flash(apply_rope(q, cos1, sin1), kr, v, causal=False),
    }
    with torch.no_grad():
        medians, _ = time_interleaved(runners, device, repeats)
    rows = {n: {"median_ms": t * 1e3, "tokens_per_s": B / t} for n, t in medians.items()}
    return {"B": B, "H": H, "Hkv": H // group, "L": L, "D": D, "mode": "decode", "results": rows,
            "ratios": {"kernel_over_sdpa": medians["tapa_kernel"] / medians["sdpa_flash_rope"]}}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tokens", type=int, default=16384, help="batch = max(1, tokens // length) for prefill")
    ap.add_argument("--model-dim", type=int, default=2048, help="heads = model_dim // head_dim")
    ap.add_argument("--group", type=int, default=1, help="query heads per kv head (GQA); heads must divide")
    ap.add_argument("--decode-batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny fp32 case on CPU under the Triton interpreter")
    ap.add_argument("--out", type=Path, default=None, help="output JSON (default benchmarks/results/...)")
    a = ap.parse_args(argv)

    if a.smoke:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter has no bf16
        lengths, head_dims, tokens, model_dim, repeats, dec_b = [64], [32], 64, 128, 1, 2
    else:
        if not torch.cuda.is_available():
            raise SystemExit("this benchmark needs a CUDA GPU; use --smoke for a CPU dry run")
        device, dtype = torch.device("cuda"), torch.bfloat16
        lengths, head_dims, tokens, model_dim, repeats, dec_b = (
            a.lengths, a.head_dims, a.tokens, a.model_dim, a.repeats, a.decode_batch)

    records = []
    for D in head_dims:
        H = max(1, model_dim // D)
        if H % a.group:
            raise SystemExit(f"--group {a.group} must divide the head count {H}")
        for L in lengths:
            B = max(1, tokens // L)
            for mode in ("fwd", "fwd_bwd"):
                rec = bench_prefill(B, H, L, D, mode, dtype, device, repeats, a.group)
                records.append(rec)
                r = rec["results"]
                eager = r["tapa_eager"].get("median_ms", float("nan"))
                print(f"D={D:4d} L={L:6d} B={B:3d} {mode:8s} kernel {r['tapa_kernel']['median_ms']:9.3f} ms "
                      f"({r['tapa_kernel']['tflops']:6.1f} TF/s)  sdpa+rope {r['sdpa_flash_rope']['median_ms']:9.3f} ms  "
                      f"eager {eager:9.3f} ms  kernel/sdpa {rec['ratios']['kernel_over_sdpa']:.2f}", flush=True)
            rec = bench_decode(dec_b, H, L, D, dtype, device, repeats, a.group)
            records.append(rec)
            r = rec["results"]
            print(f"D={D:4d} L={L:6d} B={dec_b:3d} decode   kernel {r['tapa_kernel']['tokens_per_s']:10.0f} tok/s  "
                  f"sdpa {r['sdpa_flash_rope']['tokens_per_s']:10.0f} tok/s", flush=True)

    name = device_name(device)
    payload = {
        "device": name,
        "torch": torch.__version__,
        "dtype": str(dtype).replace("torch.", ""),
        "smoke": a.smoke,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
        "flop_convention": "causal = standard attention FLOPs / 2; fwd_bwd = 3.5 x fwd",
        "records": records,
    }
    out = a.out or RESULTS / f"tapa_attention-{slug(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
