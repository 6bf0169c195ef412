"""Tests of ``hf_posenc.training``: recipes, packing, chunked loss, end-to-end runs, resume, two processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import hf_posenc
from hf_posenc.training import config as tcfg
from hf_posenc.training.config import RecipeError, load_recipe
from hf_posenc.training.data import IGNORE_INDEX, TOKENS, build_dataset, collate, pack_concat, pack_restart
from hf_posenc.training.loss import chunked_linear_cross_entropy, full_linear_cross_entropy, shift_for_causal_lm
from hf_posenc.training.trainer import read_log, run_training

sys.path.insert(0, str(Path(__file__).parent))
from tiny import tiny_config  # noqa: E402

WORDS = "the a cat dog sat ran on under mat rug . and then slept quietly".split()
REPO = Path(__file__).resolve().parent.parent


# -- fixtures -------------------------------------------------------------------------------------------------
def _corpus(n_docs: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            animal, verb, place = rng.choice(["cat", "dog"]), rng.choice(["sat", "ran"]), rng.choice(["mat", "rug"])
            sentences.append(f"the {animal} {verb} on the {place} .")
        docs.append(" ".join(sentences))
    return docs


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A WordLevel tokenizer, a tiny random Llama checkpoint and a .jsonl + .txt corpus in a temp dir, whose
    ``datasets-cache`` holds the caches of ``datasets`` (tokenized and packed corpora) while the module runs, in this
    process and in the runs it starts."""
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("train")
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(root / "model")
    torch.manual_seed(0)
    config = tiny_config("llama", vocab_size=len(vocab), max_position_embeddings=64, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "model")
    docs = _corpus(60)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (root / "short.txt").write_text("the cat sat .")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_CACHE", str(root / "datasets-cache"))
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", root / "datasets-cache")
        yield root


