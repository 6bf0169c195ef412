"""TAPA as a model scheme: every family, kernel vs reference, KV cache, padding, packing, training."""

import pytest
import torch

import hf_posenc
from tiny import greedy_without_cache, logits, random_ids, tiny_model

FAMILIES = ["llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"]  # Gemma2/3 with sliding windows
NO_SOFTCAP = {"attn_logit_softcapping": None, "final_logit_softcapping": None}


def tapa_model(arch, backend="reference", seed=0, **config):
    if arch == "gemma2":
        config = {**NO_SOFTCAP, **config}
    with pytest.warns(UserWarning, match="needs training"):
        return hf_posenc.patch_model(tiny_model(arch, seed=seed, **config), "tapa", backend=backend)


@pytest.mark.parametrize("arch", FAMILIES)
def test_kernel_path_equals_reference_path(arch):
    ids = random_ids(2, 20)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    ref = logits(tapa_model(arch, "reference"), ids, attention_mask=mask)
    fast = logits(tapa_model(arch, "triton"), ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(fast[real], ref[real], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ref, logits(tiny_model(arch), ids, attention_mask=mask))


@pytest.mark.parametrize("arch", FAMILIES)
def test_kv_cache_generation_equals_full_forward(arch):
    model = tapa_model(arch).double()
    ids = random_ids(1, 10)
    cached = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(cached, greedy_without_cache(model, ids, 8))


def test_decode_through_the_kernel_matches_the_full_pass():
    model = tapa_model("llama", "triton")
    ids = random_ids(1, 14)
    full = logits(model, ids)
    with torch.no_grad():
        prefix = model(ids[:, :11], use_cache=True)
        step = model(ids[:, 11:], past_key_values=prefix.past_key_values, use_cache=True)
    torch.testing.assert_close(step.logits, full[:, 11:], rtol=1e-4, atol=1e-4)


def test_left_padded_batch_equals_one_by_one():
    model = tapa_model("qwen3").double()
    a, b = random_ids(1, 9, seed=5), random_ids(1, 14, seed=6)
    batch = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), a], 1), b])
    mask = torch.ones_like(batch)
    mask[0, :5] = 0
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
    out = model.generate(batch, attention_mask=mask, **kw)
    assert torch.equal(out[0, 5:], model.generate(a, **kw)[0])
    assert torch.equal(out[1], model.generate(b, **kw)[0])


def test_packed_sequences_equal_separate_passes():
    model = tapa_model("llama", "triton")
    a, b = random_ids(1, 7, seed=8), random_ids(1, 11, seed=9)
    packed = torch.cat([a, b], dim=1)
    positions = torch.cat([torch.arange(7), torch.arange(11)])[None]
    out = logits(model, packed, position_ids=positions)
    torch.testing.assert_close(out[:, :7], logits(model, a), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[:, 7:], logits(model, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_position_jumps_are_packing_only_without_a_mask(backend):
    """Transformers' rule, which stock SDPA follows: jumps in the position ids split attention into packed
    documents only when no attention mask is passed (and, for stock, no cache: compared with use_cache=False);
    with a mask (the perturbation diagnostics, any caller that moves position ids) the tokens form one sequence."""
    ids = random_ids(1, 12, seed=3)
    changed = ids.clone()
    changed[0, 2] = (ids[0, 2] + 1) % 128  # a token of the first "document"
    positions = torch.cat([torch.arange(6), torch.arange(20, 26)])[None]
    ones = torch.ones_like(ids)
    for model in (tapa_model("llama", backend), tiny_model("llama", "sdpa")):
        packed = [logits(model, x, position_ids=positions, use_cache=False)[:, 6:] for x in (ids, changed)]
        torch.testing.assert_close(packed[0], packed[1], rtol=0, atol=0)  # the second document cannot see it
        one = [logits(model, x, position_ids=positions, attention_mask=ones, use_cache=False)[:, 6:]
               for x in (ids, changed)]
        assert (one[0] - one[1]).abs().max() > 1e-4  # one sequence: the later tokens see the change


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_few_training_steps_reduce_the_loss_with_gradient_checkpointing(backend):
    torch.manual_seed(0)
    model = tapa_model("llama", backend).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = random_ids(2, 24, seed=4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_round_trip_restores_the_attention_and_refuses_another(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tapa_model("qwen2")
    ids = random_ids()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == "hf_posenc_tapa"
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    with pytest.raises(ValueError, match="computes attention itself"):
        AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="computes attention itself"):
        loaded.set_attn_implementation("eager")


def test_replacing_tapa_restores_standard_attention():
    model = tapa_model("llama")
    hf_posenc.patch_model(model, "cope", clip_low_n=0, replace=True)
    ids = random_ids()
    assert torch.equal(logits(model, ids), logits(tiny_model("llama", "sdpa"), ids))


@pytest.mark.parametrize(
    "options, error, match",
    [
        (dict(theta=0.3), ValueError, "theta"),
        (dict(alpha=0.0), ValueError, "alpha must be a finite number > 0"),
        (dict(theta=1.0), ValueError, r"theta must be in \(0, 1\)"),
        (dict(phase="cubic"), ValueError, "phase must be"),
        (dict(layers="global"), ValueError, "layers must be 'all'"),
    ],
)
def test_bad_options(options, error, match):
    model = tiny_model("llama")
    with pytest.raises(error, match=match):
        hf_posenc.patch_model(model, "tapa", **options)
    assert hf_posenc.get_scheme(model) is None


def test_gemma2_softcapping_is_refused_with_the_fix():
    model = tiny_model("gemma2")
    before = model.config.to_dict()
    with pytest.raises(ValueError, match="attn_logit_softcapping = None before patching"):
        hf_posenc.patch_model(model, "tapa")
    assert model.config.to_dict() == before
    model.config.attn_logit_softcapping = None
    with pytest.warns(UserWarning):
        model = hf_posenc.patch_model(model, "tapa")
    model.config.attn_logit_softcapping = 50.0  # set again after patching: the attention itself refuses it
    with pytest.raises(ValueError, match="attn_logit_softcapping = None"):
        logits(model, random_ids())


def test_sliding_window_layers_keep_their_window():
    """Gemma3's sliding layers attend only to the last `sliding_window` keys, through the kernel as through the
    reference; a long sequence makes the window bite."""
    ids = random_ids(1, 40)
    ref = tapa_model("gemma3_text", "reference", sliding_window=8)
    fast = tapa_model("gemma3_text", "triton", sliding_window=8)
    wide = tapa_model("gemma3_text", "reference", sliding_window=64)
    torch.testing.assert_close(logits(fast, ids), logits(ref, ids), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits(ref, ids), logits(wide, ids), atol=1e-3)
