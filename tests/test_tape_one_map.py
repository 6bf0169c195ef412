"""TAPE's one-map CPU path (schemes/tape/one_map.py): O and Ẽ from one attention map, blocked over query rows,
against eager attention in float64 and against the two SDPA calls it replaces; where the model takes it; and the
skipped Ẽ while W_att = 0."""

import pytest
import torch
import torch.nn.functional as F

import hf_posenc
from hf_posenc.schemes.tape import TapeBlock, attention, one_map
from tiny import logits, padded_batch, random_ids, tiny_model

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-6), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def reference(q, k, ve, mask, scaling, causal):
    """softmax(QKᵀ·scale + mask)·[V | E] in float64, one head at a time, keys repeated per query group; rows that
    attend nothing give 0 (SDPA's convention)."""
    group = q.shape[1] // k.shape[1]
    k, ve = (t.double().repeat_interleave(group, dim=1) for t in (k, ve))
    scores = (q.double() @ k.transpose(-1, -2)) * scaling
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), float("-inf"))
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ ve).transpose(1, 2)  # [B, Lq, Hq, Dv]


def inputs(b=2, hq=6, hkv=2, lq=37, lk=37, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, hq, d, generator=g, dtype=dtype).transpose(1, 2)  # the layout the model hands over
    k = torch.randn(b, hkv, lk, d, generator=g, dtype=dtype)
    ve = torch.randn(b, hkv, lk, 2 * d, generator=g, dtype=dtype)
    return q, k, ve


def padding_mask(b, lq, lk, pads, causal=True):
    """[B, 1, Lq, Lk] boolean, True = attend: row 0 left-padded by ``pads`` keys; padded queries attend nothing."""
    keep = torch.ones(b, lk, dtype=torch.bool)
    keep[0, :pads] = False
    offset = lk - lq
    allowed = keep[:, None, None, :].expand(b, 1, lq, lk).clone()
    if causal:
        allowed &= torch.ones(lq, lk, dtype=torch.bool).tril(offset)
    return allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [16, one_map.BLOCK_ROWS])  # 37 queries: blocks that do not divide the length
