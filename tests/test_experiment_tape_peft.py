"""TAPE's parameter-efficient context extension against LoRA (hf_posenc_experiments.tape_peft, issue #33 §2): the
toy end to end through the command line, the parameter-matching arithmetic, which parameters train in each arm
(through the real recipe trainer: exactly the declared ones change, every other stays bit-identical), the
recipe's ``peft.r = 0`` (modules trained whole, no LoRA), and the claim line read from planted results."""

import json
import math
from pathlib import Path

import pytest

from hf_posenc_experiments.claims import CONFIRMED, REFUTED, UNTESTABLE_SCALE
from hf_posenc_experiments.config import (
    LLAMA2_PRETRAIN_LEARNING_RATE, TAPE_PAPER_LEARNING_RATE, TAPE_PEFT_LORA, TAPE_PEFT_OPROJ, TAPE_PEFT_TAPE,
    TapePeftConfig,
)
from experiment_cli import austen, run_cli as _run_cli  # noqa: F401 (austen: a fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy_run(austen, tmp_path_factory):
    """The toy through the command line as a user runs it (1 seed: the tests' intervals are read from planted
    results below), once for the module."""
    root = tmp_path_factory.mktemp("tape_peft")
    out, work = root / "out", root / "work"
    with pytest.MonkeyPatch.context() as env:  # one torch thread: tiny tensors, and no spinning on shared cores
        env.setenv("OMP_NUM_THREADS", "1")
        proc = _run_cli("experiment", "tape_peft", "--size", "toy", "--seeds", "1", "--out", str(out), "--work",
                        str(work), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), out, work


