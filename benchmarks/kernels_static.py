"""Static kernel report: what the compiled GPU binaries of the TAPA / TAPE kernels spend per score element.

No GPU runs here. Every kernel is planned by its own host code for an A100 (sm_80) or H100 (sm_90) target and
compiled with Triton's bundled ptxas (the compile lane, `hf_posenc.kernels.compile_lane`); registers, spills and
shared memory come from `cuobjdump -res-usage`, the instruction mix from `nvdisasm` SASS:

* the inner loops are the SASS regions closed by a backward branch that contain no other loop; those with
  tensor-core instructions (HMMA / HGMMA) are the attention loops. The steady-state (unmasked) loop is the one
  whose shortest path through forward branches is shortest; the masked loop (causal diagonal, window edge,
  padding) is reported beside it;
* per score element = instructions on that path × threads per program / (BLOCK_M × BLOCK_N), split into
  special-function (MUFU), FMA/ALU (float and integer datapath), tensor core (HMMA/HGMMA) and other (memory,
  barriers, uniform-datapath address and descriptor arithmetic, control);
* a plain causal FlashAttention-2 forward built from the same pieces and tiles (benchmarks/flash_baseline.py)
  is the baseline: ratios are per score element against it.

Writes benchmarks/results/kernels-static-sm90.json and -sm80.json (bf16, head dims 64 / 128 / 256, both TAPA
phase modes). Takes a few minutes on 2 cores from an empty Triton cache.

Usage: python benchmarks/kernels_static.py [--arch 90 80] [--head-dim 64 128 256] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for real GPUs (must precede the kernel imports)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BASELINE = str(HERE / "flash_baseline.py")

_INS = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRA = re.compile(r"\bBRA(?:\.\w+)*\s+`\((\.L_x_\d+)\)")
TENSOR = {"HMMA", "HGMMA", "IMMA"}
NOT_ALU = {"FENCE"}
ALU_EXTRA = {"LOP3", "SEL", "SHF", "LEA", "VIADD", "PRMT", "MOV", "PLOP3", "P2R", "R2P", "SGXT", "BMSK", "POPC",
             "FLO", "BREV", "VIMNMX", "VIADDMNMX", "IMNMX"}


def parse_sass(text: str) -> tuple[list[dict], dict[str, int]]:
    """Instructions (opcode, predicated?, branch target) and label positions of nvdisasm output."""
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
            items.append(dict(op=m.group(2), pred=m.group(1) is not None, target=b.group(1) if b else None))
    return items, labels


def inner_loops(items: list[dict], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) instruction of every loop (label ... backward branch to it) that holds no other loop."""
    loops = [(labels[it["target"]], i) for i, it in enumerate(items)
             if it["target"] in labels and labels[it["target"]] <= i]
    return [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]


def shortest_path(items: list[dict], labels: dict[str, int], a: int, b: int) -> list[int]:
    """Instructions executed on the shortest path from a to the loop's back branch b (forward branches only)."""
    best: dict[int, tuple[int, int | None]] = {a: (1, None)}
    for i in range(a, b + 1):
        if i not in best:
            continue
        it = items[i]
        succ = []
        if i != b:
            if it["op"] == "BRA" and it["target"] in labels and a < labels[it["target"]] <= b:
                succ.append(labels[it["target"]])
                if it["pred"]:
                    succ.append(i + 1)
            elif it["op"] != "BRA" or it["pred"]:
                succ.append(i + 1)
        for j in succ:
            if j <= b and (j not in best or best[i][0] + 1 < best[j][0]):
                best[j] = (best[i][0] + 1, i)
    path, i = [], b
    while i is not None:
        path.append(i)
        i = best[i][1]
    return path[::-1]


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


def analyse(record, sass_text: str) -> dict:
    items, labels = parse_sass(sass_text)
    bm, bn = record.constexprs["BLOCK_M"], record.constexprs["BLOCK_N"]
    threads = record.num_warps * 32
    mma = [(a, b) for a, b in inner_loops(items, labels) if any(items[i]["op"] in TENSOR for i in range(a, b + 1))]
    if not mma:
        return {}
    paths = sorted((shortest_path(items, labels, a, b) for a, b in mma), key=len)
    out = {"steady_state_loop": loop_mix(items, paths[0], threads, bm * bn)}
    if len(paths) > 1:
        out["masked_loop"] = loop_mix(items, paths[-1], threads, bm * bn)
    return out


