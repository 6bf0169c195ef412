"""TAPE's claim (issue #33 §2, redone per issue #47 §2), in miniature: parameter-efficient TAPE against a LoRA rank
curve at the paper's parameter ratio, each arm at its own learning rate, over several bases.

The TAPE paper (§3.3, §4.3) extends Llama2-7B from 4k to 8k tokens training TAPE's modules and reports a lower PG19
perplexity at 8k than LoRA r = 8 (7.063 against 8.199); its authors' code trains TAPE's W_att, W1, W2 and ψ (no
o_proj), the embeddings and every norm, with PI × 2, for every method. There, TAPE's modules have about twice LoRA
r = 8's parameters. Here (:class:`.config.TapePeftConfig`) a 4-layer byte-level RoPE base is pretrained at L once
per base seed, then continued at 2L with PI × 2 and each arm, everything else frozen but the norms (trained in
every arm): the norms alone (the control, the curve's r = 0), LoRA on q, k, v, o at r = 1, 2, 4, 8, 16, TAPE's
blocks at the authors' width (I = 4H: 0.10 : 1 against LoRA r = 8, for 2 heads) and TAPE's blocks widened to the
paper's ratio (1.97 : 1). Every arm tries the same rates on the first base and keeps the one with the lowest
validation loss at 2L (:func:`chosen_rates`); each arm is then continued once per base at its rate. TAPE is
compared, at the trained length, with LoRA at its own trainable-parameter count (the curve interpolated,
:func:`interpolate`), with LoRA r = 8 (the paper's comparison) and with the control, paired by base; "refuted"
needs the paper's regime (:class:`.claims.Tuning`). All through the project's recipe trainer and real PEFT (LoRA;
``peft.r = 0`` trains the norms whole through PEFT's LN-tuning wrapper, with TAPE's blocks as modules to save).

Timings (``small``, measured on 2 cores with timed 100-step runs, one torch thread each, two at a time as the
experiment runs them): the base's pretraining 53 ms a step, the norms alone 44, LoRA 49-54 (r = 1 to 16), TAPE
59-62 at I = 4H and 62-68 widened, plus 3-5 s a run for set-up, the scored evaluation (L to 8L) and the validation
pass (under 1 s); alone on an idle core each is 10-20 % faster. At 1,000 steps a base takes about 62 s and a
continued run 48-70 s (467 s for the 8 arms on one base), so the 3 bases, the 24 grid runs and the 16 runs on the
other bases, two at a time, take about 23 min, within the 30-minute budget. A partial run of the whole pipeline
(2 bases, 200 pretraining and 40 continued steps, the cores partly busy) took 2.6 min, within 12 % of the same
arithmetic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import runner
from .claims import CONFIRMED, REFUTED, UNTESTABLE_SCALE, Claim, Tuning, claims_section
from .config import (
    LLAMA2_PRETRAIN_LEARNING_RATE, LLAMA2_7B, LLAMA_NORMS, TAPE_PAPER_LEARNING_RATE, TAPE_PAPER_LORA_RANK,
    TAPE_PEFT_CONTROL, TAPE_PEFT_TAPE, TAPE_PEFT_WIDE, PeftArm, TapePeftConfig, lora_label, lora_parameters,
    paper_ratio, tape_parameters,
)
from .context_extension import BASE_LABEL
from .corpus import Corpus
from .length_generalisation import begin
from .rate_grid import best_rate, bracketing_runs, grid_edge, one_digit, tried_rates
from .report import (
    NEGLIGIBLE, TABLE_NOTE, Tests, analysis, make_payload, markdown_table, plot_summary, publish, tests_explained,
)
from .runner import Cell, Summary, build_recipe, fingerprint, run_cells, slug, train_and_evaluate
from .stats import Difference, compare
from .tokenizer import VOCAB_SIZE

# cells trained at once unless ``--jobs`` asks for more: two runs side by side on 2 cores (runner.run_cells)
JOBS = 2
# a TAPE arm is in the paper's regime when its TAPE : LoRA r = 8 ratio is at least this fraction of the paper's
REGIME_FRACTION = 0.5


# -- what trains ------------------------------------------------------------------------------------------------
def peft_section(config: TapePeftConfig, arm: PeftArm) -> dict[str, Any]:
    """The recipe's ``peft`` section of ``arm``, the norms trained in every arm: LoRA at the arm's rank (alpha =
    ``lora_alpha_per_rank`` × rank, dropout 0) on ``config.lora_modules`` with the norms trained whole; or, without
    LoRA (``r = 0``), the norms as PEFT's targets, trained whole, and the scheme's modules (TAPE's blocks) where the
    arm says so. Nothing else trains: no embeddings (this base ties them to the output head, which ``r = 0``
    cannot keep tied), no o_proj."""
    lora = {"r": arm.rank, "alpha": config.lora_alpha_per_rank * arm.rank,
            "target_modules": list(config.lora_modules), "trainable_norms": True}
    whole = {"r": 0, "alpha": 16.0, "target_modules": list(LLAMA_NORMS), "trainable_norms": False}
    return {"enabled": True, **(lora if arm.lora else whole), "dropout": 0.0, "modules_to_save": [],
            "trainable_embeddings": False, "scheme_modules": arm.scheme_modules}


def _base_model(config: TapePeftConfig) -> Any:
    """A fresh Llama of ``config.model`` at the extended length (the base's shape, random weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = config.model.llama_config(VOCAB_SIZE, VOCAB_SIZE - 1, config.extended_length)
    return LlamaForCausalLM(LlamaConfig(**{k: v for k, v in settings.items() if k != "model_type"}))


def trainable_parameters(config: TapePeftConfig, arm: PeftArm) -> dict[str, int]:
    """Name -> size of every parameter that trains in ``arm``, counted on the model the trainer builds: the Llama of
    ``config.model``, patched with the arm's scheme, wrapped by PEFT with the config
    :func:`hf_posenc.adapters.lora_config` makes from :func:`peft_section` (as ``hf_posenc.training`` does)."""
    import hf_posenc  # noqa: F401  (registers the patched model types)
    from peft import get_peft_model

    from hf_posenc.adapters import lora_config
    from hf_posenc.patching import patch_model
    from hf_posenc.schemes.spec import parse_scheme_spec

    model = _base_model(config)
    patch_model(model, parse_scheme_spec(arm.spec))
    p = peft_section(config, arm)
    with warnings.catch_warnings():  # PEFT's LN tuning names LayerNorm; RMSNorm is "at your own risk" (it works)
        warnings.simplefilter("ignore")
        peft_config = lora_config(model, r=p["r"], lora_alpha=p["alpha"], lora_dropout=p["dropout"],
                                  target_modules=p["target_modules"], train_norms=p["trainable_norms"],
                                  modules_to_save=p["modules_to_save"], scheme_modules=p["scheme_modules"])
        wrapped = get_peft_model(model, peft_config)
    return {name: param.numel() for name, param in wrapped.named_parameters() if param.requires_grad}


def module_kind(name: str) -> str:
    """What a trainable parameter belongs to: ``tape`` (TAPE's blocks), ``lora`` (LoRA's A and B), ``norms``."""
    if ".tape." in name:
        return "tape"
    if ".lora_A." in name or ".lora_B." in name:
        return "lora"
    if any(f".{norm}." in name for norm in LLAMA_NORMS):
        return "norms"
    return "other"


def arm_budget(config: TapePeftConfig) -> dict[str, dict[str, Any]]:
    """Label -> ``{"rank", "parameters", "method_parameters", "by_module"}``: each arm's LoRA rank (0 without
    LoRA), its trainable parameters counted on the built model (:func:`trainable_parameters`), those of its method
    (all but the norms, which every arm trains) and the count per :func:`module_kind`."""
    out = {}
    for label, arm in config.arms.items():
        by_module: dict[str, int] = {}
        for name, size in trainable_parameters(config, arm).items():
            by_module[module_kind(name)] = by_module.get(module_kind(name), 0) + size
        total = sum(by_module.values())
        out[label] = {"rank": arm.rank, "parameters": total, "method_parameters": total - by_module.get("norms", 0),
                      "by_module": by_module}
    return out


def base_parameters(config: TapePeftConfig) -> int:
    """Parameters of the base model (tied embeddings)."""
    return sum(p.numel() for p in _base_model(config).parameters())


def ratio(config: TapePeftConfig, budget: dict[str, dict[str, Any]], label: str) -> float:
    """``label``'s method parameters against LoRA r = 8's on this model (the paper's comparison)."""
    return budget[label]["method_parameters"] / lora_parameters(config.model, TAPE_PAPER_LORA_RANK)


def in_paper_regime(value: float) -> bool:
    """A TAPE : LoRA r = 8 ratio of at least :data:`REGIME_FRACTION` of the paper's (:func:`.config.paper_ratio`)."""
    return value >= REGIME_FRACTION * paper_ratio()


def extension_recipe(config: TapePeftConfig, prepared: dict[str, Any], arm: PeftArm, rate: float, seed: int,
                     output_dir: str, base_dir: str) -> Any:
    """The validated recipe of one continued run: the base in ``base_dir`` at 2L with ``arm``'s scheme (PI
    included) and :func:`peft_section`, ``config.extend``'s optimisation at ``rate``, evaluation at ``config``'s
    lengths on the scored text."""
    from hf_posenc.training.config import PeftSection, validate_recipe

    train = dataclasses.replace(config.extend, learning_rate=rate)
    recipe = build_recipe(config, prepared, scheme=arm.spec, seed=seed, context_length=config.extended_length,
                          model=config.model, train=train, output_dir=output_dir, base_model=base_dir)
    recipe = dataclasses.replace(recipe, peft=PeftSection(**peft_section(config, arm)))
    validate_recipe(recipe)
    return recipe


def validation_loss(run_dir: str | Path, text: str, length: int, tokens: int) -> dict[str, Any]:
    """Held-out loss of the finished run in ``run_dir`` (its base, scheme and adapter reloaded) on the validation
    ``text`` at ``length``, disjoint windows over its first ``tokens`` bytes: what each arm's rate is chosen on."""
    from hf_posenc.evaluation import evaluate
    from hf_posenc.training.trainer import load_trained

    model, tokenizer = load_trained(run_dir)
    result = evaluate({"validation": model}, tokenizer, tasks=("ppl",), lengths=[length], text=text, stride=length,
                      max_tokens=tokens, progress=False).to_dict()
    [scored] = result["perplexity"]
    return {"context_length": length, "nll": scored["nll"], "num_scored": scored["num_scored"]}


# -- the run ----------------------------------------------------------------------------------------------------
def base_cells(config: TapePeftConfig, prepared: dict[str, Any], work: Path, common: dict[str, Any]
               ) -> tuple[list[Cell], dict[int, dict[str, Any]]]:
    """The bases: RoPE pretrained at L with ``config.pretrain``, one per base seed; and each one's settings (which
    the continued runs' settings name)."""
    cells, settings = [], {}
    for seed in config.bases:
        settings[seed] = {**common, "role": "base", "spec": "rope", "seed": seed,
                          "context_length": config.context_length, "model": config.model, "train": config.pretrain}

        def make(d: str, seed: int = seed) -> Any:
            return build_recipe(config, prepared, scheme="rope", seed=seed, model=config.model,
                                context_length=config.context_length, train=config.pretrain, output_dir=d)

        cells.append(Cell(BASE_LABEL, "rope", seed, work / "runs" / "base" / f"seed{seed}", settings[seed], make))
    return cells, settings


def extension_cell(config: TapePeftConfig, prepared: dict[str, Any], work: Path, common: dict[str, Any],
                   label: str, rate: float, seed: int, base: dict[str, Any], base_settings: dict[str, Any]) -> Cell:
    """One continued run: arm ``label`` at ``rate`` from the base of ``seed`` (also the run's data seed), scored on
    the held-out text at every length and on the validation text at 2L (:func:`validation_loss`)."""
    arm = config.arms[label]
    length = config.extended_length
    settings = {**common, "role": "extension", "base": fingerprint(base_settings), "spec": arm.spec, "seed": seed,
                "context_length": length, "model": config.model,
                "train": dataclasses.replace(config.extend, learning_rate=rate), "peft": peft_section(config, arm),
                "validation": {"length": length, "tokens": config.eval_tokens}}
    text = Path(prepared["validation_file"]).read_text()

    def execute(directory: Path) -> dict[str, Any]:
        recipe = extension_recipe(config, prepared, arm, rate, seed, str(directory / "run"), base["model_dir"])
        out = train_and_evaluate(recipe, directory / "train.log")
        with open(directory / "validation.log", "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out["validation"] = validation_loss(directory / "run", text, length, config.eval_tokens)
        return {**out, "learning_rate": rate}

    return Cell(label, arm.spec, seed, work / "runs" / slug(label) / f"lr{rate:g}" / f"base{seed}", settings, None,
                execute=execute)


def run(config: TapePeftConfig, out: str | Path, work: str | Path, command: str, corpus: Corpus | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment: the bases, every arm at every rate on the first base, each arm at its rate
    on the other bases; writes ``results.json``, ``results.md``, ``heldout_loss.png`` and
    ``loss_vs_parameters.png`` to ``out`` and returns the JSON payload. ``corpus`` defaults to the Austen novels."""
    start = time.perf_counter()
    out, work, corpus, prepared = begin(config, out, work, corpus)
    jobs = max(runner.JOBS, JOBS)
    budget = arm_budget(config)
    common = {"experiment": config.name, "eval_lengths": config.eval_lengths, "eval_tokens": config.eval_tokens,
              "train_chars": config.train_chars, "train_bytes": prepared["train_bytes"]}
    what = f"{config.name} ({config.size})"
    cells, base_settings = base_cells(config, prepared, work, common)
    bases = dict(zip(config.bases, run_cells(cells, desc=f"{what}: pretraining the bases", progress=progress,
                                             jobs=jobs)))
    tuned_on = config.bases[0]

    def cell(label: str, rate: float, seed: int) -> Cell:
        return extension_cell(config, prepared, work, common, label, rate, seed, bases[seed], base_settings[seed])

    def train(pairs: list[tuple[str, float]], stage: str) -> list[dict[str, Any]]:
        desc = (f"{what}: {len(config.learning_rates)} rates per arm on base {tuned_on}" if stage == "grid" else
                f"{what}: {len(pairs)} arms at an end of their rates, one step beyond, on base {tuned_on}")
        return run_cells([cell(label, rate, tuned_on) for label, rate in pairs], desc=desc, progress=progress,
                         jobs=jobs)

    grid = bracketing_runs(list(config.arms), config.learning_rates, config.rate_extensions, train, key=grid_key,
                           loss=lambda r: r["validation"]["nll"])
    chosen = chosen_rates(grid, config)
    others = [cell(label, chosen[label], seed) for label in config.arms for seed in config.bases[1:]]
    rest = run_cells(others, desc=f"{what}: each arm at its rate on the other bases", progress=progress, jobs=jobs)
    final = []
    for label in config.arms:
        final.append(next(r for r in grid if r["label"] == label and r["learning_rate"] == chosen[label]))
        final.extend(r for r in rest if r["label"] == label)
    everything = [*bases.values(), *final]
    summary = Summary.from_results(everything, config.eval_lengths)
    payload = make_payload(config.name, command, config.to_dict(), corpus.name,
                           "held-out cross-entropy in nats per byte (perplexity = exp)", prepared["floors"],
                           everything, time.perf_counter() - start, summary=summary.to_dict(), trainable=budget,
                           base_parameters=base_parameters(config), paper_ratio=paper_ratio(),
                           grid=[{k: v for k, v in r.items() if k != "model_dir"} for r in grid], chosen_rates=chosen,
                           jobs=jobs)
    payload["seconds_in_runs"] += sum(r["seconds"] for r in grid if r not in final)
    publish(out, payload, config)
    plot_summary(summary, out / "heldout_loss.png",
                 f"{config.seeds} bases at L = {config.context_length}, extended at {config.extended_length} bytes "
                 f"with PI x{config.position_interpolation:g}, each arm at its rate ({config.size})",
                 prepared["floors"], config.extended_length)
    plot_parameters(summary, config, budget, out / "loss_vs_parameters.png")
    return payload


# -- the rate grid ----------------------------------------------------------------------------------------------
def grid_key(result: dict[str, Any]) -> tuple[str, float]:
    """A grid run -> its ``(arm, rate)``."""
    return result["label"], result["learning_rate"]


def chosen_rates(grid: Sequence[dict[str, Any]], config: TapePeftConfig) -> dict[str, float]:
    """Label -> the rate, of every rate it tried on the first base, with the lowest validation loss at 2L
    (:func:`.rate_grid.best_rate`: the lower rate on a tie; a diverged run counts as infinite)."""
    return {label: best_rate(grid_losses(grid, label, config)) for label in config.arms}


def grid_losses(grid: Sequence[dict[str, Any]], label: str, config: TapePeftConfig) -> dict[float, float]:
    """Rate -> validation loss at 2L of ``label``'s run on the first base, for every rate it tried (the grid's,
    and those the widening added); infinite for a diverged run."""
    found = {r["learning_rate"]: r["validation"]["nll"] for r in grid
             if r["label"] == label and r["seed"] == config.bases[0]}
    missing = [rate for rate in config.learning_rates if rate not in found]
    if missing:
        raise ValueError(f"the rate grid has no run of {label!r} at {missing}")
    return {rate: math.inf if loss is None else float(loss) for rate, loss in sorted(found.items())}


def arm_rates(grid: Sequence[dict[str, Any]], label: str) -> tuple[float, ...]:
    """The rates ``label`` tried, ascending."""
    return tried_rates(grid, label, grid_key)


def at_edge(grid: Sequence[dict[str, Any]], label: str, rate: float) -> str:
    """``"highest"`` / ``"lowest"`` where ``rate`` is that end of the rates ``label`` tried, else ``""``
    (:func:`.rate_grid.grid_edge`)."""
    return grid_edge(rate, arm_rates(grid, label))


def flattened(losses: Sequence[float], fraction: float) -> bool | None:
    """Whether a run's logged training losses had flattened: the last quarter's mean fell from the third quarter's
    by at most ``fraction`` of the fall from the first log to the last quarter (a run that did not fall at all has
    flattened); ``None`` with fewer than 8 logs (not measured)."""
    if len(losses) < 8:
        return None
    q = len(losses) // 4
    last, third = statistics.fmean(losses[-q:]), statistics.fmean(losses[-2 * q:-q])
    fall = losses[0] - last
    return True if fall <= 0 else third - last <= fraction * fall


def reference_arm(config: TapePeftConfig) -> str:
    """The arm whose curve says whether the runs had flattened: LoRA r = 8 (the paper's), else the highest rank."""
    rank = TAPE_PAPER_LORA_RANK if TAPE_PAPER_LORA_RANK in config.ranks else max(config.ranks)
    return lora_label(rank)


def reference_flattened(payload: dict[str, Any], config: TapePeftConfig) -> bool | None:
    """:func:`flattened` for the reference arm's run on every base (``None`` if any is not measured)."""
    reads = [flattened(r["losses"], config.flat_fraction) for r in payload["runs"]
             if r["label"] == reference_arm(config)]
    return None if not reads or None in reads else all(reads)


# -- the LoRA curve ---------------------------------------------------------------------------------------------
def curve(config: TapePeftConfig, budget: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """The LoRA curve's points, (label, method parameters), fewest first: the control (0), then each rank."""
    return sorted([(TAPE_PEFT_CONTROL, budget[TAPE_PEFT_CONTROL]["method_parameters"]),
                   *[(lora_label(r), budget[lora_label(r)]["method_parameters"]) for r in config.ranks]],
                  key=lambda point: point[1])


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """The curve through ``points`` (parameters, loss; increasing parameters) at ``x`` parameters: linear in the
    parameters between a point at 0 (the control) and the next, linear in log parameters between two ranks (LoRA's
    loss falls about evenly per doubling of rank); outside the curve, its nearest end (no extrapolation)."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = (x - x0) / (x1 - x0) if x0 <= 0 else math.log(x / x0) / math.log(x1 / x0)
            return y0 + t * (y1 - y0)
    return points[-1][1]


def bracket(config: TapePeftConfig, budget: dict[str, dict[str, Any]], parameters: int) -> str:
    """Where ``parameters`` falls on the curve, in words: ``"between LoRA r=8 (16,384) and LoRA r=16 (32,768)"``."""
    points = curve(config, budget)
    if parameters <= points[0][1]:
        return f"at or below {points[0][0]} ({points[0][1]:,})"
    for (a, pa), (b, pb) in zip(points, points[1:]):
        if parameters <= pb:
            return f"between {a} ({pa:,}) and {b} ({pb:,})"
    return f"beyond {points[-1][0]} ({points[-1][1]:,}), compared with it (fewer parameters than TAPE)"


def lora_at(summary: Summary, config: TapePeftConfig, budget: dict[str, dict[str, Any]], parameters: int,
            length: int) -> dict[int, float]:
    """Per base, the LoRA curve's loss at ``length`` interpolated at ``parameters`` (:func:`interpolate`)."""
    points = curve(config, budget)
    seeds = summary.values[points[0][0]][length]
    return {seed: interpolate([(p, summary.values[label][length][seed]) for label, p in points], parameters)
            for seed in seeds}


def equal_count(summary: Summary, config: TapePeftConfig, budget: dict[str, dict[str, Any]], label: str,
                length: int) -> Difference:
    """``label`` − LoRA at ``label``'s trainable-parameter count, at ``length``, paired by base."""
    return compare(summary.values[label][length],
                   lora_at(summary, config, budget, budget[label]["method_parameters"], length))


# -- the analysis -----------------------------------------------------------------------------------------------
def decisive(diff: Difference) -> bool:
    """Detected (the interval excludes 0) and at least :data:`.report.NEGLIGIBLE` (0.001 nats/byte, the tables'
    precision): a difference that can decide a claim."""
    return diff.detected and abs(diff.estimate) >= NEGLIGIBLE


def tape_claim_status(vs_lora: Difference, vs_control: Difference) -> str:
    """The reading of TAPE's claim from TAPE − LoRA at TAPE's parameter count and TAPE − the control (the norms
    alone) at the trained length (negative: TAPE has the lower loss): **refuted** when TAPE is decisively worse
    than LoRA at its count, or than the control (its modules then cost); **confirmed** when decisively better than
    both; otherwise it cannot be told at this scale (an interval containing 0 is not a match). A "refuted" reading
    becomes "not tested fairly" where the tuning record is not fair (:meth:`.claims.Claim.judged`)."""
    if any(decisive(d) and d.estimate > 0 for d in (vs_lora, vs_control)):
        return REFUTED
    if all(decisive(d) and d.estimate < 0 for d in (vs_lora, vs_control)):
        return CONFIRMED
    return UNTESTABLE_SCALE


def describe_budget(trainable: dict[str, dict[str, Any]]) -> str:
    """``"norms only 576 (norms 576); LoRA r=1 2,624 (lora 2,048, norms 576); ..."``."""
    return "; ".join(f"{label} {b['parameters']:,} (" + ", ".join(f"{k} {v:,}" for k, v in b["by_module"].items())
                     + ")" for label, b in trainable.items())


def tuning(payload: dict[str, Any], config: TapePeftConfig, label: str) -> Tuning:
    """The tuning record of the comparison of TAPE arm ``label`` with the LoRA curve and the control: the rates
    every arm tried, the steps, the reference's curve, and the parameter ratio against the paper's."""
    compared = [TAPE_PEFT_CONTROL, *map(lora_label, config.ranks), label]
    value = ratio(config, payload["trainable"], label)
    regime = (f"TAPE : LoRA r = {TAPE_PAPER_LORA_RANK} parameters {value:.2f} : 1 here against the paper's "
              f"{paper_ratio():.2f} : 1 (Llama-2-7B, {LLAMA2_7B.num_heads} heads); in the paper's regime from "
              f"{REGIME_FRACTION * paper_ratio():.2f} : 1")
    return Tuning(rates={arm: arm_rates(payload["grid"], arm) for arm in compared},
                  steps={arm: config.extend.steps for arm in compared}, validated=True,
                  flattened=reference_flattened(payload, config), regime=regime, regime_reached=in_paper_regime(value),
                  chosen={arm: rate for arm, rate in chosen_rates(payload["grid"], config).items() if arm in compared},
                  grid=tuple(config.learning_rates) if config.rate_extensions else ())


def rate_line(payload: dict[str, Any], config: TapePeftConfig) -> str:
    """The rates tried and chosen, in words, with the arms whose best rate is at the grid's edge."""
    grid, chosen = payload["grid"], chosen_rates(payload["grid"], config)
    edges = [f"{label} ({at_edge(grid, label, rate)})" for label, rate in chosen.items()
             if at_edge(grid, label, rate)]
    widened = [f"{label} {'/'.join(f'{r:g}' for r in arm_rates(grid, label) if r not in config.learning_rates)}"
               for label in config.arms if set(arm_rates(grid, label)) - set(config.learning_rates)]
    extra = (f"; the arms whose best was an end of what they tried went on one step at a time, up to "
             f"{config.rate_extensions} beyond each end: " + ", ".join(widened) if widened else
             "; no arm needed a rate beyond the grid" if config.rate_extensions else "")
    return (f"Rates: every arm tried {', '.join(f'{r:g}' for r in config.learning_rates)} for "
            f"{config.extend.steps:,} steps on base {config.bases[0]}{extra}; each kept the one with the lowest "
            f"validation loss at {config.extension_factor}L: "
            + "; ".join(f"{label} {rate:g}" for label, rate in chosen.items())
            + ". " + (f"Best at the edge of the rates tried: {', '.join(edges)} (a rate beyond it might do better)."
                      if edges else "Every arm's best rate is inside the rates it tried."))


def verdict(summary: Summary, payload: dict[str, Any], config: TapePeftConfig, tests: Tests) -> list[str]:
    """The design's record (bases, parameters, rates, the reference's curve), every arm against the unextended
    base, the LoRA curve, then each TAPE arm against LoRA at its count, LoRA r = 8 and the control, at 2L, L and
    the longest length."""
    trained, longest, L = config.extended_length, config.eval_lengths[-1], config.context_length
    f, k = config.extension_factor, longest // L
    budget = payload["trainable"]
    reference = reference_arm(config)
    rule = f"its last quarter's mean fell by at most {config.flat_fraction:g} of its fall from the first log"
    flat = {True: f"had flattened by the end on every base ({rule})",
            False: f"was still falling at the end on some base (the flattening rule: {rule})",
            None: "was not measured (fewer than 8 logged losses)"}
    lines = [tests_explained(summary),
             f"Bases: {config.seeds} RoPE bases pretrained with seeds {', '.join(map(str, config.bases))}; every arm "
             "is continued once per base at its rate, so the intervals are over bases, paired by base: they contain "
             "the bases' spread and the continued training's.",
             f"Trainable parameters (counted on the model PEFT builds; the base has {payload['base_parameters']:,}; "
             "the norms train in every arm): " + describe_budget(budget) + ".",
             rate_line(payload, config),
             f"The reference's curve: {reference}'s logged training loss (windows new to the run) "
             f"{flat[reference_flattened(payload, config)]}."]
    for label in config.arms:
        row = summary.rows[label]
        lines.append(f"{label}: {row[trained][0]:.3f} at {f}L (trained length), {row[longest][0]:.3f} at {k}L; "
                     + tests.line([(f"{label} - base at {f}L", summary.diff(label, BASE_LABEL, trained),
                                    "higher loss than the base", "lower loss than the base")]) + ".")
    ranks = [lora_label(r) for r in config.ranks]
    lines.append(f"The LoRA curve at {f}L: " + ", ".join(f"{a} {summary.rows[a][trained][0]:.3f}" for a in
                                                        [TAPE_PEFT_CONTROL, *ranks]) + "; "
                 + tests.line([(f"{ranks[-1]} - {ranks[0]} at {f}L", summary.diff(ranks[-1], ranks[0], trained),
                                f"higher loss than {ranks[0]}", f"lower loss than {ranks[0]}")]) + ".")
    for label in config.tape_arms:
        params = budget[label]["method_parameters"]
        lines.append(f"{label}: {params:,} parameters besides the norms, {ratio(config, budget, label):.2f} : 1 "
                     f"against LoRA r = {TAPE_PAPER_LORA_RANK}, {bracket(config, budget, params)} on the curve.")
        for length, name in ((trained, f"{f}L"), (L, "L"), (longest, f"{k}L")):
            items = [(f"{label} - LoRA at its count at {name}", equal_count(summary, config, budget, label, length),
                      "higher loss than LoRA at its count", "lower loss than LoRA at its count"),
                     (f"{label} - {reference} at {name}", summary.diff(label, reference, length),
                      f"higher loss than {reference}", f"lower loss than {reference}"),
                     (f"{label} - {TAPE_PEFT_CONTROL} at {name}", summary.diff(label, TAPE_PEFT_CONTROL, length),
                      f"higher loss than {TAPE_PEFT_CONTROL}", f"lower loss than {TAPE_PEFT_CONTROL}")]
            lines.append(f"At {name}" + (" (the trained length)" if length == trained else "") + ": "
                         + tests.line(items) + ".")
    return lines



CLAIM = ("parameter-efficient TAPE (its blocks trained, the base frozen) extends a RoPE model's context better than "
         "LoRA (Llama2-7B from 4k to 8k, TAPE's modules about twice LoRA r = 8's parameters: PG19 perplexity at 8k "
         "7.063 vs 8.199)")
WHICH = {TAPE_PEFT_TAPE: "TAPE at the authors' width, I = 4 x heads",
         TAPE_PEFT_WIDE: "TAPE widened to the paper's parameter ratio"}


def paper_claims(summary: Summary, payload: dict[str, Any], config: TapePeftConfig, tests: Tests) -> list[Claim]:
    """TAPE's claim, once per TAPE arm, from TAPE − LoRA at TAPE's count and TAPE − the control at the trained
    length (:func:`tape_claim_status`), judged with the arm's tuning record (:func:`tuning`)."""
    trained, f = config.extended_length, config.extension_factor
    budget, reference = payload["trainable"], reference_arm(config)
    out = []
    for label in config.tape_arms:
        vs_lora = equal_count(summary, config, budget, label, trained)
        vs_control = summary.diff(label, TAPE_PEFT_CONTROL, trained)
        status = tape_claim_status(vs_lora, vs_control)
        evidence = tests.line([
            (f"{label} - LoRA at its count at {f}L", vs_lora, "higher loss than LoRA at its count",
             "lower loss than LoRA at its count"),
            (f"{label} - {reference} at {f}L", summary.diff(label, reference, trained), f"higher loss than {reference}",
             f"lower loss than {reference}"),
            (f"{label} - {TAPE_PEFT_CONTROL} at {f}L", vs_control, "higher loss than the norms alone",
             "lower loss than the norms alone")])
        params = budget[label]["method_parameters"]
        setting = (f"{params:,} parameters besides the norms, {ratio(config, budget, label):.2f} : 1 against LoRA r = "
                   f"{TAPE_PAPER_LORA_RANK}, {bracket(config, budget, params)} on the curve")
        regime = (f"for this regime (a {config.model.num_layers}-layer byte model extended from "
                  f"{config.context_length} to {trained} bytes with PI x{config.position_interpolation:g}, "
                  f"{config.extend.steps:,} steps, {config.seeds} bases), not the paper's 7B model: ")
        if status == REFUTED:
            worse = [name for name, d in (("LoRA at its count", vs_lora), ("the norms alone", vs_control))
                     if decisive(d) and d.estimate > 0]
            reading = f"TAPE ({setting}) has a higher loss than {' and than '.join(worse)}: "
        elif status == CONFIRMED:
            reading = (f"TAPE ({setting}) has a lower loss than LoRA at its count and than the norms alone, so the "
                       "gain is TAPE's modules': ")
        elif decisive(vs_lora) and vs_lora.estimate < 0:
            reading = (f"TAPE ({setting}) has a lower loss than LoRA at its count but is not detectably better than "
                       "the norms alone, so the gain cannot be attributed to its modules: ")
        else:
            reading = f"with {vs_lora.n} bases the test cannot tell TAPE ({setting}) from LoRA at its count: "
        out.append(Claim.judged("TAPE", f"{CLAIM}; here {WHICH.get(label, label)}", status,
                                regime + reading + evidence + ".", tuning(payload, config, label)))
    return out


def analyse(payload: dict[str, Any], config: TapePeftConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``); the rates
    are chosen again from its grid, and must be the rates its final runs used."""
    chosen = chosen_rates(payload["grid"], config)
    used = {(r["label"], r["seed"]): r["learning_rate"] for r in payload["runs"] if r["label"] != BASE_LABEL}
    wrong = sorted({label for (label, _), rate in used.items() if rate != chosen[label]})
    if wrong:
        raise ValueError(f"the final runs of {wrong} did not use the rate chosen on the validation text")
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload, config, tests), paper_claims(summary, payload, config, tests))


# -- the report -------------------------------------------------------------------------------------------------
CLAIM_NOTES = (
    "What the paper's setup trained, in its authors' code (`VITA-Group/TAPE`, `train_llama.py` and "
    "`script/train_llama.sh`): \"the post-attention linear layer\" of §3.3 is `post_attention_linear`, a heads x "
    "heads map on TAPE's positional states after attention (W_att, the `attn_mix` of each `tape` block here), not "
    "the attention output projection o_proj, which the code freezes; both TAPE and LoRA (r = 8, alpha = 16, q, k, v, "
    "o) also train the embeddings and every norm (`trainable_params` \"embed,norm\"), with linear RoPE scaling (PI) "
    "x2 for every method, at lr 2e-5 for 1,000 steps. Here every arm trains the norms and no embeddings (this base "
    "ties them to the output head), with PI x2; TAPE's arms train W_att, psi, W1 and W2 of every block.",
    "The parameter ratio decides what the comparison can say: TAPE's blocks scale with the head count (W1 and W2 "
    "act on the head axis, psi maps d to I = 4 x heads), LoRA's with the width, so at 2 heads TAPE at the authors' "
    "width has a tenth of LoRA r = 8's parameters where the paper's 32 heads give it twice. The widened arm restores "
    "the ratio, not the shape (I / d = 2.5 here against 1/32 in Llama-2-7B); a claim is refuted only by an arm in "
    "the paper's regime with every arm tuned alike.",
)


def grid_table(payload: dict[str, Any], config: TapePeftConfig) -> list[str]:
    """Validation loss at 2L of every arm at every rate on the first base, the chosen rate in bold."""
    chosen = chosen_rates(payload["grid"], config)
    rates = sorted({r["learning_rate"] for r in payload["grid"]})
    head = ["arm", *[f"lr {rate:g}" for rate in rates], "chosen"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in config.arms:
        losses = grid_losses(payload["grid"], label, config)
        cells = [("diverged" if math.isinf(losses[r]) else f"{losses[r]:.4f}") if r in losses else "-"
                 for r in rates]
        cells = [f"**{c}**" if r == chosen[label] else c for r, c in zip(rates, cells)]
        side = at_edge(payload["grid"], label, chosen[label])
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {chosen[label]:g}"
                     + (f" ({side} tried)" if side else "") + " |")
    return lines


def pair_table(summary: Summary, payload: dict[str, Any], config: TapePeftConfig) -> list[str]:
    """Each TAPE arm against LoRA at its count, the reference LoRA and the control, and the reference against the
    control, at every length: paired-by-base 95 % intervals."""
    budget, reference = payload["trainable"], reference_arm(config)
    head = ["difference (paired by base)", *config.length_names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows: list[tuple[str, Any]] = []
    for label in config.tape_arms:
        rows += [(f"{label} - LoRA at its count",
                  lambda n, label=label: equal_count(summary, config, budget, label, n)),
                 (f"{label} - {reference}", lambda n, label=label: summary.diff(label, reference, n)),
                 (f"{label} - {TAPE_PEFT_CONTROL}", lambda n, label=label: summary.diff(label, TAPE_PEFT_CONTROL, n))]
    rows.append((f"{reference} - {TAPE_PEFT_CONTROL}", lambda n: summary.diff(reference, TAPE_PEFT_CONTROL, n)))
    for name, diff in rows:
        lines.append(f"| {name} | " + " | ".join(diff(n).interval() for n in summary.lengths) + " |")
    return lines


def arm_line(label: str, arm: PeftArm, budget: dict[str, Any], config: TapePeftConfig) -> str:
    """``"- LoRA r=8: scheme `...`, LoRA on q_proj, ... at rank 8 (alpha 16): 16,960 trainable parameters ..."``."""
    from hf_posenc.schemes.spec import parse_scheme_spec

    if arm.lora:
        what = (f"LoRA on {', '.join(config.lora_modules)} at rank {arm.rank} (alpha "
                f"{config.lora_alpha_per_rank * arm.rank:g})")
    elif arm.scheme_modules:
        width = parse_scheme_spec(arm.spec).hidden or 4 * config.model.num_heads
        what = f"TAPE's blocks (W_att, psi, W1, W2; I = {width}) trained whole"
    else:
        what = "nothing but the norms (the control: the LoRA curve's r = 0)"
    share = (f", {ratio(config, {label: budget}, label):.2f} : 1 against LoRA r = {TAPE_PAPER_LORA_RANK}"
             if arm.scheme_modules else "")
    return (f"- {label}: scheme `{arm.spec}`, {what}: {budget['parameters']:,} trainable parameters "
            f"({budget['method_parameters']:,} besides the norms{share})")


def paper_rate_note(config: TapePeftConfig) -> str:
    """Where the paper's rate sits in the grid: the paper's 2e-5 (its Table 5, every method in the authors'
    script) is 1/15 of Llama 2's pretraining peak, and taken to the same fraction of this base's peak."""
    fraction = TAPE_PAPER_LEARNING_RATE / LLAMA2_PRETRAIN_LEARNING_RATE
    scaled = fraction * config.pretrain.learning_rate
    where = next((f"the {'first' if i == 0 else f'rate {i + 1}'}" for i, r in enumerate(config.learning_rates)
                  if math.isclose(r, scaled, rel_tol=1e-6)), None)
    source = (f"the paper's {TAPE_PAPER_LEARNING_RATE:g} (its Table 5, the same for every method in the authors' "
              f"script), 1/{1 / fraction:.0f} of Llama 2's pretraining peak ({LLAMA2_PRETRAIN_LEARNING_RATE:g}), at "
              f"the same fraction of this base's {config.pretrain.learning_rate:g}")
    if where:
        return f"; {where} is {source}"
    widening = (f", which an arm tries when its best rate is the grid's lowest (each arm whose best rate is an end "
                f"of what it tried goes on one grid step further, up to {config.rate_extensions} "
                f"rate{'s' if config.rate_extensions > 1 else ''} beyond each end)" if config.rate_extensions else ", not tried")
    return f"; {source}, is {one_digit(scaled):g}{widening}"


def render(payload: dict[str, Any], config: TapePeftConfig) -> str:
    """``results.md`` from ``results.json``."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    claims = [Claim.from_dict(c) for c in payload.get("claims") or []]
    model, ext, pre, budget = config.model, config.extend, config.pretrain, payload["trainable"]
    md = [
        f"# TAPE's parameter-efficient context extension against a LoRA rank curve ({config.size})",
        "",
        f"Rerun: `{payload['command']}`",
        "",
        f"{config.seeds} byte-level Llama-style bases (d = {model.hidden_size}, {model.num_layers} layers, "
        f"{model.num_heads} heads of {model.head_dim}; {payload['base_parameters']:,} parameters), each pretrained "
        f"with RoPE at L = {config.context_length} bytes for {pre.steps:,} steps of {pre.batch_size} windows (lr "
        f"{pre.learning_rate:g}; seeds {', '.join(map(str, config.bases))}), then trained further at "
        f"{config.extension_factor}L = {config.extended_length} bytes with linear position interpolation "
        f"x{config.position_interpolation:g} (the paper's PI x2 for its 4k -> 8k) for {ext.steps:,} steps of "
        f"{ext.batch_size} windows with each arm. The norms train in every arm (the paper trains them, and the "
        "embeddings, for every method); the embeddings in none (this base ties them to the output head, which PEFT "
        "without LoRA cannot keep tied); every other weight is frozen (PEFT through the project's recipe trainer; "
        "TAPE's W2 and W_att start at zero, so its first step is the base with PI):",
        "",
        *[arm_line(label, arm, budget[label], config) for label, arm in config.arms.items()],
        "",
        f"The paper's ratio: in Llama-2-7B TAPE's {LLAMA2_7B.num_layers - 1} blocks (I = 4 x {LLAMA2_7B.num_heads} "
        f"heads) have {tape_parameters(LLAMA2_7B):,} parameters and LoRA r = {TAPE_PAPER_LORA_RANK} on q, k, v, o "
        f"{lora_parameters(LLAMA2_7B, TAPE_PAPER_LORA_RANK):,}: {paper_ratio():.2f} : 1. An arm is in the paper's "
        f"regime from {REGIME_FRACTION * paper_ratio():.2f} : 1. TAPE is compared with LoRA at its own count (the "
        "curve from the control through the ranks, interpolated linearly in the parameters from the control to the "
        "first rank and in log parameters between ranks), with the paper's LoRA and with the control.",
        "",
        f"Every arm: {ext.warmup_steps} warm-up steps then constant, weight decay {ext.weight_decay:g}, AdamW, the "
        f"same data order per base. Rates tried for every arm on base {config.bases[0]}: "
        f"{', '.join(f'{r:g}' for r in config.learning_rates)}{paper_rate_note(config)}. Each arm keeps the rate with the lowest loss at {config.extension_factor}L on the "
        f"validation text (the last {config.eval_tokens:,} bytes of the held-out novel: never trained on, far from "
        f"the scored slice) and is continued at it on the other bases. Validation loss at "
        f"{config.extension_factor}L on base {config.bases[0]}, nats per byte (bold: chosen):",
        "",
        *grid_table(payload, config),
        "",
        f"Text: {payload['corpus']}. Scored: the first {config.eval_tokens:,} bytes of the held-out novel, disjoint "
        f"windows, nats per byte, mean ± sd over the bases ({TABLE_NOTE}).",
        "",
        markdown_table(summary, config.length_names, payload["floors"]),
        "",
        "Differences, each a paired-by-base 95 % interval (positive: the first named has the higher loss; LoRA at "
        "its count: the curve interpolated at the TAPE arm's parameters, per base):",
        "",
        *pair_table(summary, payload, config),
        "",
        *[f"- {line}" for line in payload["verdict"]],
        "",
        f"Wall time {payload['wall_seconds'] / 60:.1f} min ({payload['seconds_in_runs'] / 60:.1f} min in training "
        f"and evaluation runs, {payload.get('jobs', 1)} at a time).",
        "",
        "![held-out loss](heldout_loss.png)",
        "",
        "![loss against trainable parameters](loss_vs_parameters.png)",
        "",
        *claims_section(claims, CLAIM_NOTES),
    ]
    return "\n".join(md)


def plot_parameters(summary: Summary, config: TapePeftConfig, budget: dict[str, dict[str, Any]],
                    path: str | Path) -> None:
    """Held-out loss at the trained length against trainable parameters besides the norms: the LoRA rank curve
    (mean ± sd over bases, each base a dot), the control as a dashed line, each TAPE arm placed on it."""
    from hf_posenc.results_io import pyplot

    plt = pyplot()
    n = config.extended_length
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ranks = [lora_label(r) for r in config.ranks]
    xs = [budget[label]["method_parameters"] for label in ranks]
    line = ax.errorbar(xs, [summary.rows[a][n][0] for a in ranks], yerr=[summary.rows[a][n][1] for a in ranks],
                       marker="o", capsize=3, label="LoRA on q, k, v, o, r = " + ", ".join(map(str, config.ranks)))
    for x, label, rank in zip(xs, ranks, config.ranks):
        values = list(summary.values[label][n].values())
        ax.scatter([x] * len(values), values, s=9, alpha=0.5, color=line[0].get_color())
        ax.annotate(f"r={rank}", (x, summary.rows[label][n][0]), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    control = summary.rows[TAPE_PEFT_CONTROL][n][0]
    ax.axhline(control, linestyle="--", color="grey", linewidth=1)
    ax.annotate(f"{TAPE_PEFT_CONTROL} (r = 0)", (xs[0], control), textcoords="offset points", xytext=(2, 3),
                fontsize=8, color="grey")
    for label, marker in zip(config.tape_arms, ("s", "D", "^", "v")):
        x = budget[label]["method_parameters"]
        mean, sd = summary.rows[label][n]
        ax.errorbar([x], [mean], yerr=[sd], marker=marker, markersize=8, capsize=3, linestyle="none",
                    label=f"{label}: {ratio(config, budget, label):.2f} : 1 against LoRA r = {TAPE_PAPER_LORA_RANK}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("trainable parameters besides the norms (log scale)")
    ax.set_ylabel(f"held-out loss at {config.extension_factor}L = {n} (nats / byte)")
    ax.set_title(f"TAPE on the LoRA rank curve ({config.size}, {config.seeds} bases, each arm at its rate)",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
