"""The ``hf-posenc`` console command.

It lives outside the ``hf_posenc`` package on purpose: importing ``hf_posenc`` registers its schemes with
Transformers, which imports torch (seconds on a laptop), and ``--help``, ``--version`` and argument errors should
answer at once. So the command line is parsed here from :mod:`hf_posenc_cli.arguments` (standard library only), and
``hf_posenc`` is imported only to run a command that parsed (:func:`hf_posenc.cli.run_command`).
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run ``hf-posenc`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from .arguments import parse

    args = parse(argv)  # exits 0 (help, --version) or 2 (an argument error) without importing torch
    from hf_posenc.cli import run_command

    return run_command(args)
