"""patch_model on every family × attention backend × scheme, with tiny random models."""

import copy

import pytest
import torch

import hf_posenc
from tiny import ARCHS, arch_backend_pairs, backends, greedy_without_cache, logits, padded_batch, random_ids, tiny_model

IDENTITY = [("cope", {"clip_low_n": 0}), ("hardclip", {"clip_low_n": 0}), ("prope", {"p": 1.0}), ("rope", {})]
ACTIVE = [("cope", {"clip_low_n": 3}), ("hardclip", {"clip_low_n": 3}), ("prope", {"p": 0.5}),
          ("rope", {"rope_theta": 500.0, "scaling": "yarn", "factor": 2.0})]


@pytest.mark.upstream
@pytest.mark.parametrize("arch, backend", arch_backend_pairs())
def test_identity_settings_are_bitwise_equal(arch, backend):
    ids, mask = padded_batch()
    reference = logits(tiny_model(arch, backend), ids, attention_mask=mask)
    for scheme, options in IDENTITY:
        model = hf_posenc.patch_model(tiny_model(arch, backend), scheme, layers="all", **options)
        assert torch.equal(logits(model, ids, attention_mask=mask), reference), (scheme, options)


@pytest.mark.upstream
@pytest.mark.parametrize("arch", ARCHS)
def test_schemes_run_on_every_backend_and_agree(arch):
    ids, mask = padded_batch()
    unpatched = logits(tiny_model(arch, "eager"), ids, attention_mask=mask)
    for scheme, options in ACTIVE:
        outs = {b: logits(hf_posenc.patch_model(tiny_model(arch, b), scheme, **options), ids, attention_mask=mask)
                for b in backends(arch)}
        assert not torch.allclose(outs["eager"], unpatched), f"{scheme} changed nothing"
        real = mask.bool()  # padded query rows are garbage by design and differ between backends
        for backend, out in outs.items():
            torch.testing.assert_close(out[real], outs["eager"][real], rtol=1e-4, atol=1e-4)


@pytest.mark.upstream
@pytest.mark.parametrize("arch, backend", arch_backend_pairs(("eager", "sdpa")))
def test_kv_cache_generation_equals_full_forward(arch, backend):
    ids = random_ids(1, 12)
    for scheme, options in ACTIVE:
        model = hf_posenc.patch_model(tiny_model(arch, backend), scheme, **options)
        cached = model.generate(ids, max_new_tokens=10, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
        assert torch.equal(cached, greedy_without_cache(model, ids, 10)), scheme


def test_gemma3_applies_to_global_layers_by_default_and_all_on_request():
    stock = tiny_model("gemma3_text").model.rotary_emb
    glob = hf_posenc.patch_model(tiny_model("gemma3_text"), "hardclip", clip_low_n=3).model.rotary_emb
    every = hf_posenc.patch_model(tiny_model("gemma3_text"), "hardclip", clip_low_n=3, layers="all").model.rotary_emb
    assert torch.equal(glob.sliding_attention_inv_freq, stock.sliding_attention_inv_freq)
    assert torch.all(glob.full_attention_inv_freq[-3:] == 0)
    assert torch.all(every.sliding_attention_inv_freq[-3:] == 0)
    assert torch.equal(every.full_attention_inv_freq, glob.full_attention_inv_freq)


def test_replace_applies_to_the_original_frequencies():
    ids = random_ids()
    model = hf_posenc.patch_model(tiny_model("qwen3"), "cope", clip_low_n=3)
    assert hf_posenc.patch_model(model, "cope", clip_low_n=3) is model  # same scheme again: a no-op
    hf_posenc.patch_model(model, "prope", p=0.5, replace=True)
    direct = hf_posenc.patch_model(tiny_model("qwen3"), "prope", p=0.5)
    assert torch.equal(logits(model, ids), logits(direct, ids))
    assert model.config.rope_parameters == direct.config.rope_parameters
    assert hf_posenc.get_scheme(model) == hf_posenc.PRoPEConfig(p=0.5)


def snapshot(model):
    return (type(model), type(model.config), copy.deepcopy(model.config.to_dict()),
            {k: v.clone() for k, v in model.state_dict().items()}, logits(model, random_ids()))


def assert_unchanged(model, before):
    after = snapshot(model)
    assert after[0] is before[0] and after[1] is before[1]
    assert after[2] == before[2]
    assert after[3].keys() == before[3].keys() and all(torch.equal(after[3][k], before[3][k]) for k in after[3])
    assert torch.equal(after[4], before[4])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(scheme="nope"), ValueError, "valid schemes"),
        (dict(scheme="prope", p=2.0), ValueError, r"\[0, 1\]"),
        (dict(scheme="cope", clip_low_n=9), ValueError, "exceeds"),
        (dict(scheme="hardclip", clip_low_n=2), ValueError, "replace=True"),
    ],
)
def test_failed_calls_leave_the_model_unchanged(kwargs, error, match):
    model = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3)
    before = snapshot(model)
    with pytest.raises(error, match=match):
        hf_posenc.patch_model(model, **kwargs)
    assert_unchanged(model, before)


def test_unsupported_architecture_names_the_supported_ones():
    from transformers import AutoModelForCausalLM, GPT2Config

    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    before = copy.deepcopy(model.config.to_dict())
    with pytest.raises(ValueError, match=r"does not support model type 'gpt2': no rotary.*verified with every "
                                         r"frequency scheme: \[.*'llama'.*'mistral'"):
        hf_posenc.patch_model(model, "cope")
    assert model.config.to_dict() == before


def test_peft_wrapped_model_is_refused_with_the_way_out():
    peft = pytest.importorskip("peft")
    base = tiny_model("llama")
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    before = snapshot(base)
    with pytest.raises(TypeError, match=r"Patch the base model before wrapping"):
        hf_posenc.patch_model(wrapped, "cope")
    assert_unchanged(base, before)


@pytest.mark.upstream
def test_patch_then_peft_trains_and_keeps_the_scheme():
    peft = pytest.importorskip("peft")
    model = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    ids = random_ids()
    loss = wrapped(input_ids=ids, labels=ids).loss
    loss.backward()
    assert hf_posenc.get_scheme(wrapped.get_base_model()).clip_low_n == 3
    assert any(p.grad is not None for n, p in wrapped.named_parameters() if "lora" in n)
