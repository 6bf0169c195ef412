"""`run_selftest`: the kernel checks, then the timing, on this machine's GPU (or CPU through the interpreter)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from hf_posenc_cli.vocabulary import SELFTEST_SIZES as SIZES  # the command line's --size

from . import checks as checks_mod
from ..kernels import timing as timing_mod
from .environment import device_name, interpreting, needs_fresh_process, resolve_device, versions
from .report import SelftestReport, TimingRow

DEFAULT_DTYPES = {"cuda": ("bf16", "fp16"), "cpu": ("fp32", "fp16")}


@dataclass(frozen=True)
class TimingPlan:
    """Shapes of the timing part: batch = max(1, tokens // length) for prefill, decode_batch for decode."""

    lengths: tuple[int, ...]
    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    repeats: int
    warmup: int
    decode_batch: int


TIMING = {
    "realistic": TimingPlan(lengths=(1024, 2048, 4096, 8192, 16384), tokens=16384, q_heads=32, kv_heads=8,
                            head_dim=128, repeats=5, warmup=2, decode_batch=8),
    "small": TimingPlan(lengths=(64, 128), tokens=128, q_heads=4, kv_heads=2, head_dim=32, repeats=2, warmup=1,
                        decode_batch=2),
    "tiny": TimingPlan(lengths=(32,), tokens=32, q_heads=2, kv_heads=1, head_dim=16, repeats=1, warmup=0,
                       decode_batch=1),
}


def run_selftest(
    device: str | torch.device | None = None,
    *,
    size: str | None = None,
    dtypes: tuple[str, ...] | list[str] | None = None,
    lengths: tuple[int, ...] | list[int] | None = None,
    repeats: int | None = None,
    only: tuple[str, ...] | list[str] = (),
    checks: bool = True,
    timing: bool = True,
    json_path: str | Path | None = None,
    progress: bool = True,
) -> SelftestReport:
    """Check every kernel against its reference, then time TAPA and TAPE against RoPE + SDPA flash.

    device: "cuda" or "cpu" (default: CUDA when available). size: "realistic" (default on CUDA: L = 1024
    checks, 1k–16k timing), "small" (default on CPU) or "tiny". dtypes: checked dtypes (default bf16+fp16
    on CUDA, fp32+fp16 on CPU, where the interpreter has no bf16); the timing runs in the first. only: run
    just the checks whose name contains one of these strings. json_path: also write the report there.

    On CPU the kernels must run in the Triton interpreter, which can only be switched on before `triton` is
    first imported; when this process was started without TRITON_INTERPRET=1 the selftest runs in a fresh
    `python -m hf_posenc.selftest` process with it set, and its report is read back."""
    dev = resolve_device(device)
    size = size or ("realistic" if dev.type == "cuda" else "small")
    dtypes = tuple(dtypes or DEFAULT_DTYPES[dev.type])
    _check_options(dev, size, dtypes, timing)
    plan = _timing_plan(size, lengths, repeats)
    if needs_fresh_process(dev):
        argv = selftest_argv(dev.type, size, dtypes, plan.lengths if lengths else None, repeats, only, checks, timing,
                             progress)
        return _run_in_fresh_process(argv, json_path)

    cases = _selected_cases(size, dtypes, dev, only) if checks else []
    units = [(f, mode, n) for n in plan.lengths for f in checks_mod.families() for mode in f.TIMING] if timing else []
    report = SelftestReport(
        device=dev.type, device_name=device_name(dev), interpreter=interpreting(), size=size, dtypes=list(dtypes),
        versions=versions(), started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        timing_shape={**asdict(plan), "dtype": dtypes[0], "causal": True},
        timing_note=_timing_note(dev),
    )
    _run_steps(report, cases, units, plan, checks_mod.DTYPES[dtypes[0]], dev, progress)
    if json_path is not None:
        report.write_json(json_path)
    return report


def _check_options(dev: torch.device, size: str, dtypes: tuple[str, ...], timing: bool) -> None:
    """Refuse a size, dtype or dtype order this device cannot run, naming the fix."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    for dt in dtypes:
        if dt not in checks_mod.DTYPES:
            raise ValueError(f"unknown dtype {dt!r}; pick from {sorted(checks_mod.DTYPES)}")
    if dev.type == "cpu" and "bf16" in dtypes:
        raise ValueError("bf16 needs a GPU: the Triton interpreter has no bf16; check fp32 and fp16 on CPU")
    if dev.type == "cuda" and timing and dtypes[0] == "fp32":
        raise ValueError("the timing runs in the first dtype listed, and SDPA's flash backend takes only bf16/fp16 "
                         "on CUDA: list bf16 or fp16 first (e.g. --dtypes bf16 fp32) or pass --no-timing")


def _timing_plan(size: str, lengths: tuple[int, ...] | list[int] | None, repeats: int | None) -> TimingPlan:
    """The size's :data:`TIMING` plan with the lengths and repeats asked for, if any."""
    plan = TIMING[size]
    if lengths:
        if min(lengths) <= 0:
            raise ValueError(f"lengths must be positive, got {list(lengths)}")
        plan = replace(plan, lengths=tuple(int(n) for n in lengths))
    if repeats is not None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        plan = replace(plan, repeats=int(repeats))
    return plan


def _selected_cases(size: str, dtypes: tuple[str, ...], dev: torch.device, only: tuple[str, ...] | list[str]) -> list:
    """The size's kernel checks in these dtypes, only those whose name contains one of ``only`` when given (none
    matching is refused)."""
    cases = checks_mod.build_cases(checks_mod.SHAPES[size], dtypes, dev)
    if only:
        cases = [c for c in cases if any(s in c.name for s in only)]
        if not cases:
            raise ValueError(f"no check name contains any of {list(only)}; names look like 'tapa/decode/D128/bf16'")
    return cases


def _run_steps(report: SelftestReport, cases: list, units: list, plan: TimingPlan, dtype: torch.dtype,
               dev: torch.device, progress: bool) -> None:
    """Run the checks, then the timing units, into ``report`` behind one progress bar; sets its duration."""
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    with tqdm(total=len(cases) + len(units), desc="selftest", unit="step", file=sys.stderr,
              disable=not progress) as bar:
        for case in cases:
            bar.set_postfix_str(case.name)
            report.checks.append(checks_mod.run_case(case, dev))
            bar.update()
        for family, mode, length in units:
            bar.set_postfix_str(f"timing {next(iter(family.KERNELS))} {mode} L={length}")
            report.timing.extend(_time_unit(family, mode, length, plan, dtype, dev))
            bar.update()
    report.duration_s = time.perf_counter() - t0


def _timing_note(dev: torch.device) -> str:
    if dev.type == "cuda":
        return ("GPU figures: median over round-robin repeats; RoPE = rotation + SDPA restricted to the flash "
                "backend; TFLOP/s = causal matmul FLOPs (x3.5 for fwd_bwd) / time")
    return ("CPU/interpreter figures, NOT GPU performance: the Triton kernels run in the Triton interpreter "
            "(TRITON_INTERPRET=1) and RoPE runs through the CPU flash SDPA; they only show the timing code works")


def _time_unit(family, mode: str, length: int, plan: TimingPlan, dtype: torch.dtype,
               dev: torch.device) -> list[TimingRow]:
    """Time one (family, mode, length); an exception becomes an error row (and fails the selftest)."""
    kernel, batch = next(iter(family.KERNELS)), plan.decode_batch if mode == "decode" else max(1, plan.tokens // length)
    try:
        results = family.time_unit(mode, length, batch, plan, dtype, dev)
        if "error" in results:
            return [TimingRow(kernel, mode, length, batch, "-", error=results["error"])]
        results = {family.LABELS.get(name, name): r for name, r in results.items()
                   if isinstance(r, dict)}  # skips flags such as "fused_meets_target"
        base = results[timing_mod.ROPE]["median_ms"]
    except Exception as exc:  # noqa: BLE001 -- reported as an error row and a selftest failure
        return [TimingRow(kernel, mode, length, batch, "-", error=f"{type(exc).__name__}: {exc}".strip()[:2000])]
    return [TimingRow(kernel, mode, length, batch, label, median_ms=r["median_ms"], tflops=r.get("tflops"),
                      tokens_per_s=r.get("tokens_per_s"), peak_mem_bytes=r.get("peak_mem_bytes"),
                      vs_rope=r["median_ms"] / base) for label, r in results.items()]


# -- Re-running in a fresh process (CPU without TRITON_INTERPRET=1 at start-up) -------------------------------


def selftest_argv(device: str, size: str | None, dtypes, lengths, repeats, only, checks: bool, timing: bool,
                  progress: bool) -> list[str]:
    """Command-line arguments of `python -m hf_posenc.selftest` for these options."""
    argv = ["--device", device]
    if size:
        argv += ["--size", size]
    if dtypes:
        argv += ["--dtypes", *dtypes]
    if lengths:
        argv += ["--lengths", *map(str, lengths)]
    if repeats is not None:
        argv += ["--repeats", str(repeats)]
    for s in only:
        argv += ["--only", s]
    if not checks:
        argv.append("--no-checks")
    if not timing:
        argv.append("--no-timing")
    if not progress:
        argv.append("--no-progress")
    return argv


def rerun_with_interpreter(argv: list[str]) -> int:
    """Run `python -m hf_posenc.selftest ARGV` with TRITON_INTERPRET=1; returns its exit status."""
    print("hf-posenc selftest: Triton reads TRITON_INTERPRET when it is first imported, so the CPU selftest "
          "re-runs itself in a fresh process with TRITON_INTERPRET=1 set", file=sys.stderr, flush=True)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "hf_posenc.selftest", *argv], env=env).returncode


def _run_in_fresh_process(argv: list[str], json_path: str | Path | None) -> SelftestReport:
    import json

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(json_path) if json_path is not None else Path(tmp) / "selftest.json"
        path.unlink(missing_ok=True)  # so a report left by an earlier run is never read back as this one
        code = rerun_with_interpreter([*argv, "--json", str(path)])
        if not path.exists():
            raise RuntimeError(f"the selftest process exited with status {code} without writing its report "
                               "(see its output above)")
        return SelftestReport.from_dict(json.loads(path.read_text()))
