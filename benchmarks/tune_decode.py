"""Measured decode tuning on a GPU (the counterpart of the static tune_tiles.py, whose instruction counts do not
see memory latency, which is what a decode kernel waits on).

For TAPA's and TAPE's decode (one query per sequence against a KV cache; split-K over the keys), every candidate
tile (BLOCK_N, num_warps, num_stages; BLOCK_M is the 16-row GQA tile) and split-K density (programs per SM,
`_triton.layout.DECODE_PROGRAMS_PER_SM`) is timed as CUDA-graph replays of the whole op (its kernels only: the host
planning is captured once), at several cache lengths, and its output checked against the current table's. The
ranking is the geometric mean of the times over the lengths, per family and row width.

Writes benchmarks/results/tune_decode-<device>.json.
Usage: python benchmarks/tune_decode.py [--lengths 1024 4096 16384] [--batch 8]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import write_results  # noqa: E402
from hf_posenc.kernels._triton import layout as _layout  # noqa: E402
from hf_posenc.kernels.tapa import decode as tapa_decode  # noqa: E402
from hf_posenc.kernels.tapa import tapa_attention_triton  # noqa: E402
from hf_posenc.kernels.tape import decode as tape_decode  # noqa: E402
from hf_posenc.kernels.tape import tape_attention_triton  # noqa: E402

TILES = [(16, n, w, s) for n in (64, 128) for w, s in ((4, 1), (4, 2), (4, 3), (8, 2))]
DENSITY = (2, 4, 8)
# (family, head dim, table module, width bucket): TAPA's row width is pow2(D) at θ = 0.5; TAPE's is D + De
CASES = [("tapa", 64, tapa_decode, 64), ("tapa", 128, tapa_decode, 128),
         ("tape", 64, tape_decode, 128), ("tape", 128, tape_decode, 256)]


def graph_ms(fn, replays: int = 100) -> float:
    """Mean time of `replays` back-to-back CUDA-graph replays of fn (its kernels only), timed by one event pair."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    a = ap.parse_args()
    device = torch.device("cuda")
    arch = "sm90" if torch.cuda.get_device_capability()[0] >= 9 else "sm80"
    rows = []
    best = {}
    for family, d, module, width in CASES:
        current = module._TILES[arch][width]
        dens0 = _layout.DECODE_PROGRAMS_PER_SM
        times: dict[tuple, list[float]] = {}
        for length in a.lengths:
            g = torch.Generator(device=device).manual_seed(length + d)
            q = torch.randn(a.batch, a.heads, 1, d, device=device, dtype=torch.bfloat16, generator=g)
            k, v, e = (torch.randn(a.batch, a.kv_heads, length, d, device=device, dtype=torch.bfloat16, generator=g)
                       for _ in range(3))
            fn = (lambda: tapa_attention_triton(q, k, v)) if family == "tapa" else \
                (lambda: tape_attention_triton(q, k, v, e))
            module._TILES[arch][width], _layout.DECODE_PROGRAMS_PER_SM = current, dens0
            ref = fn()
            ref = torch.cat([t.float().flatten() for t in (ref if isinstance(ref, tuple) else (ref,))])
            for tile, dens in itertools.product(TILES, DENSITY):
                module._TILES[arch][width], _layout.DECODE_PROGRAMS_PER_SM = tile, dens
                try:
                    out = fn()
                    out = torch.cat([t.float().flatten() for t in (out if isinstance(out, tuple) else (out,))])
                    err = (out - ref).abs().max().item()
                    ms = graph_ms(fn)
                except Exception as exc:  # a candidate that does not compile or fit is recorded, not fatal
                    rows.append(dict(family=family, head_dim=d, length=length, tile=tile, density=dens,
                                     error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                    continue
                rows.append(dict(family=family, head_dim=d, length=length, tile=tile, density=dens, ms=ms,
                                 max_abs_diff=err, current=(tile == current and dens == dens0)))
                if err < 3e-2:
                    times.setdefault((tile, dens), []).append(ms)
        module._TILES[arch][width], _layout.DECODE_PROGRAMS_PER_SM = current, dens0
        full = {c: math.exp(sum(map(math.log, t)) / len(t)) for c, t in times.items() if len(t) == len(a.lengths)}
        ranked = sorted(full.items(), key=lambda kv: kv[1])
        cur = full.get((current, dens0))
        best[f"{family}-d{d}"] = dict(current=dict(tile=current, density=dens0, geomean_ms=cur),
                                      ranking=[dict(tile=c[0], density=c[1], geomean_ms=t,
                                                    speedup=(cur / t if cur else None)) for c, t in ranked[:6]])
        print(f"{family} D={d}: current {current} x{dens0}: {cur:.4f} ms; best " +
              "; ".join(f"{c[0]} x{c[1]}: {t:.4f} ms" for c, t in ranked[:4]), flush=True)
    path = write_results("tune_decode", device, {
        "note": "GPU measurement: CUDA-graph replays of the whole decode op (kernels only), bf16, mean of 100",
        "shape": dict(batch=a.batch, heads=a.heads, kv_heads=a.kv_heads, lengths=a.lengths),
        "best": best, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
