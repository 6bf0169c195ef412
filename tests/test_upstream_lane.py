"""The upstream lane's runner (scripts/upstream_lane.py): what it prints when the newest releases pass, and the
message that fails CI when one breaks a test, naming the release found by putting each moved package back alone."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def lane(monkeypatch):
    spec = importlib.util.spec_from_file_location("upstream_lane", REPO / "scripts" / "upstream_lane.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    locked = module.locked_versions()
    newest = {**{n: locked[n] for n in map(module.normalize, module.UPSTREAM)},
              "transformers": "99.0.0", "peft": "99.1.0", "torch": "2.13.0+cpu"}
    monkeypatch.setattr(module, "installed_versions", lambda python, names: {module.normalize(n): newest[
        module.normalize(n)] for n in names})
    return module, locked


def _junit(path: Path, failed: list[str], passed: list[str]) -> None:
    cases = [f'<testcase classname="tests.test_x" name="{n}"><failure message="x"/></testcase>' for n in failed]
    cases += [f'<testcase classname="tests.test_x" name="{n}"/>' for n in passed]
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')


def test_the_lock_is_read_with_pips_names(lane):
    module, locked = lane
    assert "transformers" in locked and "huggingface-hub" in locked  # huggingface_hub==... in the lock


def test_failed_tests_are_read_from_the_junit_report(lane, tmp_path):
    module, _ = lane
    _junit(tmp_path / "r.xml", ["test_a[llama]", "test_b"], ["test_c"])
    assert module.failed_tests(tmp_path / "r.xml") == ["tests/test_x.py::test_a[llama]", "tests/test_x.py::test_b"]


def test_a_pass_prints_the_versions_tested(lane, monkeypatch, capsys):
    module, locked = lane
    monkeypatch.setattr(module, "run_pytest", lambda python, args, junit, env=None: 0)
    assert module.main([]) == 0
    out = capsys.readouterr().out
    assert f"transformers     99.0.0       locked {locked['transformers']}  <- newer than the lock" in out
    assert "passed on the newest releases (transformers 99.0.0, peft 99.1.0)" in out


def test_a_failure_names_the_release_that_broke_which_test(lane, monkeypatch, capsys):
    module, locked = lane

    def failing(python, args, junit, env=None):
        _junit(junit, ["test_cache[llama]"], ["test_ok"])
        return 1

    monkeypatch.setattr(module, "run_pytest", failing)
    tried = []
    monkeypatch.setattr(module, "passes_with_locked",
                        lambda python, package, version, tests: tried.append((package, version)) or package == "peft")
    assert module.main([]) == 1
    err = capsys.readouterr().err
    assert (f"a newer release of peft (99.1.0; the locked {locked['peft']} passes) broke\n"
            "  tests/test_x.py::test_cache[llama]") in err
    assert ("transformers", locked["transformers"]) in tried and ("peft", locked["peft"]) in tried


def test_an_empty_selection_fails_the_lane(lane, monkeypatch, capsys):
    module, _ = lane
    monkeypatch.setattr(module, "run_pytest", lambda python, args, junit, env=None: 5)
    assert module.main([]) == 1
    assert "no test is marked 'upstream'" in capsys.readouterr().err


def test_the_locked_torch_is_the_pin_the_locked_lane_installs(lane, tmp_path):
    module, locked = lane
    import torch

    assert locked["torch"] == module.public(torch.__version__)  # this suite runs in the locked lane
    setup = tmp_path / "setup.sh"
    setup.write_text('set -e\nTORCH_PIN="torch==9.8.7"\n')
    assert module.locked_versions(setup=setup)["torch"] == "9.8.7"
    setup.write_text('pip install torch\n')
    with pytest.raises(SystemExit, match="no TORCH_PIN"):
        module.locked_versions(setup=setup)


def test_a_newer_torch_and_the_older_triton_it_pins_are_shown_and_blamed_as_such(lane, monkeypatch, capsys):
    """The newest torch pins an older Triton than the lock's: the lane shows which way each package moved and
    names an older release as older."""
    module, locked = lane
    newest = {**{n: locked[n] for n in map(module.normalize, module.UPSTREAM)}, "torch": "2.99.0",
              "triton": "0.1.0"}
    monkeypatch.setattr(module, "installed_versions", lambda python, names: {module.normalize(n): newest[
        module.normalize(n)] for n in names})

    def failing(python, args, junit, env=None):
        _junit(junit, ["test_kernel[fp16]"], [])
        return 1

    monkeypatch.setattr(module, "run_pytest", failing)
    monkeypatch.setattr(module, "passes_with_locked", lambda python, package, version, tests: package == "triton")
    assert module.main([]) == 1
    captured = capsys.readouterr()
    assert f"torch            2.99.0       locked {locked['torch']}  <- newer than the lock\n" in captured.out
    assert (f"triton           0.1.0        locked {locked['triton']}  <- older than the lock (what a newer "
            "release requires)\n") in captured.out
    assert (f"upstream lane: an older release of triton (0.1.0; the locked {locked['triton']} passes) broke\n"
            "  tests/test_x.py::test_kernel[fp16]") in captured.err


def test_the_torch_wheels_of_one_release_count_as_that_release(lane, monkeypatch, capsys):
    module, locked = lane
    monkeypatch.setattr(module, "run_pytest", lambda python, args, junit, env=None: 0)
    assert module.main([]) == 0  # the fixture's torch is the pin's CPU wheel, "<pin>+cpu"
    out = capsys.readouterr().out
    assert f"torch            2.13.0+cpu   locked {locked['torch']}\n" in out and "torch 2.13.0" not in out


def test_the_lane_selects_the_interpreter_tests_and_the_compile_lane_without_its_seed():
    """What the marker selects on the newest torch and Triton: the kernels under the interpreter and the compile
    lane's checks that need no seed; the full compile lane (its seed is keyed by the locked Triton build: minutes
    on another one) stays in the locked lane."""
    files = ["tests/test_tapa_kernel.py", "tests/test_tape_kernel.py", "tests/test_autocast_attention.py",
             "tests/test_compile_lane.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           "-m", "upstream", *files], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    for path in files:
        assert any(line.startswith(path + "::") for line in selected), (path, selected)
    assert "tests/test_compile_lane.py::test_one_cell_compiles_on_this_triton" in selected
    assert not [line for line in selected if "test_every_kernel_compiles_for_a100_and_h100" in line
                or "test_seed_holds_exactly_the_standard_binaries" in line]
