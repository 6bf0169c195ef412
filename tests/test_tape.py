"""TAPE on pretrained models: exact at init, trainable under gradient checkpointing, exact KV cache, the paper's
symmetries (eq. 4-5, Proposition 1)."""

import copy

import pytest
import torch

import hf_posenc
from hf_posenc.schemes.tape import TapeBlock
from hf_posenc.schemes.tape.modeling import FEW_HEADS, mix_heads
from tiny import ARCHS, arch_backend_pairs, greedy_without_cache, logits, padded_batch, random_ids, tiny_model


# Tolerance where two computations of the same function take different kernel paths (PyTorch folds a CPU matmul
# differently when requires_grad differs, as between a PEFT model being trained and one loaded for inference):
# float rounding, orders of magnitude below what a lost or wrong TAPE weight changes (6e-2 in the PEFT test).
SAME_FUNCTION_TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def assert_same_function(actual, expected):
    tol = SAME_FUNCTION_TOL[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def tape_blocks(model):
    return [m for m in model.modules() if isinstance(m, TapeBlock)]


def perturb(model, seed=0, std=0.3):
    g = torch.Generator().manual_seed(seed)
    for block in tape_blocks(model):
        for p in block.parameters():
            p.data = torch.randn(p.shape, generator=g) * std
    return model


def test_fused_kernel_reads_values_and_states_in_place(monkeypatch):
    """The cache holds [V | E] rows; the fused path hands the kernel V and E as views of them (one storage, unit last
    stride), not copies: a copy of both halves of the cache per layer per token would cost decode more than the
    kernel itself at long contexts."""
    import hf_posenc.kernels.tape as kernels

    seen = []
    real = kernels.tape_attention

    def spy(q, k, v, e, **options):
        seen.append((v.untyped_storage().data_ptr() == e.untyped_storage().data_ptr(), v.stride(-1), e.stride(-1)))
        return real(q, k, v, e, **options)

    monkeypatch.setattr(kernels, "tape_attention", spy)
    model = perturb(hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape", backend="triton"))
    with torch.no_grad():
        prefix = model(random_ids(1, 9), use_cache=True)
        model(random_ids(1, 1, seed=4), past_key_values=prefix.past_key_values, use_cache=True)
    assert len(seen) == 2 * model.config.num_hidden_layers  # prefill and one decode step, every layer
    assert all(seen_one == (True, 1, 1) for seen_one in seen), seen


@pytest.mark.upstream
@pytest.mark.parametrize("arch, backend", arch_backend_pairs())
def test_at_init_tape_is_bitwise_the_unpatched_model(arch, backend):
    ids, mask = padded_batch()
    reference = logits(tiny_model(arch, backend), ids, attention_mask=mask)
    model = hf_posenc.patch_model(tiny_model(arch, backend), "tape")
    # every layer whose state a later layer reads: all but the last; Gemma3 keeps one state per layer type
    assert len(tape_blocks(model)) == (0 if arch == "gemma3_text" else model.config.num_hidden_layers - 1)
    assert torch.equal(logits(model, ids, attention_mask=mask), reference)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_at_init_tape_is_bitwise_the_unpatched_model_in_half_precision(backend, dtype):
    """The KV cache holds [V | E]; attention over its V half (a strided view) rounds like the stock model's."""
    ids, mask = padded_batch()
    reference = logits(tiny_model("llama", backend).to(dtype), ids, attention_mask=mask)
    model = hf_posenc.patch_model(tiny_model("llama", backend).to(dtype), "tape")
    for use_cache in (True, False):
        assert torch.equal(logits(model, ids, attention_mask=mask, use_cache=use_cache), reference)


@pytest.mark.parametrize("frequencies", [{"scheme": "cope", "clip_low_n": 3}, {"scheme": "prope", "p": 0.5}])
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_at_init_tape_equals_its_frequency_scheme(arch, frequencies):
    ids = random_ids()
    options = {k: v for k, v in frequencies.items() if k != "scheme"}
    reference = logits(hf_posenc.patch_model(tiny_model(arch), frequencies["scheme"], **options), ids)
    model = hf_posenc.patch_model(tiny_model(arch), "tape", frequencies=frequencies)
    assert torch.equal(logits(model, ids), reference)


def test_head_mixing_really_mixes_heads():
    model = hf_posenc.patch_model(tiny_model("llama"), "tape")
    block = tape_blocks(model)[0]
    block.attn_mix.weight.data = torch.randn_like(block.attn_mix.weight)
    e = torch.zeros(1, 3, 2, 16)
    e_tilde = torch.zeros(1, 3, 4, 16)
    e_tilde[:, :, 3] = 1.0  # only the last query head carries a state
    out = block.attention_update(e, e_tilde)
    assert torch.all(out[:, :, 0] != 0) and torch.all(out[:, :, 1] != 0)  # both KV heads receive it


@pytest.mark.parametrize("source_heads", [4, FEW_HEADS + 4])  # multiply-adds, then matmul
@pytest.mark.parametrize("per_token", [False, True])  # W_att (eq. 7) or the per-token map of eq. 8
def test_mix_heads_is_the_head_axis_matmul(source_heads, per_token):
    g = torch.Generator().manual_seed(source_heads + per_token)
    x = torch.randn(2, 7, source_heads, 16, generator=g)
    weight = torch.randn(*((2, 7) if per_token else ()), 3, source_heads, generator=g)
    expected = torch.einsum("...kj,...jd->...kd", weight.double(), x.double()).float()
    torch.testing.assert_close(mix_heads(weight, x), expected, rtol=1e-6, atol=1e-6)


def test_mix_heads_refuses_a_weight_that_does_not_match_the_heads():  # the loop would read only J of them
    for weight in (torch.randn(2, 3), torch.randn(2, 5)):
        with pytest.raises(ValueError, match="head axis"):
            mix_heads(weight, torch.randn(1, 5, 4, 8))


def test_mix_heads_keeps_matmul_in_half_precision():  # one rounding of an fp32 accumulation, not one per head
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(1, 5, 4, 8, generator=g).bfloat16(), torch.randn(2, 4, generator=g).bfloat16()
    assert torch.equal(mix_heads(weight, x), weight @ x)


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_every_tape_parameter_gets_a_gradient_under_checkpointing(arch, reentrant):
    ids = random_ids()
    four = dict(num_hidden_layers=4)
    if arch == "gemma3_text":
        four["layer_types"] = ["sliding_attention", "full_attention"] * 2
    model = perturb(hf_posenc.patch_model(tiny_model(arch, **four), "tape"))
    assert len(tape_blocks(model)) >= 2
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()
    model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        if ".tape." in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_zero_initialised_maps_get_gradients_at_init():
    ids = random_ids()
    model = hf_posenc.patch_model(tiny_model("llama", num_hidden_layers=3), "tape").train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model(input_ids=ids, labels=ids).loss.backward()
    for block in tape_blocks(model):
        assert block.attn_mix.weight.grad.abs().sum() > 0 and block.w2.weight.grad.abs().sum() > 0


def test_training_only_tape_parameters_reduces_the_loss():
    torch.manual_seed(0)
    ids = random_ids(4, 32, seed=3)
    model = hf_posenc.patch_model(tiny_model("qwen3"), "tape").train()
    for name, p in model.named_parameters():
        p.requires_grad = ".tape." in name
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    losses = []
    for _ in range(12):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    # the positional states alone move a random tiny model slowly, but every step must help
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < losses[0] - 2e-3, losses


@pytest.mark.upstream
@pytest.mark.parametrize("arch, backend", arch_backend_pairs(("eager", "sdpa")))
def test_cached_generation_equals_full_forward_after_perturbation(arch, backend):
    # float64: cached and full passes differ only by float rounding, which must not flip a near-tie argmax
    model = perturb(hf_posenc.patch_model(tiny_model(arch, backend), "tape")).double()
    ids = random_ids(1, 10)
    cached = model.generate(ids, max_new_tokens=10, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    assert torch.equal(cached, greedy_without_cache(model, ids, 10))


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_equals_one_by_one(arch):
    model = perturb(hf_posenc.patch_model(tiny_model(arch, "sdpa" if arch != "gemma2" else "eager"), "tape"))
    if arch != "gemma2":  # stock eager Gemma2 turns padded rows into NaN in float64 (its mask overflows)
        model = model.double()  # batched and single rows round differently: no near-tie argmax may flip
    a, b = random_ids(1, 9, seed=5), random_ids(1, 14, seed=6)
    batch = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), a], 1), b])
    mask = torch.ones_like(batch)
    mask[0, :5] = 0
    out = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    one_a = model.generate(a, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    one_b = model.generate(b, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(out[0, 5:], one_a[0]) and torch.equal(out[1], one_b[0])


def test_proposition_1_shifting_positions_leaves_logits_unchanged():
    model = perturb(hf_posenc.patch_model(tiny_model("llama"), "tape"))
    ids = random_ids(1, 16)
    base = logits(model, ids, position_ids=torch.arange(16)[None])
    shifted = logits(model, ids, position_ids=torch.arange(16)[None] + 37)
    torch.testing.assert_close(shifted, base, rtol=1e-4, atol=1e-4)


def _layer_io(model, x, e):
    """Run the first TAPE layer bidirectionally on hidden features x [1,S,C] and a state e [1,S,Hkv,D]."""
    layer = model.model.layers[0]
    layer.self_attn.is_causal = False
    with torch.no_grad():
        x_out, states = layer((x, e[:, :, None]), attention_mask=None, position_ids=torch.arange(x.shape[1])[None])
    return x_out, states[:, :, 0]


def test_block_is_permutation_equivariant_and_rotation_equivariant():
    """Eq. 4-5: permuting tokens permutes both outputs; rotating every state by the same unit complex number per
    frequency rotates the state output and leaves the features unchanged."""
    model = perturb(hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape"))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 10, 64, generator=g)
    e = torch.randn(1, 10, 2, 16, generator=g)
    x_out, e_out = _layer_io(model, x, e)

    perm = torch.randperm(10, generator=g)
    xp, ep = _layer_io(model, x[:, perm], e[:, perm])
    torch.testing.assert_close(xp, x_out[:, perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ep, e_out[:, perm], rtol=1e-5, atol=1e-5)

    phi = torch.rand(8, generator=g) * 6.28
    def rot(s):
        re, im = s[..., :8], s[..., 8:]
        return torch.cat([re * phi.cos() - im * phi.sin(), re * phi.sin() + im * phi.cos()], dim=-1)
    xr, er = _layer_io(model, x, rot(e))
    torch.testing.assert_close(xr, x_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(er, rot(e_out), rtol=1e-5, atol=1e-5)


def test_replace_removes_tape():
    ids = random_ids()
    model = perturb(hf_posenc.patch_model(tiny_model("llama"), "tape"))
    hf_posenc.patch_model(model, "cope", clip_low_n=2, replace=True)
    assert not tape_blocks(model)
    direct = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2)
    assert torch.equal(logits(model, ids), logits(direct, ids))


@pytest.mark.parametrize(
    "options, match",
    [({"hidden": 0}, "hidden must be >= 1"), ({"frequencies": {"scheme": "tapa"}}, "must name a frequency scheme"),
     ({"frequencies": {"scheme": "cope", "clip_low_n": 99}}, "exceeds"), ({"layers": "global"}, "must stay|must be 'all'")],
)
def test_bad_tape_options(options, match):
    model = tiny_model("llama")
    before = copy.deepcopy(model.config.to_dict())
    with pytest.raises(ValueError, match=match):
        hf_posenc.patch_model(model, "tape", **options)
    assert model.config.to_dict() == before and not tape_blocks(model)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_kernel_backend_equals_the_model_attention_path(arch):
    ids, mask = padded_batch()
    auto = perturb(hf_posenc.patch_model(tiny_model(arch, "sdpa"), "tape"))
    fused = perturb(hf_posenc.patch_model(tiny_model(arch, "sdpa"), "tape", backend="triton"))
    assert fused.config._attn_implementation == "hf_posenc_tape"
    real = mask.bool()
    torch.testing.assert_close(logits(fused, ids, attention_mask=mask)[real],
                               logits(auto, ids, attention_mask=mask)[real], rtol=1e-4, atol=1e-4)
    grads = []
    for model in (auto, fused):
        model.train()
        model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(~real, -100)).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for n, p in model.named_parameters() if ".tape." in n]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-5)


def test_fused_kernel_decode_matches_the_full_pass_and_refuses_packing():
    model = perturb(hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape", backend="triton"))
    ids = random_ids(1, 14)
    full = logits(model, ids)
    with torch.no_grad():
        prefix = model(ids[:, :11], use_cache=True)
        step = model(ids[:, 11:], past_key_values=prefix.past_key_values, use_cache=True)
    torch.testing.assert_close(step.logits, full[:, 11:], rtol=1e-4, atol=1e-4)
    jumps = torch.cat([torch.arange(7), torch.arange(7)])[None]
    with pytest.raises(ValueError, match="packed sequences; use backend='auto'"):
        logits(model, ids, position_ids=jumps)
    # with a mask the tokens are one sequence (Transformers' rule), which the fused kernel computes
    auto = perturb(hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape", backend="auto"))
    auto.load_state_dict(model.state_dict())
    ones = torch.ones_like(ids)
    torch.testing.assert_close(logits(model, ids, position_ids=jumps, attention_mask=ones),
                               logits(auto, ids, position_ids=jumps, attention_mask=ones), rtol=1e-4, atol=1e-4)


@pytest.mark.upstream
def test_peft_adapter_round_trip_restores_tape_weights_and_refuses_an_unpatched_base(tmp_path):
    peft = pytest.importorskip("peft")
    from hf_posenc.adapters import load_adapter, lora_config, save_adapter

    ids = random_ids()
    model = hf_posenc.patch_model(tiny_model("llama"), "tape")
    config = lora_config(model, r=2, train_norms=True)
    assert "tape" in config.modules_to_save and "input_layernorm" in config.modules_to_save
    wrapped = peft.get_peft_model(model, config)
    for name, p in wrapped.named_parameters():  # stand-in for training: every trainable weight moves
        if p.requires_grad:
            p.data.add_(torch.randn_like(p) * 0.1)
    save_adapter(wrapped, tmp_path / "adapter")
    expected = logits(wrapped, ids)

    # loaded for inference (requires_grad off): the same function through other matmul paths
    fresh = hf_posenc.patch_model(tiny_model("llama"), "tape")
    loaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    assert_same_function(logits(loaded, ids), expected)
    again = load_adapter(hf_posenc.patch_model(tiny_model("llama"), "tape"), tmp_path / "adapter")
    assert_same_function(logits(again, ids), expected)
    for wrapper in (m for m in again.modules() if isinstance(getattr(m, "original_module", None), TapeBlock)):
        wrapper.modules_to_save["default"].load_state_dict(wrapper.original_module.state_dict())
    lost = (logits(again, ids) - expected).abs().max()  # what the check guards: the trained TAPE weights
    assert lost > 1e3 * SAME_FUNCTION_TOL[torch.float32], lost
    with pytest.raises(ValueError, match=r"patch the base first: `hf_posenc.patch_model\(base, 'tape'"):
        load_adapter(tiny_model("llama"), tmp_path / "adapter")
    unpatched = tiny_model("llama")
    with pytest.raises(ValueError, match=r"modules \['tape'\] are missing from the base"):
        peft.PeftModel.from_pretrained(unpatched, tmp_path / "adapter")  # PEFT alone would drop them silently
    assert not hasattr(unpatched, "peft_config")


FOUR_GEMMA3_LAYERS = dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)


# -- outputs that mean what they say ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, config", [("llama", {}), ("gemma3_text", FOUR_GEMMA3_LAYERS)])
def test_hidden_states_are_the_hidden_features_only(arch, config):
    ids = random_ids()
    with torch.no_grad():
        stock = tiny_model(arch, **config)(ids, output_hidden_states=True).hidden_states
        model = hf_posenc.patch_model(tiny_model(arch, **config), "tape")
        at_init = model(ids, output_hidden_states=True).hidden_states
        perturbed = perturb(model)(ids, output_hidden_states=True).hidden_states
    assert len(at_init) == len(stock) == model.config.num_hidden_layers + 1
    for ours, theirs in zip(at_init, stock):  # identity at init, layer by layer
        assert torch.equal(ours, theirs)
    assert all(h.shape == stock[0].shape for h in perturbed)
    assert not torch.allclose(perturbed[-1], at_init[-1])


def test_recorded_states_start_from_the_rotary_frequencies_and_move_with_the_weights():
    from hf_posenc.schemes.tape import record_tape_states

    ids = random_ids(2, 12)
    model = perturb(hf_posenc.patch_model(tiny_model("llama", num_hidden_layers=3), "tape"))
    with record_tape_states(model) as states, torch.no_grad():
        model(ids)
    assert len(states) == 3 and all(s.shape == (2, 12, 2, 16) for s in states)  # [B, S, Hkv, D] per layer
    cos, sin = model.model.rotary_emb(states[0], torch.arange(12)[None])
    e0 = torch.cat([cos[..., :8], sin[..., :8]], dim=-1)  # one complex number per frequency: [re | im]
    assert torch.equal(states[0], e0[:, :, None].expand(2, -1, 2, -1))
    assert not torch.allclose(states[1], states[0]) and not torch.allclose(states[2], states[1])
    with pytest.raises(ValueError, match="patch it first"):
        with record_tape_states(tiny_model("llama")):
            pass


def test_output_attentions_returns_the_maps_under_eager_and_refuses_other_backends():
    ids = random_ids(2, 12)
    with torch.no_grad():
        stock = tiny_model("llama")(ids, output_attentions=True).attentions
        model = hf_posenc.patch_model(tiny_model("llama"), "tape")
        at_init = model(ids, output_attentions=True).attentions
        maps = perturb(model)(ids, output_attentions=True).attentions
    assert len(at_init) == len(stock) == 2
    for ours, theirs in zip(at_init, stock):
        assert torch.equal(ours, theirs)
    for p in maps:  # [B, Hq, S, S]: causal rows of a softmax
        assert p.shape == (2, 4, 12, 12)
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 12))
        assert torch.all(p.triu(1) == 0)
    assert not torch.allclose(maps[1], at_init[1])  # the perturbed states move the second layer's map
    sdpa = hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape")
    with pytest.raises(ValueError, match="attention maps only with attn_implementation='eager'"):
        logits(sdpa, ids, output_attentions=True)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_dropout_draws_one_mask_for_values_and_states(backend):
    """Eq. 7 mixes the states with the P that mixes the values, dropout included: fed the same tensor as values
    and as states, both outputs must come out identical."""
    from hf_posenc.schemes.tape import mix_values_and_states

    model = hf_posenc.patch_model(tiny_model("llama", backend, attention_dropout=0.5), "tape").train()
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 10, 16, generator=g) for h in (4, 2, 2))
    torch.manual_seed(0)
    o, e_tilde, _ = mix_values_and_states(attn, q, k, torch.cat([v, v], dim=-1), None, dropout=0.5, scaling=0.25)
    assert torch.equal(o, e_tilde)
    torch.manual_seed(0)
    plain, _, _ = mix_values_and_states(attn, q, k, torch.cat([v, v], dim=-1), None, dropout=0.0, scaling=0.25)
    assert not torch.allclose(o, plain)  # dropout did act
    loss = model(input_ids=random_ids(), labels=random_ids()).loss  # and a training step runs with it
    loss.backward()
    assert torch.isfinite(loss)