def _recipe(ws: Path, out: str, **sections) -> dict:
    data = {
        "model": {"path": str(ws / "model"), "attn_implementation": "sdpa"},
        "scheme": {"name": "cope"},
        "context_length": 32,
        "data": {"files": [str(ws / "corpus.jsonl")]},
        "peft": {"r": 4, "alpha": 8, "trainable_norms": True, "trainable_embeddings": True},
        "training": {"max_steps": 12, "learning_rate": 3e-2, "lr_scheduler_type": "constant", "save_steps": 4,
                     "per_device_train_batch_size": 2, "logging_steps": 1, "use_cpu": True, "disable_tqdm": True},
        "loss": {"chunk_size": 16},
        "output": {"dir": str(ws / out)},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


# -- recipes fail before loading any model ---------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:training.extra is deprecated")
def test_bad_recipes_name_the_key_or_path(workspace, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("a model was loaded for a bad recipe")

    monkeypatch.setattr("hf_posenc.training.trainer.load_base_model", no_load)
    good = _recipe(workspace, "bad")
    load_recipe(data=good)  # the base recipe is valid
    cases = [
        (["training.max_stepz=3"], "training.max_stepz"),
        (["training.max_steps=ten"], "training.max_steps"),
        (["peft.r=true"], "peft.r"),
        (["data.packing=shuffle"], "data.packing"),
        ([f"data.files=[{workspace}/missing.txt]"], "missing.txt"),
        (["model.path=/nowhere/model"], "/nowhere/model"),
        (["scheme.clip_low_n=-3"], "scheme"),
        (["scheme.name=nope"], "scheme"),
        (["training.extra.not_an_arg=1"], "training.not_an_arg"),  # training.extra: deprecated, keys moved up
        (["liger.rope=true", "scheme.name=tapa"], "liger.rope"),
        (["loss.implementation=liger"], "liger_kernel"),
        (["bogus=1"], "bogus"),
    ]
    for overrides, needle in cases:
        with pytest.raises(RecipeError, match=None) as info:
            load_recipe(data=good, overrides=overrides)
        assert needle in str(info.value), (overrides, str(info.value))
    path = workspace / "bad.yaml"
    path.write_text(yaml.safe_dump(good))
    recipe = load_recipe(path, ["training.learning_rate=1e-5", "evaluation.lengths=[32, 64]",
                                "training.save_total_limit=null"])  # values are YAML: 1.2 floats, lists, null
    assert (recipe.training.learning_rate, recipe.evaluation.lengths, recipe.training.save_total_limit) == (
        1e-5, [32, 64], None)


@pytest.mark.filterwarnings("ignore:training.extra is deprecated")
def test_a_bad_training_key_fails_before_any_model_loads(workspace, monkeypatch, capsys):
    """`hf-posenc train` with a misspelt or mistyped `training` key (in the file or on the command line) exits 2
    naming the dotted key, and the fix where there is one, before loading a config, a tokenizer or weights."""
    from hf_posenc.cli import main
    from hf_posenc.training import trainer

    def no_load(*a, **k):
        raise AssertionError("a model was loaded for a bad recipe")

    for name in ("load_base_model", "load_model_config", "load_tokenizer"):
        monkeypatch.setattr(trainer, name, no_load)
    typo = "unknown recipe key(s) ['training.learnig_rate'] (did you mean 'training.learning_rate'"
    cases = [
        ({"learnig_rate": 1e-4}, [], typo),
        ({}, ["training.learnig_rate=1e-4"], typo),
        ({"max_steps": "ten"}, [], "recipe key 'training.max_steps': invalid int value: 'ten'"),
        ({}, ["training.max_steps=3.5"], "recipe key 'training.max_steps': invalid int value: '3.5'"),
        ({"use_cpu": "maybe"}, [], "recipe key 'training.use_cpu': Truthy value expected: got maybe"),
        ({"adam_beta2": [0.9]}, [], "recipe key 'training.adam_beta2' must be float, got list ([0.9])"),
        ({"lr_scheduler_type": "cosine_annealing"}, [], "'training.lr_scheduler_type': invalid choice: "
                                                        "'cosine_annealing' (choose from 'linear', 'cosine'"),
        ({"output_dir": "elsewhere"}, [], "training.output_dir: set output.dir instead"),
        ({"extra": {"adam_beta3": 0.9}}, [], "['training.adam_beta3'] (did you mean 'training.adam_beta2'"),
    ]
    path = workspace / "bad-training.yaml"
    for training, overrides, message in cases:
        path.write_text(yaml.safe_dump(_recipe(workspace, "bad-training", training=training)))
        assert main(["train", str(path), *overrides, "--dry-run"]) == 2, (training, overrides)
        err = capsys.readouterr().err
        assert message in err, (training, overrides, err)
    assert not (workspace / "bad-training").exists()


def test_training_takes_every_training_arguments_field(workspace, monkeypatch):
    """`training:` is Transformers' TrainingArguments: fields the old schema never listed (adam_beta2,
    dataloader_num_workers) reach the Trainer's args and its optimizer, next to the project's defaults; the
    recipe.yaml a run writes reads back to the same section; `training.extra` still works, with a FutureWarning."""
    from transformers import TrainingArguments

    from hf_posenc.training.config import TrainingSection
    from hf_posenc.training.trainer import PosEncTrainer

    class Stop(Exception):
        pass

    seen = {}

    def train(self, resume_from_checkpoint=None):
        seen["args"], seen["betas"] = self.args, self.create_optimizer().param_groups[0]["betas"]
        raise Stop

    monkeypatch.setattr(PosEncTrainer, "train", train)
    recipe = load_recipe(data=_recipe(workspace, "all-fields", training={"adam_beta2": 0.95, "seed": 7,
                                                                           "dataloader_num_workers": 1}))
    assert isinstance(recipe.training, TrainingSection) and isinstance(recipe.training, TrainingArguments)
    with pytest.raises(Stop):
        run_training(recipe)
    args = seen["args"]
    assert type(args) is TrainingArguments and seen["betas"] == (0.9, 0.95)
    assert (args.adam_beta2, args.dataloader_num_workers, args.seed, args.data_seed) == (0.95, 1, 7, 7)
    assert (args.output_dir, args.max_steps, args.learning_rate, args.lr_scheduler_type) == (
        str(workspace / "all-fields"), 12, 3e-2, "constant")
    assert args.activation_checkpointing and args.activation_checkpointing_kwargs == {"use_reentrant": False}
    assert (args.save_total_limit, args.remove_unused_columns, args.optim, args.disable_tqdm) == (
        2, False, "adamw_torch", True)
    assert load_recipe(workspace / "all-fields" / "recipe.yaml").training == recipe.training

    old = _recipe(workspace, "old", training={"extra": {"adam_beta2": 0.9, "dataloader_drop_last": True}})
    with pytest.warns(FutureWarning, match=r"training.extra is deprecated.*\['adam_beta2', 'dataloader_drop_last'\]"):
        assert load_recipe(data=old).training.adam_beta2 == 0.9


def test_command_line_overrides_reach_the_recipe(workspace, capsys):
    """`hf-posenc train RECIPE key=value ... --dry-run`: overrides (values read as YAML) of TrainingArguments fields
    the recipe does not name, of listed ones and of other sections show in the recipe it prints."""
    from hf_posenc.cli import main

    path = workspace / "overrides.yaml"
    path.write_text(yaml.safe_dump(_recipe(workspace, "overrides")))
    overrides = ["training.max_steps=7", "training.adam_beta2=0.95", "training.report_to=[]",
                 "training.save_total_limit=null", "scheme.clip_low_n=4", "evaluation.lengths=[32, 64]"]
    assert main(["train", str(path), *overrides, "--dry-run"]) == 0
    recipe = json.loads(capsys.readouterr().out)["recipe"]
    t = recipe["training"]
    assert (t["max_steps"], t["adam_beta2"], t["report_to"], t["save_total_limit"]) == (7, 0.95, [], None)
    assert t["learning_rate"] == 3e-2 and recipe["scheme"] == {"name": "cope", "clip_low_n": 4}
    assert recipe["evaluation"]["lengths"] == [32, 64]


def test_liger_refusal_without_liger_and_for_tapa(workspace):
    with pytest.raises(RecipeError, match="liger.rope.*tape|TAPE|liger.rope"):
        load_recipe(data=_recipe(workspace, "x", scheme={"name": "tape"}, liger={"rope": True}))
    with pytest.raises(RecipeError, match="liger_kernel"):
        load_recipe(data=_recipe(workspace, "x", liger={"rms_norm": True}))


def test_context_length_note_explains_plain_rope(workspace):
    from hf_posenc.training.trainer import context_length_notes, load_model_config

    recipe = load_recipe(data=_recipe(workspace, "x", scheme={"name": "rope"}, context_length=256))
    notes = context_length_notes(recipe, load_model_config(recipe))
    assert len(notes) == 1 and "max_position_embeddings=64" in notes[0] and "yarn" in notes[0]
    for scheme in ({"name": "rope", "scaling": "yarn", "factor": 4.0}, {"name": "tapa"}, {"name": "rope",
                                                                                         "rope_theta": 1e6}):
        recipe = load_recipe(data=_recipe(workspace, "x", scheme=scheme, context_length=256))
        notes = context_length_notes(recipe, load_model_config(recipe))
        assert not notes or "ABF" in notes[0], (scheme, notes)


def test_short_corpus_says_found_and_needed(workspace):
    from transformers import AutoTokenizer

    recipe = load_recipe(data=_recipe(workspace, "x", data={"files": [str(workspace / "short.txt")]}))
    tok = AutoTokenizer.from_pretrained(workspace / "model")
    with pytest.raises(RecipeError, match=r"5 tokens found.*32 needed"):
        build_dataset(recipe.data, tok, 32)


# -- packing ------------------------------------------------------------------------------------------------------
def packed(pack, docs: list[list[int]], length: int, eos_id: int = 2) -> dict[str, torch.Tensor]:
    """All windows of ``pack`` over ``docs`` (token ids without EOS), batched by :func:`collate`."""
    from datasets import Dataset

    tokens = Dataset.from_dict({"input_ids": [doc + [eos_id] for doc in docs]}, features=TOKENS)
    windows = pack(tokens, length).with_format("torch")
    return collate([windows[i] for i in range(len(windows))])


def test_pack_restart_positions_and_labels():
    docs = [[10, 11, 12], [20, 21], [30, 31, 32, 33, 34, 35]]
    restart = packed(pack_restart, docs, length=5)
    assert restart["input_ids"].tolist() == [[10, 11, 12, 2, 20], [21, 2, 30, 31, 32]]  # tail 33 34 35 EOS dropped
    assert restart["position_ids"].tolist() == [[0, 1, 2, 3, 0], [0, 1, 0, 1, 2]]
    masked = IGNORE_INDEX
    assert restart["labels"].tolist() == [[masked, 11, 12, 2, masked], [masked, 2, masked, 31, 32]]
    concat = packed(pack_concat, docs, length=5)
    assert torch.equal(concat["input_ids"], restart["input_ids"]) and torch.equal(concat["labels"], concat["input_ids"])
    assert concat["position_ids"].tolist() == [list(range(5))] * 2


def test_restart_packing_matches_separate_documents(workspace):
    """With restarted positions the loss of a packed window equals the documents' losses run one by one."""
    from transformers import AutoModelForCausalLM

    from hf_posenc.training.trainer import PosEncTrainer  # noqa: F401  (import check)

    model = AutoModelForCausalLM.from_pretrained(workspace / "model", attn_implementation="sdpa").eval()
    hf_posenc.patch_model(model, "cope")
    docs = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    window = packed(pack_restart, docs, length=15)
    with torch.no_grad():
        logits = model(window["input_ids"], position_ids=window["position_ids"],
                       use_cache=False).logits[0]  # Transformers finds packed documents only without a cache
        start = 0
        for doc in docs:
            ids = torch.tensor(doc + [2])[None]
            alone = model(ids).logits[0]
            torch.testing.assert_close(logits[start : start + ids.shape[1]], alone, rtol=1e-4, atol=1e-5)
            start += ids.shape[1]


# -- chunked loss -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float64, 1e-10), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("softcap,logit_scale", [(None, 1.0), (5.0, 1.0), (None, 0.0625), (5.0, 4.0)])
def test_chunked_loss_matches_full(dtype, tol, softcap, logit_scale):
    g = torch.Generator().manual_seed(int(time.time_ns() % 2**31))
    n, h, v = 45, 24, 70
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_()
    bias = torch.randn(v, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    labels[torch.rand(n, generator=g) < 0.2] = IGNORE_INDEX
    ref = full_linear_cross_entropy(hidden, weight, labels, bias, softcap, scale=logit_scale)
    got = chunked_linear_cross_entropy(hidden, weight, labels, bias, softcap, chunk_size=16, scale=logit_scale)
    scale = torch.rand((), generator=g).item() + 0.5
    g_ref = torch.autograd.grad(ref * scale, (hidden, weight, bias))
    g_got = torch.autograd.grad(got * scale, (hidden, weight, bias))
    torch.testing.assert_close(got.double(), ref.double(), rtol=tol, atol=tol * n)
    for a, b in zip(g_got, g_ref):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("family,config", [
    ("cohere", {"logit_scale": 0.0625}), ("granite", {"logits_scaling": 8.0}),
    ("gemma2", {"final_logit_softcapping": 5.0}), ("llama", {}),
])
def test_chunked_loss_reproduces_the_family_head(family, config, tmp_path):
    """The trainer's chunked loss (and the chunked perplexity) must equal the model's own loss: Cohere scales the
    logits, Granite divides them, Gemma2 soft-caps them (scaled heads were once trained without their scale)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_posenc.evaluation.perplexity import window_nll
    from hf_posenc.decoder_layers import output_logit_transform

    cfg = AutoConfig.for_model(family, vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, **config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits of order 10, where scale and soft-capping matter
    ids = torch.randint(0, 96, (1, 17))
    with torch.no_grad():
        own = model(ids, labels=ids).loss.double()  # Transformers computes its loss in float32
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    h, y = shift_for_causal_lm(hidden, ids)
    scale, softcap = output_logit_transform(cfg)
    chunked = chunked_linear_cross_entropy(h, model.lm_head.weight, y, model.lm_head.bias, softcap, 5, scale)
    torch.testing.assert_close(chunked / y.numel(), own, rtol=1e-6, atol=1e-6)
    nll, count = window_nll(model, ids, 16, chunk_size=5)
    torch.testing.assert_close(torch.tensor(nll / count, dtype=torch.float64), own, rtol=1e-6, atol=1e-6)

    from transformers import TrainingArguments

    from hf_posenc.training.trainer import PosEncTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True)
    trainer = PosEncTrainer(model=model, args=args, causal_lm=model, chunk_size=5)
    with torch.no_grad():
        loss = trainer.compute_loss(model, {"input_ids": ids, "labels": ids})
    torch.testing.assert_close(loss.double(), own, rtol=1e-6, atol=1e-6)  # what training minimises


def test_shift_pairs_hidden_with_next_label():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    labels = torch.arange(8).view(2, 4)
    h, y = shift_for_causal_lm(hidden, labels)
    assert h[:, 0].tolist() == [0, 1, 2, 4, 5, 6] and y.tolist() == [1, 2, 3, 5, 6, 7]


# -- end to end ---------------------------------------------------------------------------------------------------
@pytest.mark.upstream
def test_tiny_recipe_end_to_end(workspace):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    recipe = load_recipe(data=_recipe(workspace, "e2e", output={"dir": str(workspace / "e2e"), "merge": True},
                                      data={"files": [str(workspace / "corpus.jsonl")], "packing": "restart"},
                                      evaluation={"enabled": True, "lengths": [32, 128], "tasks": ["ppl"],
                                                  "options": {"progress": False}}))
    result = run_training(recipe)
    assert result.evaluation is not None and (Path(result.output_dir) / "eval.json").exists()
    ppl_lengths = sorted(r["context_length"] for r in result.evaluation["perplexity"])
    assert ppl_lengths == [32, 128], result.evaluation
    losses = result.losses
    assert len(losses) == 12 and all(map(torch.isfinite, map(torch.tensor, losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert (Path(result.output_dir) / "checkpoint-8").is_dir()

    unpatched = AutoModelForCausalLM.from_pretrained(workspace / "model", attn_implementation="sdpa")
    with pytest.raises(ValueError, match=r"scheme: adapter 'cope', base none.*patch the base first: "
                                         r"`hf_posenc.patch_model\(base, 'cope'"):
        PeftModel.from_pretrained(unpatched, result.model_dir)  # the adapter record written by the run
    base = AutoModelForCausalLM.from_pretrained(workspace / "model", attn_implementation="sdpa")
    hf_posenc.patch_model(base, "cope")
    reloaded = PeftModel.from_pretrained(base, result.model_dir).eval()
    ids = torch.randint(4, 4 + len(WORDS), (2, 24))
    with torch.no_grad():
        a = reloaded(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(result.merged_dir).eval()
        b = merged(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(workspace / "model").eval()
        c = hf_posenc.patch_model(plain, "cope")(ids).logits
    assert hf_posenc.get_scheme(merged).name == "cope"
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert (a - c).abs().max() > 1e-2  # training changed the model (norms + LoRA were saved)


def _train_cmd(recipe_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hf_posenc.training.cli", str(recipe_path), *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    return env


def test_resume_after_kill_repeats_the_loss_trajectory(workspace):
    steps = 24
    for name in ("full-run", "killed"):
        recipe = _recipe(workspace, name, peft={"dropout": 0.1}, training={"max_steps": steps, "save_steps": 3})
        (workspace / f"{name}.yaml").write_text(yaml.safe_dump(recipe))

    with open(workspace / "killed.stderr", "wb") as err:
        proc = subprocess.Popen(_train_cmd(workspace / "killed.yaml"), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=err)
        ckpt = workspace / "killed" / "checkpoint-3" / "trainer_state.json"
        deadline = time.time() + 120
        while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        alive = proc.poll() is None
        proc.kill()  # SIGKILL: no clean shutdown
        proc.wait()
    assert alive, (workspace / "killed.stderr").read_text()[-2000:]
    steps_before = [r["step"] for r in read_log(workspace / "killed" / "log.jsonl") if "loss" in r]
    assert 3 <= max(steps_before) < steps

    done = subprocess.run(_train_cmd(workspace / "killed.yaml", "--resume"), env=_env(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    full = subprocess.run(_train_cmd(workspace / "full-run.yaml"), env=_env(), capture_output=True)
    assert full.returncode == 0, full.stderr.decode()[-3000:]

    def losses(name):
        return [(r["step"], r["loss"]) for r in read_log(workspace / name / "log.jsonl") if "loss" in r]

    resumed, uninterrupted = losses("killed"), losses("full-run")
    # the run's mean loss covers every step, those before the resume too (the Trainer averages its session only)
    mean = [next(r["train_loss"] for r in read_log(workspace / n / "log.jsonl") if "train_loss" in r)
            for n in ("killed", "full-run")]
    assert mean[0] == pytest.approx(mean[1], rel=1e-5)
    assert [s for s, _ in resumed] == list(range(1, steps + 1))
    assert [s for s, _ in resumed] == [s for s, _ in uninterrupted]
    for (step, a), (_, b) in zip(resumed, uninterrupted):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), (step, resumed, uninterrupted)


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT delivered and not ignored, as for a command typed in a terminal. A test
    worker may have inherited SIGINT ignored or blocked (some library's helper process left it so), and a child
    inherits both, so Python there would never raise KeyboardInterrupt (reproduced: the run trains to the end)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_resume_refuses_a_changed_recipe_and_ctrl_c_says_how_to_resume(workspace):
    # far more steps than run before the Ctrl-C, so the run cannot end before it lands
    recipe = _recipe(workspace, "run", training={"max_steps": 2000, "save_steps": 2})
    (workspace / "run.yaml").write_text(yaml.safe_dump(recipe))
    proc = subprocess.Popen(_train_cmd(workspace / "run.yaml"), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=_ctrl_c_as_in_a_terminal)
    ckpt = workspace / "run" / "checkpoint-2" / "trainer_state.json"
    deadline = time.time() + 120
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "interrupted; the newest complete checkpoint is" in err.decode() and "--resume`" in err.decode()
    saved = (workspace / "run" / "recipe.yaml").read_text()

    changed = subprocess.run(_train_cmd(workspace / "run.yaml", "context_length=16", "training.logging_steps=2",
                                        "--resume"), env=_env(), capture_output=True)
    assert changed.returncode == 2
    message = changed.stderr.decode()
    assert "the recipe differs from the one the run" in message and "context_length: 32 -> 16" in message
    assert "logging_steps" not in message  # what is only logged may change
    assert (workspace / "run" / "recipe.yaml").read_text() == saved  # the record still describes the run


@pytest.fixture(scope="module")
def recorded_run(workspace):
    """An output.dir as a run leaves it after its first checkpoint: ``recipe.yaml`` written by the run's own
    ``_start_log`` and a complete ``checkpoint-2`` (its ``trainer_state.json``). The resume check reads nothing
    else, so no training runs for the cases below."""
    from hf_posenc.training.trainer import _start_log

    path = workspace / "recorded.yaml"
    path.write_text(yaml.safe_dump(_recipe(workspace, "recorded", training={"warmup_steps": 2, "seed": 42})))
    recipe = load_recipe(path)
    _start_log(recipe, Path(recipe.output.dir), None)
    checkpoint = Path(recipe.output.dir) / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    return path


class _Loaded(Exception):
    """Raised where a resumed run would load the base model's config: the resume check let the recipe through."""


def _resume(recorded_run: Path, overrides: list[str], monkeypatch) -> None:
    def loaded(recipe):
        raise _Loaded

    monkeypatch.setattr("hf_posenc.training.trainer.load_model_config", loaded)
    run_training(load_recipe(recorded_run, overrides), resume=True)


@pytest.mark.parametrize("override, shown", [
    ("training.learning_rate=0.01", "training.learning_rate: 0.03 -> 0.01"),
    ("training.lr_scheduler_type=cosine", "training.lr_scheduler_type: 'constant' -> 'cosine'"),
    ("training.warmup_steps=5", "training.warmup_steps: 2.0 -> 5.0"),  # a float in TrainingArguments
    ("training.max_steps=20", "training.max_steps: 12 -> 20"),
    ("training.seed=7", "training.seed: 42 -> 7"),
    ("context_length=16", "context_length: 32 -> 16"),
], ids=["learning-rate", "scheduler", "warmup", "steps", "seed", "context-length"])
def test_resume_refuses_each_class_of_changed_training_key(recorded_run, monkeypatch, override, shown):
    """Every class of key that changes what trains is refused on resume, before anything loads, naming the key
    with its recorded and new values; the record is left as it was."""
    saved = (recorded_run.parent / "recorded" / "recipe.yaml").read_text()
    with pytest.raises(RecipeError) as refusal:
        _resume(recorded_run, [override], monkeypatch)
    assert "--resume: the recipe differs from the one the run in" in str(refusal.value)
    assert shown in str(refusal.value), str(refusal.value)
    assert (recorded_run.parent / "recorded" / "recipe.yaml").read_text() == saved


@pytest.mark.parametrize("overrides", [
    [], ["training.logging_steps=3", "training.save_steps=6", "training.save_total_limit=5"],
    ["training.report_to=none", "evaluation.lengths=[32, 64]"],
], ids=["unchanged", "logging-and-saving", "reporting-and-evaluation"])
def test_resume_lets_what_is_only_logged_saved_or_evaluated_change(recorded_run, monkeypatch, overrides):
    with pytest.raises(_Loaded):  # past the resume check, at the first load
        _resume(recorded_run, overrides, monkeypatch)


def test_an_output_that_cannot_be_written_is_refused_before_any_model_loads(workspace, capsys):
    from hf_posenc.training.cli import main as train_main

    (workspace / "a-file").write_text("")
    recipe = _recipe(workspace, "a-file/run")
    (workspace / "ro.yaml").write_text(yaml.safe_dump(recipe))
    started = time.time()
    assert train_main([str(workspace / "ro.yaml")]) == 2
    assert "is not writable" in capsys.readouterr().err and time.time() - started < 10


@pytest.mark.parametrize("world_size, bad", [("1", False), ("2", False), ("2", True)],
                         ids=["alone", "a launched rank", "a launched rank that failed"])
def test_a_launched_rank_that_succeeded_ends_without_the_interpreters_shutdown(workspace, world_size, bad):
    """``python -m hf_posenc.training.cli`` (what a launcher starts in each process) ends a rank whose command
    succeeded with ``os._exit`` once its output is flushed, so no C++ destructor of the distributed stack can abort it
    after a successful run (SIGABRT seen in ZeRO-3 launches); a failure, and a process outside a launch, exit the usual
    way (the interpreter's shutdown runs: an atexit handler prints)."""
    recipe = _recipe(workspace, "ended")
    if bad:
        recipe["training"] = {**recipe.get("training", {}), "max_steps": -1}
    (workspace / "ended.yaml").write_text(yaml.safe_dump(recipe))
    code = ("import atexit, runpy, sys; atexit.register(lambda: print('interpreter shutdown ran', flush=True)); "
            f"sys.argv = ['hf_posenc.training.cli', {str(workspace / 'ended.yaml')!r}, '--dry-run']; "
            "runpy.run_module('hf_posenc.training.cli', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "WORLD_SIZE": world_size},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == (2 if bad else 0), proc.stderr[-3000:]
    if not bad:  # the command's whole output came out before the process ended
        assert json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])["recipe"]["training"]
    assert ("interpreter shutdown ran" in proc.stdout) == (world_size == "1" or bad), proc.stdout[-2000:]


def test_two_process_run(workspace):
    recipe = _recipe(workspace, "ddp", training={"max_steps": 3, "save_steps": 3})
    (workspace / "ddp.yaml").write_text(yaml.safe_dump(recipe))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "recipes" / "accelerate" / "cpu-2proc.yaml"), "--main_process_port", "29533",
           "-m", "hf_posenc.training.cli", str(workspace / "ddp.yaml")]
    done = subprocess.run(cmd, env=_env(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    losses = [r for r in read_log(workspace / "ddp" / "log.jsonl") if "loss" in r]
    assert [r["step"] for r in losses] == [1, 2, 3]
    assert all(r["world_size"] == 2 for r in losses)  # really two processes
    assert (workspace / "ddp" / "adapter" / "adapter_model.safetensors").exists()
    state = json.loads((workspace / "ddp" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3


@pytest.mark.slow
def test_a_run_on_the_embedded_model_names_it_and_shows_only_what_concerns_the_user(workspace):
    """`hf-posenc train` on @smollm2 (a GGUF inside this environment), as a newcomer runs it: the adapter (and its
    checkpoints) name the base `@smollm2`, not the folder it resolves to; its README, and every checkpoint's, is
    hf-posenc's card (the Hub's metadata checks pass), which says to import hf_posenc and patch the base first, in
    code; and the output holds none of DeepSpeed's "Setting accelerator to CPU", PEFT's "Could not find a config
    file" (once per save), datasets' "Downloading data" (16+ local files) or PyTorch's "'pin_memory' argument is set
    as true but no accelerator is found" (the DataLoader's default on a machine without one)."""
    from test_hub import assert_card_is_well_formed

    docs = workspace / "docs"
    docs.mkdir(exist_ok=True)
    for i, text in enumerate(_corpus(20, seed=3)):
        (docs / f"doc{i:02d}.txt").write_text(text)
    recipe = _recipe(workspace, "smollm2", model={"path": "@smollm2"}, scheme={"clip_low_n": 3},
                     data={"files": [str(docs / "*.txt")]}, peft={"trainable_embeddings": False},
                     training={"max_steps": 1, "save_steps": 1, "per_device_train_batch_size": 1,
                               "use_cpu": False})  # unset, as in recipes/smollm2-*-cpu.yaml
    (workspace / "smollm2.yaml").write_text(yaml.safe_dump(recipe))
    done = subprocess.run(_train_cmd(workspace / "smollm2.yaml"), env=_env(), capture_output=True, timeout=300)
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output[-3000:]
    for chatter in ("Setting accelerator to CPU", "Could not find a config file", "Downloading data", "pin_memory"):
        assert chatter not in output, (chatter, output[-3000:])

    adapter = workspace / "smollm2" / "adapter"
    for saved in (adapter, workspace / "smollm2" / "checkpoint-1"):
        assert json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"] == "@smollm2"
        assert (saved / "hf_posenc_adapter.json").is_file(), saved  # the record PEFT's loaders check
        card = (saved / "README.md").read_text()
        assert sys.prefix not in card and "More Information Needed" not in card, saved  # not PEFT's boilerplate
        assert "**Run `import hf_posenc` before loading this adapter**" in card and "| `clip_low_n` | `3` |" in card
        assert_card_is_well_formed(card)
        code = card.split("```python\n", 1)[1].split("```", 1)[0]
        assert code.startswith("import hf_posenc")
        assert "base = hf_posenc.patch_model(hf_posenc.load_model(\"@smollm2\"), 'cope', clip_low_n=3)" in code
        assert f"model = PeftModel.from_pretrained(base, {json.dumps(str(saved))})" in code


def test_what_a_run_quiets_is_only_that_and_only_meanwhile(workspace):
    """The one DeepSpeed notice is dropped, its other messages are not; datasets' progress bars are back on after
    the local text files are read."""
    import logging

    import datasets

    from hf_posenc.training.data import _text_files
    from hf_posenc.training.trainer import _without_deepspeed_cpu_notice

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(handler)
    try:
        with _without_deepspeed_cpu_notice():
            logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to ...")
            logger.warning("a real warning")
        logger.warning("Setting accelerator to CPU. (outside a run)")
    finally:
        logger.removeHandler(handler)
    assert seen == ["a real warning", "Setting accelerator to CPU. (outside a run)"]
    assert not datasets.utils.are_progress_bars_disabled()
    assert len(_text_files([str(workspace / "short.txt")])) == 1
    assert not datasets.utils.are_progress_bars_disabled()


FSDP2_CPU = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: "no"
num_machines: 1
num_processes: 2
machine_rank: 0
main_training_function: main
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: FULL_STATE_DICT
use_cpu: false
"""


@pytest.mark.parametrize("config,use_cpu,expected", [
    ("fsdp2", True, "did not enable it (training.use_cpu is set: it then runs DDP instead)"),
    ("fsdp2", False, "did not enable it, so nothing would be sharded"),
    ("ddp", False, "each would train alone"),
])
def test_a_launch_the_trainer_would_run_unsharded_is_refused(workspace, config, use_cpu, expected):
    """Two CPU processes that the Trainer would quietly run as something else: FSDP2 (recipes/accelerate/fsdp2.yaml's
    settings) becomes DDP with use_cpu and unsharded without it; DDP without use_cpu becomes two processes training
    alone. Each ended normally before; now each fails before any step, naming what happened."""
    (workspace / "fsdp2-cpu.yaml").write_text(FSDP2_CPU)
    config_file = workspace / "fsdp2-cpu.yaml" if config == "fsdp2" else REPO / "recipes" / "accelerate" / "cpu-2proc.yaml"
    name = f"refused-{config}-{int(use_cpu)}"
    recipe = _recipe(workspace, name, training={"max_steps": 2, "save_steps": 2, "use_cpu": use_cpu})
    (workspace / f"{name}.yaml").write_text(yaml.safe_dump(recipe))
    port = 29540 + 2 * (config == "ddp") + int(use_cpu)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
           "--main_process_port", str(port), "-m", "hf_posenc.training.cli", str(workspace / f"{name}.yaml")]
    done = subprocess.run(cmd, env=_env(), capture_output=True, timeout=180)
    err = done.stderr.decode()
    assert done.returncode != 0, err[-2000:]
    assert expected in err, err[-3000:]
    log = workspace / name / "log.jsonl"
    assert not log.exists() or not any("loss" in r for r in read_log(log))


def test_shipped_recipes_parse():
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert len(recipes) >= 8
    for path in recipes:
        recipe = load_recipe(path, validate=False)  # keys, types, values (data files may live on GPU hosts)
        assert recipe.scheme_config().name == recipe.scheme.name  # bf16 recipes parse on a CPU host too
        assert load_recipe(data=tcfg.read_yaml(yaml.safe_dump(recipe.to_dict())), validate=False) == recipe


def test_lora_setup_is_one_path_with_checked_names(workspace):
    """hf-posenc train wraps with adapters.lora_config: the scheme's modules, norms of every kind, embeddings with
    an untied head, and names that are not modules refused (as a RecipeError naming the section in a recipe)."""
    from hf_posenc.adapters import lora_config
    from hf_posenc.training.trainer import wrap_peft
    from tiny import tiny_model

    tape = hf_posenc.patch_model(tiny_model("llama"), "tape")
    config = lora_config(tape, r=2, train_norms=True, train_embeddings=True)
    assert set(config.modules_to_save) == {"tape", "input_layernorm", "post_attention_layernorm", "norm",
                                           "embed_tokens", "lm_head"}  # tiny llama: untied head
    assert lora_config(tape, r=2, scheme_modules=False).modules_to_save is None
    qwen3 = tiny_model("qwen3", tie_word_embeddings=True)
    tied = lora_config(qwen3, r=2, train_norms=True, train_embeddings=True)
    assert {"q_norm", "k_norm", "embed_tokens"} <= set(tied.modules_to_save) and "lm_head" not in tied.modules_to_save
    assert tied.ensure_weight_tying
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] are not modules of this model.*'q_proj'"):
        lora_config(qwen3, target_modules=("qkv_proj",))
    with pytest.raises(ValueError, match=r"modules_to_save \['adapter_norm'\] are not modules"):
        lora_config(qwen3, modules_to_save=("adapter_norm",))
    recipe = load_recipe(data=_recipe(workspace, "lora", peft={"target_modules": ["qkv_proj"]}))
    with pytest.raises(RecipeError, match="peft: LoRA target_modules"):
        wrap_peft(recipe, tiny_model("llama"))


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_model_without_rotary_embeddings_is_refused_from_its_config_before_any_weight_loads(
        workspace, monkeypatch, capsys, dry_run):
    """A GPT-2 recipe (learned absolute positions) ends with one line naming the model type, exit 2, both with
    --dry-run and without, and no weights loaded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_posenc.cli import main

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=16, n_positions=64)).save_pretrained(
        workspace / "gpt2")

    def no_load(*a, **k):
        raise AssertionError("weights were loaded for a model no scheme applies to")

    monkeypatch.setattr("hf_posenc.training.trainer.load_base_model", no_load)
    path = workspace / "gpt2.yaml"
    path.write_text(yaml.safe_dump(_recipe(workspace, "gpt2-out", model={"path": str(workspace / "gpt2")})))
    capsys.readouterr()  # the save's progress bar
    assert main(["train", str(path), *(["--dry-run"] if dry_run else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-posenc train: model: hf-posenc does not support model type 'gpt2'"), err
    assert "Traceback" not in err
    out = workspace / "gpt2-out"
    assert not out.exists() or not any(out.iterdir())  # nothing written (the output check may leave it empty)