def _nvdisasm(cubin: str) -> str:
    from hf_posenc.kernels._triton import _tool

    return subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True).stdout


KERNEL_NAMES = {"tapa_fwd": "TAPA forward", "tapa_bwd": "TAPA backward, fused (dK/dV/dQ, atomic dQ; the default)",
                "tapa_bwd_dkdv": "TAPA backward dK/dV (deterministic backward)",
                "tapa_bwd_dq": "TAPA backward dQ (deterministic backward)",
                "tapa_decode": "TAPA decode (split-K)", "tape_fwd": "TAPE forward",
                "tape_bwd_dkdv": "TAPE backward dK/dV/dE",
                "tape_bwd_dq": "TAPE backward dQ", "tape_decode": "TAPE decode (split-K)",
                "flash_fwd": "baseline causal FlashAttention-2 forward (TAPA forward tiles)",
                "flash_fwd_tape_tiles": "baseline causal FlashAttention-2 forward (TAPE forward tiles)"}


def build_report(arch: int, head_dims, jobs: int | None) -> dict:
    import torch
    import triton

    from hf_posenc.kernels.compile_lane import FAMILIES, run_lane

    with tempfile.TemporaryDirectory() as tmp:
        records = run_lane(FAMILIES + (BASELINE,), (arch,), ("bfloat16",), head_dims, jobs, cubin_dir=tmp)
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
                entry.update(analyse(r, _nvdisasm(r.cubin)))
            kernels.append(entry)
    kernels.sort(key=lambda e: (e["head_dim"], e["kernel"], e["linear_phase"], -(e["theta"] or 0.5)))

    def per_el(name, d):
        for e in kernels:
            if (name == e["kernel"] or name in e["same_binary_as"]) and e["head_dim"] == d and not e["linear_phase"] \
                    and e["theta"] in (None, 0.5) and "steady_state_loop" in e:
                return e["steady_state_loop"]["per_element_total"]
        return None

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
    return dict(
        static=True,
        note=("Static figures from compiled binaries (Triton -> PTX -> cubin with the bundled ptxas; "
              "cuobjdump / nvdisasm), no GPU run. Per score element = instructions on the steady-state path of "
              "the inner loop x threads per program / (BLOCK_M x BLOCK_N); issued instructions, not timings."),
        arch=f"sm_{arch}", device_model="H100" if arch == 90 else "A100", triton=triton.__version__,
        torch=torch.__version__, dtype="bfloat16",
        theta="summary at 0.5; kernels lists theta 0.25 binaries too",
        method=dict(loop="innermost SASS loop with tensor-core instructions, shortest path through forward "
                         "branches (the masked loop is listed as masked_loop); in the forward kernels (baseline "
                         "included) that path skips the lazy-rescale branch, which runs only when some row's "
                         "maximum grows by more than 2^8 (the first key blocks of a tile, rarely after)",
                    classes=dict(special_function="MUFU", tensor_core="HMMA/HGMMA",
                                 fma_alu="float and integer datapath (F*, H*, I*, LOP3, SEL, SHF, LEA, ...)",
                                 other="memory, barriers/fences, uniform-datapath descriptor and address "
                                       "arithmetic (U*, R2UR), control"),
                    baseline="benchmarks/flash_baseline.py with the TAPA forward tiles (tape_forward_same_tiles: "
                             "with the TAPE forward tiles)"),
        summary=summary, kernels=kernels,
    )


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", nargs="+", type=int, default=[90, 80])
    ap.add_argument("--head-dim", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--out-dir", default=str(RESULTS))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    out = []
    for arch in a.arch:
        report = build_report(arch, tuple(a.head_dim), a.jobs)
        path = Path(a.out_dir) / f"kernels-static-sm{arch}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        for d, s in report["summary"].items():
            print(f"sm_{arch} {d}: {s['instructions_per_score_element']} ratios {s['ratio_to_baseline']} "
                  f"targets {s['targets']}")
        out.append(path)
    return out


if __name__ == "__main__":
    main()