def test_mix_values_and_states_refuses_values_without_states():
    from hf_posenc.schemes.tape import mix_values_and_states

    attn = hf_posenc.patch_model(tiny_model("llama", "sdpa"), "tape").model.layers[0].self_attn
    q, k, v = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match=r"\[V \| E\], 2 x head_dim = 32"):
        mix_values_and_states(attn, q, k, v, None, scaling=0.25)


def test_fused_kernel_refuses_dropout():
    model = hf_posenc.patch_model(tiny_model("llama", "sdpa", attention_dropout=0.1), "tape", backend="triton")
    with pytest.raises(ValueError, match="no attention dropout"):
        model.train()(input_ids=random_ids(1, 8))


def test_kv_cache_holds_the_states_only_where_a_later_layer_reads_them():
    """Layers that mix states cache [V | E] (1.5x the plain K/V); the last layer computes no Ẽ and caches plain V."""
    model = hf_posenc.patch_model(tiny_model("llama", "sdpa", num_hidden_layers=3), "tape")
    with torch.no_grad():
        cache = model(random_ids(1, 6), use_cache=True).past_key_values
    assert [layer.keys.shape[-1] for layer in cache.layers] == [16, 16, 16]
    assert [layer.values.shape[-1] for layer in cache.layers] == [32, 32, 16]


@pytest.mark.upstream
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("trained", [False, True], ids=["at_init", "trained"])
@pytest.mark.parametrize("backend, attn", [("auto", "eager"), ("auto", "sdpa"), ("triton", "sdpa")])
def test_generate_equals_full_forward_for_every_backend_and_cache(backend, attn, trained, cache):
    """Every TAPE backend, at init (where CPU inference skips Ẽ while W_att = 0: the fused kernel still takes
    [V | E]) and with trained weights, through a dynamic and a static cache, generates what full forwards choose."""
    model = hf_posenc.patch_model(tiny_model("qwen3", attn), "tape", backend=backend)
    if trained:
        perturb(model)
    if backend == "auto":  # float64: no near-tie argmax may flip between cached and full passes
        model = model.double()
    ids = random_ids(1, 9)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    out = model.generate(ids, **kw) if cache == "dynamic" else model.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(out, greedy_without_cache(model, ids, 6))
