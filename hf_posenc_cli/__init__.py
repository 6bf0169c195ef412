"""The ``hf-posenc`` console command.

It lives outside the ``hf_posenc`` package on purpose: importing ``hf_posenc`` registers its schemes with
Transformers, which imports torch (seconds on a laptop), and ``--help``, ``--version`` and argument errors should
answer at once. So the command line is parsed here from :mod:`hf_posenc_cli.arguments` (standard library only), and
``hf_posenc`` is imported only to run a command that parsed (:func:`hf_posenc.cli.run_command`). ``experiment``
runs the research harness, :mod:`hf_posenc_experiments`, a package beside the library that the library never imports.
"""

from __future__ import annotations


def _experiment(args) -> int:
    from hf_posenc_experiments.cli import run_experiment

    return run_experiment(args)


# commands that run outside the hf_posenc library (hf_posenc.cli.COMMANDS runs the others)
OUTSIDE_THE_LIBRARY = {"experiment": _experiment}


def main(argv: list[str] | None = None) -> int:
    """Run ``hf-posenc`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from .arguments import parse

    args = parse(argv)  # exits 0 (help, --version) or 2 (an argument error) without importing torch
    from hf_posenc.cli import run_command

    return run_command(args, OUTSIDE_THE_LIBRARY)
