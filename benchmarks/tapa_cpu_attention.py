"""TAPA attention on CPU (paper eq. 12): RoPE attention through SDPA vs the TAPA reference vs the chunked TAPA
path, side by side, with SmolLM2-135M's attention shapes (9 query / 3 KV heads, head dim 64, causal, fp32).

For each length: forward (and forward + backward at the smaller lengths) — median wall time of interleaved
runs (round-robin, so load drift hits every candidate alike) and peak resident memory, each case measured once
in a fresh subprocess that imports only torch and the kernels (RSS high-water mark, reset after the inputs are
built so the import's transient peak does not count; also the RSS right before the call, so the working memory
of the call itself is reported too). The reference materialises [B, H, L, L]
scores and runs only where its estimated footprint fits in the memory available. Ratios chunked/SDPA (time,
peak RSS, working memory) and reference/chunked. Records the machine's load average before and after (other
processes share the cores) and writes benchmarks/results/tapa_cpu_attention-<device>.json.

Usage:
  python benchmarks/tapa_cpu_attention.py [--lengths 2048 4096 8192 16384] [--bwd-lengths 2048] [--repeats 3]
  python benchmarks/tapa_cpu_attention.py --smoke     # tiny lengths, seconds, same code paths
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and "--memory-case" in sys.argv:
    # A memory child imports only torch and the kernels (not the package's Transformers-based top level), so every
    # candidate starts from the same small baseline.
    _pkg = types.ModuleType("hf_posenc")
    _pkg.__path__ = [str(ROOT / "hf_posenc")]
    sys.modules["hf_posenc"] = _pkg

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from common import device_name, time_interleaved, write_results  # noqa: E402

from hf_posenc.kernels.tapa import tapa_attention_chunked, tapa_attention_reference  # noqa: E402
from hf_posenc.kernels.timing import apply_rope, rope_tables, sdpa_flash  # noqa: E402

B, HQ, HKV, D = 1, 9, 3, 64  # SmolLM2-135M
CANDIDATES = ("sdpa_rope", "tapa_reference", "tapa_chunked")
TARGETS = {"time_ratio_max": 3.0, "peak_rss_ratio_max": 1.5, "lengths": [8192, 16384]}  # issue #10, part 5
REFERENCE_TEMPORARIES = {"fwd": 6, "fwd_bwd": 12}  # fp32 [B, H, L, L] tensors the reference keeps alive


def make_inputs(L: int, mode: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(L)
    grad = mode == "fwd_bwd"
    q = torch.randn(B, HQ, L, D, generator=g).requires_grad_(grad)
    k = torch.randn(B, HKV, L, D, generator=g).requires_grad_(grad)
    v = torch.randn(B, HKV, L, D, generator=g).requires_grad_(grad)
    do = torch.randn(B, HQ, L, D, generator=g)
    return q, k, v, do


def make_runner(name: str, mode: str, q, k, v, do) -> Callable[[], object]:
    """One call of a candidate: forward under no_grad ("fwd"), or forward + backward to q, k, v ("fwd_bwd")."""
    cos, sin = rope_tables(q.shape[2], D, q.device, q.dtype)
    forwards = {  # RoPE is part of the cost TAPA replaces; SDPA through its flash backend, as on GPU
        "sdpa_rope": lambda: sdpa_flash(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, causal=True),
        "tapa_reference": lambda: tapa_attention_reference(q, k, v),
        "tapa_chunked": lambda: tapa_attention_chunked(q, k, v),
    }
    if name not in forwards:
        raise ValueError(f"unknown candidate {name!r}; pick one of {CANDIDATES}")
    forward = forwards[name]
    if mode == "fwd_bwd":
        return lambda: torch.autograd.grad(forward(), (q, k, v), do)
    return torch.no_grad()(forward)


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def reference_fits(L: int, mode: str) -> tuple[bool, str]:
    need = B * HQ * L * L * 4 * REFERENCE_TEMPORARIES[mode]
    free = available_memory()
    if need > 0.4 * free:  # leave room for the other processes on the machine
        return False, f"needs ~{need / 2**30:.1f} GiB of [B,H,L,L] fp32 temporaries; {free / 2**30:.1f} GiB available"
    return True, ""


def current_rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0), so the peak excludes the transient
    peak of importing torch; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def memory_case(name: str, L: int, mode: str) -> dict:
    """Runs in a fresh process: the high-water RSS of one call (inputs included), and the RSS with only the
    inputs allocated."""
    q, k, v, do = make_inputs(L, mode)
    run = make_runner(name, mode, q, k, v, do)
    before = current_rss()
    reset = reset_peak_rss()
    run()
    peak = peak_rss()
    return {"peak_rss_bytes": peak, "rss_inputs_bytes": before, "working_bytes": peak - before,
            "peak_includes_startup": not reset}


def measure_memory(name: str, L: int, mode: str, threads: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-case", name, str(L), mode,
           "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"memory case {name} L={L} {mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(L: int, mode: str, repeats: int, threads: int, measure_mem: bool) -> dict:
    q, k, v, do = make_inputs(L, mode)
    names = list(CANDIDATES)
    rows: dict[str, dict] = {}
    ok, why = reference_fits(L, mode)
    if not ok:
        names.remove("tapa_reference")
        rows["tapa_reference"] = {"skipped": why}
    runners = {n: make_runner(n, mode, q, k, v, do) for n in names}
    medians, samples = time_interleaved(runners, torch.device("cpu"), repeats, warmup=1)
    for n in names:
        rows[n] = {"median_s": medians[n], "samples_s": samples[n]}
        if measure_mem:
            rows[n].update(measure_memory(n, L, mode, threads))
    sdpa, chunk = rows["sdpa_rope"], rows["tapa_chunked"]
    ratios = {"chunked_over_sdpa_time": chunk["median_s"] / sdpa["median_s"]}
    if measure_mem:
        ratios["chunked_over_sdpa_peak_rss"] = chunk["peak_rss_bytes"] / sdpa["peak_rss_bytes"]
        ratios["chunked_over_sdpa_working_memory"] = chunk["working_bytes"] / max(sdpa["working_bytes"], 1)
    if "median_s" in rows["tapa_reference"]:
        ratios["reference_over_chunked_time"] = rows["tapa_reference"]["median_s"] / chunk["median_s"]
        if measure_mem:
            ref_peak = rows["tapa_reference"]["peak_rss_bytes"]
            ratios["reference_over_chunked_peak_rss"] = ref_peak / chunk["peak_rss_bytes"]
    return {"L": L, "mode": mode, "results": rows, "ratios": ratios}


def targets_met(records: list[dict]) -> dict:
    """Issue #10 part 5: at 8k-16k, chunked TAPA within 3x of SDPA's time and 1.5x of its peak RSS (forward)."""
    out = {}
    for rec in records:
        if rec["mode"] != "fwd" or rec["L"] not in TARGETS["lengths"]:
            continue
        r = rec["ratios"]
        out[str(rec["L"])] = {
            "time": r["chunked_over_sdpa_time"] <= TARGETS["time_ratio_max"],
            "peak_rss": r.get("chunked_over_sdpa_peak_rss", float("inf")) <= TARGETS["peak_rss_ratio_max"],
        }
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--bwd-lengths", type=int, nargs="*", default=[2048], help="forward + backward at these lengths")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the issue measured 2)")
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory measurements")
    ap.add_argument("--smoke", action="store_true", help="tiny lengths, one repeat, memory of the forward: seconds")
    ap.add_argument("--out", type=Path, default=None, help="output JSON (default benchmarks/results/...)")
    ap.add_argument("--memory-case", nargs=3, metavar=("CANDIDATE", "L", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(a.threads)
    try:
        if a.memory_case:
            name, L, mode = a.memory_case
            print(json.dumps(memory_case(name, int(L), mode)))
            return Path()
        return run(a)
    finally:
        torch.set_num_threads(caller_threads)


def run(a: argparse.Namespace) -> Path:
    lengths, bwd_lengths, repeats = a.lengths, a.bwd_lengths, a.repeats
    if a.smoke:
        lengths, bwd_lengths, repeats = [256], [256], 1
    load_before = os.getloadavg()
    started = time.time()
    records = []
    for L in sorted(set(lengths) | set(bwd_lengths)):
        for mode in ("fwd", "fwd_bwd"):
            if (mode == "fwd" and L not in lengths) or (mode == "fwd_bwd" and L not in bwd_lengths):
                continue
            # smoke: fresh-process memory for the forward only (each child pays the torch import)
            measure_mem = not a.no_memory and not (a.smoke and mode == "fwd_bwd")
            rec = bench(L, mode, repeats, a.threads, measure_mem)
            records.append(rec)
            res, rat = rec["results"], rec["ratios"]
            ref = res["tapa_reference"].get("median_s", float("nan"))
            mem = (f"  peak RSS chunked/sdpa {rat['chunked_over_sdpa_peak_rss']:.2f}"
                   if "chunked_over_sdpa_peak_rss" in rat else "")
            print(f"L={L:6d} {mode:8s} sdpa+rope {res['sdpa_rope']['median_s']:8.3f} s  "
                  f"tapa chunked {res['tapa_chunked']['median_s']:8.3f} s  tapa reference {ref:8.3f} s  "
                  f"time chunked/sdpa {rat['chunked_over_sdpa_time']:.2f}{mem}", flush=True)
    payload = {
        "benchmark": "tapa_cpu_attention",
        "shapes": {"batch": B, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "causal": True, "dtype": "float32"},
        "threads": a.threads,
        "repeats": repeats,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg()), "cpus": os.cpu_count()},
        "wall_s": time.time() - started,
        "targets": TARGETS,
        "targets_met": targets_met(records),
        "records": records,
    }
    device = torch.device("cpu")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"device": device_name(device), "torch": torch.__version__, **payload}, indent=2))
        path = a.out
    else:
        path = write_results("tapa_cpu_attention", device, payload)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
