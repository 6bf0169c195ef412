"""Static kernel report: what the compiled GPU binaries of the TAPA / TAPE kernels spend per score element, and
which execution pipe bounds each of them.

No GPU runs here. Every kernel is planned by its own host code for an A100 (sm_80) or H100 (sm_90) target and
compiled with Triton's bundled ptxas (the compile lane, `hf_posenc.kernels.dev.compile_lane`); registers, spills and
shared memory come from `cuobjdump -res-usage`, the instruction mix from `nvdisasm` SASS:

* the inner loops are the SASS regions closed by a backward branch that contain no other loop; those with
  tensor-core instructions (HMMA / HGMMA) are the attention loops. Every path through a loop's tile-uniform
  forward branches is costed with the per-pipe issue model below. The steady state is the far-tile path, the
  one with the fewest special-function instructions (TAPA's `_dpow` binomial series, no lazy rescale: what tiles
  away from the diagonal run); the near-diagonal path (the exact lg2/ex2 distance power), the cheapest and the
  most expensive path are reported beside it. The cheapest is not always the far-tile path: in the TAPA
  backward, where issue binds, the series' extra FMAs make the exact path cheaper. The steady-state (unmasked)
  loop is the loop whose far-tile path is cheapest; the masked loop (causal diagonal, window edge, padding) is
  reported too;
* per score element = instructions on that path × threads per program / (BLOCK_M × BLOCK_N), split into
  special-function (MUFU), FMA/ALU (float and integer datapath), tensor core (HMMA/HGMMA) and other (memory,
  barriers, uniform-datapath address and descriptor arithmetic, control);
* per-pipe issue model (`Machine`, `pipe_of`, `pipe_bounds`): per SM per clock, tensor core FLOPs (each HGMMA /
  HMMA's FLOPs from its shape), the special-function/conversion pipe (XU: MUFU, F2F, F2I, I2F at 16 lanes; FRND
  on the ALU, as an H100 A/B says), FP32 FMA (128 lanes on sm_90, IMAD on its heavy half only), integer/logic
  ALU (64 lanes), instruction issue (4 warp-instructions = 128 lanes) and, for decode, HBM bytes of K/V per
  score element. Each gives a lower bound in SM clocks per score element; the largest binds. Rates and their
  sources are the constants below;
* a plain causal FlashAttention-2 forward built from the same pieces and tiles (benchmarks/flash_baseline.py)
  is the baseline: ratios are per score element against it;
* the model is checked against every measured row (benchmarks/results/selftest-timing-nvidia-*.json: medians
  converted to SM clocks per score element): it must rank the rows at 16k as the GPU did. Each JSON is checked
  with the binaries it measured: the package as committed with it (compiled from `git archive` in a subprocess),
  or the working tree where the JSON differs from that commit (then the committed JSON, with its binaries, gives
  the measured change against the modelled one); the current tree's bounds stand beside as a prediction. The
  decode kernels' measured times (benchmarks/results/tune_decode-*.json) are checked against their HBM bound.

Writes benchmarks/results/kernels-static-sm90.json and -sm80.json (bf16, head dims 64 / 128 / 256, both TAPA
phase modes; the pipe model under the key "pipe_model"). Takes a few minutes on 2 cores from an empty Triton
cache.

Usage: python benchmarks/kernels_static.py [--arch 90 80] [--head-dim 64 128 256] [--out-dir DIR] [--jobs N]
       [--measured-rev auto|none]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BASELINE = str(HERE / "flash_baseline.py")

_INS = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRA = re.compile(r"\bBRA(?:\.\w+)*\s+`\((\.L_x_\d+)\)")
TENSOR = {"HMMA", "HGMMA", "IMMA"}
NOT_ALU = {"FENCE"}
ALU_EXTRA = {"LOP3", "SEL", "SHF", "LEA", "VIADD", "PRMT", "MOV", "PLOP3", "P2R", "R2P", "SGXT", "BMSK", "POPC",
             "FLO", "BREV", "VIMNMX", "VIADDMNMX", "IMNMX"}


# ---------------------------------------------------------------------------------------------------------------
# Per-pipe issue model. Rates are per SM per clock; a "lane" is one thread's share of a warp instruction (a warp
# instruction is 32 lanes), so a pipe of L lanes/clk/SM retires L/32 warp instructions per clock per SM.
#
# Sources:
#  [peak]  H100 SXM5 dense BF16 989 TFLOP/s = 132 SMs x 1.83 GHz x 4096 FLOP/clk/SM (NVIDIA H100 datasheet; the
#          same decomposition in NVIDIA/cudnn-frontend PR #650's peak-MMA table). A100 SXM4 dense BF16 312 TFLOP/s
#          = 108 SMs x 1.41 GHz x 2048 FLOP/clk/SM (A100 datasheet).
#  [mma]   mma.sync (SASS HMMA) on Hopper: not in NVIDIA's tables. Assumed half the warpgroup (HGMMA) rate,
#          2048 FLOP/clk/SM: community measurements of wmma/mma.sync on H100 top out near 50% of the 989 TFLOP/s
#          peak, and FlashAttention-2 (mma.sync) reaches ~335-350 TFLOP/s there against FA3's ~616-740 (FA3
#          paper figs. 5-6). On A100 HMMA is the full rate.
#  [mufu]  MUFU (ex2, lg2, sin, cos, rcp): 16/clk/SM on sm_80 and sm_90 (CUDA C++ Programming Guide, "Arithmetic
#          Instructions" throughput table: 32-bit reciprocal, log2, exp2, sine, cosine: 16; FA3 paper sec. 3.2:
#          3.9 TFLOP/s of special functions on H100).
#  [xu]    Conversions share that quarter-rate pipe: Nsight Compute's Kernel Profiling Guide names the XU pipe
#          "Transcendental and Data Type Conversion Unit ... special functions such as sin, cos, and reciprocal
#          square root ... also int-to-float and float-to-int type conversions", and the programming guide's
#          table gives "all other type conversions" 16/clk/SM at compute capability 8.x / 9.0. So F2I, I2F and
#          F2F are costed on the XU pipe with MUFU. F2FP (pack two fp32 into bf16x2 / f16x2) is not: the same
#          guide puts "fast FP32-to-FP16 conversion" on the ALU pipe from Ampere on. I2FP (sm_90's int-to-float
#          opcode beside I2F) is assumed ALU: no table names it; it is rare in these loops.
#  [frnd]  FRND (PTX cvt.rni.f32.f32, round to an integral float; no document names its pipe): costed on the ALU
#          (`Machine.frnd_pipe`), because a GPU A/B says it does not take an XU slot: on one H100 the TAPA forward
#          whose cos range reduction replaced FRND by two FADDs (XU bound 0.31 -> 0.25 clk/element if FRND were
#          XU) ran 6.7% slower relative to SDPA (exact distance power, selftest 16k, 2026-11-27 against the
#          2026-11-26 run), as the ALU/issue costing predicts (+1%, +6% forward+backward) and the XU costing
#          does not (-19%, -2%). The report carries both (`frnd_on_xu`, and `model_ratio_frnd_on_xu` in the
#          measured change).
#  [fma]   FP32 FFMA / FADD / FMUL: 128 lanes/clk/SM on sm_90 (programming guide table; Hopper doubled FP32 per
#          SM), 64 on sm_80. NVIDIA's answer on the developer forum ("Separate CUDA core pipeline for FP16 and
#          FP32", 2024): GH100 splits them into FMAheavy (FP32, IMAD, IDP) and FMAlite (FP32 only), 16 lanes each
#          per SM sub-partition, so IMAD/IMUL get 64 lanes/clk/SM and share them with FP32; on GA100 one FMA pipe
#          (64 lanes) runs FP32 and IMAD.
#  [alu]   Integer add, logic, shifts, compare / min / max / select (FP32 FMNMX, FSETP, FSEL included), LEA, SEL,
#          PRMT, MOV, F2FP: the ALU pipe, 64 lanes/clk/SM (programming guide table: 32-bit integer add, compare,
#          min, max, shift, bitwise: 64 at 8.x / 9.0; Nsight's ALU pipe: "most bit manipulation and logic
#          instructions ... integer instructions, excluding IMAD and IMUL").
#  [issue] Four warp schedulers per SM, one warp instruction per clock each: 128 lanes/clk/SM of any kind
#          (uniform-datapath U* instructions, memory, barriers and branches take an issue slot too).
#  [hbm]   H100 SXM5 HBM3 3.35 TB/s, H200 HBM3e 4.8 TB/s, A100 SXM4 80 GB 2.04 TB/s (datasheets), spread over the
#          SMs at the model clock. Costed for decode only: in prefill each K/V tile is re-read by every query
#          tile of its head from L2 (one head's K and V at 16k, 8 MB, fit H100's 50 MB L2), not HBM.
#  [clock] 1.83 GHz: the clock at which 4096 FLOP/clk/SM gives the datasheet's 989 TFLOP/s (the notes' figure);
#          H100 / H200 SXM boost to 1.98 GHz at most. Measured times convert to clocks at this clock: a different
#          clock scales every measured row (and every efficiency) alike and leaves the ranking unchanged.
# Not modelled: shared-memory / LSU bandwidth (LDS, LDSM, STS, SHFL: issue slots only), latency and occupancy
# (one 8-warp block per SM leaves little overlap), dual issue limits between pipes. Each pipe figure is a lower
# bound on time; the largest is the bound, which real kernels reach only with perfect overlap of all pipes.
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Machine:
    """Per-SM-per-clock rates of one GPU (see the sources above)."""

    name: str
    arch: int
    sm_count: int
    clock_ghz: float
    hbm_bytes_per_s: float
    wgmma_flop_per_clk: float | None  # HGMMA dense bf16/fp16, fp32 accumulate [peak]
    mma_sync_flop_per_clk: float  # HMMA [peak] [mma]
    xu_lanes: int  # MUFU and conversions [mufu] [xu]
    fp32_lanes: int  # FFMA / FADD / FMUL [fma]
    imad_lanes: int  # IMAD / IMUL (the FMA-heavy half on sm_90) [fma]
    alu_lanes: int  # [alu]
    issue_lanes: int  # [issue]
    frnd_pipe: str = "alu"  # [frnd]: "alu", or "xu" for the documented-conversion reading

    @property
    def hbm_bytes_per_clk(self) -> float:
        return self.hbm_bytes_per_s / (self.sm_count * self.clock_ghz * 1e9)


H100 = Machine("H100 SXM5", 90, 132, 1.83, 3.35e12, 4096.0, 2048.0, 16, 128, 64, 64, 128)
H200 = Machine("H200 SXM", 90, 132, 1.83, 4.8e12, 4096.0, 2048.0, 16, 128, 64, 64, 128)
A100 = Machine("A100 SXM4 80GB", 80, 108, 1.41, 2.04e12, None, 2048.0, 16, 64, 64, 64, 128)
H100_FRND_ON_XU = replace(H100, frnd_pipe="xu")
MACHINES = {90: H100, 80: A100}

XU_OPS = {"MUFU", "F2F", "F2I", "I2F"}
FP32_OPS = {"FFMA", "FADD", "FMUL", "FFMA32I", "FADD32I", "FMUL32I", "HFMA2", "HADD2", "HMUL2", "FSWZADD"}
IMAD_OPS = {"IMAD", "IMUL", "IMAD32I", "IMUL32I", "IDP"}
ALU_OPS = ALU_EXTRA | {"FMNMX", "FSEL", "FSETP", "FSET", "ISETP", "IADD3", "IADD", "IADD32I", "LOP", "LOP32I", "SHL",
                       "SHR", "IABS", "ISCADD", "HMNMX2", "HSETP2", "F2FP", "I2FP", "F2IP"}
PIPES = ("tensor_core", "special_function", "fma", "alu", "issue", "memory")
_HMMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "884": (8, 8, 4), "16832": (16, 8, 32)}


def pipe_of(op: str) -> str:
    """The pipe a SASS opcode (no modifiers) issues to: tensor, xu, fp32, imad, alu, uniform or other; "frnd"
    for FRND, whose pipe the machine decides (`Machine.frnd_pipe`)."""
    if op in TENSOR:
        return "tensor"
    if op in XU_OPS:
        return "xu"
    if op == "FRND":
        return "frnd"
    if op in FP32_OPS:
        return "fp32"
    if op in IMAD_OPS:
        return "imad"
    if op in ALU_OPS:
        return "alu"
    if op.startswith("U") or op in ("R2UR", "S2UR"):
        return "uniform"
    return "other"


def mma_flops(op: str, mods: str) -> tuple[str, float]:
    """("wgmma" or "mma_sync", FLOPs) of one tensor-core instruction: an HGMMA.MxNxK is issued by each warp of a
    warpgroup for one 2·M·N·K product; an HMMA.mnk by one warp for 2·m·n·k."""
    if op == "HGMMA":
        m = re.match(r"\.(\d+)x(\d+)x(\d+)", mods)
        if not m:
            raise ValueError(f"HGMMA without a shape: {op}{mods}")
        return "wgmma", 2.0 * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    m = re.match(r"\.(\d+)", mods)
    shape = _HMMA_SHAPES.get(m.group(1)) if m else None
    if shape is None:
        raise ValueError(f"unknown tensor-core shape: {op}{mods}")
    return "mma_sync", 2.0 * shape[0] * shape[1] * shape[2]


def path_profile(items: list[dict], path: list[int], num_warps: int, elements: int) -> dict:
    """Per score element along one path: lane-instructions per pipe, and tensor-core FLOPs (warpgroup and mma.sync
    separately: they run at different rates on Hopper)."""
    threads = num_warps * 32
    lanes = Counter()
    flops = Counter()
    for i in path:
        it = items[i]
        p = pipe_of(it["op"])
        lanes[p] += threads / elements
        lanes["total"] += threads / elements
        if p == "tensor":
            kind, f = mma_flops(it["op"], it.get("mods", ""))
            flops[kind] += f * (num_warps / 4 if kind == "wgmma" else num_warps) / elements
    return dict(lanes=dict(lanes), flops=dict(flops))


def pipe_bounds(profile: dict, machine: Machine, memory_bytes: float | None = None) -> dict:
    """SM clocks per score element on each pipe (a lower bound each), the binding pipe and the bound (their max)."""
    ln, fl = profile["lanes"], profile["flops"]
    if fl.get("wgmma") and not machine.wgmma_flop_per_clk:
        raise ValueError(f"{machine.name} has no warpgroup MMA")
    fp32, imad = ln.get("fp32", 0.0), ln.get("imad", 0.0)
    frnd = ln.get("frnd", 0.0)
    xu = ln.get("xu", 0.0) + (frnd if machine.frnd_pipe == "xu" else 0.0)
    alu = ln.get("alu", 0.0) + (frnd if machine.frnd_pipe == "alu" else 0.0)
    clk = dict(tensor_core=fl.get("wgmma", 0.0) / (machine.wgmma_flop_per_clk or 1.0)
               + fl.get("mma_sync", 0.0) / machine.mma_sync_flop_per_clk,
               special_function=xu / machine.xu_lanes,
               fma=max((fp32 + imad) / machine.fp32_lanes, imad / machine.imad_lanes),
               alu=alu / machine.alu_lanes,
               issue=ln.get("total", 0.0) / machine.issue_lanes)
    if memory_bytes is not None:
        clk["memory"] = memory_bytes / machine.hbm_bytes_per_clk
    binding = max(clk, key=clk.get)
    return dict(binding=binding, bound=round(clk[binding], 4), clocks_per_element={k: round(v, 4) for k, v in
                                                                                     clk.items()},
                tensor_flops_per_element={k: round(v, 1) for k, v in fl.items()},
                lanes_per_element={k: round(v, 3) for k, v in sorted(ln.items())})


def parse_sass(text: str) -> tuple[list[dict], dict[str, int]]:
    """Instructions (opcode, its modifiers, predicated?, branch target) and label positions of nvdisasm output."""
    items: list[dict] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(items)
            continue
        m = _INS.match(line)
        if m:
            b = _BRA.search(line)
            items.append(dict(op=m.group(2), mods=m.group(3) or "", pred=m.group(1) is not None,
                              target=b.group(1) if b else None))
    return items, labels


def inner_loops(items: list[dict], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) instruction of every loop (label ... backward branch to it) that holds no other loop."""
    loops = [(labels[it["target"]], i) for i, it in enumerate(items)
             if it["target"] in labels and labels[it["target"]] <= i]
    return [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]


