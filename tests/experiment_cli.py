"""Shared by the experiment tests: the Austen data (installed on first use) and the command line as a user runs it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_posenc_experiments.corpus import find_janeaustenr

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def austen():
    try:
        return find_janeaustenr()
    except FileNotFoundError:
        subprocess.run(["bash", str(ROOT / "scripts" / "data" / "install_austen.sh")], check=True)
        return find_janeaustenr()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m hf_posenc_cli ARGS`` in a fresh process without the test suite's TRITON_INTERPRET (TAPA takes
    its CPU path), as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "hf_posenc_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
