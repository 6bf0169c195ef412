"""The verdict rule of the experiments' claims: "refuted" only where every arm had the same tuning effort (a grid
of rates per arm chosen on a validation split, the same steps) and the design reaches the paper's regime; any other
negative reading is "not tested fairly at this scale", naming what is missing; and no committed report breaks it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_posenc_experiments.claims import CONFIRMED, REFUTED, UNFAIR, Claim, Tuning

ROOT = Path(__file__).resolve().parents[1]


def _tuning(**changes) -> Tuning:
    fair = dict(rates={"RoPE": (1e-3, 3e-3), "TAPA": (1e-3, 3e-3)}, steps={"RoPE": 4000, "TAPA": 4000},
                validated=True, flattened=True, regime="phase at distance 1: 7 rad here, about 7 rad in the paper",
                regime_reached=True)
    return Tuning(**{**fair, **changes})


def test_a_refuted_claim_needs_a_fair_record():
    with pytest.raises(ValueError, match="no tuning record"):
        Claim("TAPA", "c", REFUTED, "worse")
    with pytest.raises(ValueError, match="the paper's regime"):
        Claim("TAPA", "c", REFUTED, "worse", _tuning(regime_reached=False))
    assert Claim("TAPA", "c", REFUTED, "worse", _tuning()).status == REFUTED


@pytest.mark.parametrize("changes,missing", [
    ({"rates": {"RoPE": (3e-3,), "TAPA": (3e-3,)}}, "a per-arm learning-rate grid at the final budget (rates tried: "
                                                    "RoPE 0.003, TAPA 0.003)"),
    ({"rates": {"RoPE": (1e-3, 3e-3), "TAPA": (3e-4, 1e-3, 3e-3)}}, "the same number of learning rates tried"),
    ({"validated": False}, "each arm's rate chosen on a validation split"),
    ({"steps": {"RoPE": 4000, "TAPA": 200}}, "the same steps for every arm"),
    ({"regime_reached": False}, "the paper's regime (phase at distance 1"),
    ({"chosen": {"RoPE": 1e-3, "TAPA": 3e-3}}, "a grid that brackets each arm's best rate (chosen at the grid's "
                                               "edge: RoPE (lowest), TAPA (highest))"),
])
def test_a_negative_reading_without_a_fair_record_is_not_a_fair_test(changes, missing):
    claim = Claim.judged("TAPA", "c", REFUTED, "TAPA - RoPE +0.4 [+0.3, +0.5]", _tuning(**changes))
    assert claim.status == UNFAIR
    assert claim.reason.startswith("a negative reading, not a fair test: missing ") and missing in claim.reason
    assert "TAPA - RoPE +0.4 [+0.3, +0.5]" in claim.reason and "tuning: RoPE: " in claim.reason
    assert claim.to_dict()["tuning"]["fair"] is False


def test_a_fair_record_keeps_the_verdict_and_says_its_budget():
    for status in (REFUTED, CONFIRMED):
        claim = Claim.judged("TAPA", "c", status, "evidence", _tuning())
        assert claim.status == status
        assert "RoPE: 0.001/0.003 x 4,000 steps" in claim.reason and "the reference's curve flattened" in claim.reason
        assert claim.to_dict()["tuning"]["missing"] == []


def test_a_choice_inside_the_grid_is_fair_and_named():
    inside = _tuning(rates={"RoPE": (1e-3, 3e-3, 1e-2), "TAPA": (1e-3, 3e-3, 1e-2)},
                     chosen={"RoPE": 3e-3, "TAPA": 3e-3})
    assert inside.fair and inside.at_edge() == {}
    assert "RoPE: 0.001/0.003/0.01 x 4,000 steps (chose 0.003)" in inside.describe()
    one_edge = _tuning(rates=inside.rates, chosen={"RoPE": 3e-3, "TAPA": 1e-2})
    assert one_edge.at_edge() == {"TAPA": "highest"} and not one_edge.fair
    assert Claim.from_dict(Claim.judged("TAPA", "c", REFUTED, "worse", one_edge).to_dict()).tuning == one_edge


def test_a_widening_grid_is_equal_effort_when_every_arm_tried_the_shared_grid():
    grid = (6e-4, 2e-3, 6e-3)
    widened = _tuning(rates={"RoPE": grid, "TAPA": (*grid, 2e-2, 6e-2)}, chosen={"RoPE": 2e-3, "TAPA": 2e-2},
                      grid=grid)
    assert widened.fair and "grid" in widened.to_dict()
    assert Claim.from_dict(Claim.judged("TAPA", "c", REFUTED, "worse", widened).to_dict()).tuning == widened
    # the same counts without the shared grid's record: a fixed grid must give every arm as many rates
    fixed = _tuning(rates=widened.rates, chosen=widened.chosen)
    assert fixed.missing() == ["the same number of learning rates tried for every arm"] and "grid" not in fixed.to_dict()
    # an arm that skipped a rate of the shared grid had less effort
    short = _tuning(rates={"RoPE": grid[1:], "TAPA": (*grid, 2e-2)}, chosen={"RoPE": 2e-3, "TAPA": 2e-3}, grid=grid)
    assert short.missing()[0] == "every arm at every rate of the shared grid (not tried in full by: RoPE)"
    # a widened arm still at its end is not bracketed
    edge = _tuning(rates=widened.rates, chosen={"RoPE": 2e-3, "TAPA": 6e-2}, grid=grid)
    assert edge.at_edge() == {"TAPA": "highest"} and not edge.fair


def test_no_committed_report_says_refuted_without_a_fair_record():
    reports = sorted((ROOT / "examples" / "experiments").glob("*/results.json"))
    assert len(reports) >= 9
    for path in reports:
        for claim in json.loads(path.read_text()).get("claims") or []:
            if claim["status"] == REFUTED:
                tuning = claim.get("tuning")
                assert tuning and tuning["fair"] and not tuning["missing"], (path, claim["claim"])
