"""Length generalisation from scratch (TAPA, p-RoPE and CoPE papers), in miniature.

A Llama-style byte-level model is trained from random weights at a short length L with each scheme (RoPE, NoPE,
CoPE, HardClip, p-RoPE 0.25 / 0.75, TAPA with quadratic and linear phase) and each seed, then scored on a held-out
novel at L, 2L, 4L and 8L (disjoint windows: every position 0…n−1 of each window is scored, so positions never
seen in training count). The held-out unigram and bigram entropies are reported as floors: a model below the
bigram floor uses more than one byte of context, which is where positional encoding can matter.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hf_posenc.schemes.spec import parse_scheme_spec
from .claims import (
    CONFIRMED, COPE_PAPER, PROPE_PAPER, REFUTED, UNTESTABLE_SCALE, Claim, Tuning, claims_section, fixed_rates,
    han_ji_claim, llama_parameters, paper_reach, reach, tapa_init_phase, tapa_regime, tapa_step, turn,
)
from .config import ExperimentSettings, LengthGeneralisationConfig, ModelSettings, TrainSettings
from .corpus import Corpus, austen_corpus, ngram_entropies, write_text
from .rate_grid import best_rate, grid_edge
from .report import (
    TABLE_NOTE, Tests, analysis, closing_lines, make_payload, markdown_table, plot_summary, publish,
    tests_explained,
)
from .runner import Cell, Summary, build_recipe, run_cells, slug, train_and_evaluate, validation_loss
from .stats import Difference
from .tokenizer import VOCAB_SIZE, byte_tokenizer, save_byte_tokenizer
from .why import diagnose


def prepare(config: ExperimentSettings, corpus: Corpus, work: Path) -> dict[str, Any]:
    """Write the training files, the held-out evaluation file, the validation file and the tokenizer under
    ``work``; measure the floors.

    The scored text is the first ``eval_tokens`` bytes of the held-out novel; the validation text (on which the
    experiments with a learning-rate grid choose each arm's rate) is its last ``eval_tokens`` bytes: never trained
    on, and hundreds of thousands of bytes away from the scored slice, so a rate chosen on it is not chosen on the
    scores it is judged by."""
    data = work / "data"
    train = Corpus(corpus.name, {k: v if config.train_chars is None else v[: config.train_chars]
                                 for k, v in corpus.train.items()}, corpus.heldout)
    files = train.write_train_files(data / "train")
    tokenizer = byte_tokenizer()
    eval_ids = tokenizer(corpus.heldout).input_ids[: config.eval_tokens]
    if len(eval_ids) < config.eval_tokens:
        raise ValueError(f"the held-out text has {len(eval_ids)} bytes, fewer than eval_tokens={config.eval_tokens}")
    eval_file = write_text(data / "heldout.txt", tokenizer.decode(eval_ids))
    heldout_ids = tokenizer(corpus.heldout).input_ids
    validation_ids = heldout_ids[-config.eval_tokens:]
    if len(heldout_ids) < 2 * config.eval_tokens:
        raise ValueError(f"the held-out text has {len(heldout_ids)} bytes, fewer than twice eval_tokens="
                         f"{config.eval_tokens}: the scored and the validation slices would overlap")
    validation_file = write_text(data / "validation.txt", tokenizer.decode(validation_ids))
    return {"train_files": files, "eval_file": eval_file, "tokenizer_dir": save_byte_tokenizer(data / "tokenizer"),
            "eval_ids": eval_ids, "validation_file": validation_file, "validation_ids": validation_ids, "eos_id": tokenizer.eos_token_id, "floors": ngram_entropies(eval_ids),
            "train_bytes": sum(len(t.encode()) for t in train.train.values())}


def begin(config: ExperimentSettings, out: str | Path, work: str | Path, corpus: Corpus | None
          ) -> tuple[Path, Path, Corpus, dict[str, Any]]:
    """Create ``out`` and ``work`` and prepare the data (:func:`prepare`; the Austen novels by default)."""
    out, work = Path(out), Path(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    corpus = austen_corpus() if corpus is None else corpus
    return out, work, corpus, prepare(config, corpus, work)


def arm_cells(config: LengthGeneralisationConfig, arms: dict[str, tuple[str, ModelSettings, TrainSettings]],
              prepared: dict[str, Any], work: Path, experiment: str | None = None, *, validate: bool = False,
              seeds: Sequence[int] | None = None) -> list[Cell]:
    """Cells of ``arms`` (label -> scheme spec, model, optimisation) × ``seeds`` (default ``config``'s), on
    ``config``'s data and evaluation; ``experiment`` names the experiment in each cell's fingerprint (default
    ``config.name``).

    ``validate``: each run is also scored on the validation text at L (its result's ``validation``, with its
    ``learning_rate``), and runs at different rates of one arm live in directories of their own
    (``<arm>/lr<rate>/seed<k>``): the cells of a rate grid (:func:`choose_rates`), whose run at the chosen rate is
    the same cell as the row's run of that seed."""
    out = []
    for label, (spec, model, train) in arms.items():
        for seed in config.seed_list if seeds is None else seeds:
            settings = {"experiment": experiment or config.name, "spec": spec, "seed": seed,
                        "context_length": config.context_length, "model": model, "train": train,
                        "eval_lengths": config.eval_lengths, "eval_tokens": config.eval_tokens,
                        "train_chars": config.train_chars, "train_bytes": prepared["train_bytes"]}
            directory = work / "runs" / slug(label) / f"seed{seed}"

            def make(output_dir: str, spec: str = spec, seed: int = seed, model: ModelSettings = model,
                     train: TrainSettings = train) -> Any:
                return build_recipe(config, prepared, scheme=spec, seed=seed, context_length=config.context_length,
                                    model=model, train=train, output_dir=output_dir)

            if not validate:
                out.append(Cell(label, spec, seed, directory, settings, make))
                continue
            settings["validation"] = {"length": config.context_length, "tokens": config.eval_tokens}
            directory = work / "runs" / slug(label) / f"lr{train.learning_rate:g}" / f"seed{seed}"

            def execute(directory: Path, make: Callable[[str], Any] = make, rate: float = train.learning_rate
                        ) -> dict[str, Any]:
                result = train_and_evaluate(make(str(directory / "run")), directory / "train.log")
                start = time.perf_counter()
                loss = validation_loss(result["model_dir"], prepared["validation_file"], config.context_length,
                                       config.eval_tokens)
                result["seconds"] += time.perf_counter() - start
                return {**result, "learning_rate": rate, "validation": loss if math.isfinite(loss) else None}

            out.append(Cell(label, spec, seed, directory, settings, None, execute=execute))
    return out


def choose_rates(config: LengthGeneralisationConfig, arms: dict[str, tuple[str, ModelSettings, TrainSettings]],
                 rates: Sequence[float], prepared: dict[str, Any], work: Path, experiment: str, progress: bool = True
                 ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The per-arm learning-rate grid at the final budget: every arm trained at each of ``rates`` with the first
    seed and scored on the validation text at L (never the scored text); returns label -> the rate of the lowest
    validation loss (the lower rate on a tie; a diverged run is never chosen) and the grid's results."""
    cells = [cell for label, (spec, model, train) in arms.items() for rate in rates
             for cell in arm_cells(config, {label: (spec, model, dataclasses.replace(train, learning_rate=rate))},
                                   prepared, work, experiment=experiment, validate=True, seeds=[config.first_seed])]
    results = run_cells(cells, desc=f"{experiment} ({config.size}): {len(rates)} rates per arm, seed "
                        f"{config.first_seed}", progress=progress)

    chosen = {label: best_rate({r["learning_rate"]: r["validation"] for r in results if r["label"] == label})
              for label in arms}
    return chosen, results


def grid_tuning(payload: dict[str, Any], labels: Sequence[str], steps: int, regime: str, regime_reached: bool
                ) -> Tuning:
    """The tuning record of ``labels`` in a report whose rows each ran ``steps`` at the rate its grid chose
    (``payload``'s ``grid``: every rate tried at the final budget, the choice on the validation text; its
    ``chosen_rates``: each row's choice)."""
    return Tuning(rates={label: tuple(sorted({r["learning_rate"] for r in payload["grid"] if r["label"] == label}))
                         for label in labels},
                  steps={label: steps for label in labels}, validated=True, flattened=None, regime=regime,
                  regime_reached=regime_reached,
                  chosen={label: payload["chosen_rates"][label] for label in labels
                          if label in payload.get("chosen_rates", {})})


def grid_table(payload: dict[str, Any]) -> list[str]:
    """The Markdown table of a report's rate grid: per row, the validation loss at L (first seed) at each rate,
    the chosen one in bold, marked where it is the grid's edge."""
    grid = payload["grid"]
    rates = sorted({r["learning_rate"] for r in grid})
    chosen = payload["chosen_rates"]
    lines = ["| row | " + " | ".join(f"validation at lr {rate:g}" for rate in rates) + " | chosen |",
             "|---|" + "---|" * (len(rates) + 1)]
    for label, rate in chosen.items():
        found = {r["learning_rate"]: r["validation"] for r in grid if r["label"] == label}
        cells = [("diverged" if found[r] is None else f"{found[r]:.4f}") if r in found else "n/a" for r in rates]
        cells = [f"**{c}**" if r == rate else c for r, c in zip(rates, cells)]
        side = grid_edge(rate, rates)
        edge = f" (the grid's {side})" if side else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {rate:g}{edge} |")
    return lines


REFERENCE = "RoPE"


def verdict(summary: Summary, floors: dict[str, float], context_length: int, tests: Tests | None = None) -> list[str]:
    """Plain statements the numbers support, each comparison with its test (:class:`.report.Tests`): RoPE
    against the bigram floor at L, then per row its growth from L to the longest length and, against RoPE, its
    difference at L, at the longest length and in growth (paired by seed)."""
    tests = Tests() if tests is None else tests
    L, longest = context_length, summary.lengths[-1]
    k = longest // L
    lines = [tests_explained(summary)]
    if REFERENCE in summary.rows:
        rope = summary.rows[REFERENCE][L][0]
        lines.append(f"RoPE at L = {L}: {rope:.3f} nats/byte; " + tests.line([
            (f"RoPE - bigram floor ({floors['bigram']:.3f})", summary.diff(REFERENCE, floors["bigram"], L),
             "above the floor: this run does not show context use", "below the floor: the models use context")]) + ".")
    for label, row in summary.rows.items():
        items = [(f"growth L -> {k}L", summary.diff(label, label, longest, other_length=L), "grows", "shrinks")]
        if label != REFERENCE and REFERENCE in summary.rows:
            items += [(f"{label} - RoPE at L", summary.diff(label, REFERENCE, L), "higher loss than RoPE",
                       "lower loss than RoPE"),
                      (f"at {k}L", summary.diff(label, REFERENCE, longest), "higher loss than RoPE",
                       "lower loss than RoPE"),
                      ("growth - RoPE's growth", summary.growth_diff(label, REFERENCE, L, longest),
                       "grows more than RoPE", "grows less than RoPE")]
        lines.append(f"{label}: {row[L][0]:.3f} at L -> {row[longest][0]:.3f} at {k}L; " + tests.line(items) + ".")
    return lines


def judge(evidence: Sequence[tuple[Difference, int]]) -> str | None:
    """The status a claim's evidence gives: confirmed when every difference is detected with the claimed sign
    (+1: the first named has the higher loss), refuted when any is detected with the other sign, ``None`` (not
    decided by this test) otherwise."""
    if any(d.detected and (d.estimate > 0) != (sign > 0) for d, sign in evidence):
        return REFUTED
    if evidence and all(d.detected for d, _ in evidence):
        return CONFIRMED
    return None


def undecided(evidence: Sequence[Difference]) -> str:
    """Why a claim within reach is not decided: an interval contains 0 with this many seeds."""
    n = max((d.n for d in evidence), default=0)
    return f"with {n} seeds the test cannot tell"


def paper_claims(summary: Summary, floors: dict[str, float], config: LengthGeneralisationConfig,
                 why: dict[str, Any], tests: Tests, grid: dict[str, Any] | None = None) -> list[Claim]:
    """One :class:`.claims.Claim` per claim of the CoPE, p-RoPE, TAPA and position-generalization papers that this
    experiment's rows speak to, with the intervals (recorded in ``tests``) or the reason it cannot test them.

    ``grid``: the report's rate grid (its ``grid`` entry, :func:`choose_rates`) when each row ran at the rate it
    chose; a comparison's tuning record is then :func:`grid_tuning`'s, else every row at ``config``'s one rate."""
    L, longest = config.context_length, summary.lengths[-1]
    k = longest // L
    rows, model = summary.rows, config.model
    names = {f"L = {L}": L, f"{k}L = {longest}": longest}
    out: list[Claim] = []

    def diff(name: str, a: str, b: str | float, length: int, higher: str, lower: str) -> str:
        return tests.line([(name, summary.diff(a, b, length), higher, lower)])

    def tuned(labels: Sequence[str], regime: str, reached: bool) -> Tuning:  # the grid's record, or one rate each
        if grid is not None:
            return grid_tuning(grid, labels, config.train.steps, regime, reached)
        return fixed_rates({label: (config.train.learning_rate, config.train.steps) for label in labels}, regime,
                           reached)

    if REFERENCE in rows and "CoPE" in rows:
        spec = config.schemes["CoPE"]
        cos = math.cos(turn(spec, model.head_dim, model.rope_theta, L))
        at_longest = diff(f"CoPE - RoPE at {k}L", "CoPE", REFERENCE, longest, "higher loss than RoPE",
                          "lower loss than RoPE")
        out.append(Claim(
            "CoPE", "soft-clipping RoPE's lowest frequencies beats RoPE on long-context tasks inside the training "
            "length (HELMET 58.68 vs 52.94 at 64k) and beyond it (28.48 vs 14.37 at 256k)", UNTESTABLE_SCALE,
            f"{reach(spec, model.head_dim, model.rope_theta, names)}, against {paper_reach(spec, COPE_PAPER)}: "
            f"inside L clipping them changes rotations of at most that angle (cos ≥ {cos:.3f}), so CoPE equals "
            f"RoPE by construction where it is trained, and a byte model's perplexity is not the paper's "
            f"long-context task scores; {at_longest}."))
        if "HardClip" in rows:
            out.append(Claim(
                "CoPE", "HardClip (the same frequencies zeroed) is worse than CoPE inside the training length "
                "(HELMET 50.71 vs 58.68 at 64k)", UNTESTABLE_SCALE,
                f"{reach(config.schemes['HardClip'], model.head_dim, model.rope_theta, {f'L = {L}': L})}: both "
                "equal RoPE by construction here; "
                + diff("HardClip - CoPE at L", "HardClip", "CoPE", L, "higher loss than CoPE", "lower loss than CoPE")
                + "."))
    if REFERENCE in rows and "p-RoPE 0.75" in rows:
        spec = config.schemes["p-RoPE 0.75"]
        out.append(Claim(
            "p-RoPE", "0.75-RoPE has a lower perplexity than RoPE at the training length (4.4414 vs 4.4627, -0.5 %)",
            UNTESTABLE_SCALE,
            f"{reach(spec, model.head_dim, model.rope_theta, {f'L = {L}': L})}, against "
            f"{paper_reach(spec, PROPE_PAPER)}: stopping them changes almost nothing, so 0.75-RoPE equals RoPE by "
            "construction here; " + diff("p-RoPE 0.75 - RoPE at L", "p-RoPE 0.75", REFERENCE, L,
                                         "higher loss than RoPE", "lower loss than RoPE") + "."))
    if REFERENCE in rows and "p-RoPE 0.25" in rows:
        spec = config.schemes["p-RoPE 0.25"]
        d = summary.diff("p-RoPE 0.25", REFERENCE, L)
        status = judge([(d, +1)])
        text = diff("p-RoPE 0.25 - RoPE at L", "p-RoPE 0.25", REFERENCE, L, "higher loss than RoPE",
                    "lower loss than RoPE")
        within = reach(spec, model.head_dim, model.rope_theta, {f'L = {L}': L})
        out.append(Claim.judged(
            "p-RoPE", "0.25-RoPE has a higher perplexity than RoPE at the training length (4.5302 vs 4.4627)",
            status or UNTESTABLE_SCALE, f"{within}, so this one is within reach; "
            + text + ("" if status else f"; {undecided([d])} (the paper's effect is 1.5 %)") + ".",
            tuned([REFERENCE, "p-RoPE 0.25"], within, True)))
    nope_refs = [r for r in (REFERENCE, "p-RoPE 0.75", "p-RoPE 0.25") if r in rows]
    if "NoPE" in rows and nope_refs:
        evidence = [(summary.diff("NoPE", r, L), +1) for r in nope_refs]
        status = judge(evidence)
        text = tests.line([(f"NoPE - {r} at L", d, f"higher loss than {r}", f"lower loss than {r}")
                           for r, (d, _) in zip(nope_refs, evidence)])
        out.append(Claim.judged(
            "p-RoPE", "NoPE has the highest perplexity at the training length (4.8594, against 4.4627 for RoPE and "
            "4.4414 / 4.5302 for 0.75- / 0.25-RoPE)", status or UNTESTABLE_SCALE,
            text + ("" if status else f"; {undecided([d for d, _ in evidence])}") + ".",
            tuned(["NoPE", *nope_refs], "NoPE against rotations that turn (RoPE's fastest frequency 1 rad per "
                  "position)", True)))
    tapa = [label for label in ("TAPA quadratic", "TAPA linear") if label in rows]
    if REFERENCE in rows and tapa:
        main = tapa[0]
        d = summary.diff(main, REFERENCE, L)
        worse = d.detected and d.estimate > 0  # the paper: within a few hundredths of RoPE, i.e. no worse
        regime, reached = tapa_regime(
            tapa_init_phase(model.hidden_size, model.initializer_range),
            config.train.steps * config.train.batch_size * L,
            llama_parameters(model.hidden_size, model.intermediate_size, model.num_layers, VOCAB_SIZE))
        out.append(Claim.judged(
            "TAPA", "TAPA matches RoPE's perplexity inside the training length (within a few hundredths at 1k-16k)",
            REFUTED if worse else UNTESTABLE_SCALE,
            (f"for this regime ({model.num_layers}-layer byte model "
             + ("with each row at the rate its grid chose" if grid is not None else "trained with RoPE's optimisation")
             + "; the TAPA sweep varies TAPA's settings), not the paper's 7B model: " if worse else "")
            + diff(f"{main} - RoPE at L", main, REFERENCE, L, "higher loss than RoPE", "lower loss than RoPE")
            + ("" if worse else ", and no difference detected is not a match") + ".",
            tuned([REFERENCE, main], regime, reached)))
        floor = floors["bigram"]
        below = {label: summary.diff(label, floor, L) for label in tapa}
        below = {label: d for label, d in below.items() if d.detected and d.estimate < 0}
        rope_growth = summary.diff(REFERENCE, REFERENCE, longest, other_length=L)
        context = (f"TAPA hardly uses context here (not detectably below the bigram floor), so its flat curve is that "
                   f"of a model with little context to lose: " if main not in below else
                   "TAPA uses some context here (below the bigram floor), but far less than RoPE: ")
        out.append(Claim(
            "TAPA", "without long-context fine-tuning TAPA degrades beyond the training length too, but far less "
            "than RoPE (perplexity 17.96 vs about 5.9e3 at 2x the training length, 122.7 vs 1.6e4 at 4x)",
            UNTESTABLE_SCALE,
            context + tests.line([(f"{main} - bigram floor ({floor:.3f}) at L", summary.diff(main, floor, L),
                                   "above the bigram floor", "below the bigram floor")])
            + f"; and RoPE does not collapse at this scale (its perplexity grows x{math.exp(rope_growth.estimate):.2f}"
            f" from L to {k}L; the paper's RoPE goes from about 12 to 5.9e3 at 2x): "
            + tests.line([(f"RoPE growth L -> {k}L", rope_growth, "grows", "shrinks")]) + "."))
        if len(tapa) == 2:
            step = tapa_step(config.schemes[main])
            usage = ("neither variant is detectably below the bigram floor, so neither uses the positions the phase "
                     "encodes" if not below else f"only {', '.join(below)} is below the bigram floor, and both are "
                     "far above RoPE")
            out.append(Claim(
                "TAPA", "the quadratic phase beats the linear one at every length (perplexity 11.74 vs 13.13 at "
                "32k)", UNTESTABLE_SCALE,
                f"{usage} (with α = {parse_scheme_spec(config.schemes[main]).alpha:g} the phase changes {step:.0%} "
                "from distance 1 to 2); " + diff("TAPA quadratic - TAPA linear at L", tapa[0], tapa[1], L,
                                                 "higher loss than the linear phase",
                                                 "lower loss than the linear phase") + "."))
    if why:
        out.append(han_ji_claim(why))
    return out


NOTES_PROPE = ("The p-RoPE paper has no length-generalisation experiment and makes no claim about it: its rows "
               "beyond L test nothing of that paper.")


def analyse(payload: dict[str, Any], config: LengthGeneralisationConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs: ``verdict`` (lines), ``comparisons`` (every test
    behind them) and ``claims`` (one per paper claim)."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload["floors"], config.context_length, tests),
                    paper_claims(summary, payload["floors"], config, payload.get("why") or {}, tests,
                                 payload if "grid" in payload else None))


def render(payload: dict[str, Any], config: LengthGeneralisationConfig) -> str:
    """``results.md`` from ``results.json``."""
    return render_from_scratch(payload, config, title=f"Length generalisation from scratch ({config.size})",
                               claim_notes=[NOTES_PROPE] if any(s.startswith("prope") for s in
                                                                config.schemes.values()) else [])


def render_from_scratch(payload: dict[str, Any], config: LengthGeneralisationConfig, *, title: str,
                        notes: Sequence[str] = (), claim_notes: Sequence[str] = ()) -> str:
    """The Markdown of a from-scratch experiment (``config``: its length-generalisation settings): setup, table,
    ``notes``, verdict, diagnostics, wall time, plot, then the paper claims (and ``claim_notes``)."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    command, seeds = payload["command"], config.seed_list
    claims = [Claim.from_dict(c) for c in payload.get("claims") or []]
    rate = (f"lr {config.train.learning_rate:g}" if "grid" not in payload else
            "each row's peak rate chosen by the rate grid below")
    grid = [] if "grid" not in payload else [
        f"Rate grid at the final budget: every row trained at each of "
        f"{', '.join(f'{r:g}' for r in payload['rate_grid'])} with seed {config.first_seed}, scored on the "
        "validation text (the held-out novel's last bytes, never the scored ones) at L; each row's seeds then ran "
        "at the rate of its lowest validation loss (the table above):", "", *grid_table(payload), ""]
    md = [
        f"# {title}",
        "",
        f"Rerun: `{command}`",
        "",
        f"Byte-level Llama-style model (d = {config.model.hidden_size}, {config.model.num_layers} layers, "
        f"{config.model.num_heads} heads of {config.model.head_dim}) trained from scratch at L = "
        f"{config.context_length} bytes for {config.train.steps} steps of {config.train.batch_size} windows "
        f"({rate}, cosine, {config.train.warmup_steps} warm-up steps, initial weight "
        f"std {config.model.initializer_range:g}, unless a row says otherwise), {config.seeds} seeds per row "
        f"({', '.join(map(str, seeds))}). "
        f"Training text: {payload['corpus']}. Evaluation: the first {config.eval_tokens} bytes of the held-out "
        "novel, disjoint windows; held-out loss in nats per byte, mean ± sample sd over seeds "
        f"({TABLE_NOTE}). Floors: plug-in unigram and bigram entropies of the evaluation text.",
        "",
        markdown_table(summary, config.length_names, payload["floors"]),
        "",
        *grid,
        *notes,
        *closing_lines(payload["verdict"], payload["why"], config.context_length,
                       f"Wall time {payload['wall_seconds'] / 60:.1f} min ({payload['seconds_in_runs'] / 60:.1f} min "
                       f"in training and evaluation runs, torch threads {payload['machine']['threads']}).",
                       claims_section(claims, claim_notes)),
    ]
    return "\n".join(md)


def run(config: LengthGeneralisationConfig, out: str | Path, work: str | Path, command: str,
        corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md`` and ``heldout_loss.png`` to
    ``out`` and returns the JSON payload. ``corpus`` defaults to the Austen novels."""
    arms = {label: (spec, config.model, config.train) for label, spec in config.schemes.items()}
    return run_from_scratch(config, arms, out, work, command, corpus=corpus, progress=progress,
                            experiment=config.name, experiment_config=config.to_dict(), config_object=config,
                            rate_grid=config.rate_grid)


def run_from_scratch(config: LengthGeneralisationConfig, arms: dict[str, tuple[str, ModelSettings, TrainSettings]],
                     out: str | Path, work: str | Path, command: str, *, experiment: str,
                     experiment_config: dict[str, Any], config_object: Any = None, corpus: Corpus | None = None,
                     progress: bool = True, plot: Callable[[Summary, dict[str, float], Path], None] | None = None,
                     rate_grid: Sequence[float] = (), **_: Any) -> dict[str, Any]:
    """Train every arm × seed from scratch on ``config``'s data, evaluate at ``config``'s lengths and write the
    report (``results.json``, and ``results.md`` rendered from it by the ``experiment`` module's ``analyse`` and
    ``render`` with ``config_object``, the experiment's own settings; ``heldout_loss.png``, or what ``plot``
    (summary, floors, out) draws instead).

    ``rate_grid``: first every arm at each of these peak rates with the first seed (:func:`choose_rates`), then
    every row at the rate chosen on the validation text, with every seed (the first seed's run is the grid's);
    the report gains ``grid`` (those runs) and ``chosen_rates``. Empty: each arm at its own rate."""
    start = time.perf_counter()
    out, work, corpus, prepared = begin(config, out, work, corpus)
    fields: dict[str, Any] = {}
    if rate_grid:
        chosen, grid = choose_rates(config, arms, rate_grid, prepared, work, experiment, progress=progress)
        arms = {label: (spec, model, dataclasses.replace(train, learning_rate=chosen[label]))
                for label, (spec, model, train) in arms.items()}
        fields = {"rate_grid": list(rate_grid), "chosen_rates": chosen,
                  "grid": [{k: v for k, v in r.items() if k != "model_dir"} for r in grid]}
    cells = arm_cells(config, arms, prepared, work, experiment=experiment, validate=bool(rate_grid))
    results = run_cells(cells, desc=f"{experiment} ({config.size})", progress=progress)
    summary = Summary.from_results(results, config.eval_lengths)
    first = {r["label"]: r["model_dir"] for r in results if r["seed"] == config.first_seed}
    why = diagnose(first, prepared["eval_ids"][: config.diagnostic_tokens], config.context_length,
                   out / "diagnostics", progress=progress)
    floors = prepared["floors"]
    elapsed = time.perf_counter() - start
    payload = make_payload(experiment, command, experiment_config, corpus.name,
                           "held-out cross-entropy in nats per byte (perplexity = exp)", floors, results, elapsed,
                           summary=summary.to_dict(), **fields, why=why)
    if rate_grid:  # the grid's runs at the rates not chosen (the chosen one's is a row's first seed)
        payload["seconds_in_runs"] += sum(r["seconds"] for r in fields["grid"]
                                          if r["learning_rate"] != fields["chosen_rates"][r["label"]])
    publish(out, payload, config if config_object is None else config_object)
    if plot is not None:
        plot(summary, floors, out)
        return payload
    plot_summary(summary, out / "heldout_loss.png",
                 f"Trained at L = {config.context_length} bytes ({config.size}, {config.seeds} seeds)", floors,
                 config.context_length)
    return payload
