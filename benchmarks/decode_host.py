"""Host cost of ONE eager decode call of the Triton ops, apart from kernel execution (CPU proxy).

Decode is host-bound on a GPU: the TAPA decode kernels take 0.03-0.21 ms, but an eager call spent about 0.41 ms on
the host, paid once per layer per token under Transformers' ``generate``. This script measures, on the CPU, what
that host time is made of, for TAPA (default positions, and explicit int64 positions as the TAPA scheme passes
them) and TAPE decode (B=8, Hq=32, Hkv=8, D=128, one query, L keys):

- ``aten_ops``: the ATen ops one call dispatches (counted with a ``TorchDispatchMode``), split into ``compute``
  (each one a CUDA kernel launch on a GPU, about 5 us of host time each), ``alloc`` (``empty*``: the caching
  allocator, no launch) and ``view`` (metadata only);
- ``triton_launches``: the ``LaunchSpec.launch`` calls (each one a Triton kernel launch on a GPU);
- ``host_us``: median wall time of one call with every Triton launch replaced by a no-op, so what is timed is the
  Python host path (validation, positions, planning) and the ATen ops, run on CPU tensors.

The launches are planned for an H100 (``Target.gpu(90)``, its tile tables and split-K: ``--target sm90``, the
default) or for the interpreter (``--target interpreter``); nothing runs in the interpreter (TRITON_INTERPRET=1
only lets the ops' device checks pass CPU tensors). The kernels are imported as a GPU process holds them
(``--kernels jit``, the default: JITFunction objects) or as the CPU tests do (``--kernels interpreter``), whose
launch planning used to pay for introspection a GPU process does not.

These are CPU proxies: on a GPU each compute op is a CUDA launch (its host cost is not what the CPU op costs here:
at L = 16384 the CPU computes the position arithmetic over 8 x 16k entries itself) and each Triton launch goes
through Triton's launcher; neither is timed here, so the GPU host time per call remains to be measured.

Writes benchmarks/results/decode_host-<cpu>.json, keeping the other label's runs, so one file holds the figures
before and after a change side by side (``--label before`` on the old code, ``--label after`` on the new).
On a GPU, ``--device cuda`` times the same calls with real launches (host time = the time a call takes to return
with the device idle before it), beside RoPE + SDPA, and writes benchmarks/results/decode_host-<gpu>.json (or
--json): the measurement the CPU proxy stands in for.

Usage: python benchmarks/decode_host.py [--label after] [--kernels jit] [--target sm90] [--lengths 1024 16384]
       [--calls 400] [--smoke] [--profile]
       python benchmarks/decode_host.py --device cuda [--json out.json]   # on a GPU
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# --kernels: how the Triton kernels are imported, decided before anything imports Triton. "jit" (the default): as
# a GPU process holds them (JITFunction objects; TRITON_INTERPRET=1 is set only after the import, so the ops' device
# checks accept CPU tensors); "interpreter": TRITON_INTERPRET=1 from the start (InterpretedFunction objects, as the
# CPU tests run them; their launch planning pays for some introspection a GPU process does not).
KERNELS = "interpreter" if "--kernels=interpreter" in sys.argv or (
    "--kernels" in sys.argv and sys.argv[sys.argv.index("--kernels") + 1:][:1] == ["interpreter"]) else "jit"
if KERNELS == "interpreter":
    os.environ["TRITON_INTERPRET"] = "1"
else:
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, device_name, slug  # noqa: E402
from hf_posenc.kernels._triton import launch as _launch  # noqa: E402
from hf_posenc.kernels.tapa import tapa_attention_triton  # noqa: E402
from hf_posenc.kernels.tape import tape_attention_triton  # noqa: E402

CUDA = "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cuda"]
if not CUDA:  # read at call time by the ops' device checks (no kernel runs: planned_only)
    os.environ["TRITON_INTERPRET"] = "1"

FULL = dict(B=8, H=32, Hkv=8, D=128, lengths=(1024, 16384), calls=400, warmup=40)
SMOKE = dict(B=1, H=4, Hkv=2, D=32, lengths=(64,), calls=5, warmup=1)


class AtenCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched under it, by overload name."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        self.ops[str(func)] += 1
        self.kinds[op_kind(func, name)] += 1
        return func(*args, **(kwargs or {}))


def op_kind(func, name: str) -> str:
    """"view" (metadata only), "alloc" (an allocation, no kernel) or "compute" (a kernel launch on a GPU)."""
    if func.is_view or name in ("view", "_unsafe_view", "alias", "as_strided", "expand", "slice", "select",
                                "t", "transpose", "detach", "unsqueeze", "squeeze"):
        return "view"
    if name.startswith("empty") or name in ("new_empty", "new_empty_strided"):
        return "alloc"
    return "compute"


@contextmanager
def planned_only(target: _launch.Target, launches: list[str]):
    """Every `LaunchSpec.launch` records its name instead of running, and the ops plan for `target`."""
    real_launch, real_of = _launch.LaunchSpec.launch, _launch.Target.__dict__["of"]

    def record(self):
        launches.append(self.name)

    _launch.LaunchSpec.launch = record
    _launch.Target.of = classmethod(lambda cls, t: target)
    try:
        yield
    finally:
        _launch.LaunchSpec.launch = real_launch
        _launch.Target.of = real_of


def cases(B: int, H: int, Hkv: int, D: int, L: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The calls timed: TAPA with default positions, TAPA with the positions its scheme builds at a decode step
    without padding (`schemes/tapa/attention._positions`; built before the call, and built in it as the scheme
    does in every layer), TAPE; on CUDA also the baseline, RoPE on the new query + SDPA over a cache of rotated
    keys (as the selftest's decode row)."""
    from hf_posenc.kernels.timing import apply_rope, rope_tables, sdpa_flash
    from hf_posenc.schemes.tapa.attention import _positions

    # CPU: torch.empty, the pages of a large cache are never touched (no kernel runs), so L = 16k costs no memory
    make = torch.randn if device.type == "cuda" else torch.empty
    q = make(B, H, 1, D, dtype=dtype, device=device)
    k, v, e = (make(B, Hkv, L, D, dtype=dtype, device=device) for _ in range(3))
    position_ids = torch.tensor([[L - 1]], device=device)

    def tapa(q_pos, k_pos):
        return tapa_attention_triton(q, k, v, alpha=0.1, theta=0.5, phase="quadratic", causal=True,
                                     q_positions=q_pos, k_positions=k_pos, key_padding_mask=None,
                                     q_segment_ids=None, k_segment_ids=None)

    positions = _positions(position_ids, None, B, 1, L, device)
    out = {
        "tapa_default_positions": lambda: tapa_attention_triton(q, k, v),
        "tapa_scheme_positions": lambda: tapa(*positions),  # the scheme's positions, built before the call
        "tapa_scheme_step": lambda: tapa(*_positions(position_ids, None, B, 1, L, device)),  # ... built in it
        "tape": lambda: tape_attention_triton(q, k, v, e, scale=None, causal=True, key_padding_mask=None),
    }
    if device.type == "cuda":
        cos, sin = rope_tables(L, D, device, dtype)
        cos1, sin1 = cos[-1:], sin[-1:]
        out["rope_sdpa"] = lambda: sdpa_flash(apply_rope(q, cos1, sin1), k, v, causal=False)
    return out


