"""Was TAPA's committed gap to RoPE the setup or the method? Learning curves with controls (issue #47 §1).

Every committed TAPA arm ends where NoPE ends, and the phase term starts cold: with the experiments' init the median
phase at distance 1 (TAPA eq. 12, ``2π·|m−n|^α·q_P·k_P/√((1−θ)D)`` at ``|m − n| = 1``) is about 0.11 rad at the
2-layer preset, where cos ≈ 1 gives the phase half almost no gradient. Here RoPE (3e-3 and 1e-3), NoPE (3e-3), TAPA
at 1e-3 with the paper's α = 0.1, θ = 0.5, and TAPA at 1e-3 started in the paper's phase regime (the hot start: the
median phase at distance 1 at init set to 7 rad) are trained from scratch with a constant rate after the warm-up,
one 4,000-step run per cell scored at its checkpoints (1k, 2k, 4k steps), with the phase diagnostic at each; and a
per-method rate grid at the final budget (seed 0), each method's rate chosen on the validation text.

The reading rule (:class:`.config.TapaCurvesConfig`, fixed before the runs) is :func:`read`: TAPA − RoPE shrinking
with steps, or TAPA pulling away from NoPE, says the committed gap was the setup; TAPA staying at NoPE's level with a
gap equal to NoPE − RoPE says the method, in this regime.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .claims import (
    REFUTED, TAPA_PAPER_PHASE, UNTESTABLE_SCALE, Claim, Tuning, angle,
    claims_section, llama_parameters, tapa_init_phase, tapa_regime,
)
from .config import TAPA_CURVES_NEEDED_PHASE, CurveArm, TapaCurvesConfig, rate_name
from .corpus import Corpus
from .length_generalisation import begin
from .rate_grid import best_rate, bracketing_runs, grid_edge, grid_step
from .report import TABLE_NOTE, Tests, analysis, fmt, make_payload, markdown_table, plot_settings, publish, \
    tests_explained
from .runner import Cell, Summary, build_recipe, run_cells, score, slug, train_and_evaluate
from .stats import Difference, compare
from .tokenizer import VOCAB_SIZE

REFERENCE, SAME_RATE, NOPE = "RoPE", "RoPE lr=1e-3", "NoPE"
SETUP, METHOD, NEITHER, NO_TEST = "the setup", "the method", "neither", "no test"


# -- the cells --------------------------------------------------------------------------------------------------
def score_checkpoints(run_dir: Path, config: TapaCurvesConfig, prepared: dict[str, Any]) -> dict[str, Any]:
    """Per checkpoint (str(step) -> ...): the held-out loss at L, the phase diagnostic of a TAPA model
    (:func:`hf_posenc.diagnostics.phase_regime` on the first ``diagnostic_tokens`` held-out bytes, windows of L;
    ``None`` for the other schemes) and, at the last checkpoint only, the validation loss at L (the grid's
    choice)."""
    import hf_posenc  # noqa: F401  (registers the patched model types)
    import torch
    from hf_posenc.diagnostics import phase_regime
    from hf_posenc.models import load_model

    base = config.base
    L = base.context_length
    heldout = Path(prepared["eval_file"]).read_text()
    validation = Path(prepared["validation_file"]).read_text()
    ids = torch.tensor(prepared["eval_ids"][: base.diagnostic_tokens])
    out: dict[str, Any] = {}
    for step in config.checkpoints:
        model = load_model(run_dir / f"checkpoint-{step}")
        with torch.no_grad():
            regime = phase_regime(model, ids, window=L, name=f"step {step}")
            entry = {"heldout": score(model, heldout, L, base.eval_tokens),
                     "phase": regime.to_dict() if regime.applies else None}
            if step == config.checkpoints[-1]:
                entry["validation"] = score(model, validation, L, base.eval_tokens)
        out[str(step)] = entry
    return out


def curve_cell(config: TapaCurvesConfig, prepared: dict[str, Any], work: Path, label: str, arm: CurveArm,
               seed: int) -> Cell:
    """One run of ``arm``: trained once for ``steps`` with a checkpoint every :attr:`~.TapaCurvesConfig.save_steps`,
    each of ``config.checkpoints`` scored (:func:`score_checkpoints`); the hot start's ``scheme_init.json`` kept;
    the checkpoints deleted once scored (the final model stays)."""
    base = config.base
    train = config.train_of(arm)
    settings = {"experiment": config.name, "spec": arm.spec, "seed": seed, "context_length": base.context_length,
                "model": base.model, "train": train, "scheme_init": arm.scheme_init,
                "checkpoints": config.checkpoints, "eval_tokens": base.eval_tokens,
                "diagnostic_tokens": base.diagnostic_tokens, "train_chars": base.train_chars,
                "train_bytes": prepared["train_bytes"]}

    def execute(directory: Path) -> dict[str, Any]:
        run_dir = directory / "run"
        recipe = build_recipe(base, prepared, scheme=arm.spec, seed=seed, context_length=base.context_length,
                              model=base.model, train=train, output_dir=str(run_dir), scheme_init=arm.scheme_init,
                              save_steps=config.save_steps)
        out = train_and_evaluate(recipe, directory / "train.log")
        start = time.perf_counter()
        with open(directory / "checkpoints.log", "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out["curve"] = score_checkpoints(run_dir, config, prepared)
        out["seconds"] += time.perf_counter() - start
        found = run_dir / "scheme_init.json"
        out["scheme_init"] = json.loads(found.read_text()) if found.is_file() else None
        for checkpoint in run_dir.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
        return {**out, "method": arm.method, "learning_rate": arm.learning_rate}

    return Cell(label, arm.spec, seed, work / "runs" / slug(label) / f"seed{seed}", settings, None, execute=execute)


def steps_name(steps: int) -> str:
    """``"1 step"``, ``"4,000 steps"``."""
    return f"{steps:,} step" + ("" if steps == 1 else "s")


# -- the curves -------------------------------------------------------------------------------------------------
def curves(runs: Sequence[dict[str, Any]], config: TapaCurvesConfig) -> Summary:
    """The held-out loss at L per arm, seed and checkpoint as a :class:`.runner.Summary` whose "lengths" are the
    checkpoints' steps (``summary.values[label][step][seed]``, ``summary.diff(a, b, step)``)."""
    rows = [{"label": r["label"], "seed": r["seed"], "seconds": r["seconds"],
             "final_train_loss": r.get("final_train_loss"),
             "perplexity": {str(s): {"nll": r["curve"][str(s)]["heldout"]} for s in config.checkpoints}}
            for r in runs]
    return Summary.from_results(rows, config.checkpoints)


