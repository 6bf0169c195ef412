"""The package's layers (pyproject.toml, [tool.importlinter]): upstream <- kernels <- schemes <- core <- io <- apps <- front,
each importing only the ones below it, every top-level module placed in a layer. Checked with import-linter on
the package as it is, and shown to fail on a copy where a lower layer imports a higher one. A second contract keeps
the command line's argument parsers (hf_posenc_cli/arguments.py) free of hf_posenc, torch and Transformers, and a third
keeps the research harness (hf_posenc_experiments) out of the library."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("importlinter")


def _lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports with the project's contracts on the package under `root` (no cache files written)."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "hf_posenc", tmp_path / "hf_posenc", ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("hf_posenc_cli", "hf_posenc_experiments"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_layer_contract_holds():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 kept, 0 broken" in run.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(tmp_path):
    root = _copy(tmp_path)
    rope = root / "hf_posenc" / "schemes" / "rope" / "__init__.py"
    rope.write_text(rope.read_text() + "\n\ndef _publish(model):\n    from ...hub import push_to_hub\n\n"
                    "    return push_to_hub\n")
    run = _lint(root)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BROKEN" in run.stdout and "hf_posenc.schemes.rope -> hf_posenc.hub" in run.stdout, run.stdout


def test_a_module_outside_every_layer_breaks_the_contract(tmp_path):
    root = _copy(tmp_path)
    (root / "hf_posenc" / "stray.py").write_text('"""A new top-level module nobody placed in a layer."""\n')
    run = _lint(root)
    assert run.returncode == 1 and "hf_posenc.stray" in run.stdout, run.stdout + run.stderr


def test_the_library_importing_the_experiments_breaks_their_contract(tmp_path):
    """hf_posenc_experiments (the research harness) sits beside the library: hf_posenc may not import it."""
    root = _copy(tmp_path)
    evaluation = root / "hf_posenc" / "evaluation" / "__init__.py"
    evaluation.write_text(evaluation.read_text() + "\n\ndef _austen():\n    from hf_posenc_experiments import corpus\n\n"
                          "    return corpus\n")
    run = _lint(root)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "hf_posenc.evaluation -> hf_posenc_experiments.corpus" in run.stdout, run.stdout


def test_the_argument_parsers_importing_hf_posenc_break_their_contract(tmp_path):
    root = _copy(tmp_path)
    arguments = root / "hf_posenc_cli" / "arguments.py"
    arguments.write_text(arguments.read_text() + "\n\nfrom hf_posenc.record import LIBRARY_VERSION  # noqa: E402\n")
    run = _lint(root)
    assert run.returncode == 1 and "hf_posenc_cli.arguments -> hf_posenc.record" in run.stdout, run.stdout