def test_tape_peft_toy_end_to_end(toy_run):
    import yaml

    from hf_posenc_experiments.context_extension import BASE_LABEL
    from hf_posenc_experiments.runner import slug

    data, out, work = toy_run
    config = TapePeftConfig.preset("toy", seeds=1)
    assert [r["label"] for r in data["runs"]] == [BASE_LABEL, *config.arms]
    base_model = str(work / "runs" / "base" / "run" / "model")
    for label, arm in config.arms.items():
        run = work / "runs" / slug(label) / "seed0" / "run"
        recipe = yaml.safe_load((run / "recipe.yaml").read_text())
        assert recipe["model"]["path"] == base_model and recipe["context_length"] == config.extended_length
        assert recipe["scheme"]["name"] == arm.spec and recipe["scheme"]["replace"] is True
        training = recipe["training"]
        assert (training["max_steps"], training["lr_scheduler_type"], training["weight_decay"],
                training["warmup_steps"]) == (config.extend.steps, "constant_with_warmup", 0.0, 1)
        assert training["learning_rate"] == pytest.approx(3e-3 / 15)  # the paper's 2e-5 / 3e-4 of the base's rate
        peft = recipe["peft"]
        rank = data["trainable"][label]["rank"]
        assert peft["enabled"] and peft["r"] == rank and peft["target_modules"] == list(arm.modules)
        assert peft["scheme_modules"] is arm.scheme_modules and not peft["trainable_embeddings"]
        assert (rank >= 1) is arm.lora and (not arm.lora or peft["alpha"] == 2 * rank)
        adapter = json.loads((run / "adapter" / "adapter_config.json").read_text())
        assert adapter["peft_type"] == ("LORA" if arm.lora else "LN_TUNING")
        assert adapter["modules_to_save"] == (["tape"] if arm.scheme_modules else None)
    for r in data["runs"]:
        assert sorted(r["perplexity"], key=int) == [str(n) for n in config.eval_lengths]
    # the continued runs moved the base (an arm that trained nothing would score the base's loss bit for bit)
    nll = {r["label"]: r["perplexity"][str(config.extended_length)]["nll"] for r in data["runs"]}
    assert all(abs(v - nll[BASE_LABEL]) > 1e-7 for v in nll.values() if v is not nll[BASE_LABEL])
    assert [c["paper"] for c in data["claims"]] == ["TAPE"]
    assert data["claims"][0]["status"] in (CONFIRMED, REFUTED, UNTESTABLE_SCALE)
    assert data["verdict"][0].startswith("Tests:") and data["verdict"][3].startswith("Trainable parameters")
    markdown = (out / "results.md").read_text()
    assert markdown.count("## The papers' claims") == 1 and "| TAPE + o_proj - LoRA (matched) |" in markdown
    assert f"{data['trainable'][TAPE_PEFT_TAPE]['parameters']:,} trainable parameters" in markdown
    assert (out / "heldout_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --render-only rebuilds the same report from results.json (the preset's fingerprint, the analysis)
    before = markdown
    (out / "results.md").write_text("stale")
    proc = _run_cli("experiment", "tape_peft", "--size", "toy", "--render-only", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "results.md").read_text() == before


def _analytic(config: TapePeftConfig) -> dict[str, int]:
    """Trainable parameters by hand: o_proj (H·hd)·d a layer; a TAPE block (W_att H×Hkv, ψ d×I, W1 Hkv×I, W2
    I×Hkv, I = 4·Hkv) in every layer but the last (whose update no layer reads); LoRA r·(in + out) per target."""
    m = config.model
    d, inner, kv, layers = m.hidden_size, m.num_heads * m.head_dim, m.num_heads, m.num_layers
    width = 4 * kv
    o_proj = layers * inner * d
    tape = (layers - 1) * (m.num_heads * kv + d * width + kv * width + width * kv)
    lora_per_rank = layers * ((d + inner) + 2 * (d + kv * m.head_dim) + (inner + d))
    return {"o_proj": o_proj, "tape": tape, "lora_per_rank": lora_per_rank}


@pytest.mark.parametrize("size", ["toy", "small"])
def test_lora_rank_matches_the_tape_arms_trainable_parameters(size):
    from hf_posenc_experiments.tape_peft import arm_budget, closest_rank, trainable_parameters

    config = TapePeftConfig.preset(size)
    counts = _analytic(config)
    budget = arm_budget(config)
    tape = counts["o_proj"] + counts["tape"]
    assert budget[TAPE_PEFT_TAPE]["parameters"] == tape
    assert budget[TAPE_PEFT_TAPE]["by_module"] == {"o_proj": counts["o_proj"], "tape": counts["tape"]}
    assert budget[TAPE_PEFT_OPROJ] == {"rank": 0, "parameters": counts["o_proj"], "by_module": {"o_proj":
                                                                                                   counts["o_proj"]}}
    rank = budget[TAPE_PEFT_LORA]["rank"]
    assert budget[TAPE_PEFT_LORA]["parameters"] == rank * counts["lora_per_rank"]
    assert rank == min(range(1, 65), key=lambda r: (abs(r * counts["lora_per_rank"] - tape), r))
    assert sum(trainable_parameters(config, config.arms[TAPE_PEFT_LORA], rank + 1).values()) == \
        (rank + 1) * counts["lora_per_rank"]
    if size == "small":  # the numbers the report states: 8,192 + 548 against rank 9 (9,216; rank 8: 8,192)
        assert (tape, rank, rank * counts["lora_per_rank"], counts["o_proj"]) == (8740, 9, 9216, 8192)
    assert closest_rank(100, 40) == 2 and closest_rank(60, 40) == 1 and closest_rank(10, 40) == 1  # tie: lower
    assert config.extend.learning_rate == pytest.approx(
        TAPE_PAPER_LEARNING_RATE / LLAMA2_PRETRAIN_LEARNING_RATE * config.pretrain.learning_rate)


def test_small_preset_is_the_context_extension_base_and_the_papers_steps():
    from hf_posenc_experiments.config import ContextExtensionConfig

    config, base = TapePeftConfig.preset("small"), ContextExtensionConfig.preset("small")
    assert (config.model, config.pretrain, config.context_length, config.train_chars) == \
        (base.model, base.pretrain, base.context_length, base.train_chars)
    assert config.extended_length == 4 * config.context_length and config.eval_multiples == (1, 4, 8, 16)
    assert (config.extend.steps, config.extend.warmup_steps, config.extend.weight_decay, config.seeds) == \
        (1000, 50, 0.0, 3)
    with pytest.raises(ValueError, match="--size small"):
        TapePeftConfig.preset("gpu")


def _strip(name: str) -> str:
    """A PEFT parameter name as the base model names it."""
    for part in ("base_model.model.", ".base_layer", ".original_module", ".ln_tuning_layers.default",
                 ".modules_to_save.default"):
        name = name.replace(part, "")
    return name


def test_exactly_the_declared_parameters_train(toy_run, tmp_path, monkeypatch):
    """Each arm through the real recipe trainer (hf_posenc.training.run_training on the experiment's recipe): the
    trainable parameters are exactly the declared modules (every o_proj, TAPE's blocks, LoRA's A and B on q, k, v,
    o) and each of them changed; every other parameter is bit-identical after training."""
    import torch

    from hf_posenc.training import trainer
    from hf_posenc_experiments.corpus import austen_corpus
    from hf_posenc_experiments.length_generalisation import prepare
    from hf_posenc_experiments.tape_peft import arm_budget

    _, _, work = toy_run
    config = TapePeftConfig.preset("toy", seeds=1)
    prepared = prepare(config, austen_corpus(), tmp_path / "work")
    budget = arm_budget(config)
    declared = {
        TAPE_PEFT_TAPE: lambda n: ".self_attn.o_proj." in n or ".tape." in n,
        TAPE_PEFT_OPROJ: lambda n: ".self_attn.o_proj." in n,
        TAPE_PEFT_LORA: lambda n: ".lora_A." in n or ".lora_B." in n,
    }
    captured = {}
    wrap = trainer.wrap_peft

    def spy(recipe, model):
        captured["before"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        captured["model"] = wrap(recipe, model)
        return captured["model"]

    monkeypatch.setattr(trainer, "wrap_peft", spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is as fast, and does not spin on shared cores
    try:
        _train_each_arm(config, prepared, budget, work, tmp_path, captured, declared)
    finally:
        torch.set_num_threads(threads)


def _train_each_arm(config, prepared, budget, work, tmp_path, captured, declared):
    import dataclasses

    import torch

    from hf_posenc.training import trainer
    from hf_posenc_experiments.runner import slug
    from hf_posenc_experiments.tape_peft import extension_recipe

    layers = config.model.num_layers
    for label, arm in config.arms.items():
        recipe = extension_recipe(config, prepared, arm, budget[label]["rank"], 0,
                                  str(tmp_path / "runs" / slug(label)), str(work / "runs" / "base" / "run" / "model"))
        trainer.run_training(dataclasses.replace(recipe, evaluation=dataclasses.replace(recipe.evaluation,
                                                                                        enabled=False)))
        before, model = captured["before"], captured["model"]
        trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
        assert trained and all(declared[label](n) for n in trained), (label, sorted(trained))
        assert sum(p.numel() for p in trained.values()) == budget[label]["parameters"]
        if arm.lora:
            assert {_strip(n).split(".lora_")[0].rsplit(".", 1)[-1] for n in trained} == set(arm.modules)
            assert all(bool(p.any()) for n, p in trained.items() if ".lora_B." in n)  # B starts at zero
        else:
            names = {_strip(n) for n in trained}
            assert sum(".self_attn.o_proj." in n for n in names) == layers
            assert sum(".tape." in n for n in names) == (4 * (layers - 1) if arm.scheme_modules else 0)
            for n, p in trained.items():
                assert not torch.equal(p.detach(), before[_strip(n)]), f"{label}: {n} did not change"
        frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
        assert len(frozen) >= len(before)
        for n, p in frozen.items():
            assert torch.equal(p.detach(), before[_strip(n)]), f"{label}: frozen {n} changed"


def test_recipe_r_0_trains_the_targets_whole_without_lora():
    from peft import LNTuningConfig, LoraConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posenc.adapters import lora_config
    from hf_posenc.training.config import PeftSection, RecipeError

    assert PeftSection(r=0).r == 0
    with pytest.raises(RecipeError, match="peft.r must be >= 1"):
        PeftSection(r=-1)
    with pytest.raises(RecipeError, match="target_modules is empty"):
        PeftSection(r=0, target_modules=[])
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                         tie_word_embeddings=True))
    whole = lora_config(model, r=0, target_modules=["o_proj"])
    assert isinstance(whole, LNTuningConfig) and set(whole.target_modules) == {"o_proj"} and not whole.modules_to_save
    assert isinstance(lora_config(model, r=4, target_modules=["o_proj"]), LoraConfig)
    with pytest.raises(ValueError, match="r is LoRA's rank"):
        lora_config(model, r=-1, target_modules=["o_proj"])
    with pytest.raises(ValueError, match="r=0 cannot train tied embeddings"):
        lora_config(model, r=0, target_modules=["o_proj"], train_embeddings=True)


# -- the claim line, read from planted results ------------------------------------------------------------------
def _payload(config: TapePeftConfig, means: dict[str, float], noise: dict[str, list[float]] | None = None):
    """A results payload whose runs score ``means[label]`` (+ ``noise[label][seed]``) at every length."""
    from hf_posenc_experiments.context_extension import BASE_LABEL
    from hf_posenc_experiments.runner import Summary

    noise = noise or {}
    runs = [{"label": BASE_LABEL, "spec": "rope", "seed": 0, "seconds": 1.0, "final_train_loss": 2.0,
             "perplexity": {str(n): {"nll": 2.5, "ppl": math.exp(2.5), "num_scored": 1}
                            for n in config.eval_lengths}}]
    for label, arm in config.arms.items():
        for seed in config.seed_list:
            value = means[label] + noise.get(label, [0.01, -0.02, 0.01])[seed]
            runs.append({"label": label, "spec": arm.spec, "seed": seed, "seconds": 1.0, "final_train_loss": value,
                         "perplexity": {str(n): {"nll": value, "ppl": math.exp(value), "num_scored": 1}
                                        for n in config.eval_lengths}})
    trainable = {TAPE_PEFT_TAPE: {"rank": 0, "parameters": 8740, "by_module": {"o_proj": 8192, "tape": 548}},
                 TAPE_PEFT_LORA: {"rank": 9, "parameters": 9216, "by_module": {"q_proj": 9216}},
                 TAPE_PEFT_OPROJ: {"rank": 0, "parameters": 8192, "by_module": {"o_proj": 8192}}}
    return {"experiment": "tape_peft", "command": "planted", "config": config.to_dict(), "corpus": "planted",
            "floors": {"unigram": 3.0, "bigram": 2.4}, "runs": runs, "trainable": trainable,
            "base_parameters": 100000, "wall_seconds": 60.0, "seconds_in_runs": 50.0, "machine": {"threads": 2},
            "summary": Summary.from_results(runs, config.eval_lengths).to_dict()}


@pytest.mark.parametrize("means, noise, status, reading", [
    # TAPE worse than LoRA at matched parameters: refuted, whatever o_proj alone does
    ({TAPE_PEFT_TAPE: 2.00, TAPE_PEFT_LORA: 1.90, TAPE_PEFT_OPROJ: 2.10}, None, REFUTED, "higher loss than LoRA"),
    # better than LoRA and than o_proj alone: confirmed
    ({TAPE_PEFT_TAPE: 1.80, TAPE_PEFT_LORA: 1.90, TAPE_PEFT_OPROJ: 1.85}, None, CONFIRMED, "the gain is TAPE's"),
    # better than LoRA, but o_proj alone is better still: the gain is not TAPE's
    ({TAPE_PEFT_TAPE: 1.80, TAPE_PEFT_LORA: 1.90, TAPE_PEFT_OPROJ: 1.75}, None, REFUTED, "o_proj alone does better"),
    # better than LoRA, not told from o_proj alone: cannot be attributed
    ({TAPE_PEFT_TAPE: 1.80, TAPE_PEFT_LORA: 1.90, TAPE_PEFT_OPROJ: 1.80},
     {TAPE_PEFT_OPROJ: [0.03, -0.03, 0.02]}, UNTESTABLE_SCALE, "cannot be attributed to TAPE's modules"),
    # no difference from LoRA detected
    ({TAPE_PEFT_TAPE: 1.90, TAPE_PEFT_LORA: 1.90, TAPE_PEFT_OPROJ: 1.95},
     {TAPE_PEFT_LORA: [0.03, -0.03, 0.02]}, UNTESTABLE_SCALE, "cannot tell TAPE from LoRA"),
])
def test_tape_claim_reads_planted_results(means, noise, status, reading):
    from hf_posenc_experiments.tape_peft import analyse, render

    config = TapePeftConfig.preset("toy")
    payload = _payload(config, means, noise)
    payload.update(analyse(payload, config))
    [claim] = payload["claims"]
    assert claim["paper"] == "TAPE" and claim["status"] == status and reading in claim["reason"], claim
    markdown = render(payload, config)
    assert f"**{status}**" in markdown and "| TAPE + o_proj - o_proj only |" in markdown


def test_a_negligible_difference_decides_nothing():
    from hf_posenc_experiments.stats import Difference
    from hf_posenc_experiments.tape_peft import tape_claim_status

    def diff(estimate: float, half: float) -> Difference:
        return Difference("paired", 3, 3, estimate, estimate - half, estimate + half, 2, math.inf)

    assert tape_claim_status(diff(-0.05, 0.01), diff(-0.02, 0.01)) == CONFIRMED
    assert tape_claim_status(diff(-0.05, 0.01), diff(-0.0005, 0.0001)) == UNTESTABLE_SCALE  # detected, negligible
    assert tape_claim_status(diff(0.0005, 0.0001), diff(-0.02, 0.01)) == UNTESTABLE_SCALE
    assert tape_claim_status(diff(0.002, 0.001), diff(-0.02, 0.01)) == REFUTED
