"""p-RoPE at Gemma's ratio of RoPE base to training length (issue #33), in miniature.

The p-RoPE paper's claim (Table 2) is an order of validation perplexity *at the training length* of Gemma 2B
trained from scratch at 8k tokens with θ = 10,000: NoPE worst (4.8594), 0.25-RoPE (4.5302) worse than 0.75-RoPE
(4.4414), and 0.75-RoPE no worse than RoPE, even slightly better (4.4627: −0.5 % in perplexity on Wiki; on
FlanV2 6.4422 against 6.4429). The length-generalisation experiment cannot test it: at θ = 10⁴ and L = 64 the
frequencies 0.75-RoPE stops turn 0.064 rad over L, so it equals RoPE by construction. Here θ / L is Gemma's
(:class:`.config.PropeGemmaRatioConfig`: θ = 78 at L = 64), the stopped frequencies turn 1.1–2.4 rad over L, and
every row is trained with the same seeds and scored at L only, compared paired by seed.

What the design can detect is part of the answer: the 0.75 − RoPE interval's half-width, relative to RoPE's loss,
against the paper's effect expressed the same way (ln 4.4414 / ln 4.4627 − 1 = −0.32 % of the loss, a ratio that
does not depend on whether the loss is per token or per byte), and the smallest effect the design detects with 80 %
power, (t₀.₉₇₅ + t₀.₈₀) · se with n − 1 degrees of freedom.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .claims import (
    CONFIRMED, PROPE_PAPER, REFUTED, UNTESTABLE_SCALE, Claim, angle, changed_frequencies, fixed_rates, han_ji_claim,
    turns,
    unless_context_is_used,
)
from .config import GEMMA_THETA_PER_LENGTH, PropeGemmaRatioConfig
from .corpus import Corpus
from .length_generalisation import grid_tuning, judge, render_from_scratch, run_from_scratch, undecided
from .report import NEGLIGIBLE, Tests, analysis, plot_settings, tests_explained
from .runner import Summary
from .stats import Difference, t_quantile

REFERENCE, P75, P25, NOPE = "RoPE", "p-RoPE 0.75", "p-RoPE 0.25", "NoPE"
# the p-RoPE paper's Table 2: validation perplexity of Gemma 2B trained from scratch at 8k tokens, θ = 10,000
PAPER_WIKI = {REFERENCE: 4.4627, P75: 4.4414, P25: 4.5302, NOPE: 4.8594}
PAPER_FLAN = {REFERENCE: 6.4429, P75: 6.4422, P25: 6.5111, NOPE: 6.6429}
POWER = 0.8  # the power at which the smallest detectable effect is stated


def paper_relative(label: str) -> float:
    """The paper's ``label`` − RoPE on Wiki as a fraction of RoPE's loss (log perplexity): −0.0032 for 0.75-RoPE."""
    return math.log(PAPER_WIKI[label]) / math.log(PAPER_WIKI[REFERENCE]) - 1.0


def sensitivity(diff: Difference, reference_loss: float, effect: float, power: float = POWER) -> dict[str, Any]:
    """What a difference ``diff`` of this design can detect, against an ``effect`` given as a fraction of
    ``reference_loss``: its half-width (the smallest estimate whose interval excludes 0), the same as a fraction of
    the loss, the smallest true difference detected with probability ``power`` ((t_{(1+level)/2} + t_power) · se,
    the interval's degrees of freedom), and ``effect`` in nats at ``reference_loss`` with whether it reaches that
    smallest difference. NaN where ``diff`` has no interval."""
    scaled = effect * reference_loss
    if not diff.finite:
        return {"half_width": math.nan, "relative_half_width": math.nan, "detectable": math.nan, "power": power,
                "effect": scaled, "effect_detectable": False}
    t = t_quantile(0.5 + diff.level / 2, diff.df)
    half = (diff.high - diff.low) / 2
    detectable = (t + t_quantile(power, diff.df)) * half / t
    return {"half_width": half, "relative_half_width": half / reference_loss, "detectable": detectable,
            "power": power, "effect": scaled, "effect_detectable": detectable <= abs(scaled)}


def rad(radians: float) -> str:
    """:func:`.claims.angle`, without decimals from 100 rad up (``819``)."""
    return angle(radians) if radians < 100 else f"{radians:,.0f}"


def setting_line(config: PropeGemmaRatioConfig) -> str:
    """The rotation angles over L of the frequencies each p-RoPE row stops, here and in Gemma 2B at 8k."""
    model, L = config.model, config.context_length
    parts = []
    for label in (P75, P25):
        if label not in config.schemes:
            continue
        spec = config.schemes[label]
        here = turns(spec, model.head_dim, model.rope_theta, L)
        gemma = turns(spec, PROPE_PAPER.head_dim, PROPE_PAPER.rope_theta, PROPE_PAPER.length)
        parts.append(f"the {len(here)} of {model.head_dim // 2} frequencies {label} stops turn {rad(min(here))}–"
                     f"{rad(max(here))} rad over L (Gemma 2B at 8k: {len(gemma)} of {PROPE_PAPER.head_dim // 2}, "
                     f"{rad(min(gemma))}–{rad(max(gemma))} rad over {PROPE_PAPER.length:,} tokens)")
    return (f"Setting: θ = {model.rope_theta:g} at L = {L} (θ / L = {model.rope_theta / L:.2f}; Gemma 2B at 8k: "
            f"{GEMMA_THETA_PER_LENGTH:.2f}); " + "; ".join(parts) + ". So these rows differ from RoPE by "
            "construction here, unlike at θ = 10⁴ (0.064 rad).")


def order_items(summary: Summary, L: int) -> list[tuple[str, Difference, str, str]]:
    """The paper's order as paired comparisons at L: NoPE − 0.25, 0.25 − 0.75, 0.75 − RoPE (rows present)."""
    chain = [label for label in (NOPE, P25, P75, REFERENCE) if label in summary.rows]
    return [(f"{a} - {b} at L", summary.diff(a, b, L), f"higher loss than {b}", f"lower loss than {b}")
            for a, b in zip(chain, chain[1:])]


def sensitivity_line(summary: Summary, L: int) -> tuple[str, dict[str, Any]] | None:
    """The line on what 0.75 − RoPE can detect, and the numbers behind it."""
    if not (REFERENCE in summary.rows and P75 in summary.rows):
        return None
    d = summary.diff(P75, REFERENCE, L)
    rope = summary.rows[REFERENCE][L][0]
    s = sensitivity(d, rope, paper_relative(P75))
    if not d.finite:
        return "Sensitivity: one run per row, so no interval and nothing detectable.", s
    reach = ("an effect of the paper's relative size is within the design's reach" if s["effect_detectable"] else
             "an effect of the paper's relative size is below what the design detects")
    inside = d.low <= s["effect"] <= d.high
    return (f"Sensitivity (n = {d.n} seeds): p-RoPE 0.75 - RoPE at L is {d.interval()}, half-width "
            f"{s['half_width']:.4f} nats/byte = {s['relative_half_width']:.2%} of RoPE's loss ({rope:.3f}); the "
            f"smallest difference detected with {POWER:.0%} power is {s['detectable']:.4f} "
            f"({s['detectable'] / rope:.2%} of the loss). The paper's 0.75-RoPE - RoPE (4.4414 vs 4.4627, -0.48 % in "
            f"perplexity) is {paper_relative(P75):+.2%} of its loss, {s['effect']:+.4f} nats/byte at RoPE's loss "
            f"here: {reach}, and it lies {'inside' if inside else 'outside'} the interval.", s)


def verdict(summary: Summary, floors: dict[str, float], config: PropeGemmaRatioConfig, tests: Tests) -> list[str]:
    """Plain statements the numbers support, each comparison with its test: the setting's angles, RoPE against
    the bigram floor, every row against RoPE, the paper's order link by link, and the design's sensitivity."""
    L = config.context_length
    lines = [tests_explained(summary), setting_line(config)]
    if REFERENCE in summary.rows:
        lines.append(f"RoPE at L = {L}: {summary.rows[REFERENCE][L][0]:.3f} nats/byte; " + tests.line([
            (f"RoPE - bigram floor ({floors['bigram']:.3f})", summary.diff(REFERENCE, floors["bigram"], L),
             "above the floor: this run does not show context use", "below the floor: the models use context")])
            + ".")
        for label, row in summary.rows.items():
            if label != REFERENCE:
                lines.append(f"{label}: {row[L][0]:.3f} at L; " + tests.line([
                    (f"{label} - RoPE at L", summary.diff(label, REFERENCE, L), "higher loss than RoPE",
                     "lower loss than RoPE")]) + ".")
    items = order_items(summary, L)
    if items:
        lines.append("The paper's order, link by link (NoPE > 0.25-RoPE > RoPE >= 0.75-RoPE in perplexity): "
                     + tests.line(items) + ".")
    found = sensitivity_line(summary, L)
    if found is not None:
        lines.append(found[0])
    return lines


def paper_claims(summary: Summary, floors: dict[str, float], config: PropeGemmaRatioConfig, why: dict[str, Any],
                 tests: Tests, payload: dict[str, Any] | None = None) -> list[Claim]:
    """The p-RoPE paper's Table 2 claims at the training length (and the position-generalization paper's
    diagnostics), each with its paired intervals. Where RoPE is not detectably below the bigram floor the models
    hardly use context, so no claim about positional encodings can be tested (whatever the intervals say).
    ``payload``: the report, whose rate grid (``grid``) is each claim's tuning record where it has one."""
    L, rows = config.context_length, summary.rows
    out: list[Claim] = []

    def diff(a: str, b: str) -> Difference:
        return summary.diff(a, b, L)

    def item(a: str, b: str) -> tuple[str, Difference, str, str]:
        return (f"{a} - {b} at L", diff(a, b), f"higher loss than {b}", f"lower loss than {b}")

    rates = {label: (config.train.learning_rate, config.train.steps) for label in rows}
    reach_text = (f"the frequencies the arms stop turn up to "
                  f"{angle(max(turns(config.schemes[P25], config.model.head_dim, config.model.rope_theta, L)))} "
                  f"rad over L at Gemma's θ / L" if P25 in config.schemes else "Gemma's θ / L")
    # the angles reach the paper's (the module docstring)
    tuning = (grid_tuning(payload, list(rows), config.train.steps, reach_text, True)
              if payload is not None and "grid" in payload else fixed_rates(rates, reach_text, True))
    others = [r for r in (REFERENCE, P75, P25) if r in rows]
    if NOPE in rows and others:
        evidence = [(diff(NOPE, r), +1) for r in others]
        status = judge(evidence)
        out.append(Claim.judged(
            "p-RoPE", "NoPE has the highest perplexity at the training length (4.8594, against 4.4627 for RoPE and "
            "4.4414 / 4.5302 for 0.75- / 0.25-RoPE)", status or UNTESTABLE_SCALE,
            tests.line([item(NOPE, r) for r in others])
            + ("" if status else f"; {undecided([d for d, _ in evidence])}") + ".", tuning))
    if P25 in rows and P75 in rows:
        pairs = [(P25, P75)] + ([(P25, REFERENCE)] if REFERENCE in rows else [])
        evidence = [(diff(a, b), +1) for a, b in pairs]
        status = judge(evidence)
        out.append(Claim.judged(
            "p-RoPE", "0.25-RoPE has a higher perplexity than 0.75-RoPE (4.5302 vs 4.4414) and RoPE (4.4627) at the "
            "training length", status or UNTESTABLE_SCALE,
            f"the {len(changed_frequencies(config.schemes[P25], config.model.head_dim))} frequencies it stops turn "
            f"up to {angle(max(turns(config.schemes[P25], config.model.head_dim, config.model.rope_theta, L)))} rad "
            "over L; " + tests.line([item(a, b) for a, b in pairs])
            + ("" if status else f"; {undecided([d for d, _ in evidence])} (the paper's 0.25-RoPE - RoPE is "
               f"{paper_relative(P25):+.2%} of its loss, "
               f"{paper_relative(P25) * rows[REFERENCE][L][0]:+.3f} nats/byte at RoPE's loss here)"
               if REFERENCE in rows else "") + ".", tuning))
    if P75 in rows and REFERENCE in rows:
        d = diff(P75, REFERENCE)
        text = tests.line([item(P75, REFERENCE)])
        s = sensitivity(d, rows[REFERENCE][L][0], paper_relative(P75))
        margin = abs(s["effect"])
        worse = d.detected and d.low > 0 and abs(d.estimate) >= NEGLIGIBLE
        if worse:
            status, reason = REFUTED, f"for this regime (a 2-layer byte model at Gemma's θ / L): {text}"
        elif d.finite and d.high < margin:
            status, reason = CONFIRMED, (
                f"non-inferiority with the paper's own effect size as the margin: the interval's upper end "
                f"{d.high:+.4f} is below +{margin:.4f} nats/byte ({abs(paper_relative(P75)):.2%} of RoPE's loss, the "
                f"size of the paper's 0.75-RoPE - RoPE), so 0.75-RoPE is at most that much worse; {text}")
        else:
            status, reason = UNTESTABLE_SCALE, (
                f"the interval reaches above +{margin:.4f} nats/byte (the paper's effect size, "
                f"{abs(paper_relative(P75)):.2%} of the loss) without excluding 0; {text}")
        out.append(Claim.judged(
            "p-RoPE", "0.75-RoPE is no worse than RoPE at the training length (Wiki 4.4414 vs 4.4627; FlanV2 6.4422 "
            "vs 6.4429)", status, reason + ".", tuning))
        if d.detected and d.high < 0:
            status, reason = CONFIRMED, text
        elif worse:
            status, reason = REFUTED, f"for this regime: {text}"
        elif not d.finite:
            status, reason = UNTESTABLE_SCALE, f"one run per row, no interval: {text}"
        else:
            size = (f"an improvement of the paper's relative size ({s['effect']:+.4f} nats/byte here) lies outside "
                    "the interval, so any improvement at this scale is smaller than the paper's, and a smaller one "
                    "this design cannot resolve" if d.low > s["effect"] else
                    f"the smallest difference this design detects with {POWER:.0%} power is {s['detectable']:.4f} "
                    f"nats/byte, against the paper's relative effect of {s['effect']:+.4f} here")
            status, reason = UNTESTABLE_SCALE, f"{text}; {size}"
        out.append(Claim.judged(
            "p-RoPE", "0.75-RoPE has a lower perplexity than RoPE at the training length (Wiki 4.4414 vs 4.4627, "
            "-0.5 %; it 'even seems to improve')", status, reason + ".", tuning))
    if REFERENCE in rows:
        out = unless_context_is_used(out, summary.diff(REFERENCE, floors["bigram"], L),
                                     "the order of positional encodings")
    if why:
        out.append(han_ji_claim(why))
    return out


def analyse(payload: dict[str, Any], config: PropeGemmaRatioConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload["floors"], config, tests),
                    paper_claims(summary, payload["floors"], config, payload.get("why") or {}, tests, payload))


