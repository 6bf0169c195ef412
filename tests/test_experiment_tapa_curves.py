"""The ``tapa_curves`` experiment (issue #47 §1): its settings, the toy run through the command line, the reading
rule on synthetic curves in both directions, the rate grid's choice on validation and the claims' statuses."""

import json
from pathlib import Path

import pytest
import yaml

from hf_posenc_experiments.claims import UNFAIR, UNTESTABLE_SCALE
from hf_posenc_experiments.config import TAPA_CURVES_HOT_PHASE, TapaCurvesConfig, curve_label, rate_name
from hf_posenc_experiments.report import Tests as Recorder
from hf_posenc_experiments.runner import slug

from experiment_cli import austen, run_cli  # noqa: F401 (austen: a fixture)

STEPS = (1000, 2000, 4000)
SEEDS = (0, 1, 2)


def _method_rate(label: str) -> tuple[str, float]:
    """``"TAPA lr=3e-3"`` -> ``("TAPA", 3e-3)``; ``"RoPE"`` / ``"NoPE"``: at 3e-3 (:func:`curve_label`)."""
    method, _, rate = label.partition(" lr=")
    return method, float(rate) if rate else 3e-3


def _run(label: str, seed: int, losses, validation: float | None = None, phase=None) -> dict:
    """A synthetic cell result: held-out loss at L at each checkpoint, the validation loss at the last."""
    curve = {str(s): {"heldout": v, "phase": None if phase is None else {"median_phase_at_distance_1": phase}}
             for s, v in zip(STEPS, losses)}
    curve[str(STEPS[-1])]["validation"] = losses[-1] if validation is None else validation
    return {"label": label, "seed": seed, "seconds": 1.0, "final_train_loss": losses[-1], "curve": curve,
            "perplexity": {"64": {"nll": losses[-1]}}, "scheme_init": None,
            **dict(zip(("method", "learning_rate"), _method_rate(label)))}


def _payload(curves: dict, grid: dict | None = None) -> dict:
    """``curves``: label -> seed offsets added to a per-label curve (3 values); ``grid``: label -> (losses,
    validation) for the seed-0 grid cells."""
    runs = [_run(label, seed, [v + 0.002 * seed for v in losses], phase=0.1 if "TAPA" in label else None)
            for label, losses in curves.items() for seed in SEEDS]
    extra = [_run(label, 0, losses, validation) for label, (losses, validation) in (grid or {}).items()]
    return {"runs": runs, "grid": extra, "floors": {"bigram": 2.4, "unigram": 3.2}}


CURVES_METHOD = {  # TAPA at NoPE's level at every step; the gap to RoPE is NoPE's and does not shrink
    "RoPE": (2.10, 1.95, 1.85), "NoPE": (2.50, 2.45, 2.42), "RoPE lr=1e-3": (2.20, 2.05, 1.93),
    "TAPA lr=1e-3": (2.50, 2.45, 2.42), "TAPA hot lr=1e-3": (2.50, 2.45, 2.42),
}
CURVES_SETUP = {  # TAPA starts at NoPE's level and closes on RoPE: the gap shrinks, and TAPA leaves NoPE
    **CURVES_METHOD, "TAPA lr=1e-3": (2.50, 2.20, 1.95), "TAPA hot lr=1e-3": (2.40, 2.10, 1.90),
}


def _noisy(curves: dict) -> dict:
    """Seed noise that is not a constant shift (a paired difference needs some spread)."""
    out = _payload(curves)
    for r in out["runs"]:
        bump = {0: 0.0, 1: 0.004, 2: -0.003}[r["seed"]] * (len(r["label"]) % 3)
        for entry in r["curve"].values():
            entry["heldout"] += bump
    return out


@pytest.fixture(scope="module")
def config():
    return TapaCurvesConfig.preset("small")


