"""Static tile tuning: how the GPU tile tables in triton_tapa.py / triton_tape.py (and the decode tables in each
op's decode.py) were chosen, without a GPU.

For each kernel (forward, decode, dK/dV, dQ) of a family, architecture and head dim, every candidate
(BLOCK_M, BLOCK_N, num_warps, num_stages) is planned through the family's own `lane_specs` (its `tiles` table, or
for decode its `decode.tile`, patched to the candidate) and compiled for that architecture; the winner is the candidate with no register
spills (required at head dim <= 128) and shared memory within the limit that issues the fewest instructions
per score element in its steady-state loop (benchmarks/kernels_static.py's count; `--rank bound`: the lowest
pipe-model bound in SM clocks per score element, which also sees which pipe binds, ties to more pipeline stages, then
fewer instructions: how TAPE's fused backward tiles were chosen). A static proxy for speed:
it does not see memory stalls or occupancy, which a run on the GPU (`hf-posenc selftest`) measures.

Usage: python benchmarks/tune_tiles.py --family tapa --arch 90 --head-dim 128 [--kernel dkdv dq] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

CANDIDATES = {
    "fwd": [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (128, 32, 8, 2), (64, 32, 4, 2),
            (64, 64, 8, 2), (128, 128, 8, 2)],
    "decode": [(16, 64, 4, 2), (16, 64, 4, 1), (16, 128, 4, 2), (16, 128, 8, 2), (16, 32, 4, 2)],
    "bwd": [(16, 64, 4, 1), (16, 64, 8, 1), (32, 64, 4, 1), (32, 64, 8, 1), (16, 128, 8, 1), (32, 128, 8, 1),
            (32, 32, 4, 1), (32, 32, 4, 2), (64, 64, 8, 1), (64, 32, 8, 1), (16, 32, 4, 1), (16, 64, 4, 2),
            (32, 64, 4, 2), (32, 64, 8, 2), (64, 64, 8, 2), (64, 64, 4, 1)],
    "dkdv": [(16, 64, 4, 1), (16, 64, 4, 2), (32, 64, 4, 1), (32, 64, 4, 2), (16, 128, 8, 1), (32, 128, 8, 1),
             (32, 32, 4, 2), (64, 64, 4, 1), (64, 32, 8, 1), (16, 32, 4, 1)],
    "dq": [(64, 32, 4, 1), (64, 32, 4, 2), (128, 32, 8, 1), (128, 32, 8, 2), (64, 64, 4, 1), (64, 64, 4, 2),
           (128, 64, 8, 1), (32, 16, 4, 1)],
}
CANDIDATES["dkdq"] = CANDIDATES["dvde"] = [(32, 64, 4, 1), (32, 64, 4, 2), (64, 64, 4, 1), (64, 64, 4, 2),
                                          (32, 64, 8, 2), (64, 64, 8, 2), (32, 128, 8, 1), (64, 128, 8, 1),
                                          (64, 128, 8, 2), (16, 128, 8, 2), (128, 64, 8, 2), (128, 128, 8, 1)]
PAIRED = {"dkdq": ("dvde",), "dvde": ("dkdq",)}  # TAPE's fused backward: two key-side launches
LAUNCH = {"fwd": "{f}_fwd", "decode": "{f}_decode", "bwd": "{f}_bwd", "dkdv": "{f}_bwd_dkdv", "dq": "{f}_bwd_dq",
          "dkdq": "{f}_bwd_dkdq", "dvde": "{f}_bwd_dvde"}


def evaluate(family: str, kernel: str, arch: int, head_dim: int, tile: tuple[int, int, int, int],
             theta: float = 0.5, linear: bool = False) -> dict:
    """Compile one candidate (TAPA: at amplitude fraction θ, quadratic or linear phase); returns its registers,
    spills, shared memory and steady-state count."""
    import importlib

    import torch

    import kernels_static
    from hf_posenc.kernels._triton.launch import SHARED_LIMIT, Target
    from hf_posenc.kernels._triton.layout import Tile
    from hf_posenc.kernels.dev.binaries import compile_spec, resources, sass

    mod = importlib.import_module(f"hf_posenc.kernels.{family}.triton_{family}")
    if kernel == "decode":  # every width bucket
        importlib.import_module(f"hf_posenc.kernels.{family}.decode").tile = lambda target, *dims: Tile(*tile)
    else:
        table = mod.tiles
        pair = PAIRED.get(kernel, ())  # a kernel planned only beside another: that one takes the candidate too
        mod.tiles = lambda target, *dims: {**{k: Tile(*tile) for k in pair}, **table(target, *dims),
                                           kernel: Tile(*tile)}
    name = LAUNCH[kernel].format(f=family)
    out = dict(family=family, kernel=kernel, arch=arch, head_dim=head_dim, tile=tile, theta=theta, linear=linear)
    spec = next((s for s in mod.lane_specs(Target.gpu(arch), torch.bfloat16, head_dim)
                 if s.name == name and s.constexprs.get("LINEAR", False) == linear
                 and s.constexprs.get("DA", int(head_dim * theta)) == int(head_dim * theta)), None)
    if spec is None:
        return dict(out, error=f"{family} plans no {name} launch")
    try:
        compiled = compile_spec(spec, arch)
    except Exception as exc:  # a candidate the compiler refuses is a result, not a crash
        return dict(out, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    res = resources(compiled)

    class _Rec:  # what kernels_static.analyse reads
        constexprs, num_warps = spec.constexprs, spec.num_warps

    loops = kernels_static.analyse(_Rec, sass(compiled))
    steady = loops.get("steady_state_loop", {})
    far = steady.get("pipe_model", {}).get("far_tile_path", {})
    return dict(out, registers=res.registers, spills=res.spills, shared=res.shared,
                fits=res.shared <= SHARED_LIMIT[arch], per_element=steady.get("per_element_total"),
                bound=far.get("bound"), binding=far.get("binding"))


def _evaluate(args: tuple) -> dict:
    return evaluate(*args)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["tapa", "tape"], required=True)
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--kernel", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--theta", type=float, default=0.5, help="TAPA amplitude fraction (a planned one: 0.5, 0.25)")
    ap.add_argument("--linear", action="store_true", help="TAPA linear phase (eq. 16)")
    ap.add_argument("--rank", choices=["instructions", "bound"], default="instructions",
                    help="winner by issued instructions per score element (how the committed tables were chosen) or "
                         "by the pipe model's lower bound in SM clocks per score element (kernels_static)")
    a = ap.parse_args(argv)
    key = "per_element" if a.rank == "instructions" else "bound"
    jobs = [(a.family, k, arch, d, t, a.theta, a.linear) for d in a.head_dim for arch in a.arch for k in a.kernel
            for t in CANDIDATES[k]]
    with ProcessPoolExecutor(a.jobs) as pool:
        results = list(pool.map(_evaluate, jobs))
    for r in results:
        print(r, flush=True)
    for d in a.head_dim:
        for arch in a.arch:
            for k in a.kernel:
                cell = [r for r in results if r["head_dim"] == d and r["arch"] == arch and r["kernel"] == k
                        and "error" not in r and r["fits"] and r[key] is not None
                        and (r["spills"] == 0 or d > 128)]
                # --rank bound: ties (a bound is a sum of whole instructions' costs: ties are common) go to more
                # pipeline stages (latency the bound does not see), then to fewer issued instructions
                rank = (lambda r: (r["spills"] > 0, r["per_element"])) if a.rank == "instructions" else (
                    lambda r: (r["spills"] > 0, r["bound"], -r["tile"][3], r["per_element"]))
                best = min(cell, key=rank, default=None)
                print(f"best {a.family} {k} sm_{arch} D={d} by {a.rank}: {best['tile'] if best else 'none'} "
                      f"{best[key] if best else ''}")
    return results


if __name__ == "__main__":
    main()
