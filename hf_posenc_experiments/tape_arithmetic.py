"""TAPE on reversed-digit addition (issue #33 §3): the TAPE paper's arithmetic experiment, scaled to minutes.

The paper (§4.1, and appendix C, Fig. 5 for the setting here; the issue says "Table 1", but the paper's Table 1 is
SCROLLS and its arithmetic results are Figs. 2 and 5) trains decoder-only transformers from scratch on the
addition data of McLeish et al. (2024): both operands and the sum written least significant digit first,
``a+b=c``, every pair of operand lengths (i, j) equally often (their "bucket" method), the loss on the answer only
(their ``mask_before_equals``); it tests 100 problems per (i, j) up to twice the training length and reports
exact-match accuracy as a heatmap over (i, j) and its average: trained to 20 digits and tested to 40, RoPE 26.12 %,
RandPE 26.12 %, FIRE 39.44 %, TAPE 41.42 % (Fig. 5); trained to 40 and tested to 80, RoPE 26.32 %, TAPE 32.82 %
(Fig. 2).

Here RoPE and TAPE are trained with the same seeds on problems generated in the run (:func:`generate`, one token
per digit, ``+``, ``=`` and EOS), through the project's Trainer (:class:`~hf_posenc.training.trainer.
PosEncTrainer`), and scored on the same held-out problems, :attr:`.config.TapeArithmeticConfig.eval_samples` per
(i, j) up to ``test_digits``. Exact match is scored in one teacher-forced forward pass (:func:`score`): greedy
decoding writes the answer exactly iff at every answer position (each digit and the EOS that ends it) the argmax
given the true prefix is the true token, so the two are the same test without a decoding loop. The settings and
every scaling are in :class:`.config.TapeArithmeticConfig`.

Each finished run is cached in the work folder (:class:`.runner.Cell`; a rerun of the command resumes), the report
is rewritten after every run (a run killed late still leaves ``results.json`` and ``results.md`` of the runs that
finished), and when the config has a time budget a seed whose runs would not fit in what is left is not started
(the report lists it; a rerun with a larger budget, or on an idle GPU, adds it).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .claims import CONFIRMED, REFUTED, UNTESTABLE_HERE, UNTESTABLE_SCALE, Claim, claims_section, fixed_rates
from .config import TapeArithmeticConfig
from .report import Tests, analysis, fmt, make_payload, publish
from .runner import Cell, Summary, slug
from .stats import NO_DIFFERENCE, Difference, compare, t_quantile

# -- tokens ---------------------------------------------------------------------------------------------------------
PLUS, EQUALS, EOS, PAD = 10, 11, 12, 13  # the digits are tokens 0-9
VOCAB_SIZE = 14
SYMBOLS = "0123456789+=$_"  # token id -> character, to read a problem ($: EOS, _: padding)
IGNORE_INDEX = -100  # a label the trainer's loss skips (hf_posenc.training.data.IGNORE_INDEX)
EVAL_SEED = 20_000  # the held-out problems' generator seed: the same problems for every arm and seed
GENERATION_CHUNK = 65_536  # problems built at once (bounds the generator's temporary arrays)

REFERENCE, TAPE = "RoPE", "TAPE"
REGIONS = {"all": "heatmap average", "inside": "inside the training lengths", "beyond": "beyond them"}
# the paper's average exact-match accuracy over the test heatmap
PAPER_FIG5 = {"RoPE": 0.2612, "RandPE": 0.2612, "FIRE": 0.3944, "TAPE": 0.4142}  # trained to 20 digits, tested to 40
PAPER_FIG2 = {"RoPE": 0.2632, "RandPE": 0.2656, "NoPE": 0.2245, "FIRE": 0.2698, "TAPE": 0.3282}  # 40, tested to 80
MATERIAL = 0.01  # a difference in accuracy below one point is not called a win or a loss (the paper's gap: 15 points)


# -- data -----------------------------------------------------------------------------------------------------------
@dataclass
class Problems:
    """Addition problems as token rows.

    Attributes:
        tokens: [N, width] uint8: ``a+b=c`` with every number least significant digit first, then EOS, then PAD.
        a_digits, b_digits: the operands' lengths (digits; no leading zeros, so a 1-digit operand is 1-9).
        prompt_length: the first answer token's index (just after ``=``).
        length: the row's length through its EOS.
    """

    tokens: np.ndarray
    a_digits: np.ndarray
    b_digits: np.ndarray
    prompt_length: np.ndarray
    length: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    def text(self, k: int) -> str:
        """Problem ``k`` as written, through its EOS: ``"21+9=03$"`` is 12 + 9 = 30."""
        return "".join(SYMBOLS[t] for t in self.tokens[k, : self.length[k]])

    @property
    def longer(self) -> np.ndarray:
        """The longer operand's length, max(i, j): the problem's length in the accuracy-by-length table."""
        return np.maximum(self.a_digits, self.b_digits)


def sequence_width(max_digits: int) -> int:
    """Tokens of the longest problem with operands of up to ``max_digits``: a, +, b, =, a sum one digit longer, EOS."""
    return 3 * max_digits + 4


def bucket_lengths(count: int, max_digits: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Operand lengths (i, j) by McLeish et al.'s bucket method: every pair 1 <= i, j <= ``max_digits`` in turn
    (so each equally often, the remainder going to the first pairs), then shuffled."""
    pairs = np.arange(count) % (max_digits * max_digits)
    pairs = pairs[rng.permutation(count)]
    return (pairs // max_digits + 1).astype(np.int16), (pairs % max_digits + 1).astype(np.int16)


def grid_lengths(max_digits: int, per_pair: int) -> tuple[np.ndarray, np.ndarray]:
    """``per_pair`` problems of every operand-length pair (i, j), 1 <= i, j <= ``max_digits`` (the test heatmap)."""
    pairs = np.repeat(np.arange(max_digits * max_digits), per_pair)
    return (pairs // max_digits + 1).astype(np.int16), (pairs % max_digits + 1).astype(np.int16)


def random_operands(digits: np.ndarray, max_digits: int, rng: np.random.Generator) -> np.ndarray:
    """[N, max_digits] numbers least significant digit first, each exactly ``digits`` long: its last digit 1-9,
    the others 0-9, zeros after it (McLeish et al. draw uniformly from 10^(i-1) … 10^i - 1: the same law)."""
    n = len(digits)
    out = rng.integers(0, 10, size=(n, max_digits), dtype=np.int8)
    out[np.arange(n), digits - 1] = rng.integers(1, 10, size=n, dtype=np.int8)
    out[np.arange(max_digits)[None, :] >= digits[:, None]] = 0
    return out


def add_reversed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Column addition of numbers written least significant digit first: [N, D] + [N, D] -> [N, D + 1]."""
    out = np.zeros((a.shape[0], a.shape[1] + 1), dtype=np.int8)
    carry = np.zeros(a.shape[0], dtype=np.int8)
    for t in range(a.shape[1]):
        total = a[:, t] + b[:, t] + carry
        out[:, t], carry = total % 10, total // 10
    out[:, -1] = carry
    return out


def _problem_rows(i: np.ndarray, j: np.ndarray, max_digits: int, rng: np.random.Generator) -> Problems:
    """Problems with operands of exactly (i, j) digits: every row's pieces side by side (a, +, b, =, the sum, EOS,
    each at its widest), the digits past each number's length dropped and the rest moved left, PAD after."""
    a, b = random_operands(i, max_digits, rng), random_operands(j, max_digits, rng)
    c = add_reversed(a, b)
    n = len(i)
    longer = np.maximum(i, j).astype(np.int64)
    c_digits = longer + c[np.arange(n), longer]  # the carry out of the longer operand's last digit is one more digit
    one = np.ones((n, 1), dtype=np.int8)
    pieces = np.concatenate([a, PLUS * one, b, EQUALS * one, c, EOS * one], axis=1)
    column = np.arange(max_digits + 1)[None, :]
    keep = np.concatenate([column[:, :max_digits] < i[:, None], one > 0, column[:, :max_digits] < j[:, None],
                           one > 0, column < c_digits[:, None], one > 0], axis=1)
    tokens = np.full(pieces.shape, PAD, dtype=np.uint8)
    rows = np.broadcast_to(np.arange(n)[:, None], keep.shape)
    tokens[rows[keep], (np.cumsum(keep, axis=1, dtype=np.int16) - 1)[keep]] = pieces[keep]
    prompt = (i + j + 2).astype(np.int16)
    return Problems(tokens, i, j, prompt, (prompt + c_digits + 1).astype(np.int16))


def generate(max_digits: int, rng: np.random.Generator, *, count: int | None = None,
             per_pair: int | None = None) -> Problems:
    """Addition problems with operands of 1 to ``max_digits`` digits: ``count`` of them by the bucket method
    (training), or ``per_pair`` of every (i, j) in order (the test heatmap). Built in chunks of
    :data:`GENERATION_CHUNK` problems."""
    if (count is None) == (per_pair is None):
        raise ValueError("generate: give count (training problems) or per_pair (the test grid)")
    i, j = bucket_lengths(count, max_digits, rng) if count is not None else grid_lengths(max_digits, per_pair)
    parts = [_problem_rows(i[s: s + GENERATION_CHUNK], j[s: s + GENERATION_CHUNK], max_digits, rng)
             for s in range(0, len(i), GENERATION_CHUNK)]
    return Problems(*(np.concatenate([getattr(part, f) for part in parts]) for f in
                      ("tokens", "a_digits", "b_digits", "prompt_length", "length")))


@functools.lru_cache(maxsize=1)
def training_problems(max_digits: int, count: int, seed: int) -> Problems:
    """The training problems of ``seed`` (the arms of one seed train on the same ones; kept for the next arm)."""
    return generate(max_digits, np.random.default_rng([seed, max_digits]), count=count)


@functools.lru_cache(maxsize=1)
def test_problems(max_digits: int, per_pair: int) -> Problems:
    """The held-out problems: the same for every arm and seed (generator seed :data:`EVAL_SEED`)."""
    return generate(max_digits, np.random.default_rng([EVAL_SEED, max_digits]), per_pair=per_pair)


def batch_tensors(tokens: np.ndarray, prompt_length: np.ndarray, length: np.ndarray) -> dict[str, torch.Tensor]:
    """A batch cut to its longest row: ``input_ids``, ``position_ids`` 0…n−1 and ``labels``, the ids on the
    answer (its digits and the EOS after them) and :data:`IGNORE_INDEX` on the prompt and the padding. Padding
    comes after the EOS, so with a causal mask it changes nothing before it, and no attention mask is needed."""
    width = int(length.max())
    ids = torch.from_numpy(np.ascontiguousarray(tokens[:, :width]).astype(np.int64))
    pos = torch.arange(width)
    answer = (pos[None, :] >= torch.from_numpy(prompt_length.astype(np.int64))[:, None]) & \
             (pos[None, :] < torch.from_numpy(length.astype(np.int64))[:, None])
    return {"input_ids": ids, "labels": ids.masked_fill(~answer, IGNORE_INDEX),
            "position_ids": pos.repeat(len(ids), 1)}


class ProblemDataset(torch.utils.data.Dataset):
    """Training problems for the Trainer (one item a problem; :func:`collate` pads a batch)."""

    def __init__(self, problems: Problems):
        self.problems = problems

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, k: int) -> dict[str, Any]:
        p = self.problems
        return {"tokens": p.tokens[k], "prompt_length": p.prompt_length[k], "length": p.length[k]}