def _successors(items: list[dict], labels: dict[str, int], a: int, b: int, i: int) -> list[int]:
    """Where control goes from instruction i inside the loop [a, b]: forward branches inside the loop and the
    fall-through of predicated ones; an unpredicated branch out of the loop ends the path (b ends every path)."""
    if i == b:
        return []
    it = items[i]
    succ = []
    if it["op"] == "BRA" and it["target"] in labels and a < labels[it["target"]] <= b:
        succ.append(labels[it["target"]])
        if it["pred"]:
            succ.append(i + 1)
    elif it["op"] != "BRA" or it["pred"]:
        succ.append(i + 1)
    return succ


def shortest_path(items: list[dict], labels: dict[str, int], a: int, b: int) -> list[int]:
    """Instructions executed on the shortest path from a to the loop's back branch b (forward branches only)."""
    best: dict[int, tuple[int, int | None]] = {a: (1, None)}
    for i in range(a, b + 1):
        if i not in best:
            continue
        for j in _successors(items, labels, a, b, i):
            if j <= b and (j not in best or best[i][0] + 1 < best[j][0]):
                best[j] = (best[i][0] + 1, i)
    path, i = [], b
    while i is not None:
        path.append(i)
        i = best[i][1]
    return path[::-1]


def loop_paths(items: list[dict], labels: dict[str, int], a: int, b: int, limit: int = 4096) -> list[list[int]] | None:
    """Every path from a to the back branch b through forward branches (None when there are more than `limit`)."""
    count: dict[int, int] = {b: 1}
    for i in range(b - 1, a - 1, -1):
        count[i] = sum(count.get(j, 0) for j in _successors(items, labels, a, b, i))
    if count.get(a, 0) > limit:
        return None
    paths: list[list[int]] = []
    stack: list[tuple[int, list[int]]] = [(a, [])]
    while stack:
        i, prefix = stack.pop()
        run = list(prefix)
        while True:
            run.append(i)
            succ = [j for j in _successors(items, labels, a, b, i) if count.get(j, 0)]
            if i == b or not succ:
                break
            if len(succ) > 1:
                stack.extend((j, tuple(run)) for j in succ[1:])
            i = succ[0]
        if run[-1] == b:
            paths.append(run)
    return paths


