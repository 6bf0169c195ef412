"""TAPE attention (eq. 6–7) vs RoPE attention: forward and forward+backward time, side by side in one run.

Variants, all at the same shapes (bf16 on GPU):
  rope       RoPE rotation + SDPA with the flash backend (the baseline the fused kernel must stay close to)
  fused      TAPE rotation by the positional state + the fused Triton kernel (O = P·V and Ẽ = P·E in one pass)
  deterministic  the same kernel with the two-kernel (bitwise reproducible) backward (fwd_bwd only)
  sdpa_fold  TAPE rotation + one SDPA call over [V | E] (unfused; value width D + De rules out flash)
  reference  TAPE rotation + the eager reference (materialises P; only up to --reference-max)

`--scope layer` (default) times the positional part of an attention layer: the q/k rotation plus the
attention core (projections are identical for both methods and left out). `--scope op` times the
attention core alone on pre-rotated q/k. Reports medians (round-robin timing), TFLOP/s, peak CUDA memory
and ratios to rope; the target is fused <= 1.3x rope. Writes benchmarks/results/tape_attention-<device>.json.
The measuring code is `hf_posenc.kernels.tape.selftest` (on `hf_posenc.kernels.timing`), shared with `hf-posenc selftest`.

Usage: python benchmarks/tape_attention.py [--lengths 1024,2048,4096,8192,16384] [--repeats 10]
       python benchmarks/tape_attention.py --smoke     # tiny CPU case through the same code (interpreter)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

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
    if torch.device(args.device).type != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (hf_posenc does)
    return args


def main() -> None:
    args = parse_args()
    from common import write_results

    from hf_posenc.kernels.tape.selftest import MODES, TAPE_TARGET_RATIO, TapeBenchShape, bench_tape_length

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    if device.type != "cuda" and dtype == torch.bfloat16:
        raise SystemExit("bf16 needs a GPU (the Triton interpreter has no bf16); use --dtype fp32 or --smoke")
    try:
        shape = TapeBenchShape(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                               e_dim=args.e_dim, scope=args.scope, reference_max=args.reference_max)
    except ValueError as exc:
        raise SystemExit(f"bad shape options: {exc}")
    modes = ("fwd",) if args.no_backward else MODES
    torch.manual_seed(0)
    rows = []
    for n in args.lengths:
        row = bench_tape_length(shape, n, device, dtype, args.repeats, modes=modes, warmup=1 if args.smoke else 3)
        rows.append(row)
        for mode in modes:
            entry = row[mode]
            print(f"L={n:>6} {mode:<8} " + ("  ".join(
                f"{name} {r['median_ms']:8.3f} ms ({r['ratio_vs_rope']:.2f}x)"
                for name, r in entry.items() if isinstance(r, dict)) or entry.get("error", "")), flush=True)
    payload = {
        "benchmark": "tape_attention",
        "smoke": args.smoke,
        "scope": args.scope,
        "dtype": args.dtype,
        "shape": {"batch": args.batch, "q_heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                  "e_dim": args.e_dim, "causal": True},
        "repeats": args.repeats,
        "statistic": "median over round-robin repeats",
        "baseline": "rope: RoPE rotation + SDPA restricted to the flash backend"
                    + ("" if device.type == "cuda" else " (CPU implementation, smoke)"),
        "flop_convention": "causal matmul FLOPs (QK over D, PV over D, PE over De) / 2; fwd_bwd = 3.5 x fwd",
        "target_ratio_fused_vs_rope": TAPE_TARGET_RATIO,
        "triton_interpreter": os.environ.get("TRITON_INTERPRET", "0") == "1",
        "results": rows,
    }
    path = write_results("tape_attention", device, payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
