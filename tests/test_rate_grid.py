"""The rate grid's rules (hf_posenc_experiments.rate_grid): the edge, the choice, the widening that brackets each
arm's best rate, on planted validation losses."""

from __future__ import annotations

import math

import pytest

from hf_posenc_experiments.rate_grid import (
    best_rate, bracketing_runs, grid_edge, grid_step, one_digit, tried_rates, widened,
)


def test_the_edge_and_the_choice():
    assert grid_edge(3e-3, (1e-3, 3e-3)) == "highest" and grid_edge(1e-3, (1e-3, 3e-3)) == "lowest"
    assert grid_edge(2e-3, (6e-4, 2e-3, 6e-3)) == "" and grid_edge(1e-3, (1e-3,)) == ""
    assert best_rate({1e-3: 2.0, 3e-3: 1.5, 1e-2: 1.7}) == 3e-3
    assert best_rate({1e-3: 1.5, 3e-3: 1.5}) == 1e-3  # a tie: the lower rate
    assert best_rate({1e-3: 2.0, 3e-3: None, 1e-2: math.nan}) == 1e-3  # diverged runs never win
    assert best_rate({1e-3: None, 3e-3: None}) == 1e-3  # all diverged: the lowest, so a widening goes lower
    with pytest.raises(ValueError, match="no rate was tried"):
        best_rate({})


def test_the_step_rounds_to_the_rates_a_person_writes():
    assert grid_step((6e-4, 2e-3, 6e-3)) == pytest.approx(math.sqrt(10))
    assert grid_step((3e-3, 1e-3)) == pytest.approx(3.0)
    assert one_digit(6e-3 * grid_step((6e-4, 2e-3, 6e-3))) == 2e-2 and one_digit(6e-4 / math.sqrt(10)) == 2e-4
    with pytest.raises(ValueError, match="at least two different rates"):
        grid_step((1e-3, 1e-3))


def test_widening_goes_one_step_beyond_the_end_its_best_sits_at_until_it_is_inside_or_capped():
    grid = (6e-4, 2e-3, 6e-3)
    assert widened({6e-4: 1.2, 2e-3: 1.0, 6e-3: 1.1}, grid, 2) is None  # inside: done
    assert widened({6e-4: 1.2, 2e-3: 1.1, 6e-3: 1.0}, grid, 2) == 2e-2
    assert widened({6e-4: 1.2, 2e-3: 1.1, 6e-3: 1.0, 2e-2: 0.9}, grid, 2) == 6e-2
    assert widened({6e-4: 1.2, 2e-3: 1.1, 6e-3: 1.0, 2e-2: 0.9, 6e-2: 0.8}, grid, 2) is None  # capped
    assert widened({6e-4: 1.2, 2e-3: 1.1, 6e-3: 1.0, 2e-2: 1.05}, grid, 2) is None  # bracketed by the widening
    assert widened({6e-4: 1.0, 2e-3: 1.1, 6e-3: 1.2}, grid, 2) == 2e-4  # the other way
    assert widened({6e-4: 1.0, 2e-3: 1.1, 6e-3: 1.2}, grid, 0) is None  # 0: the grid alone
    assert widened({2e-4: 0.9, 6e-4: 1.0, 2e-3: 1.1, 6e-3: 1.2}, grid, 1) is None  # capped below
    # the cap counts each side: widened twice above, still free to go below
    assert widened({6e-4: 1.0, 2e-3: 1.1, 6e-3: 1.2, 2e-2: 1.3, 6e-2: 1.4}, grid, 2) == 2e-4
    with pytest.raises(ValueError, match="has not tried the grid's rates"):
        widened({6e-4: 1.0, 2e-3: 1.1}, grid, 2)
    with pytest.raises(ValueError, match="extensions must be >= 0"):
        widened({6e-4: 1.0, 2e-3: 1.1, 6e-3: 1.2}, grid, -1)


def _bowl(best: dict[str, float]):
    """Validation loss of an arm at a rate: a bowl in log rate around the arm's best rate."""
    return lambda arm, rate: (math.log10(rate) - math.log10(best[arm])) ** 2


def test_bracketing_runs_finds_each_arms_best_inside_what_it_tried_and_only_those_at_an_end_pay():
    grid = (6e-4, 2e-3, 6e-3)
    best = {"inside": 2e-3, "high": 2e-2, "low": 2e-4, "far": 1.0}
    loss = _bowl(best)
    rounds: list[list[tuple[str, float]]] = []

    def run(pairs, stage):
        rounds.append(list(pairs))
        return [{"arm": arm, "rate": rate, "loss": loss(arm, rate)} for arm, rate in pairs]

    results = bracketing_runs(list(best), grid, 2, run, key=lambda r: (r["arm"], r["rate"]), loss=lambda r: r["loss"])
    key = lambda r: (r["arm"], r["rate"])  # noqa: E731
    assert len(rounds[0]) == 12  # the grid: every arm at every rate
    assert tried_rates(results, "inside", key) == grid
    assert tried_rates(results, "high", key) == (6e-4, 2e-3, 6e-3, 2e-2, 6e-2)  # 2e-2 best, bracketed by 6e-2
    assert tried_rates(results, "low", key) == (6e-5, 2e-4, 6e-4, 2e-3, 6e-3)
    assert tried_rates(results, "far", key) == (6e-4, 2e-3, 6e-3, 2e-2, 6e-2)  # capped: still at the edge
    chosen = {arm: best_rate({r["rate"]: r["loss"] for r in results if r["arm"] == arm}) for arm in best}
    assert chosen == {"inside": 2e-3, "high": 2e-2, "low": 2e-4, "far": 6e-2}
    assert grid_edge(chosen["far"], tried_rates(results, "far", key)) == "highest"
    assert all(grid_edge(chosen[a], tried_rates(results, a, key)) == "" for a in ("inside", "high", "low"))
    assert len({key(r) for r in results}) == len(results)  # nothing trained twice


def test_bracketing_runs_reuses_the_runs_already_done():
    grid = (1e-3, 3e-3)
    loss = _bowl({"a": 1e-3, "b": 3e-3})
    asked: list[tuple[str, float]] = []

    def run(pairs, stage):
        asked.extend(pairs)
        return [{"arm": arm, "rate": rate, "loss": loss(arm, rate)} for arm, rate in pairs]

    done = [{"arm": "a", "rate": 1e-3, "loss": 0.0}, {"arm": "a", "rate": 3e-3, "loss": loss("a", 3e-3)},
            {"arm": "b", "rate": 3e-3, "loss": 0.0}]
    results = bracketing_runs(["a", "b"], grid, 1, run, key=lambda r: (r["arm"], r["rate"]),
                              loss=lambda r: r["loss"], done=done)
    assert results[:3] == done
    assert asked == [("b", 1e-3), ("a", 3e-4), ("b", 9e-3)]
