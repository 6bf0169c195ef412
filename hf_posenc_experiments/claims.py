"""What a miniature can test, and the lines that end every report: one per claim of a paper, each **confirmed**,
**refuted**, **not tested fairly at this scale** or **cannot be tested** (at this scale, or here at all), with the
reason.

"Refuted" is reserved for a comparison in which every arm had the same tuning effort (the same number of learning
rates tried, each arm at its own best rate chosen on a validation split, the same steps) and the design reaches the
paper's regime on the axis that matters (:class:`Tuning`); a negative result without that record is "not tested
fairly at this scale", with what is missing (:meth:`Claim.judged`). A :class:`Claim` that says "refuted" without a
fair record cannot be built.

Whether CoPE, HardClip or p-RoPE can differ from RoPE at all is a matter of angles: they change only RoPE's lowest
frequencies, and a frequency ω turns ω·n radians over n positions. :func:`turn` computes, from a scheme spec and a
model's head dim and base θ, the largest angle any frequency the scheme changes turns over a length: at θ = 10⁴ and
head dim 32 (the committed experiments) the 5 frequencies in CoPE's clip range turn at most 0.11 rad over 64
positions, the 4 that p-RoPE 0.75 stops 0.064 rad; in the papers' own settings (:data:`COPE_PAPER`,
:data:`PROPE_PAPER`) the same frequencies turn about 1 and 8 rad over the training length. A frequency that
hardly turns is nearly the identity whether it is kept, tapered or stopped, so there these schemes equal RoPE by
construction and their papers' claims cannot be tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hf_posenc.schemes.spec import parse_scheme_spec
from .rate_grid import grid_edge

CONFIRMED, REFUTED, UNFAIR = "confirmed", "refuted", "not tested fairly at this scale"
UNTESTABLE_SCALE, UNTESTABLE_HERE = "cannot be tested at this scale", "cannot be tested here"
STATUSES = (CONFIRMED, REFUTED, UNFAIR, UNTESTABLE_SCALE, UNTESTABLE_HERE)
CLAIMS_HEADING = "## The papers' claims"


@dataclass(frozen=True)
class RotarySetting:
    """A rotary model at a length: ``head_dim`` (rotated dimensions of a head), base ``rope_theta``, ``length``
    (positions) and a description."""

    name: str
    head_dim: int
    rope_theta: float
    length: int


# The papers' own settings (shared/papers, shared/notes/evidence-facts.md): CoPE continues Llama-3-8B (head dim
# 128) at 64k tokens after ABF to θ = 1e7 and clips 20 of its 64 frequencies; p-RoPE trains Gemma 2B (head dim
# 256) from scratch at θ = 10k and 8k tokens.
COPE_PAPER = RotarySetting("Llama-3-8B at 64k after ABF, the CoPE paper's setting", 128, 1e7, 65536)
PROPE_PAPER = RotarySetting("Gemma 2B at 8k, the p-RoPE paper's setting", 256, 1e4, 8192)


def frequencies(head_dim: int, rope_theta: float) -> list[float]:
    """RoPE's frequencies ω_i = θ^(−2i/d), i = 0 … d/2 − 1 (radians per position)."""
    return [rope_theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]