def collate(items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The Trainer's batch of :class:`ProblemDataset` items (:func:`batch_tensors`)."""
    return batch_tensors(np.stack([x["tokens"] for x in items]), np.array([x["prompt_length"] for x in items]),
                         np.array([x["length"] for x in items]))


# -- scoring --------------------------------------------------------------------------------------------------------
def score(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per problem of a batch: whether greedy decoding writes the answer exactly, its answer tokens'
    cross-entropy (nats, summed) and how many answer tokens there are. ``logits`` [B, T, V] of the teacher-forced
    batch, ``labels`` [B, T] (:func:`batch_tensors`): position t's logits predict token t + 1, and only the
    labelled positions (the answer and its EOS) count, never the prompt or the padding.

    Greedy decoding reproduces the answer iff every answer token is the argmax given the true tokens before it
    (by induction: while the decoded prefix is the true one, the next choice is the teacher-forced argmax), so
    this is exact match without a decoding loop (ties: the lower token id, as ``argmax`` and greedy decoding
    both take it)."""
    logits, target = logits[:, :-1].float(), labels[:, 1:]
    scored = target != IGNORE_INDEX
    hit = (logits.argmax(-1) == target) | ~scored
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target.clamp(min=0), reduction="none")
    return hit.all(dim=1), (nll * scored).sum(dim=1), scored.sum(dim=1)


def autocast(device: str, precision: str) -> Any:
    """bf16 autocast on CUDA when ``precision`` is ``"bf16"``, nothing otherwise."""
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: torch.nn.Module, problems: Problems, *, device: str, precision: str = "fp32",
             batch_size: int = 1024) -> dict[str, np.ndarray]:
    """Per problem (in ``problems``' order): ``correct`` (exact match, :func:`score`), ``nll`` (answer tokens,
    nats, summed) and ``scored`` (answer tokens). Batches of rows of similar length."""
    order = np.argsort(problems.length, kind="stable")
    out = {"correct": np.zeros(len(problems), bool), "nll": np.zeros(len(problems)),
           "scored": np.zeros(len(problems), np.int64)}
    model.eval()
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        batch = batch_tensors(problems.tokens[rows], problems.prompt_length[rows], problems.length[rows])
        with autocast(device, precision):
            logits = model(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device),
                           use_cache=False).logits
        correct, nll, scored = score(logits, batch["labels"].to(device))
        out["correct"][rows], out["nll"][rows], out["scored"][rows] = (
            correct.cpu().numpy(), nll.double().cpu().numpy(), scored.cpu().numpy())
    return out


def heatmap(correct: np.ndarray, a_digits: np.ndarray, b_digits: np.ndarray, max_digits: int) -> np.ndarray:
    """Exact-match accuracy per operand-length pair: [max_digits, max_digits], row i − 1, column j − 1 (NaN where
    no problem has those lengths)."""
    flat = (a_digits.astype(np.int64) - 1) * max_digits + (b_digits.astype(np.int64) - 1)
    hits = np.bincount(flat, weights=correct.astype(float), minlength=max_digits ** 2)
    counts = np.bincount(flat, minlength=max_digits ** 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (hits / counts).reshape(max_digits, max_digits)


def _longer(max_digits: int) -> np.ndarray:
    """max(i, j) of every heatmap cell."""
    n = np.arange(1, max_digits + 1)
    return np.maximum(n[:, None], n[None, :])


def accuracy_by_length(grid: np.ndarray) -> dict[int, float]:
    """n -> the mean accuracy of the heatmap cells whose longer operand has n digits (each cell weighs the same, as
    in the paper's heatmap average)."""
    longer = _longer(grid.shape[0])
    return {n: float(np.nanmean(grid[longer == n])) for n in range(1, grid.shape[0] + 1)}


def regions(grid: np.ndarray, train_digits: int) -> dict[str, float]:
    """Mean cell accuracy over the whole heatmap (``all``, the paper's average), inside the training lengths (both
    operands <= ``train_digits``) and beyond (the longer operand longer than that)."""
    inside = _longer(grid.shape[0]) <= train_digits
    return {"all": float(np.nanmean(grid)), "inside": float(np.nanmean(grid[inside])),
            "beyond": float(np.nanmean(grid[~inside])) if (~inside).any() else math.nan}


def loss_by_length(result: dict[str, np.ndarray], problems: Problems) -> dict[str, dict[str, float]]:
    """str(n) -> the answer tokens' mean cross-entropy over the problems whose longer operand has n digits, in the
    runner's ``perplexity`` layout (``nll``, ``ppl``, ``num_scored``), which :class:`.runner.Summary` reads."""
    longer, out = problems.longer, {}
    for n in range(1, int(longer.max()) + 1):
        mine = longer == n
        tokens = int(result["scored"][mine].sum())
        nll = float(result["nll"][mine].sum() / tokens)
        out[str(n)] = {"nll": nll, "ppl": math.exp(nll), "num_scored": tokens}
    return out


# -- training -------------------------------------------------------------------------------------------------------
def hardware() -> dict[str, str]:
    """Where the runs train: CUDA with bf16 autocast when a GPU is there, else the CPU in fp32."""
    if torch.cuda.is_available():
        return {"device": "cuda", "precision": "bf16" if torch.cuda.is_bf16_supported() else "fp32",
                "name": torch.cuda.get_device_name()}
    return {"device": "cpu", "precision": "fp32", "name": "cpu"}


def build_model(config: TapeArithmeticConfig, spec: str, seed: int) -> torch.nn.Module:
    """A Llama-style decoder (:class:`.config.ModelSettings`) with random weights from ``seed``, patched with the
    scheme ``spec``: the arms of one seed share every weight but the scheme's own (TAPE's are drawn after)."""
    from transformers import AutoConfig, AutoModelForCausalLM, set_seed

    from hf_posenc.patching import patch_model
    from hf_posenc.schemes.spec import parse_scheme_spec

    options = config.model.llama_config(VOCAB_SIZE, EOS, config.max_sequence_length)
    set_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(options.pop("model_type"), **options),
                                             attn_implementation="sdpa", dtype=torch.float32)
    return patch_model(model, parse_scheme_spec(spec))


def progress_callback(report: Callable[[int, int, float | None], None], every: int) -> Any:
    """A TrainerCallback that calls ``report(step, steps, last logged loss)`` every ``every`` steps and at the end."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        loss: float | None = None

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
            if logs and "loss" in logs:
                self.loss = logs["loss"]

        def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
            if state.global_step % every == 0 or state.global_step == state.max_steps:
                report(state.global_step, state.max_steps, self.loss)

    return Progress()


def train_and_score(config: TapeArithmeticConfig, spec: str, seed: int, directory: Path, where: dict[str, str],
                    report: Callable[[int, int, float | None], None] | None = None) -> dict[str, Any]:
    """Train one arm and seed (:class:`~hf_posenc.training.trainer.PosEncTrainer`, AdamW, cosine after a linear
    warm-up, loss on the answer only) and score it on the held-out problems; the Trainer's output goes to
    ``directory/train.log``, ``report`` gets the progress. Returns the cell's result (accuracy by length, the
    heatmap, its regions, the answer loss by length, the training losses and the times)."""
    from hf_posenc.training.config import TrainingSection
    from hf_posenc.training.trainer import PosEncTrainer

    device, precision = where["device"], where["precision"]
    train = config.train
    start = time.perf_counter()
    problems = training_problems(config.train_digits, train.steps * train.batch_size, seed)
    model = build_model(config, spec, seed)
    cuda = device == "cuda"
    section = TrainingSection(
        max_steps=train.steps, learning_rate=train.learning_rate, lr_scheduler_type="cosine",
        warmup_steps=train.warmup_steps, weight_decay=train.weight_decay,
        per_device_train_batch_size=train.batch_size, save_strategy="no", logging_steps=max(1, train.steps // 20),
        use_cpu=not cuda, bf16=precision == "bf16", tf32=True if cuda else None, seed=seed, disable_tqdm=True,
        activation_checkpointing=False, report_to="none", logging_nan_inf_filter=False)  # no host sync a step
    callbacks = [] if report is None else [progress_callback(report, max(1, train.steps // 10))]
    with open(directory / "train.log", "w") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log), warnings.catch_warnings():
        warnings.simplefilter("default")
        trainer = PosEncTrainer(model=model, args=section.to_training_arguments(str(directory / "run")),
                                train_dataset=ProblemDataset(problems), data_collator=collate, callbacks=callbacks,
                                loss_implementation="chunked", chunk_size=1 << 16, causal_lm=model,
                                scheme_name=spec.split(":")[0])
        trainer.train()
    if cuda:
        torch.cuda.synchronize()
    trained = time.perf_counter()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    test = test_problems(config.test_digits, config.eval_samples)
    found = evaluate(model, test, device=device, precision=precision)
    grid = heatmap(found["correct"], test.a_digits, test.b_digits, config.test_digits)
    end = time.perf_counter()
    return {"accuracy": {str(n): v for n, v in accuracy_by_length(grid).items()},
            "regions": regions(grid, config.train_digits), "heatmap": grid.tolist(),
            "perplexity": loss_by_length(found, test), "losses": losses,
            "final_train_loss": losses[-1] if losses else None, "seconds": end - start,
            "train_seconds": trained - start, "eval_seconds": end - trained, "problems_scored": len(test), **where}


# -- the grid of runs, its clock and its report --------------------------------------------------------------------
class Clock:
    """The experiment's time: elapsed, the measured seconds of each arm's runs, what is left of the budget, and the
    progress lines (to stderr, when ``show``)."""

    def __init__(self, budget: float | None, show: bool):
        self.start, self.budget, self.show = time.perf_counter(), budget, show
        self.stream = sys.stderr  # the terminal's, not the run log a training run redirects stderr to
        self.measured: dict[str, list[float]] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def record(self, label: str, seconds: float) -> None:
        self.measured.setdefault(label, []).append(seconds)

    def estimate(self, cells: Sequence[Cell]) -> float | None:
        """Seconds the uncached ``cells`` would take, from the runs of their arms so far (None: an arm not yet
        timed in this process)."""
        todo = [c for c in cells if c.cached() is None]
        if any(c.label not in self.measured for c in todo):
            return None
        return sum(statistics.fmean(self.measured[c.label]) for c in todo)

    def fits(self, cells: Sequence[Cell]) -> bool:
        """Whether ``cells`` fit in what is left of the budget (always without a budget or an estimate)."""
        need = self.estimate(cells)
        return self.budget is None or need is None or self.elapsed() + need <= self.budget

    def left(self) -> str:
        return "" if self.budget is None else f", {max(0.0, self.budget - self.elapsed()):.0f} s of the " \
                                              f"{self.budget:.0f} s budget left"

    def say(self, text: str) -> None:
        if self.show:
            print(f"[tape_arithmetic {self.elapsed():5.0f} s] {text}", file=self.stream, flush=True)


def cells_of(config: TapeArithmeticConfig, work: Path, where: dict[str, str], clock: Clock) -> list[Cell]:
    """Every (arm, seed) run, seed by seed (so a run cut short by the budget leaves whole seeds, paired)."""
    out = []
    for seed in config.seed_list:
        for label, spec in config.schemes.items():
            settings = {"experiment": config.name, "spec": spec, "seed": seed, "model": config.model,
                        "train": config.train, "train_digits": config.train_digits, "test_digits": config.test_digits,
                        "eval_samples": config.eval_samples, "eval_seed": EVAL_SEED, **where}
            settings.pop("name")  # which GPU model does not change the numbers' meaning; device and precision do
            cell = Cell(label, spec, seed, work / "runs" / slug(label) / f"seed{seed}", settings, None)
            cell.execute = functools.partial(_execute, config, cell, where, clock)
            out.append(cell)
    return out


def _execute(config: TapeArithmeticConfig, cell: Cell, where: dict[str, str], clock: Clock,
             directory: Path) -> dict[str, Any]:
    run_start = time.perf_counter()

    def report(step: int, steps: int, loss: float | None) -> None:
        spent = time.perf_counter() - run_start
        shown = "" if loss is None else f", loss {loss:.3f}"
        clock.say(f"{cell.label} seed {cell.seed}: step {step}/{steps}{shown}, {spent:.0f} s in this run, about "
                  f"{spent / step * (steps - step):.0f} s left in it{clock.left()}")

    return train_and_score(config, cell.spec, cell.seed, directory, where, report if clock.show else None)


def run(config: TapeArithmeticConfig, out: str | Path, work: str | Path, command: str,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json`` and ``results.md`` after every run, then
    ``accuracy_by_length.png`` and ``heatmaps.png``, to ``out``; returns the JSON payload."""
    out, work = Path(out), Path(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    clock = Clock(config.budget_seconds, progress)
    where = hardware()
    cells = cells_of(config, work, where, clock)
    clock.say(f"{len(cells)} runs ({', '.join(config.schemes)} x seeds {config.seed_list}) on {where['name']} "
              f"({where['precision']}){clock.left()}")
    results: list[dict[str, Any]] = []
    not_run: list[str] = []
    payload: dict[str, Any] = {}
    for seed in config.seed_list:
        group = [c for c in cells if c.seed == seed]
        if not clock.fits(group):
            not_run += [f"{c.label} seed {c.seed}" for c in group]
            clock.say(f"seed {seed} not started: its runs would take about {clock.estimate(group):.0f} s"
                      f"{clock.left()}")
            continue
        for cell in group:
            cached = cell.cached() is not None
            estimate = clock.estimate(cells[len(results):])
            clock.say(f"{cell.label} seed {cell.seed} ({len(results) + 1}/{len(cells)})"
                      + (": cached" if cached else "") + ("" if estimate is None else
                                                         f"; about {estimate:.0f} s of runs left") + clock.left())
            results.append(cell.run())
            if not cached:
                clock.record(cell.label, results[-1]["seconds"])
            payload = write_report(config, out, command, results, not_run, clock.elapsed())
    if not results:
        raise RuntimeError("tape_arithmetic: no run fitted the time budget")
    payload = write_report(config, out, command, results, not_run, clock.elapsed())
    plot(payload, config, out)
    clock.say(f"done: {out / 'results.md'}")
    return payload


def write_report(config: TapeArithmeticConfig, out: Path, command: str, results: Sequence[dict[str, Any]],
                 not_run: Sequence[str], elapsed: float) -> dict[str, Any]:
    """``results.json`` and ``results.md`` from the runs so far (:func:`.report.publish`)."""
    summary = Summary.from_results(results, config.lengths)
    payload = make_payload(
        config.name, command, config.to_dict(), "reversed-digit addition generated in the run (McLeish et al.'s "
        "bucket method, operands of 1 to each length)", "exact-match accuracy (fraction of problems, greedy "
        "decoding); summary: answer-token cross-entropy in nats per token", {}, results, elapsed,
        summary=summary.to_dict(), accuracy=accuracy_summary(results, config), not_run=list(not_run),
        device=hardware())
    return publish(out, payload, config)


# -- analysis -------------------------------------------------------------------------------------------------------
def per_seed(runs: Sequence[dict[str, Any]], read: Callable[[dict[str, Any]], float]) -> dict[str, dict[int, float]]:
    """label -> seed -> ``read(run)``."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        out.setdefault(r["label"], {})[r["seed"]] = float(read(r))
    return out


def region_values(runs: Sequence[dict[str, Any]], region: str) -> dict[str, dict[int, float]]:
    return per_seed(runs, lambda r: r["regions"][region])


def accuracy_summary(runs: Sequence[dict[str, Any]], config: TapeArithmeticConfig) -> dict[str, Any]:
    """Per arm, mean and sd over seeds of the accuracy at each length and in each region, and the seeds."""
    out: dict[str, Any] = {}
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        stats = lambda values: {"mean": statistics.fmean(values),  # noqa: E731
                                "sd": statistics.stdev(values) if len(values) > 1 else 0.0}
        out[label] = {"seeds": [r["seed"] for r in mine],
                      "by_length": {str(n): stats([r["accuracy"][str(n)] for r in mine]) for n in config.lengths},
                      "regions": {k: stats([r["regions"][k] for r in mine]) for k in REGIONS}}
    return out


def solved_up_to(runs: Sequence[dict[str, Any]], label: str, config: TapeArithmeticConfig,
                 level: float = 0.9) -> int:
    """The longest n such that the arm's mean accuracy is at least ``level`` at every length 1…n (0: not even 1)."""
    mine = [r for r in runs if r["label"] == label]
    best = 0
    for n in config.lengths:
        if statistics.fmean(r["accuracy"][str(n)] for r in mine) < level:
            break
        best = n
    return best


def _solved(n: int) -> str:
    return ("under 90 % mean accuracy already at 1 digit" if n == 0 else
            f"mean accuracy at least 90 % at every length up to {n} digit{'s' if n > 1 else ''}")


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def tests_line(runs: Sequence[dict[str, Any]]) -> str:
    """The first verdict line: how the intervals are made."""
    seeds = {label: sorted(v) for label, v in region_values(runs, "all").items()}
    sets = {tuple(s) for s in seeds.values()}
    if len(sets) == 1 and len(next(iter(sets))) > 1:
        n = len(next(iter(sets)))
        how = (f"both arms trained the same seeds ({', '.join(map(str, next(iter(sets))))}), so they are compared "
               f"paired by seed (n = {n}, df = {n - 1}, t = {t_quantile(0.975, n - 1):.3f})")
    elif all(len(s) <= 1 for s in seeds.values()):
        return ("Tests: one run per arm, so no comparison has an interval and none is a ranking; rerun with "
                "--seeds 3 or more.")
    else:
        how = "the arms trained different seeds, so they are compared with Welch's interval"
    return (f"Tests: each interval is the 95 % t interval of a difference in exact-match accuracy (a fraction of "
            f"the problems; positive: the first named is more accurate); {how}; an interval containing 0 reads "
            f"\"{NO_DIFFERENCE}\", never a ranking, and a detected difference under {MATERIAL:g} (one point) is "
            "marked negligible.")


def differences(runs: Sequence[dict[str, Any]]) -> dict[str, Difference]:
    """TAPE − RoPE in each region (paired by seed where both trained the same seeds)."""
    out = {}
    for region in REGIONS:
        values = region_values(runs, region)
        if REFERENCE in values and TAPE in values:
            out[region] = compare(values[TAPE], values[REFERENCE])
    return out


def verdict(runs: Sequence[dict[str, Any]], config: TapeArithmeticConfig, not_run: Sequence[str],
            tests: Tests) -> list[str]:
    """Plain statements the runs support: what each arm learned, then TAPE − RoPE in each region with its test."""
    T, D = config.train_digits, config.test_digits
    lines = [tests_line(runs)]
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        mean = {k: statistics.fmean(r["regions"][k] for r in mine) for k in REGIONS}
        lines.append(f"{label} ({len(mine)} seed{'s' if len(mine) > 1 else ''}): exact match on "
                     f"{pct(mean['inside'])} of the problems inside the training lengths (both operands 1-{T} "
                     f"digits), {pct(mean['beyond'])} beyond (the longer operand {T + 1}-{D}), {pct(mean['all'])} "
                     f"over the {D} x {D} heatmap; " + _solved(solved_up_to(runs, label, config)) + ".")
    found = differences(runs)
    if found:
        items = [(f"TAPE - RoPE, {REGIONS[k]}", d, "TAPE more accurate", "TAPE less accurate")
                 for k, d in found.items()]
        lines.append(tests.line(items) + ".")
    paper = (f"The paper's Fig. 5 (its 120M-parameter model, 20k steps of 512 problems) averages RoPE "
             f"{pct(PAPER_FIG5['RoPE'])} and TAPE {pct(PAPER_FIG5['TAPE'])} over the same 40 x 40 heatmap; the "
             "400 cells inside the training lengths are 25 % of it, so RoPE's 26.12 % fits a model that solves "
             "nearly all of them and little beyond (a reading of the average, not a number the paper gives).")
    if (T, D) == (20, 40):
        lines.append(paper)
    if not_run:
        lines.append(f"Not run, for the time budget ({config.budget_seconds:g} s): {', '.join(not_run)}; a rerun "
                     "of the command trains them (the finished runs are cached).")
    return lines


def _status(diff: Difference) -> str:
    """Confirmed (TAPE detectably more accurate, by at least :data:`MATERIAL`), refuted (detectably less), or
    cannot be tested at this scale."""
    if diff.detected and abs(diff.estimate) >= MATERIAL:
        return CONFIRMED if diff.estimate > 0 else REFUTED
    return UNTESTABLE_SCALE


def paper_claims(runs: Sequence[dict[str, Any]], config: TapeArithmeticConfig, tests: Tests) -> list[Claim]:
    """The TAPE paper's arithmetic claims, each with its paired interval or the reason it cannot be tested here."""
    T, D = config.train_digits, config.test_digits
    m, steps = config.model, config.train.steps
    regime = (f"for this regime (d = {m.hidden_size}, {m.num_layers} layers, {steps:,} steps of "
              f"{config.train.batch_size} problems; the paper: d = 1024, 16 layers, 20k steps of 512)")
    out: list[Claim] = []
    tuning = fixed_rates({arm: (config.train.learning_rate, steps) for arm in (REFERENCE, TAPE)},
                         regime.removeprefix("for this regime (").removesuffix(")"), False)
    found = differences(runs)
    values = {k: region_values(runs, k) for k in REGIONS}
    setting = (T, D) == (20, 40)
    if "all" in found:
        d = found["all"]
        learned = any(v > 0 for arm in values["all"].values() for v in arm.values())
        status = _status(d) if learned and setting else UNTESTABLE_SCALE
        why = (f"RoPE {pct(statistics.fmean(values['all'][REFERENCE].values()))}, TAPE "
               f"{pct(statistics.fmean(values['all'][TAPE].values()))}; " + tests.line(
                   [("TAPE - RoPE, heatmap average", d, "TAPE more accurate", "TAPE less accurate")]))
        lead = ("" if setting else f"trained to {T} digits and tested to {D} (not the paper's 20 and 40): ") + \
               ("neither arm solves a single held-out problem: " if not learned else
                f"{regime}: " if status in (CONFIRMED, REFUTED) else
                "no difference of a point or more detected: " if d.finite else "one run per arm, no interval: ")
        out.append(Claim.judged("TAPE", "trained on addition up to 20 digits and tested up to 40, TAPE's average "
                                "exact-match accuracy over the 40 x 40 operand-length heatmap is the highest: "
                                "41.42 % against RoPE's 26.12 % (appendix C, Fig. 5)", status, lead + why + ".",
                                tuning))
    if "beyond" in found:
        d = found["beyond"]
        solved = any(v > 0 for arm in values["beyond"].values() for v in arm.values())
        status = _status(d) if solved and setting else UNTESTABLE_SCALE
        inside = found["inside"]
        why = tests.line([("TAPE - RoPE, beyond the training lengths", d, "TAPE more accurate",
                           "TAPE less accurate"),
                          ("inside them", inside, "TAPE more accurate", "TAPE less accurate")])
        lead = (f"no model here solves a single problem whose longer operand has more than {T} digits, so there "
                "is no generalisation to compare: " if not solved else f"{regime}: " if status != UNTESTABLE_SCALE
                else "")
        out.append(Claim.judged("TAPE", "TAPE's gain is generalisation to operands longer than the training ones "
                                "('superior generalization to longer sequences', §4.1)", status, lead + why + ".",
                                tuning))
    out.append(Claim("TAPE", "trained up to 40 digits and tested up to 80, TAPE's heatmap average is 32.82 % "
                     "against RoPE's 26.32 % (§4.1, Fig. 2)", UNTESTABLE_HERE,
                     f"this experiment trains to {T} digits and tests to {D}"
                     + (" (the appendix's setting, the one the issue asks for)" if setting else "")
                     + "; by the paper, the 20/40 setting converges in less than half the steps of the 40/80 one."))
    return out


def analyse(payload: dict[str, Any], config: TapeArithmeticConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    tests = Tests(negligible=MATERIAL)
    return analysis(tests, verdict(payload["runs"], config, payload.get("not_run") or [], tests),
                    paper_claims(payload["runs"], config, tests))


# -- the report -----------------------------------------------------------------------------------------------------
def shown_lengths(config: TapeArithmeticConfig) -> list[int]:
    """The lengths the table shows: 1, every 5th, the last inside and the first beyond the training lengths, the
    longest."""
    T, D = config.train_digits, config.test_digits
    return sorted({1, T, min(T + 1, D), D, *range(5, D + 1, 5)})


def accuracy_table(payload: dict[str, Any], config: TapeArithmeticConfig) -> list[str]:
    acc = payload["accuracy"]
    lengths = shown_lengths(config)
    head = ["arm", *[f"n = {n}" for n in lengths], "inside (1-" + str(config.train_digits) + ")",
            f"beyond ({config.train_digits + 1}-{config.test_digits})", "heatmap average", "final train loss",
            "s / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs = payload["runs"]
    for label, row in acc.items():
        mine = [r for r in runs if r["label"] == label]
        losses = [r["final_train_loss"] for r in mine if r.get("final_train_loss") is not None]
        train = fmt(statistics.fmean(losses), statistics.stdev(losses) if len(losses) > 1 else 0.0) if losses \
            else "n/a"
        cells = [_pct_sd(row["by_length"][str(n)]) for n in lengths]
        cells += [_pct_sd(row["regions"][k]) for k in ("inside", "beyond", "all")]
        lines.append(f"| {label} | " + " | ".join(cells) +
                     f" | {train} | {statistics.fmean(r['seconds'] for r in mine):.0f} |")
    if (config.train_digits, config.test_digits) == (20, 40):
        lines.append("| *paper, Fig. 5: RoPE / TAPE* | " + " | ".join("" for _ in lengths) +
                     f" | | | {pct(PAPER_FIG5['RoPE'])} / {pct(PAPER_FIG5['TAPE'])} | | |")
    return lines


def _pct_sd(stats: dict[str, float]) -> str:
    return f"{100 * stats['mean']:.1f} ± {100 * stats['sd']:.1f}"


def loss_table(payload: dict[str, Any], config: TapeArithmeticConfig) -> list[str]:
    lengths = shown_lengths(config)
    rows = payload["summary"]["heldout_nll"]
    lines = ["| arm | " + " | ".join(f"n = {n}" for n in lengths) + " |", "|" + "---|" * (len(lengths) + 1)]
    for label, row in rows.items():
        lines.append(f"| {label} | " + " | ".join(fmt(row[str(n)]["mean"], row[str(n)]["sd"]) for n in lengths)
                     + " |")
    return lines


def render(payload: dict[str, Any], config: TapeArithmeticConfig) -> str:
    """``results.md`` from ``results.json``."""
    m, t = config.model, config.train
    runs = payload["runs"]
    devices = sorted({f"{r['device']} ({r['precision']})" for r in runs})
    claims = [Claim.from_dict(c) for c in payload.get("claims") or []]
    md = [
        f"# TAPE on reversed-digit addition ({config.size})",
        "",
        f"Rerun: `{payload['command']}`",
        "",
        f"Arms: {', '.join(f'{k} (`{v}`)' for k, v in config.schemes.items())}, the same seeds "
        f"({', '.join(map(str, config.seed_list))}). A Llama-style decoder (d = {m.hidden_size}, {m.num_layers} "
        f"layers, {m.num_heads} heads of {m.head_dim}, MLP {m.intermediate_size}, RoPE base {m.rope_theta:g}) "
        f"trained from scratch for {t.steps:,} steps of {t.batch_size} problems (AdamW, lr {t.learning_rate:g}, "
        f"{t.warmup_steps} warm-up steps, cosine, weight decay {t.weight_decay:g}) on addition with operands of "
        f"1-{config.train_digits} digits, every number least significant digit first (`a+b=c`, one token a "
        f"digit), every pair of operand lengths equally often, loss on the answer only; tested on "
        f"{config.eval_samples} held-out problems of every pair (i, j) up to {config.test_digits} digits "
        f"({config.eval_samples * config.test_digits ** 2:,} problems, the same for every run). Exact match: "
        "the greedy answer (every digit and the end) is right, scored teacher-forced in one pass. Device: "
        f"{', '.join(devices) or 'none'}.",
        "",
        "Exact-match accuracy in % (mean ± sd over seeds) by n, the longer operand's length (each (i, j) cell "
        "weighing the same), and over regions of the heatmap:",
        "",
        *accuracy_table(payload, config),
        "",
        "Answer-token cross-entropy (nats per token, mean ± sd) by n:",
        "",
        *loss_table(payload, config),
        "",
        "![accuracy by length](accuracy_by_length.png)",
        "",
        "![heatmaps](heatmaps.png)",
        "",
        *[f"- {line}" for line in payload["verdict"]],
        "",
        f"Wall time {payload['wall_seconds'] / 60:.1f} min ({payload['seconds_in_runs'] / 60:.1f} min in training "
        "and scoring runs; cached runs count their original time).",
        "",
        *claims_section(claims, ["The paper's Table 1 (which the issue names) is its SCROLLS comparison; its "
                                 "arithmetic results are Figs. 2 and 5."]),
    ]
    return "\n".join(md)


def plot(payload: dict[str, Any], config: TapeArithmeticConfig, out: Path) -> None:
    """``accuracy_by_length.png`` (each arm's mean, each seed thin) and ``heatmaps.png`` (each arm's mean heatmap
    over seeds, the training lengths outlined)."""
    from hf_posenc.results_io import pyplot

    plt = pyplot()
    runs, T, D = payload["runs"], config.train_digits, config.test_digits
    labels = list(dict.fromkeys(r["label"] for r in runs))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for k, label in enumerate(labels):
        color = f"C{k}"
        mine = [r for r in runs if r["label"] == label]
        for r in mine:
            ax.plot(config.lengths, [r["accuracy"][str(n)] for n in config.lengths], color=color, alpha=0.3, lw=0.8)
        ax.plot(config.lengths, [statistics.fmean(r["accuracy"][str(n)] for r in mine) for n in config.lengths],
                color=color, lw=2, label=f"{label} ({len(mine)} seed{'s' if len(mine) > 1 else ''})")
    ax.axvline(T + 0.5, color="black", ls=":", lw=1)
    ax.set_xlabel("digits of the longer operand")
    ax.set_ylabel("exact-match accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Trained on 1-{T} digits, {config.train.steps:,} steps ({config.size})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "accuracy_by_length.png", dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels) + 0.8, 4.0), squeeze=False)
    for ax, label in zip(axes[0], labels):
        grid = np.mean([np.array(r["heatmap"], dtype=float) for r in runs if r["label"] == label], axis=0)
        image = ax.imshow(grid, origin="lower", vmin=0, vmax=1, cmap="viridis", extent=(0.5, D + 0.5, 0.5, D + 0.5))
        ax.add_patch(plt.Rectangle((0.5, 0.5), T, T, fill=False, color="white", lw=1, ls="--"))
        ax.set_title(f"{label}: mean {np.nanmean(grid):.1%}", fontsize=10)
        ax.set_xlabel("digits of b")
        ax.set_ylabel("digits of a")
    fig.colorbar(image, ax=list(axes[0]), shrink=0.8, label="exact-match accuracy")
    fig.savefig(out / "heatmaps.png", dpi=110)
    plt.close(fig)


__all__ = ["Problems", "generate", "add_reversed", "batch_tensors", "collate", "score", "evaluate", "heatmap",
           "accuracy_by_length", "regions", "train_and_score", "run", "analyse", "render"]
