"""The experiments' runner: cells trained in forked processes (``--jobs N``) give the results of the serial run,
in the cells' order, cached; a failing cell stops the experiment naming the cell and its error file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hf_posenc_experiments import runner
from hf_posenc_experiments.runner import Cell, run_cells


def _cells(root: Path, fail: str | None = None) -> list[Cell]:
    def execute(label: str):
        def run(directory: Path) -> dict:
            if label == fail:
                raise RuntimeError(f"{label} diverged")
            import torch

            return {"value": float(torch.arange(len(label), dtype=torch.float64).sum()), "pid": os.getpid(),
                    "threads": torch.get_num_threads(), "seconds": 0.0}
        return run

    return [Cell(label, "rope", seed, root / label / f"seed{seed}", {"label": label, "seed": seed}, None,
                 execute=execute(label)) for label in ("a", "bb", "ccc") for seed in (0, 1)]


def test_forked_cells_equal_the_serial_run_in_order_and_cached(tmp_path):
    import torch

    # The parent holds a pool of 3 threads whatever the environment gives it (a one-thread parent, as under the
    # mutation check's two-at-a-time runs, would let a worker that keeps its parent's pool pass as a one-thread one).
    parent_threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        serial = run_cells(_cells(tmp_path / "serial"), "serial", progress=False, jobs=1)
        forked = run_cells(_cells(tmp_path / "forked"), "forked", progress=False, jobs=2)
    finally:
        torch.set_num_threads(parent_threads)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("pid", "threads")} for r in rows]  # noqa: E731
    assert strip(forked) == strip(serial)
    assert [(r["label"], r["seed"]) for r in forked] == [(c.label, c.seed) for c in _cells(tmp_path)]
    assert {r["pid"] for r in forked} != {os.getpid()} and os.getpid() not in {r["pid"] for r in forked}
    assert {r["threads"] for r in forked} == {1}  # one torch thread per worker
    assert all(r["pid"] == os.getpid() for r in serial)
    assert {r["threads"] for r in serial} == {3}  # the serial run keeps the parent's pool
    again = run_cells(_cells(tmp_path / "forked"), "forked", progress=False, jobs=2)  # all cached: nothing runs
    assert again == forked


def test_a_failing_forked_cell_names_itself_and_its_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"the run bb seed \d failed .*error.txt"):
        run_cells(_cells(tmp_path, fail="bb"), "x", progress=False, jobs=2)
    errors = list(tmp_path.glob("bb/seed*/error.txt"))
    assert errors and "bb diverged" in errors[0].read_text()


def test_jobs_must_be_a_positive_whole_number():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--jobs must be a whole number >= 1"):
            runner.set_jobs(bad)
    runner.set_jobs(1)