def test_settings_are_the_issues(config):
    base = config.base
    assert (base.model.hidden_size, base.model.num_layers, base.model.head_dim) == (64, 2, 32)
    assert (base.context_length, base.train.batch_size, base.train.steps, base.train.warmup_steps) == (64, 16, 4000, 50)
    assert base.train.recipe_training() == {"lr_scheduler_type": "constant_with_warmup"}
    assert (config.checkpoints, base.seeds, base.eval_multiples, config.rates) == (STEPS, 3, (1,), (1e-3, 3e-3))
    arms = {label: (a.method, a.spec, a.learning_rate, a.phase_at_distance_1) for label, a in config.arms.items()}
    assert arms == {"RoPE": ("RoPE", "rope", 3e-3, None), "NoPE": ("NoPE", "prope:p=0", 3e-3, None),
                    "RoPE lr=1e-3": ("RoPE", "rope", 1e-3, None), "TAPA lr=1e-3": ("TAPA", "tapa", 1e-3, None),
                    "TAPA hot lr=1e-3": ("TAPA hot", "tapa", 1e-3, TAPA_CURVES_HOT_PHASE)}
    assert TAPA_CURVES_HOT_PHASE == 7.0 and config.save_steps == 1000 and config.rate_extensions == 2
    assert config.arm_at("TAPA hot", 3e-4) == ("TAPA hot lr=3e-4", type(config.arms["RoPE"])(
        "TAPA hot", "tapa", 3e-4, TAPA_CURVES_HOT_PHASE))
    assert config.arm_at("RoPE", 3e-3) == ("RoPE", config.arms["RoPE"])
    # the grid reuses the main arms where the rate coincides: only three cells train extra
    assert {label: a.learning_rate for label, a in config.grid_arms().items()} == {
        "NoPE lr=1e-3": 1e-3, "TAPA lr=3e-3": 3e-3, "TAPA hot lr=3e-3": 3e-3}
    assert config.grid_arms()["TAPA hot lr=3e-3"].scheme_init == {"phase_at_distance_1": 7.0}
    assert (rate_name(1e-3), rate_name(2.5e-4), curve_label("RoPE", 3e-3), curve_label("TAPA", 3e-3)) == \
        ("1e-3", "2.5e-4", "RoPE", "TAPA lr=3e-3")
    with pytest.raises(ValueError, match="checkpoints"):
        TapaCurvesConfig(base=base, checkpoints=(1000, 2000))  # must end at the final step
    with pytest.raises(ValueError, match="hot start"):
        type(config.arms["RoPE"])("RoPE", "rope", 3e-3, 7.0)


def test_build_recipe_carries_the_hot_start_and_the_checkpoints(tmp_path, config):
    from hf_posenc_experiments.runner import build_recipe

    prepared = {"tokenizer_dir": str(tmp_path), "eos_id": 256, "train_files": [str(tmp_path / "a.txt")],
                "eval_file": str(tmp_path / "b.txt")}
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "b.txt").write_text("text")
    base = config.base
    arm = config.arms["TAPA hot lr=1e-3"]
    recipe = build_recipe(base, prepared, scheme=arm.spec, seed=0, context_length=64, model=base.model,
                          train=config.train_of(arm), output_dir=str(tmp_path / "run"), scheme_init=arm.scheme_init,
                          save_steps=config.save_steps)
    data = recipe.to_dict()
    assert data["scheme"]["init"] == {"phase_at_distance_1": 7.0}
    assert data["training"]["save_steps"] == 1000 and data["training"]["save_total_limit"] is None
    assert data["training"]["learning_rate"] == 1e-3
    plain = build_recipe(base, prepared, scheme="rope", seed=0, context_length=64, model=base.model,
                         train=base.train, output_dir=str(tmp_path / "run2")).to_dict()
    assert "init" not in plain["scheme"] and plain["training"]["save_steps"] == 4001


def test_reading_rule_in_both_directions(config):
    from hf_posenc_experiments.tapa_curves import METHOD, NEITHER, NO_TEST, SETUP, curves, read

    method = curves(_noisy(CURVES_METHOD)["runs"], config)
    for arm in ("TAPA lr=1e-3", "TAPA hot lr=1e-3"):
        reading = read(method, config, arm)
        assert reading.outcome == METHOD, reading
        assert reading.changes["RoPE"].estimate == pytest.approx(0.57 - 0.40, abs=0.01)  # the gap grows with NoPE's
        assert not reading.vs_nope.detected and reading.nope_gap.estimate == pytest.approx(0.57, abs=0.01)
    setup = curves(_noisy(CURVES_SETUP)["runs"], config)
    for arm in ("TAPA lr=1e-3", "TAPA hot lr=1e-3"):
        reading = read(setup, config, arm)
        assert reading.outcome == SETUP, reading
        assert reading.changes["RoPE"].detected and reading.changes["RoPE"].estimate < 0
        assert reading.vs_nope.detected and reading.vs_nope.estimate < 0
    # pulling away from NoPE alone is the setup too, even if the gap to RoPE does not shrink
    away = {**CURVES_METHOD, "TAPA lr=1e-3": (2.20, 2.05, 1.95)}
    assert read(curves(_noisy(away)["runs"], config), config, "TAPA lr=1e-3").outcome == SETUP
    # worse than NoPE, no shrink: neither reading
    worse = {**CURVES_METHOD, "TAPA lr=1e-3": (2.60, 2.60, 2.62)}
    assert read(curves(_noisy(worse)["runs"], config), config, "TAPA lr=1e-3").outcome == NEITHER
    one = [r for r in _payload(CURVES_METHOD)["runs"] if r["seed"] == 0]
    assert read(curves(one, config), config, "TAPA lr=1e-3").outcome == NO_TEST


