"""Running an experiment's grid of (scheme, seed) cells with the project's trainer and evaluation, caching each
finished cell, and summarising the seeds as mean ± sample standard deviation.

A cell is one training run (:func:`hf_posenc.training.run_training` on a recipe built here, byte tokenizer,
chunked loss) followed by the recipe's own evaluation (:mod:`hf_posenc.evaluation` perplexity on the held-out
text). Its result goes to ``<work>/<scheme>/seed<k>/cell.json`` together with the fingerprint of every setting
that shaped it; a rerun with the same settings reuses it (an interrupted experiment resumes where it stopped),
and any change of settings retrains.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ExperimentSettings, ModelSettings, TrainSettings
from .stats import Difference, compare
from .tokenizer import VOCAB_SIZE

# relative cost of a cell per scheme, for the time estimate (TAPA's phase attention: ~1.7x RoPE on CPU)
COST = {"tapa": 1.7, "tape": 1.3}


def slug(label: str) -> str:
    """A directory name for a report label (``"p-RoPE 0.25"`` -> ``p-rope-0.25``)."""
    return re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-")


def fingerprint(settings: dict[str, Any]) -> str:
    """A short hash of the JSON form of ``settings``."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def scheme_fields(spec: str) -> dict[str, Any]:
    """A recipe's ``scheme`` section (``{"name": ..., **options}``) from a spec such as ``prope:p=0.25``."""
    from hf_posenc.schemes.spec import parse_scheme_spec

    scheme = parse_scheme_spec(spec)
    defaults = type(scheme)()
    options = {k: v for k, v in scheme.to_dict().items() if v != getattr(defaults, k)}
    return {"name": scheme.name, **options}


def build_recipe(config: ExperimentSettings, prepared: dict[str, Any], *, scheme: str, seed: int,
                 context_length: int, model: ModelSettings, train: TrainSettings, output_dir: str,
                 base_model: str | None = None, scheme_init: dict[str, Any] | None = None,
                 save_steps: int | None = None) -> Any:
    """The validated :class:`~hf_posenc.training.Recipe` of one cell on the data ``prepared`` for ``config``
    (byte tokenizer, training files, held-out file): from scratch (``model`` as an inline Llama config) or
    continued from ``base_model`` (a saved model directory), full fine-tuning, evaluation at ``config``'s lengths
    with disjoint windows.

    ``scheme_init`` (from scratch only): the scheme section's ``init``, the scheme's own initialisation of the
    random weights (TAPA's hot start, ``{"phase_at_distance_1": 7.0}``). ``save_steps``: keep a ``checkpoint-N``
    every that many steps (all of them; default: none but the final model)."""
    from hf_posenc.training.config import load_recipe

    model_section: dict[str, Any] = {"tokenizer": prepared["tokenizer_dir"], "attn_implementation": "sdpa"}
    if base_model is None:
        model_section["config"] = model.llama_config(VOCAB_SIZE, prepared["eos_id"], context_length)
    else:
        model_section["path"] = base_model
    data = {
        "description": f"{scheme} seed {seed} at {context_length} bytes",
        "model": model_section,
        "scheme": {**scheme_fields(scheme), **({"replace": True} if base_model is not None else {}),
                   **({"init": dict(scheme_init)} if scheme_init else {})},
        "context_length": context_length,
        "data": {"files": list(prepared["train_files"]), "packing": "concat"},
        "peft": {"enabled": False},
        "training": {
            "max_steps": train.steps, "learning_rate": train.learning_rate, "lr_scheduler_type": "cosine",
            "warmup_steps": train.warmup_steps, "weight_decay": train.weight_decay,
            "per_device_train_batch_size": train.batch_size, "activation_checkpointing": False,
            "save_steps": train.steps + 1 if save_steps is None else save_steps,
            "save_total_limit": 1 if save_steps is None else None, "logging_steps": max(1, train.steps // 20),
            "use_cpu": True, "seed": seed, "disable_tqdm": True,
            **train.recipe_training(),  # e.g. CUDA with bf16 autocast, Adam's β2 (AcceleratedTrainSettings)
        },
        "loss": {"implementation": "chunked", "chunk_size": 4096},
        "output": {"dir": output_dir, "save_tokenizer": False},
        "evaluation": {"enabled": True, "lengths": list(config.eval_lengths), "tasks": ["ppl"],
                       "text_files": [prepared["eval_file"]],
                       "options": {"progress": False, "stride": max(config.eval_lengths),
                                   "max_tokens": config.eval_tokens}},
    }
    return load_recipe(data=data)


def train_and_evaluate(recipe: Any, log_path: Path) -> dict[str, Any]:
    """Run ``recipe`` (training, then its evaluation), the trainer's output going to ``log_path``; returns the
    per-length perplexities, the training losses and the time taken."""
    from hf_posenc.training.trainer import run_training

    start = time.perf_counter()
    with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), \
            warnings.catch_warnings():
        warnings.simplefilter("default")
        result = run_training(recipe)
    seconds = time.perf_counter() - start
    if not result.evaluation:
        raise RuntimeError(f"the run in {recipe.output.dir} produced no evaluation (see {log_path})")
    return {
        "perplexity": {str(p["context_length"]): {"nll": p["nll"], "ppl": p["perplexity"],
                                                  "num_scored": p["num_scored"]}
                       for p in result.evaluation["perplexity"]},
        "losses": result.losses,
        "final_train_loss": result.losses[-1] if result.losses else None,
        "seconds": seconds,
        "model_dir": result.model_dir,
    }


