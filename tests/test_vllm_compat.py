"""What ``export_stock`` does for vLLM (``hf_posenc.vllm_compat``), checked in stock Transformers: a ``longrope``
attention factor (CoPE/HardClip over YaRN) moves into the query/key weights (q/k projections for Llama/Qwen2/Gemma/
Gemma2, the q/k norms for Qwen3 and Gemma3's ``1 + w`` norms), p-RoPE over PI becomes ``longrope``, and dynamic NTK
warns. The same exports in a real vLLM: ``test_serving_vllm.py``."""

import json
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posenc
from tiny import ARCHS, random_ids, tiny_model

TOLERANCE = 1e-5  # float32 rounding of (a·W)x vs a·(Wx)


@pytest.mark.parametrize("arch", ARCHS)
def test_folded_export_keeps_the_logits_in_stock_transformers(tmp_path, arch):
    model = tiny_model(arch, initializer_range=0.1)
    hf_posenc.patch_model(model, "cope", clip_low_n=3, scaling="yarn", factor=4.0, layers="all")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = random_ids(2, 40)
    with torch.no_grad():
        want = model(ids).logits
    hf_posenc.export_stock(model, tmp_path / "stock")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the model itself is untouched
    rope = json.loads((tmp_path / "stock" / "config.json").read_text())["rope_parameters"]
    for params in rope.values() if "full_attention" in rope else [rope]:
        assert params["rope_type"] == "longrope" and params["attention_factor"] == 1.0
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "stock", attn_implementation="eager").eval()
    with torch.no_grad():
        got = stock(ids).logits
        unfolded = AutoModelForCausalLM.from_config(stock.config, attn_implementation="eager").eval()
        unfolded.load_state_dict(model.state_dict())  # attention_factor 1 without the fold: the attention changes
        wrong = unfolded(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE)
    assert (wrong - want).abs().max() > 100 * TOLERANCE


def test_exports_without_an_attention_factor_are_written_unchanged(tmp_path):
    model = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3)  # default base: attention factor 1
    hf_posenc.export_stock(model, tmp_path / "stock")
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "stock").eval()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in stock.state_dict().items())


def test_prope_over_pi_is_written_as_longrope_with_the_same_logits(tmp_path):
    model = hf_posenc.patch_model(tiny_model("llama", initializer_range=0.1), "prope", p=0.5, scaling="linear",
                                  factor=4.0)
    ids = random_ids(2, 40)
    with torch.no_grad():
        want = model(ids).logits
    hf_posenc.export_stock(model, tmp_path / "stock")
    rope = json.loads((tmp_path / "stock" / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["attention_factor"] == 1.0
    assert rope["short_factor"] == pytest.approx([4.0] * 4 + [3e38] * 4, rel=1e-6)  # head dim 16: 8 frequencies
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "stock", attn_implementation="eager").eval()
    torch.testing.assert_close(stock.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(stock(ids).logits, want, rtol=0, atol=TOLERANCE)


def test_dynamic_ntk_export_warns_that_vllm_differs(tmp_path):
    model = hf_posenc.patch_model(tiny_model("llama"), "rope", scaling="dynamic", factor=2.0)
    with pytest.warns(UserWarning, match="rope type 'dynamic' loads in vLLM but runs differently"):
        hf_posenc.export_stock(model, tmp_path / "dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf_posenc.export_stock(hf_posenc.patch_model(tiny_model("llama"), "rope", scaling="yarn", factor=2.0),
                               tmp_path / "yarn")
