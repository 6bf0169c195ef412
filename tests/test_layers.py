"""The package's layers (pyproject.toml, [tool.importlinter]): upstream <- kernels <- schemes <- core <- io <- apps <- front,
each importing only the ones below it, every top-level module placed in a layer. Checked with import-linter on
the package as it is, and shown to fail on a copy where a lower layer imports a higher one. A second contract keeps
the command line's vocabulary and argument parsers (hf_posenc_cli/vocabulary.py, arguments.py) free of hf_posenc,
torch and Transformers (and the vocabulary is standard library only), and a third keeps the research harness
(hf_posenc_experiments) and the console command (hf_posenc_cli's main) out of the library, which imports of
hf_posenc_cli only those two standard-library leaves, with no exception."""

from __future__ import annotations

import ast
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
    run = _lint_with_an_import(tmp_path, "from hf_posenc_experiments import corpus", "corpus")
    assert "hf_posenc.evaluation -> hf_posenc_experiments.corpus" in run.stdout, run.stdout


def test_the_library_importing_the_console_command_breaks_its_contract(tmp_path):
    """hf_posenc_cli's main runs the library and the research harness: the library may import only the command
    line's vocabulary and argument parsers from that package (no ignore_imports exception hides an import)."""
    run = _lint_with_an_import(tmp_path, "from hf_posenc_cli import main", "main")
    # the console command itself, not only the research harness it imports
    assert "hf_posenc.evaluation is not allowed to import hf_posenc_cli:" in run.stdout, run.stdout


def _lint_with_an_import(tmp_path: Path, statement: str, name: str) -> subprocess.CompletedProcess:
    """lint-imports on a copy whose hf_posenc.evaluation runs ``statement`` in a function; it must fail."""
    root = _copy(tmp_path)
    evaluation = root / "hf_posenc" / "evaluation" / "__init__.py"
    evaluation.write_text(evaluation.read_text() + f"\n\ndef _imported():\n    {statement}\n\n    return {name}\n")
    run = _lint(root)
    assert run.returncode == 1, run.stdout + run.stderr
    return run


@pytest.mark.parametrize("module", ["arguments", "vocabulary"])
def test_the_argument_parsers_importing_hf_posenc_break_their_contract(tmp_path, module):
    root = _copy(tmp_path)
    source = root / "hf_posenc_cli" / f"{module}.py"
    source.write_text(source.read_text() + "\n\nfrom hf_posenc.record import LIBRARY_VERSION  # noqa: E402\n")
    run = _lint(root)
    assert run.returncode == 1 and f"hf_posenc_cli.{module} -> hf_posenc.record" in run.stdout, run.stdout


def test_the_vocabulary_is_a_leaf_of_the_standard_library():
    """What both the library and the command line's parsers import: nothing but the standard library."""
    tree = ast.parse((ROOT / "hf_posenc_cli" / "vocabulary.py").read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [("." * node.level) + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    outside = [name for name in imported if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}]
    assert not outside, f"hf_posenc_cli/vocabulary.py imports {outside}: keep it to the standard library"




def _imported_modules(path: Path, text: str | None = None) -> set[str]:
    """The absolute names of the modules the hf_posenc file ``path`` (or ``text`` as if it were that file) imports:
    relative imports resolved, ``from X import y`` counted as ``X`` and ``X.y``."""
    parts = path.relative_to(ROOT).with_suffix("").parts[:-1]  # the file's package
    names = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(parts[: len(parts) - node.level + 1]) if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_code_imports_the_kernels_dev_tooling():
    """``hf_posenc.kernels.dev`` (the compile lane, reading binaries) is development tooling: no other module of the
    library imports it, so ``import hf_posenc`` and a checkpoint's remote code never need it."""
    dev, folder = "hf_posenc.kernels.dev", ROOT / "hf_posenc" / "kernels" / "dev"
    offenders = {}
    for path in (ROOT / "hf_posenc").rglob("*.py"):
        found = sorted(m for m in _imported_modules(path) if m == dev or m.startswith(dev + "."))
        if found and folder not in path.parents:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"library modules import the dev tooling: {offenders}"


@pytest.mark.parametrize("statement", ["from ..dev import compile_lane", "from hf_posenc.kernels.dev.binaries import sass",
                                       "import hf_posenc.kernels.dev"])
def test_the_dev_import_check_resolves_every_form_of_import(statement):
    where = ROOT / "hf_posenc" / "kernels" / "tapa" / "anything.py"
    assert any(m.startswith("hf_posenc.kernels.dev") for m in _imported_modules(where, statement + "\n"))