@contextmanager
def counted(launches: list[str]):
    """Every `LaunchSpec.launch` records its name and runs (real launches on the GPU)."""
    real_launch = _launch.LaunchSpec.launch

    def record(self):
        launches.append(self.name)
        real_launch(self)

    _launch.LaunchSpec.launch = record
    try:
        yield
    finally:
        _launch.LaunchSpec.launch = real_launch


def measure_cuda(fn, calls: int, warmup: int) -> dict:
    """On a GPU, real launches: `host_us` is the time one call takes to return with the device idle before it (its
    kernels only queued: host time, launches included), `call_us` the time to its end on the device (synchronised)."""
    launches: list[str] = []
    with torch.no_grad(), counted(launches):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        launches.clear()
        counter = AtenCounter()
        with counter:
            fn()
        per_call = list(launches)
        host, call = [], []
        for _ in range(calls):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            fn()
            t1 = time.perf_counter_ns()
            torch.cuda.synchronize()
            host.append(t1 - t0)
            call.append(time.perf_counter_ns() - t0)
    return {
        "host_us": statistics.median(host) / 1e3,
        "host_us_p10": sorted(host)[len(host) // 10] / 1e3,
        "call_us": statistics.median(call) / 1e3,
        "aten_ops": sum(counter.ops.values()),
        "aten_ops_by_kind": dict(sorted(counter.kinds.items())),
        "aten_ops_by_name": dict(sorted(counter.ops.items())),
        "triton_launches": len(per_call),
        "launch_names": per_call,
    }, None


def measure(fn, calls: int, warmup: int, target: _launch.Target, profile: bool) -> dict:
    launches: list[str] = []
    with torch.no_grad(), planned_only(target, launches):  # generate runs under no_grad
        for _ in range(warmup):
            fn()
        launches.clear()
        counter = AtenCounter()
        with counter:
            fn()
        per_call = list(launches)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t0)
        stats = None
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                fn()
            prof.disable()
            stats = pstats.Stats(prof)
    row = {
        "host_us": statistics.median(samples) / 1e3,
        "host_us_p10": sorted(samples)[len(samples) // 10] / 1e3,
        "aten_ops": sum(counter.ops.values()),
        "aten_ops_by_kind": dict(sorted(counter.kinds.items())),
        "aten_ops_by_name": dict(sorted(counter.ops.items())),
        "triton_launches": len(per_call),
        "launch_names": per_call,
    }
    return row, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="after", help="the run's name in the JSON (before / after)")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--calls", type=int)
    parser.add_argument("--target", choices=("sm90", "sm80", "interpreter"), default="sm90")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few calls, no JSON written")
    parser.add_argument("--profile", action="store_true", help="print the top functions by own time (cProfile)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the ops are tiny)")
    parser.add_argument("--kernels", choices=("jit", "interpreter"), default="jit",
                        help="kernel objects as a GPU process holds them (jit) or as the CPU tests do (interpreter)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the proxy (launches replaced by a no-op); cuda: real launches on the GPU, host "
                             "time measured as the time a call takes to return, beside RoPE + SDPA's")
    parser.add_argument("--json", default=None, help="with --device cuda: where to write (default: results/)")
    args = parser.parse_args()
    if args.device == "cuda":
        return main_cuda(args)
    torch.set_num_threads(args.threads)
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.lengths:
        cfg["lengths"] = tuple(args.lengths)
    if args.calls:
        cfg["calls"] = args.calls
    target = _launch.INTERPRETER if args.target == "interpreter" else _launch.Target.gpu(int(args.target[2:]))
    dtype = getattr(torch, args.dtype)
    runs = []
    for L in cfg["lengths"]:
        for name, fn in cases(cfg["B"], cfg["H"], cfg["Hkv"], cfg["D"], L, dtype, torch.device("cpu")).items():
            row, stats = measure(fn, cfg["calls"], cfg["warmup"], target, args.profile)
            runs.append({"case": name, "L": L, **row})
            kinds = row["aten_ops_by_kind"]
            print(f"{name:<24} L={L:<6} host {row['host_us']:8.1f} us  aten ops {row['aten_ops']:3d} "
                  f"(compute {kinds.get('compute', 0)}, alloc {kinds.get('alloc', 0)}, view {kinds.get('view', 0)})"
                  f"  triton launches {row['triton_launches']} {row['launch_names']}")
            if stats is not None:
                stats.sort_stats("tottime").print_stats(25)
    if args.smoke:
        return
    path = RESULTS / f"decode_host-{slug(device_name(torch.device('cpu')))}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    labels = dict(old.get("runs", {}))
    label = args.label if KERNELS == "jit" else f"{args.label}-interpreter-kernels"
    labels[label] = {"git": git_head(), "kernels": KERNELS, "runs": runs}
    payload = {
        "device": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "what": "host cost of one eager decode call, Triton launches replaced by a no-op, CPU tensors (a proxy: on "
                "a GPU each 'compute' ATen op is one CUDA launch, ~5 us of host time, and each Triton launch goes "
                "through Triton's launcher; neither is timed here)",
        "config": {"B": cfg["B"], "Hq": cfg["H"], "Hkv": cfg["Hkv"], "D": cfg["D"], "Lq": 1, "dtype": args.dtype,
                   "planned_for": args.target, "kernels": KERNELS, "calls": cfg["calls"], "warmup": cfg["warmup"],
                   "threads": args.threads, "grad_mode": "no_grad"},
        "runs": labels,
    }
    for suffix in ("", "-interpreter-kernels"):  # [before, after] per case, for each way of importing the kernels
        if f"before{suffix}" in labels and f"after{suffix}" in labels:
            payload[f"side_by_side{suffix.replace('-', '_')}"] = side_by_side(labels[f"before{suffix}"]["runs"],
                                                                             labels[f"after{suffix}"]["runs"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")


def main_cuda(args) -> None:
    """The GPU run: real host time per eager call at 1k-16k cached tokens (the target: at most 0.15 ms per call for
    TAPA), against RoPE + SDPA in the same run."""
    device = torch.device("cuda")
    cfg = dict(SMOKE if args.smoke else FULL)
    cfg["lengths"] = tuple(args.lengths) if args.lengths else (1024, 4096, 16384)
    if args.calls:
        cfg["calls"] = args.calls
    dtype = getattr(torch, args.dtype)
    runs = []
    for L in cfg["lengths"]:
        for name, fn in cases(cfg["B"], cfg["H"], cfg["Hkv"], cfg["D"], L, dtype, device).items():
            row, _ = measure_cuda(fn, cfg["calls"], cfg["warmup"])
            runs.append({"case": name, "L": L, **row})
            print(f"{name:<24} L={L:<6} host {row['host_us']:8.1f} us  call {row['call_us']:8.1f} us  "
                  f"aten ops {row['aten_ops']:3d} {row['aten_ops_by_kind']}  triton launches {row['triton_launches']}")
        del fn
        torch.cuda.empty_cache()
    name = device_name(device)
    payload = {"device": name, "torch": torch.__version__, "triton": triton.__version__, "git": git_head(),
               "what": "one eager decode call on the GPU, real launches: host_us = time for the call to return with "
                       "the device idle before it (host work and launches; kernels only queued), call_us = time to "
                       "its end on the device; medians",
               "config": {"B": cfg["B"], "Hq": cfg["H"], "Hkv": cfg["Hkv"], "D": cfg["D"], "Lq": 1,
                          "dtype": args.dtype, "calls": cfg["calls"], "warmup": cfg["warmup"],
                          "grad_mode": "no_grad"},
               "target_host_us": 150.0, "runs": runs}
    path = Path(args.json) if args.json else RESULTS / f"decode_host-{slug(name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")


def side_by_side(before: list[dict], after: list[dict]) -> list[dict]:
    old = {(r["case"], r["L"]): r for r in before}
    rows = []
    for r in after:
        b = old.get((r["case"], r["L"]))
        if b is None:
            continue
        rows.append({
            "case": r["case"], "L": r["L"],
            "host_us": [round(b["host_us"], 1), round(r["host_us"], 1)],
            "aten_ops": [b["aten_ops"], r["aten_ops"]],
            "aten_compute_ops": [b["aten_ops_by_kind"].get("compute", 0), r["aten_ops_by_kind"].get("compute", 0)],
            "triton_launches": [b["triton_launches"], r["triton_launches"]],
        })
    return rows


def git_head() -> str:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=root, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hf_posenc/kernels"], capture_output=True,
                               text=True, cwd=root, check=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