def op_class(op: str) -> str:
    if op == "MUFU":
        return "special_function"
    if op in TENSOR:
        return "tensor_core"
    if op in NOT_ALU:
        return "other"
    if op[0] in "FHI" or op in ALU_EXTRA:
        return "fma_alu"
    return "other"


def loop_mix(items: list[dict], path: list[int], threads: int, elements: int) -> dict:
    ops = Counter(items[i]["op"] for i in path)
    per = {c: 0.0 for c in ("special_function", "fma_alu", "tensor_core", "other")}
    for op, n in ops.items():
        per[op_class(op)] += n * threads / elements
    return dict(instructions=len(path), per_element={k: round(v, 2) for k, v in per.items()},
                per_element_total=round(len(path) * threads / elements, 2),
                top_opcodes=dict(ops.most_common(12)))


def _cost_key(bounds: dict, path: list[int]) -> tuple:
    return bounds["bound"], bounds["clocks_per_element"]["issue"], len(path)


def _far_key(bounds: dict, path: list[int]) -> tuple:
    return (bounds["lanes_per_element"].get("xu", 0.0),) + _cost_key(bounds, path)


def choose_paths(costed: list[tuple[dict, list[int]]]) -> dict[str, tuple[dict, list[int]]]:
    """Of a loop's costed paths ((bounds, path) pairs): the cheapest and the most expensive under the pipe model;
    the far-tile path, the one with the fewest special-function / conversion (XU) instructions (then the
    cheapest): the tile-uniform branches that tiles far from the diagonal skip, TAPA's exact lg2/ex2 distance
    power (they take the binomial series) and the lazy rescale, both add MUFU instructions; and the
    near-diagonal path, the cheapest of those with at least one XU instruction per score element more than the
    far-tile path (per-element transcendental work, the exact distance power, not the per-row rescale; the
    far-tile path where there is none). The far-tile path is what most tiles run at long context; it need not
    be the cheapest (where the special-function pipe does not bind, the series' extra FMAs cost issue slots)."""
    far = min(costed, key=lambda bp: _far_key(*bp))
    far_xu = far[0]["lanes_per_element"].get("xu", 0.0)
    exact = [bp for bp in costed if bp[0]["lanes_per_element"].get("xu", 0.0) >= far_xu + 1.0]
    return dict(cheapest=min(costed, key=lambda bp: _cost_key(*bp)),
                most_expensive=max(costed, key=lambda bp: _cost_key(*bp)),
                far_tile=far, near_diagonal=min(exact, key=lambda bp: _cost_key(*bp)) if exact else far)


