"""What a miniature can test, and the lines that end every report: one per claim of a paper, each **confirmed**,
**refuted** or **cannot be tested** (at this scale, or here at all), with the reason.

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
from dataclasses import asdict, dataclass
from typing import Any

from hf_posenc.schemes.spec import parse_scheme_spec

CONFIRMED, REFUTED = "confirmed", "refuted"
UNTESTABLE_SCALE, UNTESTABLE_HERE = "cannot be tested at this scale", "cannot be tested here"
STATUSES = (CONFIRMED, REFUTED, UNTESTABLE_SCALE, UNTESTABLE_HERE)
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
class Claim:
    """One claim of a paper and what this experiment says about it.

    Attributes:
        paper: the paper (short name).
        claim: the claim, with the paper's numbers.
        status: one of :data:`STATUSES`.
        reason: the evidence (intervals) or why the design cannot reach the claim.
    """

    paper: str
    claim: str
    status: str
    reason: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def line(self) -> str:
        return f"{self.paper}: {self.claim}: **{self.status}**: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def claims_section(claims: Sequence[Claim], notes: Sequence[str] = ()) -> list[str]:
    """The Markdown lines of a report's closing section: one line per claim, then ``notes``."""
    return [CLAIMS_HEADING, "", "One line per claim of the papers that this experiment speaks to: confirmed, refuted, "
            "or cannot be tested (at this scale, or here at all), with the reason; intervals as in the tests above.",
            "", *[f"- {c.line()}" for c in claims], "", *[f"{note}\n" for note in notes]]



def unless_context_is_used(claims: list[Claim], floor: Any, what: str) -> list[Claim]:
    """``claims`` as they are where RoPE's loss is detectably below the bigram floor (``floor``: RoPE − floor, a
    :class:`.stats.Difference`); otherwise each one "cannot be tested at this scale": models that hardly use context
    cannot show ``what`` (e.g. "the order of positional encodings")."""
    if floor.detected and floor.estimate < 0:
        return claims
    lead = (f"RoPE is not detectably below the bigram floor ({floor.interval()}): these models hardly use context, "
            f"so {what} cannot show; ")
    return [Claim(c.paper, c.claim, UNTESTABLE_SCALE, lead + c.reason) for c in claims]


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