@pytest.mark.parametrize("case", ["causal", "padded", "additive", "decode", "prefix"])
def test_one_map_is_eager_attention_over_values_and_states(case, rows, dtype, monkeypatch):
    monkeypatch.setattr(one_map, "BLOCK_ROWS", rows)
    lq, lk = {"decode": (1, 41), "prefix": (9, 41)}.get(case, (37, 37))
    q, k, ve = inputs(lq=lq, lk=lk, dtype=dtype, seed=len(case))
    mask, causal = None, case == "causal"
    if case in ("padded", "prefix"):
        mask = padding_mask(2, lq, lk, pads=5)
    elif case == "additive":
        mask = torch.randn(2, 1, lq, lk, dtype=dtype) + torch.zeros(lq, lk, dtype=dtype).masked_fill(
            torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    out = one_map.attend_values_and_states(q, k, ve, mask, 0.3, causal)
    assert out.shape == (2, lq, 6, 32) and out.dtype == dtype
    torch.testing.assert_close(out, reference(q, k, ve, mask, 0.3, causal).to(dtype), **TOL[dtype])


def test_one_map_equals_the_two_sdpa_calls_it_replaces_and_zeroes_rows_without_keys():
    q, k, ve = inputs(lq=40, lk=40)
    mask = padding_mask(2, 40, 40, pads=7)  # row 0's first 7 queries attend nothing
    two = torch.cat([F.scaled_dot_product_attention(q, k, part, attn_mask=mask, scale=0.25, enable_gqa=True)
                     for part in (ve[..., :16], ve[..., 16:])], dim=-1).transpose(1, 2)
    out = one_map.attend_values_and_states(q, k, ve, mask, 0.25, False)
    torch.testing.assert_close(out, two, **TOL[torch.float32])
    assert torch.equal(out[0, :7], torch.zeros_like(out[0, :7])) and out[0, 7:].abs().min() > 0


def test_one_map_bounds_the_scores_it_holds(monkeypatch):
    """At most MAX_SCORES scores at a time: fewer query rows per block past that, down to one, same result."""
    q, k, ve = inputs(lq=30, lk=30)
    expected = one_map.attend_values_and_states(q, k, ve, None, 0.3, True)
    seen = []
    real_softmax = torch.softmax
    monkeypatch.setattr(one_map.torch, "softmax", lambda x, dim: seen.append(x.numel()) or real_softmax(x, dim=dim))
    monkeypatch.setattr(one_map, "MAX_SCORES", 2 * 6 * 30 * 4)  # four rows of scores for every head
    out = one_map.attend_values_and_states(q, k, ve, None, 0.3, True)
    assert len(seen) == 8 and max(seen) <= one_map.MAX_SCORES  # 30 rows in blocks of 4
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


def test_one_map_broadcasts_a_mask_shared_by_every_query():
    q, k, ve = inputs(lq=5, lk=30)
    keep = torch.ones(2, 1, 1, 30, dtype=torch.bool)
    keep[0, ..., :4] = False
    out = one_map.attend_values_and_states(q, k, ve, keep, 0.3, False)
    torch.testing.assert_close(out, reference(q, k, ve, keep.expand(2, 1, 5, 30), 0.3, False).float(),
                               **TOL[torch.float32])


@pytest.mark.parametrize("bad", ["heads", "width", "causal-mask", "mask-keys"])
def test_one_map_refuses_shapes_it_cannot_attend(bad):
    q, k, ve = inputs(hq=5 if bad == "heads" else 6)
    if bad == "width":
        k = k[..., :8]
    mask = {"causal-mask": padding_mask(2, 37, 37, 3), "mask-keys": padding_mask(2, 37, 36, 3)}.get(bad)
    with pytest.raises(ValueError, match="attend_values_and_states"):
        one_map.attend_values_and_states(q, k, ve, mask, 0.3, bad == "causal-mask")


def perturbed_tape(arch="llama", dtype=torch.float32, **config):
    model = hf_posenc.patch_model(tiny_model(arch, "sdpa", **config), "tape").to(dtype)
    g = torch.Generator().manual_seed(0)
    for block in (m for m in model.modules() if isinstance(m, TapeBlock)):
        for p in block.parameters():
            p.data = (torch.randn(p.shape, generator=g) * 0.3).to(dtype)
    return model


def count_calls(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_model_takes_one_map_in_inference_and_two_calls_in_training_with_the_same_logits(arch, monkeypatch):
    model = perturbed_tape(arch)
    ids, mask = padded_batch()
    calls = count_calls(monkeypatch, attention, "attend_values_and_states")
    inference = logits(model, ids, attention_mask=mask)
    layers = model.config.num_hidden_layers - 1  # the last layer computes no Ẽ
    assert len(calls) == layers
    training = model(ids, attention_mask=mask).logits.detach()  # parameters need gradients: two SDPA calls
    assert len(calls) == layers
    real = mask.bool()
    torch.testing.assert_close(inference[real], training[real], rtol=1e-5, atol=1e-5)


def test_static_and_dynamic_cache_generation_agree_on_the_one_map_path():
    model = perturbed_tape(dtype=torch.float64)
    ids = random_ids(1, 9)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    dynamic = model.generate(ids, **kw)
    static = model.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(dynamic, static)


def test_at_init_the_unread_e_tilde_is_skipped_and_computed_again_once_w_att_moves(monkeypatch):
    """W_att = 0: eq. 7 adds W_att·Ẽ = 0, so inference skips Ẽ (the cache still holds [V | E]); training computes
    it (W_att's gradient needs it); a non-zero W_att brings it back."""
    model = hf_posenc.patch_model(tiny_model("llama", "sdpa", num_hidden_layers=3), "tape")
    calls = count_calls(monkeypatch, attention, "mix_values_and_states")
    with torch.no_grad():
        cache = model(random_ids(1, 6), use_cache=True).past_key_values
    assert calls == [] and [layer.values.shape[-1] for layer in cache.layers] == [32, 32, 16]
    model(random_ids(1, 6)).logits.sum().backward()
    assert len(calls) == 2 and all(b.attn_mix.weight.grad.abs().sum() > 0 for b in model.modules()
                                   if isinstance(b, TapeBlock))
    model.model.layers[1].tape.attn_mix.weight.data[0, 0] = 1e-3
    logits(model, random_ids(1, 6))
    assert len(calls) == 3  # layer 1 only