def analyse(record, sass_text: str, machine: Machine | None = None, memory_bytes: float | None = None) -> dict:
    """The attention loops of one binary, every path through their forward branches costed with the pipe model.
    The steady-state loop is the loop whose far-tile path (`choose_paths`) is cheapest, the masked loop the
    other; each reports the mix of its far-tile path and, under `pipe_model`, the bounds of its far-tile,
    near-diagonal, cheapest and most expensive paths. `memory_bytes`: HBM bytes per score element to cost on
    every path, else none (the report costs decode's HBM per real row instead: `decode_per_valid_row`)."""
    machine = machine or MACHINES.get(getattr(record, "arch", 90), H100)
    items, labels = parse_sass(sass_text)
    bm, bn = record.constexprs["BLOCK_M"], record.constexprs["BLOCK_N"]
    warps = record.num_warps
    threads = warps * 32
    mma = [(a, b) for a, b in inner_loops(items, labels) if any(items[i]["op"] in TENSOR for i in range(a, b + 1))]
    if not mma:
        return {}
    loops = []
    for a, b in mma:
        paths = loop_paths(items, labels, a, b)
        enumerated = paths is not None
        if not enumerated:  # too many paths to cost one by one: the shortest stands for them all
            paths = [shortest_path(items, labels, a, b)]
        costed = [(pipe_bounds(path_profile(items, p, warps, bm * bn), machine, memory_bytes), p) for p in paths]
        loops.append(dict(choose_paths(costed), paths=len(paths), enumerated=enumerated))
    loops.sort(key=lambda lp: _cost_key(*lp["far_tile"]))

    def model(lp: dict) -> dict:
        out = dict(paths=lp["paths"], all_paths_costed=lp["enumerated"])
        for key in ("far_tile", "near_diagonal", "cheapest", "most_expensive"):
            bounds, path = lp[key]
            keep = bounds if key == "far_tile" else {k: bounds[k] for k in ("binding", "bound", "clocks_per_element")}
            out[f"{key}_path"] = dict(keep, instructions=len(path))
        out["far_tile_is_cheapest"] = lp["far_tile"][1] == lp["cheapest"][1]
        return out

    steady = loops[0]
    out = {"steady_state_loop": dict(loop_mix(items, steady["far_tile"][1], threads, bm * bn),
                                     pipe_model=model(steady))}
    if len(loops) > 1:
        masked = loops[-1]
        out["masked_loop"] = dict(loop_mix(items, masked["far_tile"][1], threads, bm * bn), pipe_model=model(masked))
    return out


def _lane_modules():
    """(compile lane, binary tooling) of the package on the path: ``hf_posenc.kernels.dev``, or in a revision
    committed before that folder (which `kernels_at_rev` compiles) ``hf_posenc.kernels.compile_lane`` and
    ``hf_posenc.kernels._triton``."""
    try:
        from hf_posenc.kernels.dev import binaries, compile_lane
    except ModuleNotFoundError:
        from hf_posenc.kernels import _triton as binaries, compile_lane
    return compile_lane, binaries


def _nvdisasm(cubin: str) -> str:
    _, binaries = _lane_modules()
    return subprocess.run([binaries._tool("nvdisasm"), "-c", cubin], capture_output=True, text=True,
                          check=True).stdout


KERNEL_NAMES = {"tapa_fwd": "TAPA forward", "tapa_bwd": "TAPA backward, fused (dK/dV/dQ, atomic dQ; the default)",
                "tapa_bwd_dkdv": "TAPA backward dK/dV (deterministic backward)",
                "tapa_bwd_dq": "TAPA backward dQ (deterministic backward)",
                "tapa_decode": "TAPA decode (split-K)", "tape_fwd": "TAPE forward",
                "tape_bwd_dkdv": "TAPE backward dK/dV/dE (deterministic backward)",
                "tape_bwd_dq": "TAPE backward dQ (deterministic backward)",
                "tape_bwd_dvde": "TAPE backward dV/dE (fused backward; the default on Hopper)",
                "tape_bwd_dkdq": "TAPE backward dK with atomic dQ (fused backward; the default on Hopper)",
                "tape_decode": "TAPE decode (split-K)",
                "flash_fwd": "baseline causal FlashAttention-2 forward (TAPA forward tiles)",
                "flash_fwd_tape_tiles": "baseline causal FlashAttention-2 forward (TAPE forward tiles)"}

DECODE_ROWS = 4  # valid rows of a decode tile in the measured shape: GQA group 32/8 query heads x one query
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def decode_bytes_per_key(constexprs: dict, dtype: str) -> float:
    """HBM bytes one decode program reads per key: TAPA its amplitude, phase and value columns and its fp32
    position; TAPE its key, value and positional-feature (E) columns."""
    w = BYTES[dtype]
    if "DA" in constexprs:
        return w * (constexprs["DA"] + constexprs["DP"] + constexprs["DV"]) + 4
    return w * (2 * constexprs["BLOCK_D"] + constexprs["BLOCK_DE"])


def decode_per_valid_row(model: dict, block_m: int, rows: int = DECODE_ROWS, memory_bytes: float | None = None,
                         machine: Machine = H100) -> dict:
    """A decode loop's bounds per score element that counts: every tile row is computed, only `rows` of BLOCK_M
    are real (compute pipes x BLOCK_M / rows), and the HBM pipe reads `memory_bytes` per real score element."""
    out = {}
    for key in ("far_tile_path", "near_diagonal_path", "cheapest_path", "most_expensive_path"):
        clk = {k: v * block_m / rows for k, v in model[key]["clocks_per_element"].items()}
        if memory_bytes is not None:
            clk["memory"] = memory_bytes / machine.hbm_bytes_per_clk
        binding = max(clk, key=clk.get)
        out[key] = dict(binding=binding, bound=round(clk[binding], 4),
                        clocks_per_element={k: round(v, 4) for k, v in clk.items()})
    return dict(valid_rows=rows, block_m=block_m, hbm_bytes_per_real_element=memory_bytes, **out)


def build_kernels(arch: int, head_dims, jobs: int | None, baseline: str = BASELINE) -> list[dict]:
    """Compile (compile lane) and analyse every kernel binary for one arch: the report's `kernels` list."""
    compile_lane, _ = _lane_modules()
    FAMILIES, run_lane = compile_lane.FAMILIES, compile_lane.run_lane
    machine = MACHINES[arch]
    with tempfile.TemporaryDirectory() as tmp:
        records = run_lane(FAMILIES + (baseline,), (arch,), ("bfloat16",), head_dims, jobs, cubin_dir=tmp)
        kernels = []
        for r in records:
            name = r.launches[0]
            if name not in KERNEL_NAMES:
                continue
            theta = r.constexprs["DA"] / r.head_dim if "DA" in r.constexprs else None
            entry = dict(kernel=name, same_binary_as=r.launches[1:], description=KERNEL_NAMES[name],
                         head_dim=r.head_dim, dtype=r.dtype, theta=theta,
                         linear_phase=bool(r.constexprs.get("LINEAR", False)),
                         tiles=dict(block_m=r.constexprs["BLOCK_M"], block_n=r.constexprs["BLOCK_N"],
                                    num_warps=r.num_warps, num_stages=r.num_stages),
                         registers=r.registers, spill_bytes=r.spills, shared_bytes=r.shared,
                         shared_limit_bytes=r.shared_limit, problems=r.problems)
            if r.cubin is not None:
                text = _nvdisasm(r.cubin)
                entry.update(analyse(r, text, machine))
                if arch == 90 and "steady_state_loop" in entry:  # the other reading of FRND's pipe [frnd]
                    alt = analyse(r, text, H100_FRND_ON_XU)["steady_state_loop"]["pipe_model"]
                    entry["frnd_on_xu"] = {k: dict(binding=v["binding"], bound=v["bound"])
                                           for k, v in alt.items() if k.endswith("_path")}
                if name.endswith("_decode") and "steady_state_loop" in entry:
                    entry["decode_per_valid_score_element"] = decode_per_valid_row(
                        entry["steady_state_loop"]["pipe_model"], r.constexprs["BLOCK_M"], DECODE_ROWS,
                        decode_bytes_per_key(r.constexprs, r.dtype) / DECODE_ROWS, machine)
            kernels.append(entry)
    kernels.sort(key=lambda e: (e["head_dim"], e["kernel"], e["linear_phase"], -(e["theta"] or 0.5)))
    return kernels


