"""TAPE attention (eq. 6–7) vs RoPE attention: forward and forward+backward time, side by side in one run.

Variants, all at the same shapes (bf16 on GPU):
  rope       RoPE rotation + SDPA with the flash backend (the baseline the fused kernel must stay close to)
  fused      TAPE rotation by the positional state + the fused Triton kernel (O = P·V and Ẽ = P·E in one pass)
  sdpa_fold  TAPE rotation + one SDPA call over [V | E] (unfused; value width D + De rules out flash)
  reference  TAPE rotation + the eager reference (materialises P; only up to --reference-max)

`--scope layer` (default) times the positional part of an attention layer: the q/k rotation plus the
attention core (projections are identical for both methods and left out). `--scope op` times the
attention core alone on pre-rotated q/k. Reports medians (round-robin timing) and ratios to rope; the
target is fused <= 1.3x rope. Writes benchmarks/results/tape_attention-<device>.json.

Usage: python benchmarks/tape_attention.py [--lengths 1024,2048,4096,8192,16384] [--repeats 10]
       python benchmarks/tape_attention.py --smoke     # tiny CPU case through the same code (interpreter)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).parent))

TARGET_RATIO = 1.3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated sequence lengths, queries = keys, causal (default 1024,...,16384; "
                             "48 with --smoke)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=8, help="key/value (and positional state) heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--e-dim", type=int, default=None,
                        help="positional channels De = 2F (default: head dim, one complex number per frequency)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--scope", choices=("layer", "op"), default="layer")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--reference-max", type=int, default=4096,
                        help="longest length for the eager reference (it materialises the L×L map in fp32)")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny fp32 CPU case through the same code (Triton interpreter), writes the JSON")
    args = parser.parse_args()
    if args.smoke:
        args.device = "cpu"
        args.lengths = args.lengths or "48"
        args.batch, args.heads, args.kv_heads, args.head_dim = 1, 2, 1, 16
        args.dtype, args.repeats, args.reference_max = "fp32", 2, 48
    args.lengths = args.lengths or "1024,2048,4096,8192,16384"
    args.e_dim = args.e_dim or args.head_dim
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError as exc:
        raise SystemExit(f"--lengths must be comma-separated integers, e.g. 1024,4096: {exc}")
    if not args.lengths or min(args.lengths) <= 0:
        raise SystemExit("--lengths needs at least one positive length")
    if args.heads % args.kv_heads:
        raise SystemExit(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    if args.scope == "layer" and args.e_dim != args.head_dim:
        raise SystemExit("--scope layer rotates q/k by E, which needs --e-dim == --head-dim (De = 2F, F = D/2)")
    if args.head_dim % 2:
        raise SystemExit("--head-dim must be even (complex pairs)")
    if torch.device(args.device).type != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
    return args


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the rotate_half layout: x·cos + rotate_half(x)·sin with cos/sin [L, D]."""
    return x * cos + rotate_half(x) * sin


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


