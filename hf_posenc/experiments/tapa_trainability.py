"""Is TAPA trainable? A sweep of TAPA's settings on the length-generalisation experiment's data and model.

Two small runs disagreed: a byte-level TAPA model that learnt no context at all, and a tokenised run where TAPA
trained almost as well as RoPE but where no model was yet past the unigram/bigram stage. This experiment asks the
question where context matters (RoPE well below the held-out bigram floor): the paper's TAPA (eq. 12, α = 0.1,
θ = 0.5, quadratic phase) and one change at a time — α, θ, linear phase (eq. 16), learning rate, warm-up and the
initial weight scale (which sets the initial phase; QK-norm models start at several radians) — against RoPE and
NoPE, each with several seeds, evaluated at L…8L.

A TAPA arm *matches RoPE in-distribution* when its mean held-out loss at L is within two combined standard
deviations of RoPE's (or below it), and is *flat* when its loss grows from L to 8L by less than a quarter of
RoPE's growth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .config import TapaTrainabilityConfig
from .corpus import Corpus
from .length_generalisation import run_from_scratch
from .runner import Summary

FLAT_FRACTION = 0.25  # "flat": growth L -> 8L below this fraction of RoPE's


def classify(summary: Summary, context_length: int) -> dict[str, dict[str, Any]]:
    """Per TAPA arm: the gap to RoPE at L, the combined sd, the growth L -> longest and the two verdicts."""
    rope = summary.rows["RoPE"]
    longest = summary.lengths[-1]
    rope_growth = rope[longest][0] - rope[context_length][0]
    out = {}
    for label, row in summary.rows.items():
        if not label.startswith("TAPA"):
            continue
        mean, sd = row[context_length]
        gap = mean - rope[context_length][0]
        combined = math.sqrt(sd ** 2 + rope[context_length][1] ** 2) if math.isfinite(sd) else math.nan
        growth = row[longest][0] - mean
        out[label] = {"gap_to_rope_at_L": gap, "combined_sd": combined, "growth": growth,
                      "matches_rope": bool(math.isfinite(gap) and (gap <= 0 or gap <= 2 * combined)),
                      "flat": bool(math.isfinite(growth) and growth < FLAT_FRACTION * rope_growth)}
    return out


def relative_to_floor(loss: float, floor: float) -> str:
    """``"0.607 below the bigram floor"`` / ``"0.092 above the bigram floor"``."""
    return f"{abs(loss - floor):.3f} {'below' if loss < floor else 'above'} the bigram floor"


def verdict(summary: Summary, floors: dict[str, float], context_length: int) -> list[str]:
    """The answer: which TAPA settings match RoPE at L while staying flat to 8L, or the negative result."""
    rope = summary.rows["RoPE"]
    longest = summary.lengths[-1]
    times = longest // context_length
    lines = [f"RoPE at L = {context_length}: {rope[context_length][0]:.3f} nats/byte, "
             f"{relative_to_floor(rope[context_length][0], floors['bigram'])} ({floors['bigram']:.3f}); "
             f"grows by {rope[longest][0] - rope[context_length][0]:+.3f} to {times}L."]
    if "NoPE" in summary.rows:
        nope = summary.rows["NoPE"]
        lines.append(f"NoPE at L: {nope[context_length][0]:.3f}; grows by {nope[longest][0] - nope[context_length][0]:+.3f}"
                     f" to {times}L.")
    verdicts = classify(summary, context_length)
    for label, v in verdicts.items():
        row = summary.rows[label]
        lines.append(f"{label}: {row[context_length][0]:.3f} at L ({v['gap_to_rope_at_L']:+.3f} vs RoPE, combined sd "
                     f"{v['combined_sd']:.3f}; {relative_to_floor(row[context_length][0], floors['bigram'])}), {v['growth']:+.3f} to {times}L: "
                     + ("matches RoPE" if v["matches_rope"] else "worse than RoPE") + ", "
                     + ("flat" if v["flat"] else "not flat") + ".")
    winners = [label for label, v in verdicts.items() if v["matches_rope"] and v["flat"]]
    if winners:
        lines.append("Answer: TAPA matches RoPE at L and stays flat to " f"{times}L with: {', '.join(winners)}.")
    elif verdicts:
        best = min(verdicts, key=lambda k: summary.rows[k][context_length][0])
        lines.append(f"Answer (negative): no TAPA setting both matches RoPE at L and stays flat to {times}L. The "
                     f"best in-distribution is {best} ({verdicts[best]['gap_to_rope_at_L']:+.3f} nats/byte vs RoPE, "
                     + ("flat" if verdicts[best]["flat"] else "not flat") + ").")
    return lines


def run(config: TapaTrainabilityConfig, out: str | Path, work: str | Path, command: str,
        corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the sweep; writes ``results.json``, ``results.md`` and ``heldout_loss.png`` to ``out``."""
    arms = config.arms()
    if "RoPE" not in arms:
        raise ValueError("the TAPA sweep needs a 'RoPE' arm as its reference")
    changed = [f"- {label}: `{v.spec}`" + "".join(
        f", {k} {getattr(v, k):g}" for k in ("learning_rate", "warmup_steps", "initializer_range")
        if getattr(v, k) is not None) for label, v in config.variants.items()]
    notes = ["Arms (scheme spec and the settings each changes):", "", *changed, "",
             f"A TAPA arm matches RoPE in-distribution when its mean at L is within two combined sd of RoPE's (or "
             f"below); it is flat when its loss grows from L to {config.base.eval_multiples[-1]}L by less than "
             f"{FLAT_FRACTION:g} x RoPE's growth. The s / run column is the measured wall time of a run (training and "
             "evaluation); runs that shared the cores with other work are slower.", ""]
    return run_from_scratch(config.base, arms, out, work, command, corpus=corpus, progress=progress,
                            title=f"Is TAPA trainable? A sweep of its settings ({config.base.size})",
                            experiment=config.name, experiment_config=config.to_dict(), verdict=verdict,
                            notes=notes)
