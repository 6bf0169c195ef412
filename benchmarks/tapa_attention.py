"""TAPA attention (paper eq. 12): fused Triton kernel vs the eager TAPA reference vs RoPE attention
through SDPA's flash backend.

For each head dim and length: forward and forward+backward, causal, bf16 — median time, TFLOP/s
(causal FLOPs = standard attention's halved: 2·B·H·L²·D forward, ×3.5 for forward+backward), peak
memory. Then decode (one query against an L-token cache): tokens/s of the kernel vs SDPA. Ratios
kernel/SDPA (time) and eager/kernel (time). Results go to benchmarks/results/tapa_attention-<device>.json.
The measuring code is `hf_posenc.kernels.tapa.selftest` (on `hf_posenc.kernels.timing`), shared with `hf-posenc selftest`.

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

import torch

if "--smoke" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (hf_posenc does)

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, device_name, slug  # noqa: E402

from hf_posenc.kernels.tapa.selftest import bench_decode, bench_prefill  # noqa: E402


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
