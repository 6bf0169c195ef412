"""Is TAPA trainable? A sweep of TAPA's settings on the length-generalisation experiment's data and model.

Two small runs disagreed: a byte-level TAPA model that learnt no context at all, and a tokenised run where TAPA
trained almost as well as RoPE but where no model was yet past the unigram/bigram stage. This experiment asks the
question where context matters (RoPE well below the held-out bigram floor): the paper's TAPA (eq. 12, α = 0.1,
θ = 0.5, quadratic phase) and one change at a time — α, θ, linear phase (eq. 16), learning rate, warm-up and the
initial weight scale (which sets the initial phase; QK-norm models start at several radians) — against RoPE and
NoPE, each with several seeds, evaluated at L…8L.

Every arm trains the same seeds, so each TAPA arm is compared with RoPE paired by seed (:mod:`.stats`): at L it
is *worse* or *better* than RoPE when the 95 % interval of the difference excludes 0, and otherwise "no difference
detected at this scale" (which is not a match). It is *flat* when its growth from L to 8L minus a quarter of
RoPE's growth has an interval below 0, *not flat* when above, undecided when the interval contains 0. Where a RoPE
arm was trained with the same learning rate, warm-up and initial scale, the TAPA arm is compared with it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .claims import REFUTED, UNTESTABLE_SCALE, Claim, han_ji_claim, tapa_arms_tuning
from .config import TapaTrainabilityConfig
from .corpus import Corpus
from .length_generalisation import render_from_scratch, run_from_scratch
from .report import Tests, analysis, tests_explained
from .runner import Summary

FLAT_FRACTION = 0.25  # "flat": growth L -> 8L below this fraction of RoPE's (tested paired by seed)
REFERENCE = "RoPE"
PAPER_ARM = "TAPA paper"  # the paper's setting; every other TAPA arm changes one thing from it


def same_settings_rope(variants: dict[str, Any]) -> dict[str, str]:
    """TAPA arm -> the RoPE arm (other than the reference ``RoPE``) trained with the same learning rate, warm-up
    and initial scale, where the sweep has one (``variants``: label -> :class:`.config.Variant` or its dict)."""
    def knobs(v: Any) -> tuple:
        get = v.get if isinstance(v, dict) else lambda k: getattr(v, k)
        return get("learning_rate"), get("warmup_steps"), get("initializer_range")

    def spec(v: Any) -> str:
        return v["spec"] if isinstance(v, dict) else v.spec

    ropes = {knobs(v): label for label, v in variants.items() if spec(v) == "rope" and label != REFERENCE}
    return {label: ropes[knobs(v)] for label, v in variants.items()
            if label.startswith("TAPA") and knobs(v) in ropes}


def classify(summary: Summary, context_length: int, references: dict[str, str] | None = None
             ) -> dict[str, dict[str, Any]]:
    """Per TAPA arm, paired by seed with RoPE: the difference at L (``vs_rope``) and its reading
    (``in_distribution``: ``"worse"``, ``"better"``, ``"no difference detected"`` or, with one seed, ``"not
    testable"``), the growth L -> longest
    (``growth``) and the test of ``growth − FLAT_FRACTION · RoPE's growth`` (``flat_test``; ``flat`` True when
    its interval is below 0, False above, None when it contains 0), and against the same-settings RoPE arm of
    ``references`` (``vs_same_settings_rope``, with its label in ``same_settings_rope``)."""
    references = references or {}
    longest = summary.lengths[-1]
    out = {}
    for label in summary.rows:
        if not label.startswith("TAPA"):
            continue
        vs = summary.diff(label, REFERENCE, context_length)
        flat = summary.growth_diff(label, REFERENCE, context_length, longest, scale=FLAT_FRACTION)
        entry: dict[str, Any] = {
            "vs_rope": vs,
            "in_distribution": ("worse" if vs.low > 0 else "better") if vs.detected else
                               "no difference detected" if vs.finite else "not testable",
            "growth": summary.diff(label, label, longest, other_length=context_length),
            "flat_test": flat, "flat": (flat.high < 0) if flat.detected else None,
        }
        if label in references and references[label] in summary.rows:
            entry["same_settings_rope"] = references[label]
            entry["vs_same_settings_rope"] = summary.diff(label, references[label], context_length)
        out[label] = entry
    return out


def relative_to_floor(loss: float, floor: float) -> str:
    """``"0.607 below the bigram floor"`` / ``"0.092 above the bigram floor"``."""
    return f"{abs(loss - floor):.3f} {'below' if loss < floor else 'above'} the bigram floor"


def verdict(summary: Summary, floors: dict[str, float], context_length: int, references: dict[str, str] | None = None,
            tests: Tests | None = None) -> list[str]:
    """The answer, each comparison with its test: RoPE against the bigram floor, the other reference arms against
    RoPE, then per TAPA arm its difference from RoPE (and from the same-settings RoPE arm), from the paper's
    setting, from the bigram floor and from NoPE at L, its growth and the flatness test; last, which TAPA settings
    are not detectably worse than RoPE at L and flat, or the negative result."""
    tests = Tests() if tests is None else tests
    L, longest = context_length, summary.lengths[-1]
    k = longest // L
    bigram = floors["bigram"]
    rope = summary.rows[REFERENCE]
    lines = [tests_explained(summary),
             f"RoPE at L = {L}: {rope[L][0]:.3f} nats/byte; " + tests.line([
                 (f"RoPE - bigram floor ({bigram:.3f})", summary.diff(REFERENCE, bigram, L), "above the floor",
                  "below the floor: the models use context"),
                 (f"growth L -> {k}L", summary.diff(REFERENCE, REFERENCE, longest, other_length=L), "grows",
                  "shrinks")]) + "."]
    for label, row in summary.rows.items():
        if label == REFERENCE or label.startswith("TAPA"):
            continue
        lines.append(f"{label}: {row[L][0]:.3f} at L; " + tests.line([
            (f"{label} - RoPE at L", summary.diff(label, REFERENCE, L), "higher loss than RoPE",
             "lower loss than RoPE"),
            (f"at {k}L", summary.diff(label, REFERENCE, longest), "higher loss than RoPE", "lower loss than RoPE"),
            ("growth - RoPE's growth", summary.growth_diff(label, REFERENCE, L, longest), "grows more than RoPE",
             "grows less than RoPE")]) + ".")
    verdicts = classify(summary, L, references)
    nope = "NoPE" if "NoPE" in summary.rows else None
    for label, v in verdicts.items():
        items = [(f"{label} - RoPE at L", v["vs_rope"], "higher loss than RoPE", "lower loss than RoPE")]
        if "same_settings_rope" in v:
            ref = v["same_settings_rope"]
            items.append((f"- {ref}", v["vs_same_settings_rope"], f"higher loss than {ref}", f"lower loss than {ref}"))
        if label != PAPER_ARM and PAPER_ARM in summary.rows:  # the one change this arm makes
            items.append((f"- {PAPER_ARM}", summary.diff(label, PAPER_ARM, L), f"higher loss than {PAPER_ARM}",
                          f"lower loss than {PAPER_ARM}"))
        items.append(("- bigram floor", summary.diff(label, bigram, L), "above the bigram floor",
                      "below the bigram floor"))
        if nope:
            items.append(("- NoPE", summary.diff(label, nope, L), "higher loss than NoPE", "lower loss than NoPE"))
        items += [(f"growth L -> {k}L", v["growth"], "grows", "shrinks"),
                  (f"growth - {FLAT_FRACTION:g} x RoPE's", v["flat_test"], "not flat", "flat")]
        flat = {True: "flat", False: "not flat", None: "flatness undecided"}[v["flat"]]
        lines.append(f"{label}: {summary.rows[label][L][0]:.3f} at L; " + tests.line(items)
                     + f". In short: {v['in_distribution']} than RoPE at L, {flat}."
                     .replace("no difference detected than RoPE", "no difference from RoPE detected"))
    winners = [label for label, v in verdicts.items() if v["in_distribution"] != "worse" and v["flat"] is True]
    if winners:
        lines.append(f"Answer: no difference from RoPE detected at L (or lower loss) and flat to {k}L: "
                     f"{', '.join(winners)}.")
    elif verdicts:
        best = min(verdicts, key=lambda key: summary.rows[key][L][0])
        v = verdicts[best]
        worse = sum(x["in_distribution"] == "worse" for x in verdicts.values())
        versus = f"{v['vs_rope'].interval()} vs RoPE"
        if "same_settings_rope" in v:
            versus += f", {v['vs_same_settings_rope'].interval()} vs {v['same_settings_rope']} (the same settings)"
        lines.append(f"Answer (negative, for this regime): no TAPA setting is both no worse than RoPE at L and flat to "
                     f"{k}L; {worse} of {len(verdicts)} TAPA settings have a higher loss than RoPE at L (intervals "
                     f"above 0). The lowest mean at L is {best}: {versus}.")
    return lines


def paper_claims(summary: Summary, floors: dict[str, float], config: TapaTrainabilityConfig,
                 references: dict[str, str], why: dict[str, Any], tests: Tests) -> list[Claim]:
    """The TAPA paper's claims this sweep speaks to (and the position-generalization paper's diagnostics)."""
    L, longest = config.base.context_length, summary.lengths[-1]
    k = longest // L
    bigram = floors["bigram"]
    verdicts = classify(summary, L, references)
    out: list[Claim] = []
    if verdicts:
        best = min(verdicts, key=lambda key: summary.rows[key][L][0])
        v = verdicts[best]
        all_worse = all(x["in_distribution"] == "worse" for x in verdicts.values())
        evidence = [(f"{best} - RoPE at L", v["vs_rope"], "higher loss than RoPE", "lower loss than RoPE")]
        if "same_settings_rope" in v:
            ref = v["same_settings_rope"]
            evidence.append((f"- {ref}", v["vs_same_settings_rope"], f"higher loss than {ref}",
                             f"lower loss than {ref}"))
        same_worse = "same_settings_rope" not in v or (v["vs_same_settings_rope"].detected
                                                      and v["vs_same_settings_rope"].estimate > 0)
        status = REFUTED if all_worse and same_worse else UNTESTABLE_SCALE
        if status == REFUTED:
            why_not = (f"for this regime (2-layer byte model, 1,000 steps), not the paper's 7B model trained on 420B "
                       f"tokens: all {len(verdicts)} TAPA settings have a higher loss than RoPE at L, the lowest mean "
                       "too: ")
        elif not v["vs_rope"].finite:
            why_not = "one run per row, so no difference has a test: "
        else:
            why_not = ("some TAPA setting is not detectably worse than RoPE at L, which is not a match; the lowest "
                       "mean: ")
        out.append(Claim.judged(
            "TAPA", "TAPA trains to RoPE's perplexity inside the training length (within a few hundredths at 1k-16k; "
            "TAPA at 1/5 of RoPE's learning rate, 5k warm-up)", status, why_not + tests.line(evidence) + ".",
            tapa_arms_tuning(config.arms(), config.base.context_length)))
        uses_context = [label for label in verdicts if summary.diff(label, bigram, L).high < 0]
        items = [(f"RoPE growth L -> {k}L", summary.diff(REFERENCE, REFERENCE, longest, other_length=L), "grows",
                  "shrinks")]
        for label in uses_context:
            if "same_settings_rope" in verdicts[label]:
                ref = verdicts[label]["same_settings_rope"]
                items.append((f"{label} growth - {ref} growth", summary.growth_diff(label, ref, L, longest),
                              f"grows more than {ref}", f"grows less than {ref}"))
        out.append(Claim(
            "TAPA", "without long-context fine-tuning TAPA degrades beyond the training length, but far less than "
            "RoPE (perplexity 17.96 vs about 5.9e3 at 2x the training length)", UNTESTABLE_SCALE,
            "RoPE does not collapse at this scale, so there is no failure to avoid: " + tests.line(items)
            + f"; and a TAPA arm uses less context than the RoPE it is compared with (only "
            f"{', '.join(uses_context) or 'none'} below the bigram floor), so it has less to lose."))
        pair = (PAPER_ARM, "TAPA linear phase")
        if all(label in summary.rows for label in pair):
            below = [label for label in pair if summary.diff(label, bigram, L).high < 0]
            out.append(Claim(
                "TAPA", "the quadratic phase beats the linear one at every length (perplexity 11.74 vs 13.13 at 32k)",
                UNTESTABLE_SCALE,
                ("at the paper's α, θ and RoPE's learning rate neither phase is detectably below the bigram floor, "
                 "so neither uses the positions the phase encodes; " if not below else
                 f"only {', '.join(below)} is below the bigram floor at RoPE's learning rate; ") + tests.line([
                    ("TAPA paper - TAPA linear phase at L", summary.diff("TAPA paper", "TAPA linear phase", L),
                     "higher loss than the linear phase", "lower loss than the linear phase")]) + "."))
    if why:
        out.append(han_ji_claim(why))
    return out


def analyse(payload: dict[str, Any], config: TapaTrainabilityConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    summary = Summary.from_results(payload["runs"], config.base.eval_lengths)
    references = same_settings_rope(config.variants)
    tests = Tests()
    return analysis(tests, verdict(summary, payload["floors"], config.base.context_length, references, tests),
                    paper_claims(summary, payload["floors"], config, references, payload.get("why") or {}, tests))


def render(payload: dict[str, Any], config: TapaTrainabilityConfig) -> str:
    """``results.md`` from ``results.json``."""
    changed = [f"- {label}: `{v.spec}`" + "".join(
        f", {k} {getattr(v, k):g}" for k in ("learning_rate", "warmup_steps", "initializer_range")
        if getattr(v, k) is not None) for label, v in config.variants.items()]
    notes = ["Arms (scheme spec and the settings each changes):", "", *changed, "",
             "Every arm trains the same seeds, so a TAPA arm is compared with RoPE paired by seed: worse or better "
             "when the 95 % interval of the difference at L excludes 0, otherwise no difference detected (which is "
             f"not a match); flat when its growth from L to {config.base.eval_multiples[-1]}L minus "
             f"{FLAT_FRACTION:g} x RoPE's growth has an interval below 0. The s / run column is the measured wall "
             "time of a run (training and evaluation); runs that shared the cores with other work are slower.", ""]
    return render_from_scratch(payload, config.base,
                               title=f"Is TAPA trainable? A sweep of its settings ({config.base.size})", notes=notes)


def run(config: TapaTrainabilityConfig, out: str | Path, work: str | Path, command: str,
        corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the sweep; writes ``results.json``, ``results.md`` and ``heldout_loss.png`` to ``out``."""
    arms = config.arms()
    if REFERENCE not in arms:
        raise ValueError("the TAPA sweep needs a 'RoPE' arm as its reference")
    return run_from_scratch(config.base, arms, out, work, command, corpus=corpus, progress=progress,
                            experiment=config.name, experiment_config=config.to_dict(), config_object=config)
