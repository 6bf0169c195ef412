"""``export_stock``'s config, built into the family's stock Transformers class in this process, reproduces the patched
model: the same rotary frequencies, attention scaling and logits. (The fresh-process round trip through files is in
``test_checkpoint.py``; this is the fast check of the factors themselves.)"""

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.export import stock_config
from tiny import random_ids, tiny_model

CASES = [
    ("cope", dict(clip_low_n=3), True),  # default base: f_j = 1/w_j is how hf-posenc computes it, bit for bit
    ("hardclip", dict(clip_low_n=2), True),  # w_j = 0: a huge finite factor gives exactly 0
    ("cope", dict(clip_low_n=3, rope_theta=1e6, scaling="yarn", factor=4.0), False),  # ratios + YaRN's scaling
    ("cope", dict(clip_low_n=4, scaling="linear", factor=2.0), False),
    ("prope", dict(p=0.25), True),
]


@pytest.mark.parametrize("scheme, options, exact", CASES, ids=[f"{s}-{'-'.join(map(str, o.values()))}"
                                                               for s, o, _ in CASES])
def test_stock_class_with_the_exported_config_reproduces_the_patched_model(scheme, options, exact):
    patched = hf_posenc.patch_model(tiny_model("llama"), scheme, **options)
    sharpen_attention(patched)
    config = stock_config(patched)
    assert type(config).__name__ == "LlamaConfig" and not hasattr(config, "hf_posenc")
    stock = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    assert type(stock).__name__ == "LlamaForCausalLM"
    stock.load_state_dict(patched.state_dict())
    ours, theirs = patched.model.rotary_emb, stock.model.rotary_emb
    assert theirs.attention_scaling == pytest.approx(ours.attention_scaling, rel=1e-12)
    ids = random_ids(2, 40)  # longer than nothing in particular: LongRoPE's short/long switch must not matter
    with torch.no_grad():
        want, got = patched(ids).logits, stock(ids).logits
    if exact:
        assert torch.equal(theirs.inv_freq, ours.inv_freq)
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(theirs.inv_freq, ours.inv_freq, rtol=1e-6, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = sharpen_attention(tiny_model("llama"))
    with torch.no_grad():
        # the scheme moves the logits by far more than the tolerance (the lowest frequencies turn slowly over 40 tokens)
        assert (plain(ids).logits - want).abs().max() > 2e-4


def sharpen_attention(model):
    """Scale the query/key weights so that attention, and with it the rotary frequencies, shape the logits (at the
    random initialisation a frequency change moves them by ~1e-5 only)."""
    for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            proj.weight.data *= 6.0
    return model


def test_cope_over_the_default_base_is_written_as_its_own_factors_bit_for_bit_at_a_real_head_width():
    """SmolLM2's head width (64: clip 10 of 32 pairs): the stock factors are CoPE's 1/w itself (its rope type's
    closed form), which LongRoPE turns into exactly the patched frequencies; the ratios of the computed frequencies
    would miss 3 of them by a float32 rounding step."""
    patched = hf_posenc.patch_model(tiny_model("llama", head_dim=64), "cope", clip_low_n=10)
    stock = AutoModelForCausalLM.from_config(stock_config(patched), attn_implementation="eager")
    assert torch.equal(stock.model.rotary_emb.inv_freq, patched.model.rotary_emb.inv_freq)