def find_kernel(kernels: list[dict], name: str, d: int) -> dict | None:
    """The summary's binary of a kernel: head dim d, θ = 0.5 (TAPA), quadratic phase."""
    for e in kernels:
        if (name == e["kernel"] or name in e["same_binary_as"]) and e["head_dim"] == d and not e["linear_phase"] \
                and e["theta"] in (None, 0.5) and "steady_state_loop" in e:
            return e
    return None


# kernel -> what runs per score element (decode: per real row, see DECODE_ROWS)
TABLE_KERNELS = ("flash_fwd", "tapa_fwd", "tapa_bwd", "tapa_bwd_dkdv", "tapa_bwd_dq", "tapa_decode", "tape_fwd",
                 "tape_bwd_dvde", "tape_bwd_dkdq", "tape_bwd_dkdv", "tape_bwd_dq", "tape_decode")


def pipe_table(kernels: list[dict], head_dims) -> list[dict]:
    """One row per kernel and head dim (θ = 0.5, quadratic phase): binding pipe, bound and per-pipe clocks of the
    steady-state loop's far-tile path, the bounds of its cheapest and most expensive paths (near the diagonal:
    the exact distance power; with the lazy rescale) and of the masked loop."""
    rows = []
    for d in head_dims:
        for name in TABLE_KERNELS:
            e = find_kernel(kernels, name, d)
            if e is None:
                continue
            pm = e["decode_per_valid_score_element"] if "decode_per_valid_score_element" in e \
                else e["steady_state_loop"]["pipe_model"]
            far = pm["far_tile_path"]
            row = dict(kernel=name, head_dim=d, per="real score element (decode rows)" if name.endswith("_decode")
                       else "score element", binding=far["binding"], bound=far["bound"],
                       clocks_per_element=far["clocks_per_element"],
                       near_diagonal_path=dict(binding=pm["near_diagonal_path"]["binding"],
                                               bound=pm["near_diagonal_path"]["bound"]),
                       cheapest_path=dict(binding=pm["cheapest_path"]["binding"], bound=pm["cheapest_path"]["bound"]),
                       most_expensive_path=dict(binding=pm["most_expensive_path"]["binding"],
                                                bound=pm["most_expensive_path"]["bound"]))
            if "masked_loop" in e and not name.endswith("_decode"):
                mf = e["masked_loop"]["pipe_model"]["far_tile_path"]
                row["masked_loop"] = dict(binding=mf["binding"], bound=mf["bound"])
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The check against the measured rows
# ---------------------------------------------------------------------------------------------------------------
TIMING_FILES = {"H100": ("selftest-timing-nvidia-h100-80gb-hbm3.json", H100),
                "H200": ("selftest-timing-nvidia-h200.json", H200)}
# ranked row -> (selftest kernel, mode, candidate), the kernels whose bounds add up to it, and the path their tiles
# take ("far_tile": the default; "near_diagonal": every tile on the exact distance power, the selftest's
# "exact d^α" candidate, which sets SERIES_MAX_RATIO = 0 on the same binaries)
RANKED_ROWS = {
    "sdpa_baseline_fwd": (("tapa", "fwd", "RoPE (SDPA flash)"), ("flash_fwd",), "far_tile"),
    "tapa_fwd": (("tapa", "fwd", "TAPA (Triton)"), ("tapa_fwd",), "far_tile"),
    "tapa_fwd_bwd": (("tapa", "fwd_bwd", "TAPA (Triton)"), ("tapa_fwd", "tapa_bwd"), "far_tile"),
    "tape_fwd": (("tape", "fwd", "TAPE (Triton)"), ("tape_fwd",), "far_tile"),
    "tape_fwd_bwd": (("tape", "fwd_bwd", "TAPE (Triton)"), ("tape_fwd", "tape_bwd_dvde", "tape_bwd_dkdq"), "far_tile"),
}
# binaries from before a row's kernels existed ran these instead (TAPE's backward before its fused kernels: the
# two-kernel one, then the default)
EARLIER_PARTS = {"tape_fwd_bwd": ("tape_fwd", "tape_bwd_dkdv", "tape_bwd_dq")}
EXACT_ROWS = {  # beside the ranking: the series' gain, model against GPU, where a run timed both
    "tapa_fwd_exact": (("tapa", "fwd", "TAPA (Triton, exact d^α)"), ("tapa_fwd",), "near_diagonal"),
    "tapa_fwd_bwd_exact": (("tapa", "fwd_bwd", "TAPA (Triton, exact d^α)"), ("tapa_fwd", "tapa_bwd"),
                           "near_diagonal"),
    # TAPE's two-kernel (deterministic) backward, timed beside the fused default
    "tape_fwd_bwd_deterministic": (("tape", "fwd_bwd", "TAPE (Triton, deterministic backward)"),
                                   ("tape_fwd", "tape_bwd_dkdv", "tape_bwd_dq"), "far_tile"),
}
ALL_ROWS = {**RANKED_ROWS, **EXACT_ROWS}


def measured_clocks(timing: dict, machine: Machine, rows: dict = ALL_ROWS) -> dict[int, dict[str, float]]:
    """Measured SM clocks per score element per length and row: median × clock × SMs / (batch × query heads ×
    L(L+1)/2), the causal score elements of one call."""
    heads = timing["timing_shape"]["q_heads"]
    out: dict[int, dict[str, float]] = {}
    for name, ((kernel, mode, cand), _, _) in rows.items():
        for r in timing["timing"]:
            if (r["kernel"], r["mode"], r["candidate"]) == (kernel, mode, cand) and r.get("median_ms"):
                L = r["length"]
                elements = r["batch"] * heads * L * (L + 1) / 2
                clocks = r["median_ms"] * 1e-3 * machine.clock_ghz * 1e9 * machine.sm_count
                out.setdefault(L, {})[name] = clocks / elements
    return out


def model_bounds(kernels: list[dict], d: int = 128, rows: dict = ALL_ROWS, frnd_on_xu: bool = False) -> dict[str, dict]:
    """The model's bound per row: the sum of its kernels' steady-state bounds on the row's path (far tiles,
    nearly all of them at 16k, or the exact distance power everywhere); `frnd_on_xu`: with FRND costed on the
    special-function pipe instead [frnd]."""
    out = {}
    for name, (_, parts, path) in rows.items():
        found = [find_kernel(kernels, k, d) for k in parts]
        if any(f is None for f in found) and name in EARLIER_PARTS:
            parts = EARLIER_PARTS[name]
            found = [find_kernel(kernels, k, d) for k in parts]
        if any(f is None for f in found) or (frnd_on_xu and any("frnd_on_xu" not in f for f in found)):
            continue
        pms = [(f["frnd_on_xu"] if frnd_on_xu else f["steady_state_loop"]["pipe_model"])[f"{path}_path"]
               for f in found]
        out[name] = dict(bound=round(sum(pm["bound"] for pm in pms), 4), path=path,
                         kernels={k: dict(binding=pm["binding"], bound=pm["bound"]) for k, pm in zip(parts, pms)})
    return out


def rank_check(model: dict[str, float], measured: dict[str, float]) -> dict:
    """Do the model's bounds order the rows as the measured clocks do? Lists every pair out of order."""
    names = [n for n in measured if n in model]
    by_measured = sorted(names, key=lambda n: measured[n])
    by_model = sorted(names, key=lambda n: model[n])
    out_of_order = [dict(faster_on_gpu=a, slower_on_gpu=b, model_bound=(model[a], model[b]))
                    for i, a in enumerate(by_measured) for b in by_measured[i + 1:]
                    if model[a] >= model[b] and measured[a] < measured[b]]
    return dict(matches=not out_of_order, gpu_order=by_measured, model_order=by_model, pairs_out_of_order=out_of_order)