def score(model: Any, text: str, length: int, tokens: int) -> float:
    """Held-out loss (nats per byte) of ``model`` on ``text`` at ``length``: disjoint windows over its first
    ``tokens`` bytes, as the recipes' own evaluation."""
    from hf_posenc.evaluation import evaluate

    from .tokenizer import byte_tokenizer

    result = evaluate({"checkpoint": model}, byte_tokenizer(), tasks=("ppl",), lengths=[length], text=text,
                      stride=length, max_tokens=tokens, progress=False).to_dict()
    [scored] = result["perplexity"]
    return float(scored["nll"])


def validation_loss(model_dir: str | Path, validation_file: str | Path, length: int, tokens: int) -> float:
    """:func:`score` of the model saved in ``model_dir`` on the validation text (``validation_file``) at
    ``length``: what a rate grid chooses on, never the scored text."""
    import hf_posenc  # noqa: F401  (registers the patched model types)
    import torch
    from hf_posenc.models import load_model

    model = load_model(str(model_dir))
    with torch.no_grad():
        return score(model, Path(validation_file).read_text(), length, tokens)


@dataclass
class Cell:
    """One (scheme, seed) run of an experiment."""

    label: str
    spec: str
    seed: int
    directory: Path
    settings: dict[str, Any]
    make_recipe: Callable[[str], Any] | None  # output_dir -> recipe (None when ``execute`` is given)
    # cell directory -> result (what train_and_evaluate returns, any keys): a cell that is not a text recipe, such
    # as a custom dataset with its own evaluation (tape_arithmetic); cached and fingerprinted like the others
    execute: Callable[[Path], dict[str, Any]] | None = None

    @property
    def cost(self) -> float:
        """Relative cost for the time estimate: the scheme's (:data:`COST`) times the model's depth (layers / 2,
        where the settings hold a model)."""
        layers = getattr(self.settings.get("model"), "num_layers", None)
        return COST.get(self.spec.split(":")[0], 1.0) * (layers / 2 if layers else 1.0)

    def cached(self) -> dict[str, Any] | None:
        path = self.directory / "cell.json"
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("fingerprint") == fingerprint(self.settings):
                return data
        return None

    def run(self) -> dict[str, Any]:
        """The cell's result, from its cache or by training now."""
        found = self.cached()
        if found is not None:
            return found
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        if self.execute is not None:
            out = self.execute(self.directory)
        else:
            out = train_and_evaluate(self.make_recipe(str(self.directory / "run")), self.directory / "train.log")
        result = {"label": self.label, "spec": self.spec, "seed": self.seed, "fingerprint": fingerprint(self.settings),
                  **out}
        (self.directory / "cell.json").write_text(json.dumps(result, indent=2))
        return result


# cells trained at once by run_cells when it is not told (``hf-posenc experiment --jobs N`` sets it)
JOBS = 1


def set_jobs(jobs: int) -> None:
    """How many cells :func:`run_cells` trains at once (each in a forked process with one torch thread)."""
    global JOBS
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be a whole number >= 1, got {jobs!r}")
    JOBS = jobs


def run_cells(cells: Sequence[Cell], desc: str, progress: bool = True, jobs: int | None = None
              ) -> list[dict[str, Any]]:
    """Run every cell with a progress bar whose postfix is a cost-weighted estimate of the time left; returns the
    results in the cells' order.

    ``jobs`` (default :data:`JOBS`) > 1 trains that many cells at once, each in a forked process with one torch
    thread: the miniatures' matrices are too small for two threads to share one run, so two runs side by side do
    nearly twice the work of one on 2 cores. A cell's result is its cache (``cell.json``), which the parent reads;
    a failed cell stops the experiment naming the cell and its log."""
    from tqdm.auto import tqdm

    jobs = JOBS if jobs is None else jobs
    pending = [cell for cell in cells if cell.cached() is None]
    total_cost = sum(c.cost for c in pending)
    with tqdm(total=len(cells), desc=desc, unit="run", disable=not progress, file=sys.stderr) as bar:
        bar.update(len(cells) - len(pending))
        if jobs > 1 and len(pending) > 1:
            _run_forked(pending, jobs, bar, total_cost)
        else:
            done_cost, done_seconds = 0.0, 0.0
            for cell in pending:
                bar.set_postfix_str(f"{cell.label} seed {cell.seed}" + _eta(done_seconds, done_cost, total_cost))
                start = time.perf_counter()
                cell.run()
                done_seconds += time.perf_counter() - start
                done_cost += cell.cost
                bar.update(1)
        bar.set_postfix_str("done")
    return [cell.run() for cell in cells]  # every cell is cached now: its cell.json


