"""``hf-posenc experiment NAME [--size toy|small] [--seeds N] [--out DIR] [--work DIR]``: run a miniature
reproduction and write ``results.json``, ``results.md`` and a PNG to ``--out``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .config import SIZES

EXPERIMENTS = ("length_generalisation",)


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``experiment`` sub-command's arguments to ``parser``."""
    parser.add_argument("name", choices=EXPERIMENTS, help="which experiment")
    parser.add_argument("--size", choices=SIZES, default="small",
                        help="toy: seconds (smoke test); small: the committed results (default)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per scheme (default 3)")
    parser.add_argument("--out", help="where results.json/.md/.png go (default out/experiments/NAME-SIZE)")
    parser.add_argument("--work", help="where runs are trained and cached (default out/experiments/NAME-SIZE/work); "
                                       "a rerun reuses finished runs with the same settings")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def rerun_command(args: argparse.Namespace) -> str:
    """The canonical command line that reproduces this run."""
    parts = ["hf-posenc", "experiment", args.name, "--size", args.size, "--seeds", str(args.seeds)]
    if args.out:
        parts += ["--out", args.out]
    return shlex.join(parts)


def run_experiment(args: argparse.Namespace) -> int:
    """Run the named experiment; returns the exit status."""
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    default = Path("out") / "experiments" / f"{args.name}-{args.size}"
    out = Path(args.out) if args.out else default
    work = Path(args.work) if args.work else default / "work"
    if args.name == "length_generalisation":
        from . import length_generalisation as experiment
        from .config import LengthGeneralisationConfig

        config = LengthGeneralisationConfig.preset(args.size, seeds=args.seeds)
    payload = experiment.run(config, out, work, rerun_command(args), progress=not args.no_progress)
    print("\n".join(payload["verdict"]))
    print(f"results: {out / 'results.md'}", file=sys.stderr)
    return 0