def series_check(bounds: dict, measured: dict[str, float]) -> dict:
    """Series against exact distance power, per mode: the model's and the GPU's time ratio (series / exact)."""
    out = {}
    for mode, (series, exact) in dict(fwd=("tapa_fwd", "tapa_fwd_exact"),
                                      fwd_bwd=("tapa_fwd_bwd", "tapa_fwd_bwd_exact")).items():
        if all(n in measured and n in bounds for n in (series, exact)):
            model = bounds[series]["bound"] / bounds[exact]["bound"]
            gpu = measured[series] / measured[exact]
            out[mode] = dict(model_ratio=round(model, 3), gpu_ratio=round(gpu, 3),
                             same_direction=(model < 1) == (gpu < 1))
    return out


def check_rows(kernels: list[dict], timing: dict, machine: Machine, check_length: int = 16384, d: int = 128) -> dict:
    """Per length and row: model bound, measured clocks per element, efficiency (bound / measured); the ranking
    check of the RANKED_ROWS at `check_length` (and, for information, at every other length); the series
    against the exact distance power where the run timed both."""
    bounds = model_bounds(kernels, d)
    measured = measured_clocks(timing, machine)
    lengths = {}
    for L, rows in sorted(measured.items()):
        table = {n: dict(model_bound=bounds[n]["bound"], measured_clocks_per_element=round(c, 4),
                         efficiency=round(bounds[n]["bound"] / c, 3)) for n, c in rows.items() if n in bounds}
        ranked = [n for n in table if n in RANKED_ROWS]
        ranking = rank_check({n: bounds[n]["bound"] for n in ranked}, {n: rows[n] for n in ranked})
        if not ranking["matches"]:
            eff = [table[n]["efficiency"] for n in ranked]
            ranking["reading"] = (
                f"efficiencies spread {min(eff):.0%}-{max(eff):.0%}: the bounds cost the L^2 loops only, and at "
                f"L = {L} per-call work linear in L weighs more (the RoPE rotation the SDPA row runs and TAPA "
                "does not, TAPE's q/k rotation, layout copies, launches, host time; batch x 32 x L(L+1)/2 score "
                "elements per call); rows whose bounds differ less than that spread cannot be ordered by them"
                if L < check_length else
                f"efficiencies spread {min(eff):.0%}-{max(eff):.0%}: the bound misses what limits the rows out "
                "of order (latency and occupancy, or a pipe the model leaves out such as shared-memory bandwidth)")
        entry = dict(rows=table, ranking=ranking)
        series = series_check(bounds, rows)
        if series:
            entry["series_against_exact"] = series
        lengths[str(L)] = entry
    check = lengths.get(str(check_length))
    return dict(device=timing.get("device_name"), started=timing.get("started"), model_machine=asdict(machine),
                check_length=check_length, head_dim=d, model=bounds, lengths=lengths,
                ranking_matches_at_check_length=None if check is None else check["ranking"]["matches"])


def change_check(before: dict, after: dict, kernels_before: list[dict], kernels_after: list[dict],
                 check_length: int = 16384, d: int = 128) -> dict:
    """Two runs of one GPU on different binaries: per row, the measured change of its time relative to SDPA in
    the same run (vs_rope, which cancels the run-to-run drift of the clock) against the change of its bound."""
    def rel(timing: dict) -> dict[str, float]:
        out = {}
        for name, ((kernel, mode, cand), _, _) in ALL_ROWS.items():
            for r in timing["timing"]:
                if (r["kernel"], r["mode"], r["candidate"], r["length"]) == (kernel, mode, cand, check_length) \
                        and r.get("vs_rope"):
                    out[name] = r["vs_rope"]
        return out

    b0, b1 = model_bounds(kernels_before, d), model_bounds(kernels_after, d)
    x0, x1 = model_bounds(kernels_before, d, frnd_on_xu=True), model_bounds(kernels_after, d, frnd_on_xu=True)
    m0, m1 = rel(before), rel(after)
    rows = {}
    for name in ALL_ROWS:
        if name in m1 and name in b1:
            # a row the earlier run lacks (exact d^α) compares with the earlier binaries' default row
            # (TAPE's deterministic backward: with the binaries from before the fused one, the default)
            was = name if name in m0 else name.removesuffix("_exact").removesuffix("_deterministic")
            if was in m0 and was in b0:
                row = dict(compared_with=was, gpu_ratio=round(m1[name] / m0[was], 3),
                           model_ratio=round(b1[name]["bound"] / b0[was]["bound"], 3))
                if name in x1 and was in x0:
                    row["model_ratio_frnd_on_xu"] = round(x1[name]["bound"] / x0[was]["bound"], 3)
                rows[name] = row
    changed = [r for r in rows.values() if abs(r["gpu_ratio"] - 1) > 0.02]

    def agree(key: str) -> int:
        return sum((r[key] < 1) == (r["gpu_ratio"] < 1) for r in changed if key in r)

    return dict(length=check_length, before=before.get("started"), after=after.get("started"),
                note=("ratio after / before; gpu_ratio of vs_rope (time over SDPA's in the same run); "
                      "directions_agree counts the rows whose time moved by more than 2% on the GPU"),
                rows=rows, rows_moved=len(changed),
                directions_agree=dict(model=agree("model_ratio"), frnd_on_xu=agree("model_ratio_frnd_on_xu")))


DECODE_TIMING = "tune_decode-nvidia-h100-80gb-hbm3.json"


def decode_check(kernels: list[dict], tuning: dict, machine: Machine = H100, d: int = 128) -> dict:
    """The decode kernels against their measured kernel times (benchmarks/tune_decode.py: CUDA-graph replays of
    the decode op, split-K partials and combine, no host time) at the tile the report compiled: SM clocks per
    real score element (batch x query heads x L), against the model's bound (HBM)."""
    shape = tuning["shape"]
    out = {}
    for family in ("tapa", "tape"):
        e = find_kernel(kernels, f"{family}_decode", d)
        if e is None or "decode_per_valid_score_element" not in e:
            continue
        t = e["tiles"]
        tile = [t["block_m"], t["block_n"], t["num_warps"], t["num_stages"]]
        model = e["decode_per_valid_score_element"]["far_tile_path"]
        rows = {}
        for r in tuning["rows"]:
            if (r["family"], r["head_dim"], r["tile"], r["density"]) == (family, d, tile, 2):
                elements = shape["batch"] * shape["heads"] * r["length"]
                clocks = r["ms"] * 1e-3 * machine.clock_ghz * 1e9 * machine.sm_count / elements
                rows[str(r["length"])] = dict(measured_clocks_per_element=round(clocks, 3),
                                              efficiency=round(model["bound"] / clocks, 3))
        out[f"{family}_decode"] = dict(tile=tile, binding=model["binding"], model_bound=model["bound"],
                                       lengths=rows)
    return dict(device=tuning.get("device"), note=tuning.get("note"), head_dim=d, kernels=out)