def changed_frequencies(spec: str, head_dim: int) -> list[int]:
    """Indices of the RoPE frequencies the scheme ``spec`` changes: CoPE's and HardClip's clip range (the lowest
    ``clip_low_n``, resolved for ``head_dim`` as the scheme does; CoPE's cosine taper starts at weight 1 at the
    onset and falls to 0, HardClip zeroes them all), the ones p-RoPE stops (all but ``int(p·d/2)``); none for the
    other schemes."""
    scheme = parse_scheme_spec(spec)
    n = head_dim // 2
    if scheme.name in ("cope", "hardclip"):
        return list(range(n - scheme.resolved(head_dim).clip_low_n, n))
    if scheme.name == "prope":
        return list(range(int(scheme.p * head_dim // 2), n))
    return []


def turns(spec: str, head_dim: int, rope_theta: float, length: int) -> list[float]:
    """The angles (radians) that the frequencies ``spec`` changes turn over ``length`` positions, fastest first,
    at the spec's own base θ if it sets one (ABF) and ``rope_theta`` otherwise; empty if it changes none."""
    theta = getattr(parse_scheme_spec(spec), "rope_theta", None) or rope_theta
    freqs = frequencies(head_dim, theta)
    return [freqs[i] * length for i in changed_frequencies(spec, head_dim)]


def turn(spec: str, head_dim: int, rope_theta: float, length: int) -> float:
    """The largest angle (radians) that any frequency ``spec`` changes turns over ``length`` positions
    (:func:`turns`); 0 if it changes none."""
    return max(turns(spec, head_dim, rope_theta, length), default=0.0)


def reach(spec: str, head_dim: int, rope_theta: float, lengths: dict[str, int]) -> str:
    """``"the 5 frequencies CoPE's clip range covers turn at most 0.11 rad over L = 64 and 0.91 rad over 8L = 512
    (θ = 10000, head dim 32)"``: :func:`turn` at each named length, in words."""
    scheme = parse_scheme_spec(spec)
    theta = getattr(scheme, "rope_theta", None) or rope_theta
    count = len(changed_frequencies(spec, head_dim))
    what = {"cope": "CoPE's clip range covers", "hardclip": "HardClip zeroes",
            "prope": f"p-RoPE {getattr(scheme, 'p', '')} stops"}.get(scheme.name, "it changes")
    over = " and ".join(f"{angle(turn(spec, head_dim, rope_theta, n))} rad over {name}" for name, n in lengths.items())
    return (f"the {count} of {head_dim // 2} frequencies {what} turn at most {over} (θ = {theta:,.0f}, head dim "
            f"{head_dim})")


def paper_reach(spec: str, setting: RotarySetting) -> str:
    """:func:`reach` in a paper's own setting, over its training length."""
    return (f"{angle(turn(spec, setting.head_dim, setting.rope_theta, setting.length))} rad over "
            f"{setting.length:,} tokens in {setting.name} (θ = {setting.rope_theta:,.0f}, head dim "
            f"{setting.head_dim})")


def angle(radians: float) -> str:
    """Two significant digits, at least two decimals: ``0.11``, ``0.064``, ``8.2``."""
    if radians == 0:
        return "0"
    decimals = max(2, 1 - math.floor(math.log10(abs(radians))))
    return f"{radians:.{decimals}f}"


def tapa_step(spec: str = "tapa") -> float:
    """How much TAPA's phase 2π·d^α·φ changes from distance 1 to 2 for the same φ, relative: 2^α − 1 (7 % at
    the paper's α = 0.1)."""
    return 2.0 ** parse_scheme_spec(spec).alpha - 1.0


@dataclass(frozen=True)
class Tuning:
    """The tuning budget behind a comparison, and whether its design reaches the paper's regime.

    Attributes:
        rates: arm -> the peak learning rates tried for it at the final budget.
        steps: arm -> optimizer steps at the final budget.
        validated: each arm's rate was chosen on a validation split (not on the scored text).
        flattened: whether the reference arm's held-out curve had flattened at the final budget (``None``: not
            measured).
        regime: the regime axis that matters, in words, with the value here and the paper's (the rotation angles
            for CoPE / p-RoPE, the phase at distance 1 and the training budget for TAPA, the parameter ratio for
            TAPE).
        regime_reached: the design reaches the paper's regime on that axis.
        chosen: arm -> the rate its validation loss chose from ``rates`` (empty: not recorded). An arm whose
            choice is the grid's highest or lowest rate has not had its best rate found (a rate beyond the edge
            might do better), so the comparison is not a fair test until the grid brackets it.
        grid: the rates every arm started from when the grid widens itself (:func:`.rate_grid.bracketing_runs`:
            an arm whose best rate is an end of what it tried goes on one grid step beyond it); empty: a fixed
            grid. With a widening grid the effort is equal when every arm tried every rate of ``grid`` under the
            same widening rule, so arms may end with different numbers of rates (only those whose best lay
            outside the grid widened); with a fixed grid every arm must have tried as many rates.
    """

    rates: dict[str, tuple[float, ...]]
    steps: dict[str, int]
    validated: bool
    flattened: bool | None
    regime: str
    regime_reached: bool
    chosen: dict[str, float] = field(default_factory=dict)
    grid: tuple[float, ...] = ()

    def at_edge(self) -> dict[str, str]:
        """arm -> ``"highest"`` or ``"lowest"`` for every arm whose chosen rate is that end of its grid
        (:func:`.rate_grid.grid_edge`)."""
        return {arm: side for arm, rate in self.chosen.items() if (side := grid_edge(rate, self.rates.get(arm, ())))}

    def missing(self) -> list[str]:
        """What keeps this comparison from being a fair test (empty: a fair one)."""
        out = []
        counts = {len(r) for r in self.rates.values()}
        if not self.rates or min(counts) < 2:
            tried = ", ".join(f"{arm} {'/'.join(f'{r:g}' for r in rates)}" for arm, rates in self.rates.items())
            out.append(f"a per-arm learning-rate grid at the final budget (rates tried: {tried})")
        elif self.grid and any(not set(self.grid) <= set(r) for r in self.rates.values()):
            short = ", ".join(arm for arm, r in self.rates.items() if not set(self.grid) <= set(r))
            out.append(f"every arm at every rate of the shared grid (not tried in full by: {short})")
        elif not self.grid and len(counts) > 1:
            out.append("the same number of learning rates tried for every arm")
        elif not self.validated:
            out.append("each arm's rate chosen on a validation split")
        edge = self.at_edge()
        if edge:
            out.append("a grid that brackets each arm's best rate (chosen at the grid's edge: "
                       + ", ".join(f"{arm} ({side})" for arm, side in edge.items()) + ")")
        if len(set(self.steps.values())) > 1:
            out.append("the same steps for every arm")
        if not self.regime_reached:
            out.append(f"the paper's regime ({self.regime})")
        return out

    @property
    def fair(self) -> bool:
        return not self.missing()

    def describe(self) -> str:
        """The budget in words: rates tried and steps per arm, the reference's curve, the regime."""
        arms = "; ".join(f"{arm}: {'/'.join(f'{r:g}' for r in self.rates[arm])} x {self.steps.get(arm, 0):,} steps"
                         + (f" (chose {self.chosen[arm]:g})" if arm in self.chosen else "") for arm in self.rates)
        curve = {True: "flattened", False: "still falling", None: "not measured"}[self.flattened]
        return (f"tuning: {arms}; rate chosen on {'a validation split' if self.validated else 'no validation split'}; "
                f"the reference's curve {curve}; regime: {self.regime}")

    def to_dict(self) -> dict[str, Any]:
        """The record as a report's JSON holds it (``grid`` only where the grid widened itself)."""
        out = {k: v for k, v in asdict(self).items() if k != "grid" or self.grid}
        return {**out, "fair": self.fair, "missing": self.missing()}


def fixed_rates(arms: dict[str, tuple[float, int]], regime: str, regime_reached: bool) -> Tuning:
    """The record of a comparison whose arms each trained at one fixed rate (``arms``: arm -> (rate, steps)), with
    no grid and no validation split: equal effort at best, tuned for none."""
    return Tuning(rates={arm: (rate,) for arm, (rate, _) in arms.items()},
                  steps={arm: steps for arm, (_, steps) in arms.items()}, validated=False, flattened=None,
                  regime=regime, regime_reached=regime_reached)


# TAPA's regime (shared/notes/evidence-facts.md): with weights at normal(0, σ) and width d, the phase at distance 1
# (eq. 12 at |m − n| = 1) has a standard deviation of about 2π·d·σ² and a median magnitude 0.6745 times that. The
# paper states no init: at LLaMA-3 7B's width (d = 4096) with σ = 0.02 the median is about 6.9 rad. Its budget:
# 420B tokens for a 7B model, 60 tokens per parameter (of about 4 bytes each). A design reaches either axis at half the paper's value or
# more (the rule :mod:`.cope_passkey` applies to rotation angles).
TAPA_PAPER_WIDTH, TAPA_PAPER_INIT, TAPA_PAPER_TOKENS_PER_PARAMETER = 4096, 0.02, 420e9 / 7e9
# bytes of English per token of the paper's LLaMA-3 tokenizer (an estimate, about 4): the miniatures count bytes
TAPA_PAPER_BYTES_PER_TOKEN = 4.0


def tapa_init_phase(hidden_size: int, initializer_range: float) -> float:
    """The median |phase at distance 1| at init of TAPA in a model of width ``hidden_size`` whose weights are drawn
    from normal(0, ``initializer_range``): 0.6745 · 2π · d · σ² radians."""
    return 0.6745 * 2 * math.pi * hidden_size * initializer_range ** 2


TAPA_PAPER_PHASE = tapa_init_phase(TAPA_PAPER_WIDTH, TAPA_PAPER_INIT)


def llama_parameters(hidden_size: int, intermediate_size: int, num_layers: int, vocab_size: int) -> int:
    """Parameters of a Llama-style decoder without GQA, with tied embeddings (the miniatures' models)."""
    layer = 4 * hidden_size ** 2 + 3 * hidden_size * intermediate_size + 2 * hidden_size
    return vocab_size * hidden_size + num_layers * layer + hidden_size


def tapa_regime(phase_at_init: float, trained_bytes: int, parameters: int) -> tuple[str, bool]:
    """TAPA's regime axes in words, and whether both reach half the paper's: the median phase at distance 1 at
    init (radians) and the training budget in the paper's tokens per parameter, a byte model's ``trained_bytes``
    counted as LLaMA-3 tokens of :data:`TAPA_PAPER_BYTES_PER_TOKEN` bytes each."""
    per_parameter = trained_bytes / TAPA_PAPER_BYTES_PER_TOKEN / parameters
    reached = (phase_at_init >= TAPA_PAPER_PHASE / 2
               and per_parameter >= TAPA_PAPER_TOKENS_PER_PARAMETER / 2)
    text = (f"median phase at distance 1 at init {angle(phase_at_init)} rad here against about "
            f"{angle(TAPA_PAPER_PHASE)} rad at the paper's width (d = {TAPA_PAPER_WIDTH}, σ = {TAPA_PAPER_INIT} "
            f"assumed: the paper states no init); budget {per_parameter:.1f} tokens per parameter in the paper's unit "
            f"({trained_bytes:,} bytes, about {TAPA_PAPER_BYTES_PER_TOKEN:g} to a LLaMA-3 token, {parameters:,} "
            f"parameters) against the paper's {TAPA_PAPER_TOKENS_PER_PARAMETER:.0f} (420B tokens)")
    return text, reached


def tapa_arms_tuning(arms: dict[str, tuple[str, Any, Any]], context_length: int) -> Tuning:
    """The tuning record of a from-scratch TAPA comparison whose arms (label -> (scheme spec, model settings,
    optimisation settings)) were each trained once and scored on the held-out text: the rates each method (RoPE,
    TAPA) tried over its arms, the steps, no validation split, and TAPA's regime at its hottest initial scale and
    its largest model (byte vocabulary)."""
    from .tokenizer import VOCAB_SIZE

    rates: dict[str, set[float]] = {}
    steps: dict[str, int] = {}
    for spec, _, train in arms.values():
        method = "TAPA" if spec.startswith("tapa") else "RoPE" if spec == "rope" else None
        if method is not None:
            rates.setdefault(method, set()).add(train.learning_rate)
            steps[method] = max(steps.get(method, 0), train.steps)
    tapa = [(model, train) for spec, model, train in arms.values() if spec.startswith("tapa")]
    model, train = max(tapa, key=lambda arm: (arm[0].num_layers, arm[0].initializer_range))
    hottest = max(m.initializer_range for m, _ in tapa)
    regime, reached = tapa_regime(
        tapa_init_phase(model.hidden_size, hottest), train.steps * train.batch_size * context_length,
        llama_parameters(model.hidden_size, model.intermediate_size, model.num_layers, VOCAB_SIZE))
    return Tuning(rates={method: tuple(sorted(r)) for method, r in rates.items()}, steps=steps, validated=False,
                  flattened=None, regime=regime, regime_reached=reached)


@dataclass(frozen=True)
class Claim:
    """One claim of a paper and what this experiment says about it.

    Attributes:
        paper: the paper (short name).
        claim: the claim, with the paper's numbers.
        status: one of :data:`STATUSES`.
        reason: the evidence (intervals) or why the design cannot reach the claim.
        tuning: the tuning record of the comparison (required for "refuted", and fair there).
    """

    paper: str
    claim: str
    status: str
    reason: str
    tuning: Tuning | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.status == REFUTED and (self.tuning is None or not self.tuning.fair):
            missing = "no tuning record" if self.tuning is None else "; ".join(self.tuning.missing())
            raise ValueError(f"a claim is 'refuted' only with equal tuning of every arm in the paper's regime "
                             f"(missing: {missing}); build it with Claim.judged, which says {UNFAIR!r} instead")

    @classmethod
    def judged(cls, paper: str, claim: str, status: str, reason: str, tuning: Tuning) -> Claim:
        """The claim with ``status`` as the evidence reads, except that a negative reading ("refuted") without a
        fair ``tuning`` record becomes "not tested fairly at this scale", naming what is missing; the record is
        written into the reason either way."""
        if status == REFUTED and not tuning.fair:
            reason = (f"a negative reading, not a fair test: missing {'; '.join(tuning.missing())}. "
                      f"The evidence: {reason}")
            status = UNFAIR
        return cls(paper, claim, status, f"{reason} ({tuning.describe()})", tuning)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Claim:
        """The claim :meth:`to_dict` wrote (a report's JSON)."""
        tuning = data.get("tuning")
        if tuning is not None:
            fields = {k: v for k, v in tuning.items() if k not in ("fair", "missing")}  # derived, not fields
            tuning = Tuning(**{**fields, "rates": {arm: tuple(r) for arm, r in fields["rates"].items()},
                               "grid": tuple(fields.get("grid", ()))})
        return cls(data["paper"], data["claim"], data["status"], data["reason"], tuning)

    def line(self) -> str:
        return f"{self.paper}: {self.claim}: **{self.status}**: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tuning"] = None if self.tuning is None else self.tuning.to_dict()
        return out


def claims_section(claims: Sequence[Claim], notes: Sequence[str] = ()) -> list[str]:
    """The Markdown lines of a report's closing section: one line per claim, then ``notes``."""
    return [CLAIMS_HEADING, "", "One line per claim of the papers that this experiment speaks to: confirmed, refuted, "
            "not tested fairly at this scale, or cannot be tested (at this scale, or here at all), with the reason; "
            "intervals as in the tests above.",
            "", *[f"- {c.line()}" for c in claims], "", *[f"{note}\n" for note in notes]]



def unless_context_is_used(claims: list[Claim], floor: Any, what: str) -> list[Claim]:
    """``claims`` as they are where RoPE's loss is detectably below the bigram floor (``floor``: RoPE − floor, a
    :class:`.stats.Difference`); otherwise each one "cannot be tested at this scale": models that hardly use context
    cannot show ``what`` (e.g. "the order of positional encodings")."""
    if floor.detected and floor.estimate < 0:
        return claims
    lead = (f"RoPE is not detectably below the bigram floor ({floor.interval()}): these models hardly use context, "
            f"so {what} cannot show; ")
    return [Claim(c.paper, c.claim, UNTESTABLE_SCALE, lead + c.reason, c.tuning) for c in claims]


def han_ji_claim(why: dict[str, Any], models: str = "2-layer byte models") -> Claim:
    """The position-generalization paper's diagnostics, measured here on small models (``models``): descriptive
    only."""
    rope = next((e for label, e in why.items() if e.get("scheme") == "rope" and e.get("disentanglement")), None)
    fit = None if rope is None else rope["disentanglement"]["mean_fake_distance_correlation"]
    measured = "" if fit is None else f" (the first RoPE model here: fake-distance fit correlation {fit:.3f})"
    return Claim("Han & Ji (position generalization)",
                 "the attention logits of pretrained LLMs disentangle into position and content (fake-distance fit "
                 "correlation 0.947 in Llama-3.2; 0.028 at random init) and tolerate position perturbations",
                 UNTESTABLE_SCALE,
                 "the claim is about pretrained Llama-3.2; the diagnostics in the Why section measure the same "
                 f"quantities on {models} with one seed, which describes these models and tests nothing of "
                 f"a pretrained LLM{measured}.")
