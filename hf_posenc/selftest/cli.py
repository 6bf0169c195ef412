"""`hf-posenc selftest` (also `python -m hf_posenc.selftest`): arguments and the command.

Importing this module imports no kernel: on CPU the command first makes sure the kernels will run in the
Triton interpreter (re-running itself in a fresh process with TRITON_INTERPRET=1 when needed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .environment import device_name, needs_fresh_process, resolve_device, slug


def add_selftest_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Check every TAPA/TAPE kernel against its float64 reference (bf16/fp16, forward and backward, GQA, "
        "key padding, packed segments, sliding window, linear phase, decode), then time TAPA and TAPE against "
        "RoPE through SDPA's flash backend. On CPU the kernels run in the Triton interpreter at small shapes. "
        "Exits 1 when a check fails, naming it.")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--size", choices=("realistic", "small", "tiny"), default=None,
                   help="shapes: realistic (default on cuda), small (default on cpu), tiny")
    p.add_argument("--dtypes", nargs="+", choices=("bf16", "fp16", "fp32"), default=None,
                   help="dtypes to check; timing uses the first (default: bf16 fp16 on cuda, fp32 fp16 on cpu)")
    p.add_argument("--lengths", nargs="+", type=int, default=None,
                   help="timing lengths (default 1024 2048 4096 8192 16384 on cuda)")
    p.add_argument("--repeats", type=int, default=None, help="timing repeats per candidate (median is reported)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run only the checks whose name contains TEXT (repeatable), e.g. --only tapa/decode")
    p.add_argument("--no-checks", action="store_true", help="skip the kernel checks")
    p.add_argument("--no-timing", action="store_true", help="skip the timing")
    p.add_argument("--json", type=Path, default=None,
                   help="report path (default: hf-posenc-selftest-<device>.json in the current directory)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_selftest_command(args: argparse.Namespace) -> int:
    from .runner import rerun_with_interpreter, run_selftest, selftest_argv

    dev = resolve_device(args.device)
    json_path = args.json or Path(f"hf-posenc-selftest-{slug(device_name(dev))}.json")
    if needs_fresh_process(dev):
        argv = selftest_argv(dev.type, args.size, args.dtypes, args.lengths, args.repeats, args.only,
                             not args.no_checks, not args.no_timing, not args.no_progress)
        return rerun_with_interpreter([*argv, "--json", str(json_path)])
    report = run_selftest(dev, size=args.size, dtypes=args.dtypes, lengths=args.lengths, repeats=args.repeats,
                          only=args.only, checks=not args.no_checks, timing=not args.no_timing, json_path=json_path,
                          progress=not args.no_progress)
    print(report.format(), flush=True)
    print(f"\nwrote {json_path}")
    if not report.passed:
        print(f"hf-posenc selftest FAILED: {', '.join(report.failures)}", file=sys.stderr)
        return 1
    print("hf-posenc selftest passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-posenc selftest")
    add_selftest_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_selftest_command(args)
    except ValueError as exc:
        print(f"hf-posenc selftest: error: {exc}", file=sys.stderr)
        return 2
