"""TAPA at 15M parameters (hf_posenc_experiments.tapa_scale, issue #33 §3): the toy end to end through the command
line, the gpu preset's settings against the issue and the paper (parameter count of the model Transformers
builds, 8 layers, head dim 64, L = 256 evaluated to 16L, TAPA at a third to a fifth of RoPE's rate, the
optimiser reaching the recipe), the reading of planted results, and the background warm-up that compiles the
TAPA kernels while the RoPE runs train."""

import json
from pathlib import Path

import pytest

from hf_posenc_experiments.config import (
    TAPA_DEPTH_ARM, TAPA_DEPTH_VARIANTS, TAPA_SCALE_LEARNING_RATE, TapaScaleConfig,
)
from experiment_cli import austen, run_cli as _run_cli  # noqa: F401 (austen: a fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_tapa_scale_toy_end_to_end(austen, tmp_path):
    import yaml

    from hf_posenc_experiments.runner import slug

    out, work = tmp_path / "out", tmp_path / "work"
    proc = _run_cli("experiment", "tapa_scale", "--size", "toy", "--seeds", "2", "--out", str(out), "--work",
                    str(work), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    config = TapaScaleConfig.preset("toy", seeds=2)
    assert [r["label"] for r in data["runs"]] == [label for label in config.arms() for _ in range(2)]
    rates = {}
    for label, variant in config.variants.items():
        run = work / "runs" / slug(label) / "seed0" / "run"
        training = yaml.safe_load((run / "recipe.yaml").read_text())["training"]
        assert (training["adam_beta2"], training["weight_decay"], training["lr_scheduler_type"]) == \
            (0.95, 0.0, "cosine_with_min_lr")
        assert training["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1} and training["use_cpu"] is True
        rates[label] = training["learning_rate"]
        assert not list(run.glob("checkpoint-*"))  # runs are cached whole: no checkpoint
        saved = json.loads((run / "model" / "config.json").read_text())
        if label != "RoPE":
            assert saved["hf_posenc"]["scheme"] == "tapa"
            assert saved["hf_posenc"]["options"]["theta"] == (0.5 if label == "TAPA paper" else 0.75)
    assert rates["TAPA paper"] == rates["TAPA theta=0.75"] == pytest.approx(rates["RoPE"] / 3)
    device = data["device"]
    assert device["device"] == "cpu" and device["tapa_runs_trained_in_this_process"] == 4
    assert device["attention"]["RoPE"].startswith("sdpa") and "chunked" in device["attention"]["TAPA paper"]
    assert not any((device["triton_tapa_binaries_in_this_process"] or {}).values())  # no Triton launch on the CPU
    assert data["verdict"][0].startswith("Tests:") and data["verdict"][-1].startswith("Answer:")
    assert [c["paper"] for c in data["claims"]] == ["TAPA", "TAPA", "Han & Ji (position generalization)"]
    markdown = (out / "results.md").read_text()
    assert "| TAPA paper - RoPE |" in markdown and "| TAPA theta=0.75 - TAPA paper |" in markdown
    assert "16L = 256" in markdown and "TAPA paper: hf_posenc_tapa -> chunked" in markdown
    for name in ("heldout_loss.png", "gap_by_length.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_preset_is_the_issues_model_and_the_papers_optimiser():
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posenc_experiments.tapa_scale import SMALL_MODEL_GAPS, parameter_count
    from hf_posenc_experiments.tokenizer import VOCAB_SIZE

    config = TapaScaleConfig.preset("gpu")
    base, model = config.base, config.base.model
    assert (model.num_layers, model.head_dim, base.context_length) == (8, 64, 256)
    assert base.eval_lengths == [256, 512, 1024, 2048, 4096] and base.eval_tokens >= 4 * 4096
    built = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in model.llama_config(VOCAB_SIZE, 256, 256).items()
                                            if k != "model_type"}))
    count = sum(p.numel() for p in built.parameters())
    assert count == parameter_count(model) and 14e6 <= count <= 16e6
    assert base.seeds == 3 and TapaScaleConfig.preset("gpu", seeds=2).base.seeds == 2
    arms = config.arms()
    rope = arms["RoPE"][2].learning_rate
    assert rope == TAPA_SCALE_LEARNING_RATE
    assert config.tapa_arms == ["TAPA paper", "TAPA theta=0.75"]
    assert arms["TAPA paper"][0] == "tapa"  # the paper's α = 0.1, θ = 0.5, quadratic phase: the scheme's defaults
    assert arms["TAPA theta=0.75"][0] == TAPA_DEPTH_VARIANTS[TAPA_DEPTH_ARM].spec  # the sweep's best θ
    for label in config.tapa_arms:
        assert rope / 5 <= arms[label][2].learning_rate <= rope / 3 * (1 + 1e-12)  # a third to a fifth of RoPE's
    train = base.train
    assert train.recipe_training() == {
        "use_cpu": False, "bf16": True, "adam_beta2": 0.95, "save_strategy": "no",
        "lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}}
    assert train.weight_decay == 0.0 and train.warmup_steps == -(-train.steps // 40)  # the paper's 2.5 % warm-up
    with pytest.raises(ValueError, match="--size gpu"):
        TapaScaleConfig.preset("small")
    # the small models' gaps quoted in every report are the committed tapa-depth intervals' estimates
    depth = json.loads((ROOT / "examples" / "experiments" / "tapa-depth" / "results.json").read_text())
    key = f"TAPA ({TAPA_DEPTH_ARM}) - RoPE"
    estimates = [c["estimate"] for c in depth["comparisons"] if c["comparison"] == key]
    assert tuple(depth["config"]["depths"]) == tuple(SMALL_MODEL_GAPS)  # one comparison per depth, in order
    assert SMALL_MODEL_GAPS == pytest.approx(dict(zip(SMALL_MODEL_GAPS, estimates)), abs=5e-4)


def _payload(config, rows):
    """results.json's runs and floors for planted held-out losses: label -> length -> per-seed values."""
    runs = [{"label": label, "seed": seed, "final_train_loss": None, "seconds": 1.0,
             "perplexity": {str(n): {"nll": values[seed]} for n, values in row.items()}}
            for label, row in rows.items() for seed in range(3)]
    return {"runs": runs, "floors": {"unigram": 3.07, "bigram": 2.38}, "why": {}}


def _planted(rope, tapa, theta):
    lengths = TapaScaleConfig.preset("gpu").base.eval_lengths
    grow = {n: 0.05 * i for i, n in enumerate(lengths)}
    return {label: {n: [v + grow[n] for v in values] for n in lengths}
            for label, values in (("RoPE", rope), ("TAPA paper", tapa), ("TAPA theta=0.75", theta))}


def test_the_answer_reads_planted_results():
    from hf_posenc_experiments.claims import CONFIRMED, UNFAIR, UNTESTABLE_SCALE
    from hf_posenc_experiments.tapa_scale import analyse

    config = TapaScaleConfig.preset("gpu")
    # the 0.1M-parameter gap again (+0.40, +0.30): still above RoPE, as large as the small models' at θ = 0.5
    found = analyse(_payload(config, _planted([1.50, 1.52, 1.49], [1.90, 1.93, 1.88], [1.80, 1.83, 1.78])), config)
    answer = found["verdict"][-1]
    assert answer.startswith("Answer: at 15.4M parameters TAPA still trains to a higher loss than RoPE")
    assert "TAPA paper - RoPE is +0.400 [" in answer and "not distinguishable from the 0.1M-parameter" in answer
    assert "TAPA theta=0.75 - RoPE is +0.300 [" in answer and "smaller than the 0.1M-parameter" in answer
    # a negative reading at 200 steps, one rate per method and a cold phase: not a fair test, naming what is missing
    assert [c["status"] for c in found["claims"][:2]] == [UNFAIR, UNTESTABLE_SCALE]
    assert "the paper's regime (median phase at distance 1 at init" in found["claims"][0]["reason"]
    # the gap closes: TAPA within noise of RoPE
    found = analyse(_payload(config, _planted([1.50, 1.52, 1.49], [1.51, 1.50, 1.50], [1.49, 1.53, 1.48])), config)
    assert "TAPA is not detectably worse than RoPE" in found["verdict"][-1]
    assert found["claims"][0]["status"] == UNTESTABLE_SCALE and "is not a match" in found["claims"][0]["reason"]
    # TAPA below RoPE: the paper's claim holds in this regime
    found = analyse(_payload(config, _planted([1.50, 1.52, 1.49], [1.40, 1.43, 1.38], [1.45, 1.46, 1.44])), config)
    assert found["claims"][0]["status"] == CONFIRMED and "lower loss than RoPE" in found["verdict"][-1]
    # a model above the bigram floor uses no context: nothing about positional encodings can be tested
    found = analyse(_payload(config, _planted([2.50, 2.52, 2.49], [2.90, 2.93, 2.88], [2.80, 2.83, 2.78])), config)
    assert {c["status"] for c in found["claims"]} == {UNTESTABLE_SCALE}


def test_warm_up_trains_a_one_layer_copy_of_each_tapa_arm_in_the_background(austen, tmp_path, monkeypatch):
    import dataclasses

    from hf_posenc_experiments.corpus import austen_corpus
    from hf_posenc_experiments.length_generalisation import prepare
    from hf_posenc_experiments.tapa_scale import stop, warm_up

    toy = TapaScaleConfig.preset("toy", seeds=1)
    config = dataclasses.replace(toy, variants={k: toy.variants[k] for k in ("RoPE", "TAPA theta=0.75")})
    corpus = austen_corpus()
    prepared = prepare(config.base, corpus, tmp_path)
    assert warm_up(config, prepared, corpus, tmp_path) == []  # only on CUDA unless forced
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the child runs as on a user's machine
    (proc,) = warm_up(config, prepared, corpus, tmp_path, force=True)
    proc.wait(timeout=300)
    assert stop([proc]) == [0], (tmp_path / "warm-up" / "tapa-theta-0.75.log").read_text()[-3000:]
    saved = json.loads((tmp_path / "warm-up" / "tapa-theta-0.75" / "model" / "config.json").read_text())
    assert saved["num_hidden_layers"] == 1 and saved["hf_posenc"]["options"]["theta"] == 0.75
    assert json.loads((tmp_path / "warm-up" / "tapa-theta-0.75" / "eval.json").read_text())  # every length scored