def _git(repo: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def timing_source(repo: Path, fname: str) -> str | None:
    """Which package a timing JSON measured: "worktree" when the file differs from the last commit (a run after
    it, with the kernels as they are now), else the commit that last wrote it (None without git)."""
    rel = f"benchmarks/results/{fname}"
    if _git(repo, "status", "--porcelain", "--", rel):
        return "worktree"
    rev = (_git(repo, "log", "-1", "--format=%H", "--", rel) or "").strip()
    return rev or None


def kernels_at_rev(repo: Path, rev: str, arch: int, head_dims, jobs: int | None) -> list[dict]:
    """The report's kernel list for the package as committed at `rev` (git archive into a temporary folder,
    compiled and analysed by this script in a subprocess with that folder first on the path)."""
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "src.tar"
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "-o", str(tar), rev, "hf_posenc",
                        "benchmarks/flash_baseline.py"], check=True)
        with tarfile.open(tar) as t:
            t.extractall(tmp, filter="data")
        out = Path(tmp) / "kernels.json"
        cmd = [sys.executable, __file__, "--package-root", tmp, "--arch", str(arch), "--kernels-json", str(out),
               "--head-dim", *map(str, head_dims)] + (["--jobs", str(jobs)] if jobs else [])
        subprocess.run(cmd, check=True, cwd=tmp)
        return json.loads(out.read_text())


def measured_check(kernels_now: list[dict], measured: dict[str, tuple[list[dict] | None, str | None]],
                   results: Path = RESULTS, previous: dict[str, tuple[dict, list[dict]]] | None = None) -> dict:
    """The model against every measured row. `measured`: per device, the kernel list of the binaries its timing
    JSON measured (None where they were not compiled) and where they came from ("worktree" or a commit); the
    current tree's bounds are checked too, as the prediction for the next run. `previous`: per device whose
    JSON changed since the last commit, the committed JSON and its binaries (`change_check`)."""
    out = dict(
        note=("Measured medians (selftest timing JSONs: 32 query / 8 KV heads, head dim 128, bf16, causal, one "
              "call of forward or forward + backward, host time included) in SM clocks per score element "
              "(batch x 32 x L(L+1)/2 per call) at the model clock, against the model's bound: for fwd_bwd the "
              "bounds of the forward and of the backward kernels that run (TAPA: the fused tapa_bwd, Hopper's "
              "default; TAPE: tape_bwd_dvde + tape_bwd_dkdq, Hopper's default, or tape_bwd_dkdv + tape_bwd_dq in "
              "binaries from before them), steady-state loops only (the diagonal blocks are "
              "about 1% of the elements at 16k; the backward's preprocessing and TAPE's q/k rotation, linear in "
              "L, are left out). efficiency = bound / measured. The baseline row is SDPA's flash kernel (FA2 "
              "class), modelled by the Triton flash forward compiled here: same work, another binary. "
              "Binaries here come from this machine's Triton; the GPU runs used Triton 3.6, so the SASS is "
              "close to, not the same as, what ran. A commit's binaries are compiled from `git archive`; a "
              "JSON that differs from the last commit is taken as measured with the working tree."),
        devices={},
    )
    for device, (fname, machine) in TIMING_FILES.items():
        path = results / fname
        if not path.exists():
            continue
        timing = json.loads(path.read_text())
        kernels, source = measured.get(device, (None, None))
        entry: dict = dict(measured_binaries_from=source)
        if kernels is not None:
            entry["measured_binaries"] = check_rows(kernels, timing, machine)
        if source != "worktree":
            entry["current_tree_prediction"] = check_rows(kernels_now, timing, machine)
        if previous and device in previous:
            before, kernels_before = previous[device]
            entry["change_since_last_commit"] = change_check(before, timing, kernels_before, kernels or kernels_now)
        out["devices"][device] = entry
    if (results / DECODE_TIMING).exists():
        out["decode_kernel_times"] = decode_check(kernels_now, json.loads((results / DECODE_TIMING).read_text()))
    return out


def build_report(arch: int, head_dims, jobs: int | None, kernels: list[dict] | None = None) -> dict:
    import torch
    import triton

    if kernels is None:
        kernels = build_kernels(arch, head_dims, jobs)

    def per_el(name, d):
        e = find_kernel(kernels, name, d)
        return e["steady_state_loop"]["per_element_total"] if e else None

    summary = {}
    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    for d in head_dims:
        base, base_tape = per_el("flash_fwd", d), per_el("flash_fwd_tape_tiles", d)
        fwd, tape = per_el("tapa_fwd", d), per_el("tape_fwd", d)
        bwd, dkdv, dq = per_el("tapa_bwd", d), per_el("tapa_bwd_dkdv", d), per_el("tapa_bwd_dq", d)
        bwd_det = round(dkdv + dq, 2) if dkdv is not None and dq is not None else None
        spill_free = all(e["spill_bytes"] == 0 for e in kernels if e["head_dim"] == d)
        summary[f"D={d}"] = dict(
            instructions_per_score_element=dict(baseline_forward=base, baseline_forward_tape_tiles=base_tape,
                                                tapa_forward=fwd, tapa_backward_fused=bwd,
                                                tapa_backward_deterministic_total=bwd_det,
                                                tapa_backward_deterministic_dkdv=dkdv,
                                                tapa_backward_deterministic_dq=dq, tape_forward=tape),
            ratio_to_baseline=dict(tapa_forward=ratio(fwd, base), tape_forward=ratio(tape, base),
                                   tape_forward_same_tiles=ratio(tape, base_tape)),
            targets=dict(tapa_forward_le_30=fwd is not None and fwd <= 30,
                         tapa_backward_le_70=bwd is not None and bwd <= 70,
                         tape_forward_within_1_3x_baseline=bool(tape and base and tape / base <= 1.3),
                         no_spills=spill_free),
        )
    machine = MACHINES[arch]
    return dict(
        static=True,
        note=("Static figures from compiled binaries (Triton -> PTX -> cubin with the bundled ptxas; "
              "cuobjdump / nvdisasm), no GPU run. Per score element = instructions on the steady-state path of "
              "the inner loop x threads per program / (BLOCK_M x BLOCK_N); issued instructions, not timings. "
              "pipe_model: lower bounds in SM clocks per score element per execution pipe."),
        arch=f"sm_{arch}", device_model="H100" if arch == 90 else "A100", triton=triton.__version__,
        torch=torch.__version__, dtype="bfloat16",
        theta="summary at 0.5; kernels lists theta 0.25 binaries too",
        method=dict(loop="innermost SASS loop with tensor-core instructions; every path through its forward "
                         "branches is costed with the pipe model; the steady state (instructions_per_score_"
                         "element, steady_state_loop) is the far-tile path, the one with the fewest special-"
                         "function instructions (TAPA's binomial-series distance power, no lazy rescale, which "
                         "runs only when some row's maximum grows by more than 2^8); pipe_model lists it with the "
                         "near-diagonal (exact lg2/ex2 distance power), cheapest and most expensive paths; the "
                         "masked loop is listed as masked_loop",
                    classes=dict(special_function="MUFU", tensor_core="HMMA/HGMMA",
                                 fma_alu="float and integer datapath (F*, H*, I*, LOP3, SEL, SHF, LEA, ...)",
                                 other="memory, barriers/fences, uniform-datapath descriptor and address "
                                       "arithmetic (U*, R2UR), control"),
                    baseline="benchmarks/flash_baseline.py with the TAPA forward tiles (tape_forward_same_tiles: "
                             "with the TAPE forward tiles)"),
        summary=summary,
        pipe_model=dict(
            machine=dict(asdict(machine), hbm_bytes_per_clk_per_sm=round(machine.hbm_bytes_per_clk, 2)),
            rates=("per SM per clock: tensor core HGMMA 4096 FLOP (sm_90), HMMA 2048 (assumed half rate on sm_90; "
                   "full rate on sm_80); special-function/conversion pipe XU (MUFU, F2F, F2I, I2F) 16 lanes; "
                   "FP32 FFMA/FADD/FMUL 128 lanes on sm_90 (64 on sm_80), IMAD 64 sharing them; ALU 64 lanes "
                   "(integer, logic, compare/min/max/select, F2FP, and FRND: an H100 A/B contradicts FRND on XU; "
                   "kernels[].frnd_on_xu keeps the other reading); issue 128 lanes (4 warp instructions); "
                   "HBM bytes / (SMs x clock) for decode. Sources: the constants' comments in "
                   "benchmarks/kernels_static.py"),
            pipes=dict(tensor_core="HGMMA FLOPs / 4096 + HMMA FLOPs / 2048 per SM-clock (FLOPs from the "
                                   "instruction's shape)",
                       special_function="(MUFU + F2F + F2I + I2F lane-instructions) / 16",
                       fma="max((FP32 + IMAD) / fp32 lanes, IMAD / imad lanes)",
                       alu="(ALU + FRND lane-instructions) / 64",
                       issue="all lane-instructions / 128",
                       memory=f"decode only: K/V bytes per key / {DECODE_ROWS} real rows / HBM bytes per SM-clock"),
            decode=(f"decode rows are per real score element: {DECODE_ROWS} real rows (GQA group 4 x one query, "
                    "the measured shape) of BLOCK_M computed; compute pipes scale by BLOCK_M / 4"),
            paths=("per loop, every path through its forward branches is costed: far_tile_path (fewest "
                   "special-function instructions: the series, no rescale; the steady state at long context), "
                   "near_diagonal_path (cheapest path with one or more special-function instruction per score "
                   "element more: the exact distance power), cheapest_path, most_expensive_path"),
            table=pipe_table(kernels, head_dims),
        ),
        kernels=kernels,
    )


