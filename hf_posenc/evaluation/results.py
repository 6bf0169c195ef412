"""Typed evaluation results that round-trip through JSON.

:class:`EvaluationResult` holds every perplexity measurement (:class:`PerplexityResult`) and every retrieval trial
(:class:`RetrievalTrial`, one prompt × one model) and every sample of lm-eval's RULER tasks (:class:`LmEvalSample`)
of an :func:`~hf_posenc.evaluation.evaluate` call; accuracy grids over context length × needle depth (passkey) or
task (RULER) are computed from them, so nothing aggregated is stored twice.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..results_io import write_json

PERPLEXITY_METHOD = "sliding-window (Press et al. stride)"


@dataclass
class PerplexityResult:
    """Perplexity of one model on one text at one context length.

    ``perplexity = exp(nll)`` where ``nll`` is the token-weighted mean negative log-likelihood (nats) of the
    ``num_scored`` targets; every target is scored exactly once, by the first window that reaches it."""

    model: str
    context_length: int
    stride: int
    num_tokens: int
    num_scored: int
    num_windows: int
    nll: float
    perplexity: float
    method: str = PERPLEXITY_METHOD
    seconds: float | None = None  # wall time of the windows' forwards (None in results written before it existed)


@dataclass
class RetrievalTrial:
    """One retrieval prompt answered by one model.

    ``answers`` are the values that must appear in the output; ``score`` is the fraction found (partial match) and
    ``exact`` whether all were found. ``depth`` is the fraction of filler before the (queried) needle."""

    model: str
    task: str
    length: int
    depth: float
    trial: int
    prompt_tokens: int
    answers: list[str]
    output: str
    score: float
    exact: bool


@dataclass
class LmEvalSample:
    """One sample of an lm-eval RULER task answered by one model.

    ``length`` is the task's requested length (lm-eval's ``max_seq_length``: prompt plus the task's answer budget),
    ``index`` the sample's number at that length, ``prompt_tokens`` the prompt's tokens as the model read them;
    ``score`` is lm-eval's metric of the sample: the fraction of ``answers`` found in ``output``."""

    model: str
    task: str
    length: int
    index: int
    prompt_tokens: int
    answers: list[str]
    output: str
    score: float


@dataclass
class EvaluationResult:
    """Everything one evaluation produced, plus the settings that produced it."""

    perplexity: list[PerplexityResult] = field(default_factory=list)
    retrieval: list[RetrievalTrial] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    lm_eval: list[LmEvalSample] = field(default_factory=list)

    # -- queries ------------------------------------------------------------------------------------------------
    def models(self) -> list[str]:
        """Model names in first-seen order."""
        names = [r.model for r in self.perplexity] + [t.model for t in self.retrieval] + [s.model for s in self.lm_eval]
        return list(dict.fromkeys(names))

    def tasks(self) -> list[str]:
        """Retrieval task names in first-seen order."""
        return list(dict.fromkeys(t.task for t in self.retrieval))

    def lm_eval_tasks(self) -> list[str]:
        """lm-eval task names in first-seen order."""
        return list(dict.fromkeys(s.task for s in self.lm_eval))

    def lm_eval_grid(self, model: str) -> tuple[list[str], list[int], list[list[float]]]:
        """``(tasks, lengths, grid)`` with ``grid[i][j]`` ``model``'s mean lm-eval score on ``tasks[i]`` at
        ``lengths[j]`` (NaN where none ran)."""
        tasks, lengths = self.lm_eval_tasks(), sorted({s.length for s in self.lm_eval})
        grid = []
        for task in tasks:
            row = []
            for n in lengths:
                scores = [s.score for s in self.lm_eval if s.model == model and s.task == task and s.length == n]
                row.append(sum(scores) / len(scores) if scores else math.nan)
            grid.append(row)
        return tasks, lengths, grid

    def accuracy_grid(
        self, model: str, task: str, metric: str = "exact"
    ) -> tuple[list[int], list[float], list[list[float]]]:
        """``(lengths, depths, grid)`` with ``grid[i][j]`` the mean ``metric`` ("exact" or "score") over the trials
        at ``depths[i]`` and ``lengths[j]`` (NaN where no trial ran)."""
        if metric not in ("exact", "score"):
            raise ValueError(f"metric must be 'exact' or 'score', got {metric!r}")
        trials = [t for t in self.retrieval if t.model == model and t.task == task]
        lengths = sorted({t.length for t in trials})
        depths = sorted({t.depth for t in trials})
        grid = []
        for d in depths:
            row = []
            for n in lengths:
                values = [float(getattr(t, metric)) for t in trials if t.depth == d and t.length == n]
                row.append(sum(values) / len(values) if values else math.nan)
            grid.append(row)
        return lengths, depths, grid

    def mean_accuracy(self, model: str, task: str, length: int, metric: str = "exact") -> float:
        """Mean ``metric`` over all depths and trials at one length (NaN when none ran)."""
        values = [float(getattr(t, metric)) for t in self.retrieval
                  if t.model == model and t.task == task and t.length == length]
        return sum(values) / len(values) if values else math.nan

    def merge(self, other: EvaluationResult) -> EvaluationResult:
        """A new result with both results' measurements (settings of ``self`` win on conflicts)."""
        return EvaluationResult(self.perplexity + other.perplexity, self.retrieval + other.retrieval,
                                {**other.settings, **self.settings}, self.lm_eval + other.lm_eval)

    # -- JSON ---------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save_json(self, path: str | os.PathLike) -> str:
        """Write strict JSON to ``path`` (an infinite perplexity is written as ``null``); returns the path."""
        return write_json(self.to_dict(), path)

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> EvaluationResult:
        """Read what :meth:`save_json` wrote (``null`` perplexities back to infinity)."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for r in data.get("perplexity", []):
            for key in ("nll", "perplexity"):
                if r.get(key) is None:
                    r[key] = math.inf
        return cls([PerplexityResult(**r) for r in data.get("perplexity", [])],
                   [RetrievalTrial(**t) for t in data.get("retrieval", [])], data.get("settings", {}),
                   [LmEvalSample(**s) for s in data.get("lm_eval", [])])