def phases(runs: Sequence[dict[str, Any]], config: TapaCurvesConfig) -> dict[str, dict[int, dict[int, float]]]:
    """TAPA arm -> step -> seed -> median phase at distance 1 (radians, pooled over layers and heads)."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for r in runs:
        for step in config.checkpoints:
            found = r["curve"][str(step)]["phase"]
            if found is not None:
                out.setdefault(r["label"], {}).setdefault(step, {})[r["seed"]] = found["median_phase_at_distance_1"]
    return out


def gap(summary: Summary, a: str, b: str, step: int) -> dict[int, float]:
    """Per seed, ``a − b`` at ``step`` (the seeds both arms trained)."""
    left, right = summary.values[a][step], summary.values[b][step]
    return {s: v - right[s] for s, v in left.items() if s in right}


def change(summary: Summary, a: str, b: str, config: TapaCurvesConfig) -> Difference:
    """The change of ``a − b`` from the first checkpoint to the last: per seed the gap at the last minus the gap at
    the first, paired by seed (negative: the gap shrinks with steps)."""
    first, last = config.checkpoints[0], config.checkpoints[-1]
    return compare(gap(summary, a, b, last), gap(summary, a, b, first))


def tapa_arms(config: TapaCurvesConfig) -> list[str]:
    """The TAPA arms the reading rule reads (cold, then hot)."""
    return [label for label, arm in config.arms.items() if arm.spec.startswith("tapa")]


def rope_arms(config: TapaCurvesConfig) -> list[str]:
    """The RoPE arms TAPA is read against (3e-3, then 1e-3)."""
    return [label for label, arm in config.arms.items() if arm.method == "RoPE"]


@dataclass(frozen=True)
class Reading:
    """The reading rule applied to one TAPA arm.

    Attributes:
        arm: the TAPA arm.
        outcome: :data:`SETUP`, :data:`METHOD`, :data:`NEITHER` or :data:`NO_TEST`.
        changes: RoPE arm -> the change of TAPA − RoPE from the first checkpoint to the last (paired by seed).
        vs_nope: TAPA − NoPE at the last checkpoint.
        nope_gap: NoPE − RoPE (3e-3) at the last checkpoint: what position is worth to these models.
    """

    arm: str
    outcome: str
    changes: dict[str, Difference]
    vs_nope: Difference
    nope_gap: Difference


def read(summary: Summary, config: TapaCurvesConfig, arm: str) -> Reading:
    """The reading rule (fixed before the runs) for TAPA arm ``arm``: the committed gap was :data:`SETUP` when
    TAPA − RoPE (either rate) shrinks detectably from the first checkpoint to the last, or TAPA is detectably below
    NoPE at the last; :data:`METHOD` when neither shrinks and TAPA − NoPE at the last is not detected (TAPA at
    NoPE's level, its gap to RoPE NoPE's); :data:`NEITHER` otherwise (TAPA detectably above NoPE, or a gap that
    grows without TAPA leaving NoPE's level is not ruled out); :data:`NO_TEST` without intervals (one seed)."""
    last = config.checkpoints[-1]
    changes = {ref: change(summary, arm, ref, config) for ref in rope_arms(config)}
    vs_nope = summary.diff(arm, NOPE, last)
    nope_gap = summary.diff(NOPE, REFERENCE, last)
    if not vs_nope.finite or not all(d.finite for d in changes.values()):
        outcome = NO_TEST
    elif any(d.detected and d.estimate < 0 for d in changes.values()) or (vs_nope.detected and vs_nope.estimate < 0):
        outcome = SETUP
    elif not vs_nope.detected:
        outcome = METHOD
    else:
        outcome = NEITHER
    return Reading(arm, outcome, changes, vs_nope, nope_gap)


def reading_line(reading: Reading, config: TapaCurvesConfig, tests: Tests) -> str:
    """The reading of one TAPA arm in words, with its tests."""
    first, last = config.checkpoints[0], config.checkpoints[-1]
    span = f"{first:,} -> {last:,} steps"
    items = [(f"change of {reading.arm} - {ref}, {span}", d, "the gap grows", "the gap shrinks")
             for ref, d in reading.changes.items()]
    items.append((f"{reading.arm} - NoPE at {last:,}", reading.vs_nope, "higher loss than NoPE",
                  "lower loss than NoPE (pulls away)"))
    evidence = tests.line(items)
    if reading.outcome == NO_TEST:
        return (f"Reading, {reading.arm}: one run per arm, so the rule has no test; rerun with --seeds 3 "
                f"({evidence}).")
    verdicts = {
        SETUP: "the committed gap was the setup (the gap to RoPE shrinks with steps, or TAPA pulls away from NoPE)",
        METHOD: (f"the method, in this regime: TAPA stays at NoPE's level, its gap to RoPE is NoPE's "
                 f"(NoPE - RoPE {reading.nope_gap.interval()}), and it does not shrink with steps"),
        NEITHER: "neither reading of the rule: TAPA ends detectably above NoPE",
    }
    return f"Reading, {reading.arm}: {verdicts[reading.outcome]}; {evidence}."


def flattened(summary: Summary, label: str, config: TapaCurvesConfig) -> bool | None:
    """Whether ``label``'s held-out curve (mean over seeds) had flattened at the final budget: its fall over the
    last interval between checkpoints is at most ``flat_ratio`` of its fall over the first (a curve that did not
    fall has flattened); ``None`` with fewer than three checkpoints."""
    steps = config.checkpoints
    if len(steps) < 3:
        return None
    mean = [summary.rows[label][s][0] for s in steps]
    first, final = mean[0] - mean[1], mean[-2] - mean[-1]
    return True if first <= 0 else final <= config.flat_ratio * first


# -- the rate grid ----------------------------------------------------------------------------------------------
def grid_key(run: dict[str, Any]) -> tuple[str, float]:
    """A run -> its ``(method, rate)``."""
    return run["method"], run["learning_rate"]


def validation(run: dict[str, Any], config: TapaCurvesConfig) -> float | None:
    """A run's validation loss at L after the final budget (``None``: diverged)."""
    return run["curve"][str(config.checkpoints[-1])]["validation"]


def grid_runs(payload: dict[str, Any], config: TapaCurvesConfig) -> dict[str, dict[float, dict[str, Any]]]:
    """method -> rate -> its run with seed ``first_seed``, for every rate it tried (the grid's, a main arm's where
    the rate coincides, and the widening's), ascending."""
    seed = config.base.first_seed
    found = [r for r in [*payload["runs"], *payload.get("grid", [])] if r["seed"] == seed]
    return {method: {grid_key(r)[1]: r for r in sorted(found, key=grid_key) if r["method"] == method}
            for method in config.methods}


def chosen_rates(payload: dict[str, Any], config: TapaCurvesConfig) -> dict[str, float]:
    """method -> the rate whose seed-``first_seed`` run has the lowest validation loss at L after the final budget
    (the validation text, never the scored one; :func:`.rate_grid.best_rate`: a diverged run is never chosen over
    a finite one)."""
    return {method: best_rate({rate: validation(run, config) for rate, run in rates.items()})
            for method, rates in grid_runs(payload, config).items() if rates}


def best_summary(payload: dict[str, Any], config: TapaCurvesConfig) -> tuple[Summary, dict[str, str]]:
    """The held-out loss at L after the final budget of every run (main arms and grid cells) and method -> the
    label at its chosen rate: a main arm (every seed) where the chosen rate is one, else the grid's single run."""
    summary = Summary.from_results([*payload["runs"], *payload.get("grid", [])], [config.base.context_length])
    return summary, {method: config.arm_at(method, rate)[0] for method, rate in chosen_rates(payload, config).items()}


# -- the regime ---------------------------------------------------------------------------------------------------
def hot_start(payload: dict[str, Any]) -> dict[str, list[float]]:
    """The hot start as measured (``scheme_init.json`` of every hot run): ``target``, and the pooled ``before`` /
    ``after`` per-layer medians of every seed."""
    records = [r["scheme_init"]["phase_at_distance_1"] for r in [*payload["runs"], *payload.get("grid", [])]
               if r.get("scheme_init")]
    return {"target": sorted({rec["target"] for rec in records}),
            "before": [v for rec in records for v in rec["before"]],
            "after": [v for rec in records for v in rec["after"]]}


def regime(config: TapaCurvesConfig, phase_at_init: float) -> tuple[str, bool]:
    """TAPA's regime axes (:func:`.claims.tapa_regime`) for this experiment's model and budget: the median phase
    at distance 1 at init (``phase_at_init``) and the bytes trained, in the paper's tokens per parameter."""
    base = config.base
    trained = base.train.steps * base.train.batch_size * base.context_length
    return tapa_regime(phase_at_init, trained, llama_parameters(base.model.hidden_size, base.model.intermediate_size,
                                                                base.model.num_layers, VOCAB_SIZE))


# -- the verdict and the claims ---------------------------------------------------------------------------------
def verdict(payload: dict[str, Any], config: TapaCurvesConfig, tests: Tests) -> list[str]:
    """The answer, each comparison with its test: RoPE against the bigram floor; per checkpoint NoPE − RoPE and
    each TAPA arm against RoPE (both rates) and NoPE; the reading rule per TAPA arm; the phase at each
    checkpoint; the grid's choices on validation and each method at its own rate."""
    curve = curves(payload["runs"], config)
    L, steps = config.base.context_length, config.checkpoints
    last = steps[-1]
    bigram = payload["floors"]["bigram"]
    lines = [tests_explained(curve)]
    lines.append(f"RoPE at L = {L} after {last:,} steps: {curve.rows[REFERENCE][last][0]:.3f} nats/byte; " + tests.line(
        [(f"RoPE - bigram floor ({bigram:.3f})", curve.diff(REFERENCE, bigram, last), "above the floor",
          "below the floor: the models use context")]) + ".")
    for step in steps:
        items = [(f"NoPE - RoPE at {step:,}", curve.diff(NOPE, REFERENCE, step), "higher loss than RoPE",
                  "lower loss than RoPE")]
        for arm in tapa_arms(config):
            for ref in (*rope_arms(config), NOPE):
                items.append((f"{arm} - {ref} at {step:,}", curve.diff(arm, ref, step), f"higher loss than {ref}",
                              f"lower loss than {ref}"))
        means = ", ".join(f"{label} {curve.rows[label][step][0]:.3f}" for label in config.arms)
        lines.append(f"After {steps_name(step)} ({means}): " + tests.line(items) + ".")
    for arm in tapa_arms(config):
        lines.append(reading_line(read(curve, config, arm), config, tests))
    found = phases(payload["runs"], config)
    if found:
        trajectory = "; ".join(
            f"{arm}: " + ", ".join(f"{statistics.fmean(found[arm][s].values()):.2f} at {s:,}" for s in steps)
            for arm in found)
        lines.append(f"Median phase at distance 1 (rad, mean over seeds): {trajectory}; a position-only "
                     f"previous-token pattern needs about {TAPA_CURVES_NEEDED_PHASE} rad at α = 0.1.")
    lines.append(grid_line(payload, config, tests))
    return lines


def grid_line(payload: dict[str, Any], config: TapaCurvesConfig, tests: Tests) -> str:
    """The grid's choices (seed ``first_seed``, validation loss at L after the final budget) and each TAPA method
    at its own rate against RoPE and NoPE at theirs."""
    L, last = config.base.context_length, config.checkpoints[-1]
    runs, chosen = grid_runs(payload, config), chosen_rates(payload, config)
    summary, best = best_summary(payload, config)
    choices = "; ".join(
        f"{method} " + ", ".join(f"{rate_name(rate)}: {run['curve'][str(last)]['validation']:.3f}"
                                 for rate, run in rates.items()) + f" -> {rate_name(chosen[method])}"
        for method, rates in runs.items())
    items = []
    for method in (m for m in best if m.startswith("TAPA")):
        for other in ("RoPE", "NoPE"):
            if other in best:
                items.append((f"{best[method]} - {best[other]}", summary.diff(best[method], best[other], L),
                              f"higher loss than {other} at its rate", f"lower loss than {other} at its rate"))
    return (f"Rate grid at {last:,} steps (seed {config.base.first_seed} only; validation loss at L by rate, then the "
            f"rate chosen): {choices}. Each method at its own rate (every seed that cell trained: "
            f"{config.base.seeds} for a main arm's rate, seed {config.base.first_seed} alone for a grid cell's): "
            + (tests.line(items) if items else "nothing to compare") + ".")


def tuning(payload: dict[str, Any], config: TapaCurvesConfig) -> Tuning:
    """The tuning record of the comparison at each method's own rate: every method tried ``config.rates`` at the
    final budget, and the rates its widening added, chosen on the validation text; the reference's curve at its rate; TAPA's regime at the hot
    start (its measured median phase after the rescaling, else the target)."""
    curve = curves(payload["runs"], config)
    best = best_summary(payload, config)[1]
    reference = best.get("RoPE", REFERENCE)
    measured = hot_start(payload)["after"]
    phase = statistics.median(measured) if measured else config.hot_phase
    text, reached = regime(config, phase)
    tried = grid_runs(payload, config)
    return Tuning(rates={method: tuple(tried[method]) for method in config.methods},
                  steps={method: config.base.train.steps for method in config.methods}, validated=True,
                  flattened=flattened(curve, reference, config) if reference in curve.rows else None,
                  regime=text, regime_reached=reached, chosen=chosen_rates(payload, config),
                  grid=tuple(config.rates) if config.rate_extensions else ())


def paper_claims(payload: dict[str, Any], config: TapaCurvesConfig, tests: Tests) -> list[Claim]:
    """The TAPA paper's claim this experiment speaks to: TAPA trains to RoPE's perplexity inside the training
    length. Read at each method's own rate (chosen on validation) with the fixed arms' 3 seeds beside it;
    "refuted" only through :meth:`.claims.Claim.judged` with the grid's tuning record."""
    L, last = config.base.context_length, config.checkpoints[-1]
    curve = curves(payload["runs"], config)
    summary, best = best_summary(payload, config)
    items, worse = [], []
    for method in (m for m in best if m.startswith("TAPA")):
        d = summary.diff(best[method], best["RoPE"], L)
        items.append((f"{best[method]} - {best['RoPE']} (each at its rate)", d, "higher loss than RoPE",
                      "lower loss than RoPE"))
        worse.append(d.detected and d.estimate > 0)
    fixed = [(f"{arm} - RoPE (fixed arms)", curve.diff(arm, REFERENCE, last), "higher loss than RoPE",
              "lower loss than RoPE") for arm in tapa_arms(config)]
    status = REFUTED if worse and all(worse) else UNTESTABLE_SCALE
    lead = ("for this regime (a 2-layer byte model, both TAPA starts, each method at its own rate), not the paper's "
            "7B model trained on 420B tokens: TAPA has a higher loss than RoPE: " if status == REFUTED else
            "TAPA is not detectably worse than RoPE at some start, which is not a match at this scale either: ")
    return [Claim.judged(
        "TAPA", "TAPA trains to RoPE's perplexity inside the training length (within a few hundredths at 1k-8k; "
        "TAPA at 1/5 of RoPE's learning rate)", status, lead + tests.line([*items, *fixed]) + ".",
        tuning(payload, config))]


def analyse(payload: dict[str, Any], config: TapaCurvesConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    tests = Tests()
    return analysis(tests, verdict(payload, config, tests), paper_claims(payload, config, tests))


# -- the report -----------------------------------------------------------------------------------------------------
READING_RULE = (
    "Reading rule, fixed before the runs: TAPA - RoPE shrinking with steps (the per-seed gap at the last checkpoint "
    "minus at the first, paired by seed, against RoPE at 3e-3 or at 1e-3), or TAPA pulling away from NoPE (TAPA - "
    "NoPE at the last checkpoint detectably below 0), says the committed gap was the setup; TAPA staying at NoPE's "
    "level (TAPA - NoPE not detected) with no shrink, a gap equal to NoPE - RoPE, says the method, in this regime. "
    "Each TAPA arm (cold and hot start) is read separately.")


def curve_tables(payload: dict[str, Any], config: TapaCurvesConfig) -> list[str]:
    """Held-out loss at L per arm and checkpoint (mean ± sd), then each gap per checkpoint with its paired
    interval and its change from the first checkpoint to the last."""
    curve = curves(payload["runs"], config)
    steps = config.checkpoints
    head = ["arm", *[steps_name(s) for s in steps]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in config.arms:
        lines.append(f"| {label} | " + " | ".join(fmt(*curve.rows[label][s]) for s in steps) + " |")
    span = f"{steps[-1]:,} - {steps[0]:,}"
    lines += ["", "| difference at L (paired by seed) | " + " | ".join(f"{s:,}" for s in steps) + f" | {span} |",
              "|" + "---|" * (len(steps) + 2)]
    pairs = [(NOPE, REFERENCE)] + [(arm, ref) for arm in tapa_arms(config) for ref in (*rope_arms(config), NOPE)]
    for a, b in pairs:
        cells = [compare(gap(curve, a, b, s), 0.0).interval() for s in steps]
        lines.append(f"| {a} - {b} | " + " | ".join(cells) + f" | {change(curve, a, b, config).interval()} |")
    return lines


def phase_table(payload: dict[str, Any], config: TapaCurvesConfig) -> list[str]:
    """The median phase at distance 1 per TAPA arm: at init (the hot start's measured before / after; the cold
    start's expected value from its init) and at each checkpoint (mean ± sd over seeds)."""
    found = phases(payload["runs"], config)
    hot = hot_start(payload)
    model = config.base.model
    cold = tapa_init_phase(model.hidden_size, model.initializer_range)
    head = ["arm", "at init", *[steps_name(s) for s in config.checkpoints]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in tapa_arms(config):
        if config.arms[arm].phase_at_distance_1 is not None and hot["after"]:
            init = (f"{statistics.median(hot['before']):.2f} -> {statistics.median(hot['after']):.2f} "
                    "(measured, rescaled)")
        else:
            init = f"about {angle(cold)} (0.6745·2π·d·σ²)"
        cells = [fmt(*_mean_sd(found[arm][s].values()), digits=2) if arm in found else "n/a"
                 for s in config.checkpoints]
        lines.append(f"| {arm} | {init} | " + " | ".join(cells) + " |")
    return lines


def _mean_sd(values: Any) -> tuple[float, float]:
    vals = list(values)
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def grid_table(payload: dict[str, Any], config: TapaCurvesConfig) -> list[str]:
    """Per method: the validation loss at L after the final budget at each rate (seed ``first_seed``), the rate
    chosen, and that cell's held-out loss at L (mean ± sd over the seeds it trained)."""
    last, L = config.checkpoints[-1], config.base.context_length
    runs, chosen = grid_runs(payload, config), chosen_rates(payload, config)
    summary, best = best_summary(payload, config)
    columns = sorted({rate for rates in runs.values() for rate in rates})
    head = ["method", *[f"validation, lr {rate_name(r)}" for r in columns], "chosen", "held-out at L (chosen)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, rates in runs.items():
        cells = [("-" if r not in rates else "diverged" if not _finite(validation(rates[r], config)) else
                  f"{validation(rates[r], config):.3f}") for r in columns]
        label = best[method]
        seeds = len(summary.values[label][L])
        mean, sd = summary.rows[label][L]
        scored = fmt(mean, sd) + f" ({seeds} seeds)" if seeds > 1 else f"{mean:.3f} (1 seed)"
        side = grid_edge(chosen[method], tuple(rates))
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {rate_name(chosen[method])}"
                     + (f" ({side} tried)" if side else "") + f" | {scored} |")
    return lines


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def render(payload: dict[str, Any], config: TapaCurvesConfig) -> str:
    """``results.md`` from ``results.json``."""
    base = config.base
    claims = [Claim.from_dict(c) for c in payload.get("claims") or []]
    hot = hot_start(payload)
    arms = [f"- {label}: `{arm.spec}`, learning rate {rate_name(arm.learning_rate)}"
            + (f", hot start: median phase at distance 1 at init {arm.phase_at_distance_1:g} rad"
               if arm.phase_at_distance_1 is not None else "") for label, arm in config.arms.items()]
    extra = ", ".join(f"{label} (`{arm.spec}`)" for label, arm in config.grid_arms().items())
    widened = ", ".join(r["label"] for r in payload.get("grid", []) if r["label"] not in config.grid_arms())
    widening = (f" A method whose best rate was the highest or lowest it tried went on one grid step (x"
                f"{grid_step(config.rates):g}) further, up to {config.rate_extensions} beyond each end: "
                f"{widened or 'none needed one'}." if config.rate_extensions else "")
    measured = (f" Measured (`scheme_init.json` of every hot run, per layer): {statistics.median(hot['before']):.3f} "
                f"rad before, {statistics.median(hot['after']):.3f} after (medians over layers and seeds)."
                if hot["after"] else "")
    md = [
        f"# TAPA learning curves with controls ({base.size})",
        "",
        f"Rerun: `{payload['command']}`",
        "",
        f"Byte-level Llama-style model (d = {base.model.hidden_size}, {base.model.num_layers} layer{'' if base.model.num_layers == 1 else 's'}, "
        f"{base.model.num_heads} heads of {base.model.head_dim}) trained from scratch at L = {base.context_length} "
        f"bytes for {base.train.steps:,} steps of {base.train.batch_size} windows, the rate constant after "
        f"{base.train.warmup_steps} linear warm-up steps ({base.train.schedule}), initial weight std "
        f"{base.model.initializer_range:g}; {base.seeds} seeds per arm ({', '.join(map(str, base.seed_list))}). "
        f"One run per cell, scored at its checkpoints after {', '.join(f'{s:,}' for s in config.checkpoints)} steps "
        "(valid because the rate is constant after the warm-up). "
        f"Training text: {payload['corpus']}. Scored: the first {base.eval_tokens:,} bytes of the held-out novel at L, "
        "disjoint windows; held-out loss in nats per byte, mean ± sample sd over seeds. Validation (the rate grid's "
        f"choice only): its last {base.eval_tokens:,} bytes, never scored.",
        "",
        "Arms (scheme spec, learning rate):",
        "",
        *arms,
        "",
        f"Hot start: the phase half of every layer's q/k projections rescaled at init so that the median phase at "
        f"distance 1 at init is {config.hot_phase:g} rad, about the paper's regime ({angle(TAPA_PAPER_PHASE)} rad "
        f"with normal(0, 0.02) weights at LLaMA-3 7B's width; the paper states no init), against about "
        f"{angle(tapa_init_phase(base.model.hidden_size, base.model.initializer_range))} rad with this model's "
        f"init.{measured}",
        "",
        READING_RULE,
        "",
        "## Learning curves",
        "",
        "Held-out loss at L (mean ± sd), then the differences, each a paired-by-seed 95 % interval (the last column: "
        "the per-seed difference at the last checkpoint minus at the first):",
        "",
        *curve_tables(payload, config),
        "",
        "![learning curves](heldout_loss.png)",
        "",
        "Median phase at distance 1 (radians; TAPA eq. 12 at |m − n| = 1, pooled over layers and heads, on the "
        f"first {base.diagnostic_tokens:,} held-out bytes), mean ± sd over seeds; a position-only previous-token "
        f"pattern needs about {TAPA_CURVES_NEEDED_PHASE} rad at α = 0.1:",
        "",
        *phase_table(payload, config),
        "",
        "![phase at distance 1](phase_regime.png)",
        "",
        "## Rate grid at the final budget",
        "",
        f"Every method at each rate, seed {base.first_seed} only (the main arms' cells where the rate coincides; "
        f"trained for the grid: {extra or 'none'}), each method's rate chosen on the validation text.{widening}",
        "",
        *grid_table(payload, config),
        "",
        f"All runs after {base.train.steps:,} steps ({TABLE_NOTE}; grid rows are single runs):",
        "",
        markdown_table(Summary.from_results([*payload["runs"], *payload.get("grid", [])], base.eval_lengths),
                       base.length_names, payload["floors"]),
        "",
        "## Verdict",
        "",
        *[f"- {line}" for line in payload["verdict"]],
        "",
        f"Wall time {payload['wall_seconds'] / 60:.1f} min ({payload['seconds_in_runs'] / 60:.1f} min in training and "
        f"scoring runs, {payload.get('jobs', 1)} at once, torch threads {payload['machine']['threads']}). The s / run "
        "column is the measured wall time of a run; runs that shared the cores with other work are slower.",
        "",
        *claims_section(claims),
    ]
    return "\n".join(md)


def plot(payload: dict[str, Any], config: TapaCurvesConfig, out: Path) -> None:
    """``heldout_loss.png`` (held-out loss at L against steps per arm, mean ± sd, every seed a dot) and
    ``phase_regime.png`` (the median phase at distance 1 against steps per TAPA arm)."""
    curve = curves(payload["runs"], config)
    base = config.base
    title = (f"Scored at L = {base.context_length} bytes, constant rate after {base.train.warmup_steps} warm-up steps "
             f"({base.size}, {base.seeds} seeds)")
    series = {label: {f"{s:,}": curve.values[label][s] for s in config.checkpoints} for label in config.arms}
    plot_settings(series, out / "heldout_loss.png", title, "optimizer steps",
                  floors={"bigram": payload["floors"]["bigram"]})
    found = phases(payload["runs"], config)
    plot_settings({arm: {f"{s:,}": v for s, v in steps.items()} for arm, steps in found.items()},
                  out / "phase_regime.png", title, "optimizer steps",
                  ylabel="median phase at distance 1 (rad)")


def run(config: TapaCurvesConfig, out: str | Path, work: str | Path, command: str, corpus: Corpus | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment: the main arms × seeds, then the grid's extra cells (seed ``first_seed``);
    writes ``results.json``, ``results.md``, ``heldout_loss.png`` and ``phase_regime.png`` to ``out`` and returns
    the JSON payload. ``corpus`` defaults to the Austen novels."""
    from . import runner

    start = time.perf_counter()
    base = config.base
    out, work, corpus, prepared = begin(base, out, work, corpus)
    main = [curve_cell(config, prepared, work, label, arm, seed)
            for label, arm in config.arms.items() for seed in base.seed_list]
    extra = [curve_cell(config, prepared, work, label, arm, base.first_seed)
             for label, arm in config.grid_arms().items()]
    results = run_cells([*main, *extra], desc=f"{config.name} ({base.size})", progress=progress)
    runs, grid = results[: len(main)], results[len(main):]

    def widen(pairs: list[tuple[str, float]], stage: str) -> list[dict[str, Any]]:
        cells = [curve_cell(config, prepared, work, *config.arm_at(method, rate), base.first_seed)
                 for method, rate in pairs]
        return run_cells(cells, desc=f"{config.name} ({base.size}): {len(pairs)} methods at an end of their "
                         f"rates, one step beyond ({stage})", progress=progress)

    tuned = [r for r in results if r["seed"] == base.first_seed]
    found = bracketing_runs(list(config.methods), config.rates, config.rate_extensions, widen, key=grid_key,
                            loss=lambda r: validation(r, config), done=tuned)
    grid.extend(found[len(tuned):])
    summary = Summary.from_results(runs, base.eval_lengths)
    payload = make_payload(config.name, command, config.to_dict(), corpus.name,
                           "held-out cross-entropy in nats per byte (perplexity = exp)", prepared["floors"], runs,
                           time.perf_counter() - start, summary=summary.to_dict(),
                           grid=[{k: v for k, v in r.items() if k != "model_dir"} for r in grid], jobs=runner.JOBS)
    payload["seconds_in_runs"] += sum(r["seconds"] for r in grid)
    publish(out, payload, config)
    plot(payload, config, out)
    return payload


__all__ = ["Reading", "read", "curves", "phases", "chosen_rates", "best_summary", "regime", "tuning", "analyse",
           "render", "run", "SETUP", "METHOD", "NEITHER", "NO_TEST"]
