"""The upstream lane's runner (scripts/upstream_lane.py): what it prints when the newest releases pass, and the
message that fails CI when one breaks a test, naming the release found by putting each moved package back alone."""

from __future__ import annotations

import importlib.util
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
