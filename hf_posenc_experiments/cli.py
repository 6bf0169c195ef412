"""``hf-posenc experiment NAME [--size toy|small] [--seeds N] [--first-seed K] [--jobs N] [--out DIR] [--work DIR]
[--check-against RESULTS_JSON] [--render-only]``: run a miniature reproduction and write ``results.json``,
``results.md`` and PNGs to ``--out``; with ``--check-against``, also whether its means reproduce a committed
report's (:mod:`.reproduce`); with ``--render-only``, only rewrite ``results.md`` (and the analysis fields of
``results.json``: verdict, tests, claims) from the ``results.json`` already in ``--out``, training nothing."""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from pathlib import Path

from .config import EXPERIMENT_CONFIGS

# experiment name (also its module, with run(config, out, work, command, progress=...)) -> config class with preset()
CONFIGS = {c.name: c for c in EXPERIMENT_CONFIGS}


def rerun_command(args: argparse.Namespace) -> str:
    """The canonical command line that reproduces this run."""
    parts = ["hf-posenc", "experiment", args.name, "--size", args.size]
    jobs = getattr(args, "jobs", 1)
    for flag, value in (("--seeds", args.seeds), ("--first-seed", args.first_seed), ("--check-against", args.check_against),
                        ("--out", args.out), ("--jobs", jobs if jobs > 1 else None)):
        if value:  # only what differs from the defaults
            parts += [flag, str(value)]
    return shlex.join(parts)


def run_experiment(args: argparse.Namespace) -> int:
    """Run the named experiment; returns the exit status."""
    from .runner import set_jobs

    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    set_jobs(getattr(args, "jobs", 1))
    default = Path("out") / "experiments" / f"{args.name}-{args.size}"
    out = Path(args.out) if args.out else default
    work = Path(args.work) if args.work else default / "work"
    if getattr(args, "render_only", False):
        from .report import rerender

        if args.check_against:
            raise ValueError("--render-only trains nothing, so there is nothing to --check-against")
        found = out / "results.json"
        if found.is_file() and json.loads(found.read_text()).get("experiment") != args.name:
            raise ValueError(f"{found} is not a {args.name!r} report")
        payload = rerender(out)
        print("\n".join(payload["verdict"]))
        print(f"results: {out / 'results.md'} (re-rendered from {out / 'results.json'})", file=sys.stderr)
        return 0
    committed = None
    if args.check_against:
        path = Path(args.check_against)
        if not path.is_file():
            raise FileNotFoundError(f"--check-against {path}: no such results.json")
        committed = json.loads(path.read_text())
        if committed.get("experiment") != args.name:
            raise ValueError(f"--check-against {path} is a {committed.get('experiment')!r} report, not {args.name!r}")
        if out.resolve() == path.parent.resolve():
            raise ValueError("--out must differ from the folder of --check-against: the rerun would overwrite the "
                             "committed report it is compared with")
    experiment = importlib.import_module(f"{__package__}.{args.name}")
    seeds = {} if args.seeds is None else {"seeds": args.seeds}  # None: the experiment's own number
    config = CONFIGS[args.name].preset(args.size, **seeds, first_seed=args.first_seed)
    payload = experiment.run(config, out, work, rerun_command(args), progress=not args.no_progress)
    print("\n".join(payload["verdict"]))
    print("\n".join(f"{c['paper']}: {c['claim']}: {c['status']}" for c in payload.get("claims") or []))
    if committed is not None:
        from .reproduce import compare, write_comparison

        result = compare(committed, payload)
        write_comparison(result, out, args.check_against, payload["command"])
        print(f"reproducibility: {result['inside']} of {result['total']} cells inside the 95% prediction intervals "
              f"({out / 'reproducibility.md'})")
    print(f"results: {out / 'results.md'}", file=sys.stderr)
    return 0
