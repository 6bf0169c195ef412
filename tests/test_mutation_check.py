"""The mutation check (``scripts/mutation_check.py``): its anchors always, the full check on request.

The full check applies every wrong edit to a copy of the repository and runs its tests there (several minutes on two
CPU cores): ``pytest -m mutation tests/test_mutation_check.py`` or ``python scripts/mutation_check.py``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mutation_check.py"


def load_script():
    if "mutation_check" not in sys.modules:  # dataclasses look their module up in sys.modules
        spec = importlib.util.spec_from_file_location("mutation_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["mutation_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["mutation_check"]


def test_every_mutation_anchor_occurs_exactly_once_in_the_current_tree():
    """Cheap and always on: when the code moves on, the mutation that targets it must be updated, not silently
    dropped (the full check refuses to run with a missing anchor too)."""
    check = load_script()
    assert len(check.MUTATIONS) >= 15
    problems = check.check_names() + [p for m in check.MUTATIONS for p in check.anchor_problems(m)]
    assert not problems, "\n".join(problems)


def test_anchor_check_notices_a_lost_anchor(tmp_path):
    check = load_script()
    mutation = check.Mutation("example", "pkg/code.py", "x = 1", "x = 2", ("tests/test_x.py::test_x",), "why")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_y():\n    pass\n")
    (tmp_path / "pkg" / "code.py").write_text("the code moved on\n")
    problems = check.anchor_problems(mutation, tmp_path)
    assert any("occurs 0 times" in p for p in problems) and any("has no test function test_x" in p for p in problems)
    (tmp_path / "pkg" / "code.py").write_text("x = 1\nx = 1\n")
    assert any("occurs 2 times" in p for p in check.anchor_problems(mutation, tmp_path))
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    assert check.anchor_problems(mutation, tmp_path) == []


@pytest.mark.mutation
def test_the_suite_kills_every_mutation(request, tmp_path):
    expression = request.config.getoption("markexpr") or ""
    if "mutation" not in expression or "not mutation" in expression:
        pytest.skip("the full mutation check takes minutes: run `pytest -m mutation` or scripts/mutation_check.py")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / "outcomes.json")],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


RUNNER_PROBE = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import mutation_check as check

check.preload()
set_jobs = "raise ValueError(f\"--jobs must be a whole number >= 1, got {jobs!r}\")"
jobs_test = ["tests/test_experiment_runner.py::test_jobs_must_be_a_positive_whole_number"]
runner = "hf_posenc_experiments/runner.py"
runs = [
    (check.Mutation("harmless", runner, set_jobs, set_jobs + "  # a comment", tuple(jobs_test), ""), jobs_test),
    (check.Mutation("harmful", runner, set_jobs, "pass", tuple(jobs_test), ""), jobs_test),
    (check.Mutation("lost-anchor", runner, "not in the file", "x", tuple(jobs_test), ""), jobs_test),
]
outcomes = check.run_all(runs, workers=2, timeout=120.0)
slow_test = "tests/test_experiment_runner.py::test_forked_cells_equal_the_serial_run_in_order_and_cached"
slow = check.run_all([(None, [slow_test])], workers=1, timeout=0.01)
print(json.dumps({o.name: [o.status, o.killed_by, o.detail[-300:]] for o in outcomes + slow}))
'''


def test_forked_runs_tell_a_kill_from_a_survivor_and_an_error(tmp_path):
    """The forked runner itself (in a fresh process, as the check runs): a harmless edit survives, a harmful one is
    killed by its test, a lost anchor and a run past its timeout are errors, never kills."""
    proc = subprocess.run([sys.executable, "-c", RUNNER_PROBE, str(SCRIPT.parent)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcomes["harmless"][0] == "survived"
    jobs_test = "tests/test_experiment_runner.py::test_jobs_must_be_a_positive_whole_number"
    assert outcomes["harmful"][:2] == ["killed", jobs_test]
    assert outcomes["lost-anchor"][0] == "anchor"
    assert outcomes["baseline (no mutation)"][0] == "error" and "timed out" in outcomes["baseline (no mutation)"][2]