def test_reading_lines_and_the_tables(config):
    from hf_posenc_experiments.tapa_curves import curve_tables, curves, read, reading_line

    payload = _noisy(CURVES_METHOD)
    line = reading_line(read(curves(payload["runs"], config), config, "TAPA lr=1e-3"), config, Recorder())
    assert line.startswith("Reading, TAPA lr=1e-3: the method, in this regime: TAPA stays at NoPE's level")
    assert "change of TAPA lr=1e-3 - RoPE, 1,000 -> 4,000 steps" in line
    table = "\n".join(curve_tables(payload, config))
    assert "| arm | 1,000 steps | 2,000 steps | 4,000 steps |" in table
    assert "| TAPA hot lr=1e-3 - NoPE |" in table and "| 4,000 - 1,000 |" in table


def test_grid_chooses_each_rate_on_validation_not_on_the_scored_text(config):
    from hf_posenc_experiments.tapa_curves import best_summary, chosen_rates, grid_table

    # TAPA at 3e-3 is better on the validation text but worse on the scored one: validation decides
    grid = {"NoPE lr=1e-3": ((2.6, 2.55, 2.50), 2.50), "TAPA lr=3e-3": ((2.4, 2.3, 2.60), 2.30),
            "TAPA hot lr=3e-3": ((2.4, 2.3, 2.50), 2.60)}
    payload = _payload(CURVES_METHOD, grid)
    chosen = chosen_rates(payload, config)
    assert chosen == {"RoPE": 3e-3, "NoPE": 3e-3, "TAPA": 3e-3, "TAPA hot": 1e-3}
    summary, best = best_summary(payload, config)
    assert best == {"RoPE": "RoPE", "NoPE": "NoPE", "TAPA": "TAPA lr=3e-3", "TAPA hot": "TAPA hot lr=1e-3"}
    assert len(summary.values["TAPA lr=3e-3"][64]) == 1 and len(summary.values["TAPA hot lr=1e-3"][64]) == 3
    table = "\n".join(grid_table(payload, config))
    assert "| TAPA | 2.420 | 2.300 | 3e-3 (highest tried) | 2.600 (1 seed) |" in table
    assert "| TAPA hot | 2.420 | 2.600 | 1e-3 (lowest tried) | 2.422 ± 0.002 (3 seeds) |" in table
    # a widened rate joins its method's grid: a column of its own, the choice now inside what it tried
    payload["grid"].append(_run("TAPA lr=9e-3", 0, (2.4, 2.3, 2.7), 2.35))
    assert chosen_rates(payload, config)["TAPA"] == 3e-3
    table = "\n".join(grid_table(payload, config))
    assert "| method | validation, lr 1e-3 | validation, lr 3e-3 | validation, lr 9e-3 | chosen |" in table
    assert "| TAPA | 2.420 | 2.300 | 2.350 | 3e-3 | 2.600 (1 seed) |" in table
    assert "| RoPE | 1.930 | 1.850 | - | 3e-3 (highest tried) |" in table


def test_claims_never_refute_without_the_regime(config):
    from hf_posenc_experiments.tapa_curves import paper_claims, regime, tuning

    grid = {"NoPE lr=1e-3": ((2.6, 2.55, 2.50), 2.50), "TAPA lr=3e-3": ((2.6, 2.6, 2.60), 2.60),
            "TAPA hot lr=3e-3": ((2.6, 2.6, 2.60), 2.60)}
    worse = _noisy(CURVES_METHOD)
    worse["grid"] = _payload({}, grid)["grid"]
    [claim] = paper_claims(worse, config, Recorder())
    assert claim.status == UNFAIR  # the evidence reads negative, the design is not in the paper's regime
    assert "a negative reading, not a fair test: missing " in claim.reason and "the paper's regime" in claim.reason
    record = tuning(worse, config)
    assert record.validated and set(record.rates.values()) == {(1e-3, 3e-3)} and len(set(record.steps.values())) == 1
    # a grid of two rates brackets no choice: each method's is one of its ends
    assert set(record.chosen) == set(config.methods) and set(record.at_edge()) == set(config.methods)
    assert record.missing()[0].startswith("a grid that brackets each arm's best rate (chosen at the grid's edge: ")
    assert record.missing()[1:] == [f"the paper's regime ({record.regime})"] and "in the paper's unit" in record.regime
    # the hot start reaches the phase axis, the budget (bytes, not LLaMA-3 tokens) does not
    text, reached = regime(config, 7.0)
    assert not reached and "median phase at distance 1 at init 7.00 rad" in text and "4,096,000 bytes" in text
    assert regime(config, 0.11)[1] is False
    # TAPA as good as RoPE: no negative reading, and no match claimed either
    setup = _noisy({**CURVES_SETUP, "TAPA hot lr=1e-3": (2.40, 2.10, 1.85)})  # the hot start ends at RoPE's level
    setup["grid"] = _payload({}, {"NoPE lr=1e-3": ((2.6, 2.55, 2.50), 2.50), "TAPA lr=3e-3": ((2.4, 2.1, 1.85), 2.6),
                                  "TAPA hot lr=3e-3": ((2.4, 2.1, 1.85), 2.6)})["grid"]
    [claim] = paper_claims(setup, config, Recorder())
    assert claim.status == UNTESTABLE_SCALE and "not a match" in claim.reason


