"""The per-arm learning-rate grid at the final budget, and the widening that makes it bracket each arm's best rate.

Every experiment whose verdict compares methods trains each arm at every rate of a grid at the final budget (the
first seed, scored on a validation text that is never scored for the report) and keeps each arm's best rate
(:func:`best_rate`). A best rate at the grid's end (:func:`grid_edge`) has not been found: a rate beyond it was not
tried and might do better, so :class:`.claims.Tuning` counts such a comparison as not a fair test. A fixed grid
cannot know in advance where every arm's best lies (the rate a frozen model's new modules want can be ten times a
LoRA's), so a grid may widen itself: an arm whose best rate is at an end tries one more rate beyond that end, one
grid step further (:func:`grid_step`, rounded to one significant digit), and again, until its best rate is inside
what it tried or it has tried ``extensions`` rates beyond that end (:func:`widened`, :func:`bracketing_runs`). Only
the arms at an end pay for the widening, and each arm's record is every rate it tried.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def grid_edge(rate: float, tried: Sequence[float]) -> str:
    """``"highest"`` / ``"lowest"`` where ``rate`` is that end of a grid of two or more rates ``tried``, else ``""``
    (inside the grid, or no grid): a choice at an end may not be the best rate, since one beyond it was not tried."""
    if len(tried) < 2:
        return ""
    return "highest" if rate == max(tried) else "lowest" if rate == min(tried) else ""


def best_rate(losses: Mapping[float, float | None]) -> float:
    """The rate of the lowest validation loss (rate -> loss; ``None`` or NaN: a diverged run, counted as infinite),
    the lower rate on a tie, so a grid whose runs all diverged chooses its lowest rate."""
    if not losses:
        raise ValueError("best_rate: no rate was tried")

    def loss(rate: float) -> float:
        value = losses[rate]
        return math.inf if value is None or math.isnan(value) else float(value)

    return min(losses, key=lambda rate: (loss(rate), rate))


def grid_step(grid: Sequence[float]) -> float:
    """The grid's geometric step, ``(max / min) ** (1 / (n - 1))`` for its ``n`` distinct rates (√10 for
    6e-4, 2e-3, 6e-3; 3 for 1e-3, 3e-3)."""
    rates = sorted(set(grid))
    if len(rates) < 2 or rates[0] <= 0:
        raise ValueError(f"a grid needs at least two different rates > 0 to have a step, got {tuple(grid)}")
    return (rates[-1] / rates[0]) ** (1 / (len(rates) - 1))


def one_digit(rate: float) -> float:
    """``rate`` rounded to one significant digit (6.32e-3 -> 6e-3, 1.90e-2 -> 2e-2): the rates a person would
    write, so a widened grid reads like the grid it extends."""
    return float(f"{rate:.0e}")


def widened(losses: Mapping[float, float | None], grid: Sequence[float], extensions: int) -> float | None:
    """The next rate an arm tries, or ``None`` when it needs none: ``losses`` is every rate it tried (the
    ``grid`` and any rates beyond it) -> its validation loss. Where its best rate (:func:`best_rate`) is the
    highest or lowest it tried, the next is one :func:`grid_step` beyond (rounded by :func:`one_digit`), unless it
    has already tried ``extensions`` rates beyond ``grid`` on that side; inside what it tried: ``None``."""
    if extensions < 0:
        raise ValueError(f"extensions must be >= 0, got {extensions}")
    missing = sorted(set(grid) - set(losses))
    if missing:
        raise ValueError(f"the arm has not tried the grid's rates {missing}")
    best = best_rate(losses)
    side = grid_edge(best, sorted(losses))
    if not side:
        return None
    beyond = [r for r in losses if (r > max(grid) if side == "highest" else r < min(grid))]
    if len(beyond) >= extensions:
        return None
    step = grid_step(grid)
    rate = one_digit(best * step if side == "highest" else best / step)
    if rate in losses or rate <= 0:  # rounding cannot make a step vanish for grids a person writes; refuse if it does
        raise ValueError(f"the grid {tuple(grid)} has too fine a step to widen past {best:g}")
    return rate


def bracketing_runs(arms: Sequence[str], grid: Sequence[float], extensions: int,
                    run: Callable[[list[tuple[str, float]], str], list[dict[str, Any]]],
                    key: Callable[[dict[str, Any]], tuple[str, float]],
                    loss: Callable[[dict[str, Any]], float | None], done: Sequence[dict[str, Any]] = ()
                    ) -> list[dict[str, Any]]:
    """Every arm at every rate of ``grid``, then each arm whose best rate is at an end of what it tried at one
    more rate beyond it (:func:`widened`), round after round, until none needs one; returns every run, ``done``'s
    first, then the new ones in the order they ran.

    Args:
        arms: the arms' labels.
        grid: the rates every arm tries.
        extensions: the most rates an arm tries beyond each end of ``grid``.
        run: trains ``(arm, rate)`` pairs and returns their results (the second argument says which round, for
            the progress bar: ``"grid"`` or ``"widening"``).
        key: a result -> its ``(arm, rate)``.
        loss: a result -> its validation loss (``None``: diverged).
        done: runs already trained (the grid's cells an experiment trained with its other cells): an ``(arm,
            rate)`` among them is not run again.
    """
    results = list(done)
    have = {key(r) for r in results}
    pending = [(arm, rate) for arm in arms for rate in grid if (arm, rate) not in have]
    if pending:
        results.extend(run(pending, "grid"))
    while True:
        wanted = []
        for arm in arms:
            losses = {key(r)[1]: loss(r) for r in results if key(r)[0] == arm}
            rate = widened(losses, grid, extensions)
            if rate is not None:
                wanted.append((arm, rate))
        if not wanted:
            return results
        results.extend(run(wanted, "widening"))


def tried_rates(results: Sequence[dict[str, Any]], arm: str, key: Callable[[dict[str, Any]], tuple[str, float]]
                ) -> tuple[float, ...]:
    """The rates ``arm`` tried, ascending."""
    return tuple(sorted({key(r)[1] for r in results if key(r)[0] == arm}))


__all__ = ["grid_edge", "best_rate", "grid_step", "one_digit", "widened", "bracketing_runs", "tried_rates"]