def build_cases(args, length: int, device: torch.device, dtype: torch.dtype, backward: bool):
    """Return {variant: callable} running forward (and backward when asked) on fresh tensors of this length."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hf_posenc.kernels.tape import tape_attention_reference, tape_attention_sdpa, tape_attention_triton

    B, H, Hkv, D, De = args.batch, args.heads, args.kv_heads, args.head_dim, args.e_dim
    gen = dict(device=device, dtype=dtype, requires_grad=backward)
    q = torch.randn(B, H, length, D, **gen)
    k = torch.randn(B, Hkv, length, D, **gen)
    v = torch.randn(B, Hkv, length, D, **gen)
    angle = torch.arange(length, device=device, dtype=torch.float32)[:, None] * (
        10000.0 ** (-torch.arange(D // 2, device=device, dtype=torch.float32) / (D // 2)))
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(dtype)
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(dtype)
    # positional state: RoPE-initialised (Appendix B) and perturbed per head, as after a TAPE update
    if De == D:
        e0 = torch.cat([angle.cos(), angle.sin()], -1).expand(B, Hkv, length, De)
    else:  # --scope op with a free positional width: no rotation, any state will do
        e0 = torch.zeros(B, Hkv, length, De, device=device)
    e = (e0 + 0.1 * torch.randn(B, Hkv, length, De, device=device)).to(dtype).requires_grad_(backward)
    go = torch.randn(B, H, length, D, device=device, dtype=dtype)
    ge = torch.randn(B, H, length, De, device=device, dtype=dtype)
    layer = args.scope == "layer"
    flash = device.type == "cuda"

    def rope():
        qq, kk = (rope_rotate(q, cos, sin), rope_rotate(k, cos, sin)) if layer else (q, k)
        if flash:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qq, kk, v, is_causal=True, enable_gqa=H != Hkv)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, v, is_causal=True, enable_gqa=H != Hkv)
        if backward:
            torch.autograd.backward([o], [go])

    def tape(fn: Callable):
        def run():
            qq, kk = (tape_rotate(q, e), tape_rotate(k, e)) if layer else (q, k)
            o, eo = fn(qq, kk, v, e, causal=True)
            if backward:
                torch.autograd.backward([o, eo], [go, ge])
        return run

    cases = {"rope": rope, "fused": tape(tape_attention_triton), "sdpa_fold": tape(tape_attention_sdpa)}
    if length <= args.reference_max:
        cases["reference"] = tape(tape_attention_reference)
    return cases


def bench_length(args, length: int, device: torch.device, dtype: torch.dtype) -> dict:
    from common import time_interleaved

    row: dict = {"length": length}
    modes = ["forward"] + ([] if args.no_backward else ["forward_backward"])
    for mode in modes:
        cases = build_cases(args, length, device, dtype, backward=mode == "forward_backward")
        grad_ctx = torch.enable_grad() if mode == "forward_backward" else torch.inference_mode()
        try:
            with grad_ctx:
                medians, _ = time_interleaved(cases, device, args.repeats, warmup=1 if args.smoke else 3)
        except torch.cuda.OutOfMemoryError as exc:  # recorded in the JSON, not hidden
            row[mode] = {"error": f"out of memory: {exc}".splitlines()[0]}
            torch.cuda.empty_cache()
            continue
        base = medians["rope"]
        entry = {name: {"median_ms": t * 1e3, "ratio_vs_rope": t / base} for name, t in medians.items()}
        entry["fused_meets_target"] = medians["fused"] / base <= TARGET_RATIO
        row[mode] = entry
        print(f"L={length:>6} {mode:<17} " + "  ".join(
            f"{n} {r['median_ms']:8.3f} ms ({r['ratio_vs_rope']:.2f}x)" for n, r in entry.items() if isinstance(r, dict)))
        del cases
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def main() -> None:
    args = parse_args()
    from common import write_results

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    if device.type != "cuda" and dtype == torch.bfloat16:
        raise SystemExit("bf16 needs a GPU (the Triton interpreter has no bf16); use --dtype fp32 or --smoke")
    torch.manual_seed(0)
    rows = [bench_length(args, n, device, dtype) for n in args.lengths]
    payload = {
        "benchmark": "tape_attention",
        "smoke": args.smoke,
        "scope": args.scope,
        "dtype": args.dtype,
        "shape": {"batch": args.batch, "q_heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                  "e_dim": args.e_dim, "causal": True},
        "repeats": args.repeats,
        "statistic": "median over round-robin repeats",
        "baseline": "rope: SDPA " + ("flash backend" if device.type == "cuda" else "default CPU backend (smoke)"),
        "target_ratio_fused_vs_rope": TARGET_RATIO,
        "triton_interpreter": os.environ.get("TRITON_INTERPRET", "0") == "1",
        "results": rows,
    }
    path = write_results("tape_attention", device, payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