def difference_table(summary: Summary, L: int) -> list[str]:
    """Each row minus RoPE at L, paired by seed, in nats/byte and as a fraction of RoPE's loss, beside the
    paper's difference as a fraction of its RoPE's log perplexity (Wiki)."""
    if REFERENCE not in summary.rows:
        return []
    rope = summary.rows[REFERENCE][L][0]
    lines = ["| row | - RoPE at L (nats/byte) | as % of RoPE's loss | the paper's, % of its RoPE's loss (Wiki) |",
             "|---|---|---|---|"]
    for label in summary.rows:
        if label == REFERENCE:
            continue
        d = summary.diff(label, REFERENCE, L)
        relative = (f"{d.estimate / rope:+.2%} [{d.low / rope:+.2%}, {d.high / rope:+.2%}]" if d.finite else
                    f"{d.estimate / rope:+.2%}")
        paper = f"{paper_relative(label):+.2%}" if label in PAPER_WIKI else ""
        lines.append(f"| {label} | {d.interval()} ({d.label}) | {relative} | {paper} |")
    return lines


def render(payload: dict[str, Any], config: PropeGemmaRatioConfig) -> str:
    """``results.md`` from ``results.json``."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    notes = ["Every row minus RoPE, paired by seed (the paper's column: its row minus its RoPE in log perplexity, "
             "relative to its RoPE's, which compares effects across units and scales):", "",
             *difference_table(summary, config.context_length), "",
             "![difference from RoPE](difference_from_rope.png)", "",
             "The s / run column is the measured wall time of a run (training and evaluation); runs that shared the "
             "cores with other work are slower.", ""]
    return render_from_scratch(payload, config, title=f"p-RoPE at Gemma's θ / L ({config.size})", notes=notes)


def plot(config: PropeGemmaRatioConfig) -> Any:
    """The plots: held-out loss at L per row, and each row minus RoPE per seed."""
    L = config.context_length

    def draw(summary: Summary, floors: dict[str, float], out: Path) -> None:
        title = f"Trained and scored at L = {L} bytes, θ = {config.model.rope_theta:g} ({config.size}, " \
                f"{config.seeds} seeds)"
        plot_settings({f"L = {L}": {label: summary.values[label][L] for label in summary.rows}},
                      out / "heldout_loss.png", title, "scheme", connect=False)
        if REFERENCE in summary.rows:
            rope = summary.values[REFERENCE][L]
            diffs = {label: {s: v - rope[s] for s, v in summary.values[label][L].items() if s in rope}
                     for label in summary.rows if label != REFERENCE}
            plot_settings({"- RoPE": diffs}, out / "difference_from_rope.png", title, "scheme",
                          ylabel="held-out loss minus RoPE's, same seed (nats / byte)", zero_line=True,
                          connect=False)

    return draw


def run(config: PropeGemmaRatioConfig, out: str | Path, work: str | Path, command: str,
        corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md``, ``heldout_loss.png`` and
    ``difference_from_rope.png`` to ``out`` and returns the JSON payload."""
    if REFERENCE not in config.schemes:
        raise ValueError("the p-RoPE experiment needs a 'RoPE' row as its reference")
    arms = {label: (spec, config.model, config.train) for label, spec in config.schemes.items()}
    return run_from_scratch(config, arms, out, work, command, corpus=corpus, progress=progress,
                            experiment=config.name, experiment_config=config.to_dict(), config_object=config,
                            plot=plot(config), rate_grid=config.rate_grid)
