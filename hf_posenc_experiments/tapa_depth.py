"""Is TAPA's gap to RoPE a property of two-layer models? (issue #33), in miniature.

The TAPA sweep (:mod:`.tapa_trainability`) found every TAPA setting above RoPE at L in a 2-layer byte model. Here
its best setting (θ = 0.75 at lr 1e-3), RoPE at its own learning rate (3e-3) and at TAPA's, and NoPE are trained
from scratch at each depth of :class:`.config.TapaDepthConfig` (2 and 4 layers, 1,500 steps) with the same seeds,
and scored at L and 8L. Per depth, the gap (TAPA − RoPE at L, and TAPA − RoPE at TAPA's rate) is compared paired
by seed; its change with depth is the difference of the per-seed gaps between the deepest and the shallowest
depth, paired by seed too. A gap that shrinks says the negative result is (at least partly) a scale effect; one
that does not says TAPA trains poorly when small, whatever the depth within this range.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from .claims import REFUTED, UNTESTABLE_SCALE, Claim, han_ji_claim, tapa_arms_tuning
from .config import TAPA_DEPTH_ARM, TapaDepthConfig
from .corpus import Corpus
from .length_generalisation import render_from_scratch, run_from_scratch
from .report import Tests, analysis, fmt, plot_settings, tests_explained
from .runner import Summary
from .stats import Difference, compare, phrase

REFERENCE, SAME_RATE, NOPE = "RoPE", "RoPE lr=1e-3", "NoPE"


def gap_values(summary: Summary, a: str, b: str, length: int) -> dict[int, float]:
    """Per seed, ``a − b`` at ``length`` (the seeds both rows trained)."""
    left, right = summary.values[a][length], summary.values[b][length]
    return {s: v - right[s] for s, v in left.items() if s in right}


def gaps(summary: Summary, config: TapaDepthConfig) -> dict[str, dict[int, dict[int, float]]]:
    """name -> depth -> seed -> value, at L: TAPA − RoPE, TAPA − RoPE at TAPA's rate, NoPE − RoPE (rows
    present)."""
    L, label = config.base.context_length, config.label
    pairs = {f"{TAPA_DEPTH_ARM} - {REFERENCE}": (TAPA_DEPTH_ARM, REFERENCE),
             f"{TAPA_DEPTH_ARM} - {SAME_RATE}": (TAPA_DEPTH_ARM, SAME_RATE),
             f"{NOPE} - {REFERENCE}": (NOPE, REFERENCE)}
    out: dict[str, dict[int, dict[int, float]]] = {}
    for name, (a, b) in pairs.items():
        if a in config.variants and b in config.variants:
            out[name] = {d: gap_values(summary, label(a, d), label(b, d), L) for d in config.depths}
    return out


def change_with_depth(values: dict[int, dict[int, float]], config: TapaDepthConfig) -> Difference:
    """The per-seed value at the deepest depth minus at the shallowest, paired by seed."""
    return compare(values[config.depths[-1]], values[config.depths[0]])


def verdict(summary: Summary, floors: dict[str, float], config: TapaDepthConfig, tests: Tests) -> list[str]:
    """The answer, each comparison with its test: per depth RoPE against the bigram floor, TAPA against RoPE at
    both rates, against NoPE and the floor, NoPE against RoPE, the growth to the longest length; then the change
    of each gap with depth, and the reading."""
    L, longest, label = config.base.context_length, summary.lengths[-1], config.label
    k = longest // L
    bigram = floors["bigram"]
    lines = [tests_explained(summary)]
    tapa_name = f"TAPA ({TAPA_DEPTH_ARM})"
    for depth in config.depths:
        rope, tapa = label(REFERENCE, depth), label(TAPA_DEPTH_ARM, depth)
        items = [(f"RoPE - bigram floor ({bigram:.3f})", summary.diff(rope, bigram, L), "above the floor",
                  "below the floor")]
        for other in (SAME_RATE, NOPE):
            if other in config.variants:
                items.append((f"{other} - RoPE", summary.diff(label(other, depth), rope, L), "higher loss than RoPE",
                              "lower loss than RoPE"))
        items.append((f"{tapa_name} - RoPE", summary.diff(tapa, rope, L), "higher loss than RoPE",
                      "lower loss than RoPE"))
        if SAME_RATE in config.variants:
            items.append((f"- {SAME_RATE}", summary.diff(tapa, label(SAME_RATE, depth), L),
                          f"higher loss than {SAME_RATE}", f"lower loss than {SAME_RATE}"))
        if NOPE in config.variants:
            items.append(("- NoPE", summary.diff(tapa, label(NOPE, depth), L), "higher loss than NoPE",
                          "lower loss than NoPE"))
        items.append(("- bigram floor", summary.diff(tapa, bigram, L), "above the bigram floor",
                      "below the bigram floor"))
        if k > 1:
            items += [(f"growth L -> {k}L", summary.diff(tapa, tapa, longest, other_length=L), "grows", "shrinks"),
                      ("- RoPE's growth", summary.growth_diff(tapa, rope, L, longest), "grows more than RoPE",
                       "grows less than RoPE")]
        lines.append(f"{config.layers(depth)}, at L = {L}: RoPE {summary.rows[rope][L][0]:.3f}, TAPA "
                     f"{summary.rows[tapa][L][0]:.3f} nats/byte; " + tests.line(items) + ".")
    if len(config.depths) > 1:
        first, last = config.depths[0], config.depths[-1]
        span = f"{config.layers(last)} - {config.layers(first)}"
        items = [(f"{name}: {span}", change_with_depth(values, config), "the gap grows", "the gap shrinks")
                 for name, values in gaps(summary, config).items()]
        items += [(f"{variant}: {span}", summary.diff(label(variant, last), label(variant, first), L),
                   "higher loss deeper", "lower loss deeper") for variant in config.variants]
        lines.append(f"Change with depth at L (per-seed values at {config.layers(last)} minus {first}, paired by "
                     "seed): " + tests.line(items) + ".")
        lines.append(answer(summary, config))
    return lines


def answer(summary: Summary, config: TapaDepthConfig) -> str:
    """The reading of the change of TAPA − RoPE with depth (and of TAPA − RoPE at TAPA's rate), and whether the
    gap is still there at the deepest depth; an undetected change comes with the half-width of its interval, the
    smallest change this design would have detected."""
    first, last, L = config.depths[0], config.depths[-1], config.base.context_length
    span = f"from {first} to {config.layers(last)}"
    found = gaps(summary, config)
    values = found[f"{TAPA_DEPTH_ARM} - {REFERENCE}"]
    change = change_with_depth(values, config)
    deepest = summary.diff(config.label(TAPA_DEPTH_ARM, last), config.label(REFERENCE, last), L)
    if not change.finite:
        return "Answer: one run per row, so the change of the gap with depth has no test; rerun with --seeds 3 or more."
    still = ("still detectably above RoPE" if deepest.detected and deepest.estimate > 0 else
             "no longer detectably different from RoPE" if not deepest.detected else "below RoPE")
    at_last = f"at {config.layers(last)} TAPA is {still} ({deepest.interval()})"
    same = found.get(f"{TAPA_DEPTH_ARM} - {SAME_RATE}")
    other = ""
    if same is not None:
        d = change_with_depth(same, config)
        other = (f" Against RoPE at TAPA's rate the gap changes by {d.interval()} "
                 f"({phrase(d, 'grows', 'shrinks')}).")
    first_gap = statistics.fmean(values[first].values())
    if change.detected and change.estimate < 0:
        share = f", {-change.estimate / first_gap:.0%} of the {first}-layer gap" if first_gap > 0 else ""
        return (f"Answer: TAPA's gap to RoPE shrinks with depth ({change.interval()} {span}{share}), so the "
                f"negative result of the 2-layer sweep is at least partly a scale effect; {at_last}." + other)
    if change.detected:
        return (f"Answer: TAPA's gap to RoPE grows with depth ({change.interval()} {span}); {at_last}: not a "
                "scale effect within this range." + other)
    excluded = (f"; the interval excludes a shrink of more than {-change.low:.3f}"
                + (f" ({-change.low / first_gap:.0%} of the {first}-layer gap)" if first_gap > 0 else ""))
    return (f"Answer: no change of TAPA's gap to RoPE with depth detected ({change.interval()} {span}{excluded}), "
            f"and {at_last}: within this range the gap does not shrink detectably, which says TAPA trains poorly "
            "when small rather than at two layers only." + other)


def depths(config: TapaDepthConfig) -> str:
    """``"2 and 4"``, ``"2, 4 and 6"``."""
    names = [str(d) for d in config.depths]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def paper_claims(summary: Summary, config: TapaDepthConfig, why: dict[str, Any], tests: Tests) -> list[Claim]:
    """The TAPA paper's claims this experiment speaks to (and the position-generalization paper's diagnostics)."""
    L, longest, label = config.base.context_length, summary.lengths[-1], config.label
    k = longest // L
    out: list[Claim] = []
    refs = [r for r in (REFERENCE, SAME_RATE) if r in config.variants]
    items, worse = [], []
    for depth in config.depths:
        for r in refs:
            d = summary.diff(label(TAPA_DEPTH_ARM, depth), label(r, depth), L)
            items.append((f"TAPA - {r} at {config.layers(depth)}", d, f"higher loss than {r}",
                          f"lower loss than {r}"))
            worse.append(d.detected and d.estimate > 0)
    status = REFUTED if worse and all(worse) else UNTESTABLE_SCALE
    lead = (f"for this regime (byte models of {depths(config)} layers, {config.base.train.steps:,} steps), not the "
            "paper's 7B model trained on 420B tokens: at every depth TAPA has a higher loss than RoPE at both learning "
            "rates: " if status == REFUTED else
            "at some depth TAPA is not detectably worse than a RoPE arm, which is not a match: ")
    out.append(Claim.judged(
        "TAPA", "TAPA trains to RoPE's perplexity inside the training length (within a few hundredths at 1k-8k; "
        "TAPA at 1/5 of RoPE's learning rate)", status, lead + tests.line(items) + ".",
        tapa_arms_tuning(config.arms(), config.base.context_length)))
    if k > 1:
        growth = []
        for depth in config.depths:
            rope = summary.diff(label(REFERENCE, depth), label(REFERENCE, depth), longest, other_length=L)
            growth.append((f"RoPE growth L -> {k}L at {config.layers(depth)}", rope, "grows", "shrinks"))
        ratios = ", ".join(f"x{math.exp(d.estimate):.2f} at {config.layers(depth)}"
                           for depth, (_, d, _, _) in zip(config.depths, growth))
        out.append(Claim(
            "TAPA", "without long-context fine-tuning TAPA degrades beyond the training length, but far less than "
            "RoPE (perplexity 17.96 vs about 5.9e3 at 2x the training length)", UNTESTABLE_SCALE,
            f"RoPE does not collapse at this scale at any depth (its perplexity grows {ratios} from L to {k}L; the "
            "paper's goes from about 12 to 5.9e3 at 2x), so there is no failure to avoid: " + tests.line(growth)
            + "."))
    if why:
        out.append(han_ji_claim(why, f"byte models of {depths(config)} layers"))
    return out


def analyse(payload: dict[str, Any], config: TapaDepthConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    summary = Summary.from_results(payload["runs"], config.base.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload["floors"], config, tests),
                    paper_claims(summary, config, payload.get("why") or {}, tests))


def depth_tables(summary: Summary, config: TapaDepthConfig) -> list[str]:
    """Held-out loss at L per arm and depth (mean ± sd), and each gap per depth with its paired interval."""
    L = config.base.context_length
    head = ["arm", *[config.layers(d) for d in config.depths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in config.variants:
        lines.append(f"| {variant} | " + " | ".join(fmt(*summary.rows[config.label(variant, d)][L])
                                                   for d in config.depths) + " |")
    lines += ["", "| difference at L (paired by seed) | " + " | ".join(config.layers(d) for d in config.depths)
              + (f" | {config.depths[-1]} - {config.layers(config.depths[0])} |" if len(config.depths) > 1 else " |"),
              "|" + "---|" * (len(config.depths) + 1 + (len(config.depths) > 1))]
    for name, values in gaps(summary, config).items():
        cells = [compare(values[d], 0.0).interval() for d in config.depths]
        if len(config.depths) > 1:
            cells.append(change_with_depth(values, config).interval())
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def render(payload: dict[str, Any], config: TapaDepthConfig) -> str:
    """``results.md`` from ``results.json``."""
    summary = Summary.from_results(payload["runs"], config.base.eval_lengths)
    arms = [f"- {name}: `{v.spec}`" + (f", learning rate {v.learning_rate:g}" if v.learning_rate else "")
            for name, v in config.variants.items()]
    notes = [f"Arms, each at {depths(config)} layers (scheme spec and learning rate where it is "
             "not the default):", "", *arms, "",
             f"By depth, held-out loss at L = {config.base.context_length} (mean ± sd), then the differences, each "
             "a paired-by-seed 95 % interval (the last column: the per-seed difference at the deepest depth minus "
             "at the shallowest):", "", *depth_tables(summary, config), "",
             "![gap by depth](gap_by_depth.png)", "",
             "The s / run column is the measured wall time of a run (training and evaluation); runs that shared the "
             "cores with other work are slower.", ""]
    return render_from_scratch(payload, config.base, title=f"TAPA's gap to RoPE by depth ({config.base.size})",
                               notes=notes)


def plot(config: TapaDepthConfig) -> Any:
    """The plots: held-out loss at L per arm against depth, and the gaps against depth."""
    L = config.base.context_length

    def draw(summary: Summary, floors: dict[str, float], out: Path) -> None:
        title = f"Trained and scored at L = {L} bytes, {config.base.train.steps:,} steps ({config.base.size}, " \
                f"{config.base.seeds} seeds)"
        series = {v: {config.layers(d): summary.values[config.label(v, d)][L] for d in config.depths}
                  for v in config.variants}
        plot_settings(series, out / "heldout_loss.png", title, "depth", floors={"bigram": floors["bigram"]})
        plot_settings({name: {config.layers(d): v for d, v in values.items()}
                       for name, values in gaps(summary, config).items()},
                      out / "gap_by_depth.png", title, "depth", ylabel="difference at L, same seed (nats / byte)",
                      zero_line=True)

    return draw


def run(config: TapaDepthConfig, out: str | Path, work: str | Path, command: str, corpus: Corpus | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md``, ``heldout_loss.png`` and
    ``gap_by_depth.png`` to ``out`` and returns the JSON payload."""
    return run_from_scratch(config.base, config.arms(), out, work, command, corpus=corpus, progress=progress,
                            experiment=config.name, experiment_config=config.to_dict(), config_object=config,
                            plot=plot(config))