def format_table(report: dict, d: int = 128) -> str:
    rows = [r for r in report["pipe_model"]["table"] if r["head_dim"] == d]
    cols = ("tensor_core", "special_function", "fma", "alu", "issue", "memory")
    short = dict(tensor_core="tensor", special_function="sfu/xu", fma="fma", alu="alu", issue="issue", memory="hbm")
    lines = [f"{report['arch']} D={d}: SM clocks per score element, lower bound per pipe on the far-tile path "
             "(* binds); bound and binding pipe of the near-diagonal path (exact distance power); cheapest path",
             f"{'kernel':14s}{'binds':>17s}{'bound':>7s}" + "".join(f"{short[c]:>8s}" for c in cols)
             + f"{'near-diag':>17s}{'cheapest':>9s}"]
    for r in rows:
        clk = r["clocks_per_element"]
        cells = "".join((f"{clk[c]:7.3f}" + ("*" if c == r["binding"] else " ")) if c in clk else f"{'-':>7s} "
                        for c in cols)
        lines.append(f"{r['kernel']:14s}{r['binding']:>17s}{r['bound']:7.3f}{cells}"
                     f"{r['near_diagonal_path']['bound']:8.3f} {short[r['near_diagonal_path']['binding']]:>8s}"
                     f"{r['cheapest_path']['bound']:9.3f}")
    return "\n".join(lines)


def format_check(check: dict) -> str:
    lines = []
    for device, entry in check["devices"].items():
        for which, c in entry.items():
            if not isinstance(c, dict) or "lengths" not in c:
                continue
            at = c["lengths"].get(str(c["check_length"]))
            if at is None:
                continue
            ordered = sorted(at["rows"].items(), key=lambda kv: kv[1]["measured_clocks_per_element"])
            rows = ", ".join(f"{n} {v['model_bound']:.3f}/{v['measured_clocks_per_element']:.3f}" for n, v in ordered)
            lines.append(f"{device} {which} at {c['check_length']}: ranking "
                         f"{'matches' if at['ranking']['matches'] else 'DOES NOT match'} (bound/measured: {rows})")
            if "series_against_exact" in at:
                lines.append(f"  series / exact d^α, model vs GPU: {at['series_against_exact']}")
        if "change_since_last_commit" in entry:
            lines.append(f"{device} change since the last commit (model vs GPU ratio, vs SDPA): "
                         f"{entry['change_since_last_commit']['rows']}")
    return "\n".join(lines)


def measured_check_for(kernels_now: list[dict], compile_revs: bool, jobs: int | None,
                       repo: Path = HERE.parent) -> dict:
    """`measured_check` with each timing JSON's own binaries: the working tree's (`kernels_now`) where the JSON
    differs from the last commit, else those of the commit that last wrote it (compiled when `compile_revs`);
    for a changed JSON the committed one and its binaries too."""
    compiled: dict[str, list[dict]] = {}

    def kernels_of(rev: str | None) -> list[dict] | None:
        if rev == "worktree":
            return kernels_now
        if rev is None or not compile_revs:
            return None
        if rev not in compiled:
            compiled[rev] = kernels_at_rev(repo, rev, 90, (128,), jobs)
        return compiled[rev]

    measured, previous = {}, {}
    for device, (fname, _) in TIMING_FILES.items():
        source = timing_source(repo, fname)
        measured[device] = (kernels_of(source), source)
        if source == "worktree":
            rel = f"benchmarks/results/{fname}"
            committed = _git(repo, "show", f"HEAD:{rel}")
            rev = (_git(repo, "log", "-1", "--format=%H", "--", rel) or "").strip() or None
            before = kernels_of(rev)
            if committed and before is not None:
                previous[device] = (json.loads(committed), before)
    return measured_check(kernels_now, measured, previous=previous)


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", nargs="+", type=int, default=[90, 80])
    ap.add_argument("--head-dim", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--measured-rev", choices=["auto", "none"], default="auto",
                    help="auto: compile the package each timing JSON measured (the commit that last wrote it, or "
                         "the working tree where the JSON differs from that commit); none: the working tree only")
    ap.add_argument("--package-root", default=str(HERE.parent), help=argparse.SUPPRESS)
    ap.add_argument("--kernels-json", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    # compile for real GPUs: before anything imports the kernels (here, not at import, so that importing this
    # module, as the tests do, leaves the interpreter setting of the importing process alone)
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    root = Path(a.package_root).resolve()
    sys.path.insert(0, str(root))
    if a.kernels_json:  # the subprocess of kernels_at_rev: the kernel list of the package at root, nothing else
        baseline = root / "benchmarks" / "flash_baseline.py"
        kernels = build_kernels(a.arch[0], tuple(a.head_dim), a.jobs, str(baseline if baseline.exists() else BASELINE))
        Path(a.kernels_json).write_text(json.dumps(kernels))
        return []
    out = []
    for arch in a.arch:
        report = build_report(arch, tuple(a.head_dim), a.jobs)
        if arch == 90:
            report["pipe_model"]["measured_check"] = measured_check_for(report["kernels"], a.measured_rev == "auto",
                                                                        a.jobs)
        else:
            report["pipe_model"]["measured_check"] = "no measured rows for this arch (no A100 timing JSON)"
        path = Path(a.out_dir) / f"kernels-static-sm{arch}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        for d, s in report["summary"].items():
            print(f"sm_{arch} {d}: {s['instructions_per_score_element']} ratios {s['ratio_to_baseline']} "
                  f"targets {s['targets']}")
        if 128 in a.head_dim:
            print(format_table(report, 128))
        if isinstance(report["pipe_model"]["measured_check"], dict):
            print(format_check(report["pipe_model"]["measured_check"]))
        out.append(path)
    return out


if __name__ == "__main__":
    main()
