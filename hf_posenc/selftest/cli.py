"""`hf-posenc selftest` (also `python -m hf_posenc.selftest`; its arguments: ``hf_posenc_cli.arguments``).

Importing this module imports no kernel: on CPU the command first makes sure the kernels will run in the
Triton interpreter (re-running itself in a fresh process with TRITON_INTERPRET=1 when needed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .environment import device_name, needs_fresh_process, resolve_device, slug


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
    from hf_posenc_cli.arguments import command_parser

    args = command_parser("selftest").parse_args(argv)
    try:
        return run_selftest_command(args)
    except ValueError as exc:
        print(f"hf-posenc selftest: error: {exc}", file=sys.stderr)
        return 2