def _run_forked(cells: Sequence[Cell], jobs: int, bar: Any, total_cost: float) -> None:
    """Train ``cells`` in up to ``jobs`` forked processes at once (one torch thread each)."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("fork")  # the cells' recipes are closures: inherited, not pickled
    queue = list(cells)
    running: dict[Any, tuple[Cell, Any, float]] = {}
    done_cost, busy_seconds = 0.0, 0.0
    while queue or running:
        while queue and len(running) < jobs:
            cell = queue.pop(0)
            process = context.Process(target=_train_in_child, args=(cell,), name=f"{cell.label} seed {cell.seed}")
            process.start()
            running[process.sentinel] = (cell, process, time.perf_counter())
        names = ", ".join(f"{c.label} seed {c.seed}" for c, _, _ in running.values())
        bar.set_postfix_str(names + _eta(busy_seconds / jobs, done_cost, total_cost))
        for sentinel in wait(list(running)):
            cell, process, start = running.pop(sentinel)
            process.join()
            if process.exitcode != 0 or cell.cached() is None:
                for _, other, _ in running.values():
                    other.terminate()
                raise RuntimeError(f"the run {cell.label} seed {cell.seed} failed (exit {process.exitcode}); its "
                                   f"log: {cell.directory / 'train.log'} and {cell.directory / 'error.txt'}")
            busy_seconds += time.perf_counter() - start
            done_cost += cell.cost
            bar.update(1)


def _train_in_child(cell: Cell) -> None:
    """A forked worker: one torch thread, the cell trained into its cache; an error goes to ``error.txt``."""
    import os
    import traceback

    import torch

    torch.set_num_threads(1)
    try:
        cell.run()
    except BaseException:
        cell.directory.mkdir(parents=True, exist_ok=True)
        (cell.directory / "error.txt").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def _eta(seconds: float, cost: float, total: float) -> str:
    if cost <= 0:
        return ""
    left = seconds / cost * max(0.0, total - cost)
    return f" | about {left / 60:.1f} min left"


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``0.0`` for one value); infinities propagate to the mean."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_sd of no values")
    if any(math.isinf(v) or math.isnan(v) for v in vals):
        return (math.inf if all(not math.isnan(v) for v in vals) else math.nan), math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _loss(value: float | None) -> float:
    """A held-out loss as stored (``None``: a diverged run, written as ``null`` by strict JSON)."""
    return math.inf if value is None else float(value)


@dataclass
class Summary:
    """Per scheme and length, the seeds' mean ± sd of the held-out loss (nats per byte), and the per-seed values
    behind them (``values[label][length][seed]``), which the tests of :mod:`.stats` compare."""

    lengths: list[int]
    rows: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    train_loss: dict[str, tuple[float, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    values: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)

    @classmethod
    def from_results(cls, results: Sequence[dict[str, Any]], lengths: Sequence[int]) -> Summary:
        out = cls(lengths=list(lengths))
        for label in dict.fromkeys(r["label"] for r in results):
            mine = [r for r in results if r["label"] == label]
            out.values[label] = {n: {r["seed"]: _loss(r["perplexity"][str(n)]["nll"]) for r in mine} for n in lengths}
            out.rows[label] = {n: mean_sd([_loss(r["perplexity"][str(n)]["nll"]) for r in mine]) for n in lengths}
            losses = [r["final_train_loss"] for r in mine if r.get("final_train_loss") is not None]
            if losses:
                out.train_loss[label] = mean_sd(losses)
            out.seconds[label] = statistics.fmean(r["seconds"] for r in mine)
        return out

    def diff(self, a: str, b: str | float, length: int, other_length: int | None = None) -> Difference:
        """``a − b`` at ``length`` (``b`` a row, or a constant such as a floor; ``b`` at ``other_length`` if
        given), paired by seed when both rows have the same seeds (:func:`.stats.compare`)."""
        right = b if isinstance(b, (int, float)) else self.values[b][length if other_length is None else other_length]
        return compare(self.values[a][length], right)

    def growth(self, label: str, start: int, end: int) -> dict[int, float]:
        """Per seed, the loss at ``end`` minus the loss at ``start`` (the same model at two lengths)."""
        return {s: self.values[label][end][s] - v for s, v in self.values[label][start].items()}

    def growth_diff(self, a: str, b: str, start: int, end: int, scale: float = 1.0) -> Difference:
        """``growth(a) − scale · growth(b)`` from ``start`` to ``end``, paired by seed when the seeds match."""
        gb = {s: scale * v for s, v in self.growth(b, start, end).items()}
        return compare(self.growth(a, start, end), gb)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lengths": self.lengths,
            "heldout_nll": {label: {str(n): {"mean": m, "sd": s} for n, (m, s) in row.items()}
                            for label, row in self.rows.items()},
            "final_train_loss": {label: {"mean": m, "sd": s} for label, (m, s) in self.train_loss.items()},
            "seconds_per_run": self.seconds,
        }