def test_toy_end_to_end_through_the_command_line(austen, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = run_cli("experiment", "tapa_curves", "--size", "toy", "--seeds", "1", "--out", str(out), "--work",
                   str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    config = TapaCurvesConfig.preset("toy", seeds=1)
    assert [r["label"] for r in data["runs"]] == list(config.arms)
    # the grid's three cells, then one step beyond (x3) for each method whose best is an end (toy: once)
    from hf_posenc_experiments.rate_grid import widened
    from hf_posenc_experiments.tapa_curves import grid_runs, validation

    labels = [r["label"] for r in data["grid"]]
    assert labels[:3] == ["NoPE lr=1e-3", "TAPA lr=3e-3", "TAPA hot lr=3e-3"]
    tried = {m: {rate: validation(r, config) for rate, r in rates.items()}
             for m, rates in grid_runs(data, config).items()}
    expected = []
    for method, losses in tried.items():
        grid_only = {rate: losses[rate] for rate in config.rates}
        step = widened(grid_only, config.rates, 1)
        assert sorted(set(losses) - set(config.rates)) == ([] if step is None else [step])
        expected += [] if step is None else [config.arm_at(method, step)[0]]
    assert labels[3:] == expected
    assert data["claims"][0]["tuning"]["rates"] == {m: sorted(losses) for m, losses in tried.items()}
    for r in [*data["runs"], *data["grid"]]:
        assert sorted(r["curve"], key=int) == ["1", "2", "4"] and "validation" in r["curve"]["4"]
        assert (r["curve"]["4"]["phase"] is None) == (not r["spec"].startswith("tapa"))
        assert r["curve"]["4"]["heldout"] == pytest.approx(r["perplexity"]["16"]["nll"], abs=1e-6)  # the final model
        run = work / "runs" / slug(r["label"]) / "seed0" / "run"
        recipe = yaml.safe_load((run / "recipe.yaml").read_text())
        assert recipe["training"]["lr_scheduler_type"] == "constant_with_warmup"
        assert recipe["training"]["learning_rate"] == r["learning_rate"]
        assert not list(run.glob("checkpoint-*"))  # scored, then deleted
        hot = r["label"].startswith("TAPA hot")
        assert (r["scheme_init"] is not None) == hot and ("init" in recipe["scheme"]) == hot
        if hot:
            assert r["scheme_init"]["phase_at_distance_1"]["after"] == pytest.approx([7.0], rel=1e-5)
            assert r["scheme_init"]["phase_at_distance_1"]["before"][0] < 1.0
    markdown = (out / "results.md").read_text()
    for text in ("## Learning curves", "## Rate grid at the final budget", "Reading rule, fixed before the runs",
                 "| arm | 1 step | 2 steps | 4 steps |", "| TAPA hot lr=1e-3 | 0.", "(measured, rescaled)"):
        assert text in markdown, text
    assert any(line.startswith("Reading, TAPA lr=1e-3: one run per arm") for line in data["verdict"])
    assert [c["paper"] for c in data["claims"]] == ["TAPA"]
    assert data["claims"][0]["tuning"]["validated"] and not data["claims"][0]["tuning"]["regime_reached"]
    for name in ("heldout_loss.png", "phase_regime.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # rendered from the JSON alone
    from hf_posenc_experiments.report import rerender

    before = markdown
    rerender(out)
    assert (out / "results.md").read_text() == before
    # cached by settings: a second run trains nothing
    again = run_cli("experiment", "tapa_curves", "--size", "toy", "--seeds", "1", "--out", str(out), "--work",
                    str(work), "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["runs"] == data["runs"]
    assert Path(work / "runs").is_dir()
