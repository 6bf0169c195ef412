"""TAPE checked against the paper's equations, written here in float64 without the implementation's maths.

TAPE §3.2 (``tape-contextualized-equivariant-pe.md``), with the choices of the authors' released code
(``notes/tape-reference-facts.md``): one complex state z per RoPE frequency per key/value head, stored as the
channels [Re z_0 … Re z_{F−1}, Im z_0 … Im z_{F−1}];

* eq. 6 (φ = identity): logit(i, j) = s · Re Σ_f q_f z_{i,f} · conj(k_f z_{j,f}), with q_f = q[f] + i·q[f+F] (the
  rotate-half pairing of Transformers' RoPE) and z from the query head's key/value head (head h reads kv head
  h // (Hq/Hkv), as ``repeat_kv``);
* eq. 7: Ẽ_h = P_h·E (the same softmax P as the token attention), then E ← E + W_att·Ẽ (W_att: query heads → kv
  heads);
* eq. 8: E ← E + W₂·(silu(W_ψ·m) ⊙ W₁·E), m the token MLP's output before the residual add (the released code;
  the paper calls it x̃_j), W₁/W₂ acting on the head axis and shared over the channels.

Complex arithmetic (``torch.complex128``) replaces the implementation's rotate-half formula, and einsums replace
its linear layers, so a wrong head, a wrong operand or a missing term shows up as a difference of order 0.1-1 while the
two computations agree to ~1e-7 (eager's float32 softmax; ~1e-13 with SDPA). The TAPE weights are random (not zero-initialised), so every term contributes;
each test also checks that every term moves the output by far more than its tolerance.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import hf_posenc
from hf_posenc.schemes.tape import TapeBlock
from tiny import random_ids, tiny_model

# float64 on both sides, except that Transformers' eager attention takes its softmax in float32 and Gemma's RMSNorm
# computes in float32 (errors up to ~7e-7 on outputs of size ~5; SDPA paths agree to ~1e-15). The effects guarded
# below are of order 0.1-1.
TOL = dict(rtol=1e-6, atol=2e-6)
MIN_EFFECT = 1e-3  # every term must change the result by at least this (10⁴ × the tolerance)


# -- setup -----------------------------------------------------------------------------------------------------
def tape_model(arch: str, backend: str = "eager", seed: int = 0, **config):
    """A TAPE-patched tiny model in float64 with random (non-zero) TAPE weights."""
    model = hf_posenc.patch_model(tiny_model(arch, backend, seed=seed, **config), "tape").double()
    g = torch.Generator().manual_seed(100 + seed)
    for block in (m for m in model.modules() if isinstance(m, TapeBlock)):
        for p in block.parameters():
            p.data = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5
    return model


def causal_mask(valid: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Additive [B, 1, S, S] mask: key j visible to query i iff j <= i and key j is a real token (as Transformers)."""
    seq = valid.shape[1]
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()[None] & valid[:, None, :].bool()
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def as_complex(real_channels: torch.Tensor) -> torch.Tensor:
    """[..., 2F] = [re | im] -> [..., F] complex128."""
    f = real_channels.shape[-1] // 2
    return torch.complex(real_channels[..., :f], real_channels[..., f:])


# -- the paper's layer, written independently ----------------------------------------------------------------
def reference_layer(layer, x: torch.Tensor, e: torch.Tensor, mask: torch.Tensor, block: TapeBlock | None):
    """One decoder layer with TAPE (eq. 6–8). x [B, S, C]; e [B, S, Hkv, D]; mask additive [B, 1, S, S].

    Returns (x_out, e_out); e_out is None when the layer has no TAPE block (its update is read by no later layer).
    The stock sub-modules (norms, projections, MLP) are used as they are; the TAPE maths is written here.
    """
    attn, config = layer.self_attn, layer.self_attn.config
    b, s, _ = x.shape
    hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, attn.head_dim
    kv_of = torch.arange(hq) // (hq // hkv)  # query head -> its key/value head

    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(b, s, hq, d)
    k = attn.k_proj(h).view(b, s, hkv, d)
    v = attn.v_proj(h).view(b, s, hkv, d)
    if hasattr(attn, "q_norm"):  # Qwen3 / Gemma3 per-head norms come before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)

    z = as_complex(e)  # [B, S, Hkv, F]
    q_rot = as_complex(q) * z[:, :, kv_of]  # eq. 6: each query head rotated by its own kv head's state
    k_rot = as_complex(k) * z
    logits = attn.scaling * torch.einsum("bihf,bjhf->bhij", q_rot, k_rot[:, :, kv_of].conj()).real
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    p = torch.softmax(logits + mask, dim=-1)  # [B, Hq, S, S]: ONE map for tokens and states

    o = torch.einsum("bhij,bjhd->bihd", p, v[:, :, kv_of])
    attn_out = attn.o_proj(o.reshape(b, s, hq * d))
    e_tilde = torch.einsum("bhij,bjhc->bihc", p, e[:, :, kv_of])  # eq. 7: Ẽ_h = P_h · E  [B, S, Hq, D]

    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma2/3 sandwich norms
        x = x + layer.post_attention_layernorm(attn_out)
        m = layer.mlp(layer.pre_feedforward_layernorm(x))
        x = x + layer.post_feedforward_layernorm(m)
    else:
        x = x + attn_out
        m = layer.mlp(layer.post_attention_layernorm(x))
        x = x + m
    if block is None:
        return x, None

    w_att, w_psi = block.attn_mix.weight, block.w_psi.weight  # [Hkv, Hq], [I, C]
    w1, w2 = block.w1.weight, block.w2.weight  # [I, Hkv], [Hkv, I]
    e = e + torch.einsum("gh,bihc->bigc", w_att, e_tilde)  # residual + head mixing of Ẽ
    gate = torch.nn.functional.silu(torch.einsum("ic,bsc->bsi", w_psi, m))  # ψ(m): the diagonal of eq. 8
    e = e + torch.einsum("gi,bsi,ih,bshc->bsgc", w2, gate, w1, e)  # eq. 8: W₂ ψ(m) W₁ᵀ E
    return x, e


def run_layer(layer, x, states, mask, grad: bool = False):
    """The implementation's layer on (x, states [B, S, T, Hkv, D]); returns (x_out, states_out or None).

    ``grad``: with x requiring a gradient, as in training (SDPA on CPU then computes O and Ẽ with two calls; in
    inference, with one map blocked over query rows)."""
    with torch.set_grad_enabled(grad):
        out = layer((x.clone().requires_grad_(grad), states), attention_mask=mask,
                    position_ids=torch.arange(x.shape[1])[None])
    out = out if isinstance(out, tuple) else (out, None)
    return tuple(None if t is None else t.detach() for t in out)


def state_index(model, layer_idx: int) -> int:
    """Which of the per-layer-type states a layer reads (sorted type names; one state unless Gemma3)."""
    rope = model.config.rope_parameters
    nested = model.config.nested_rope_parameter_keys(rope)
    if not nested:
        return 0
    types = sorted(k for k in nested if rope[k] is not None)
    return types.index(model.config.layer_types[layer_idx])


LAYER_CASES = [
    ("llama", "eager", {}),
    ("llama", "sdpa", {}),
    ("qwen2", "sdpa", {}),  # q/k/v biases
    ("qwen3", "eager", {}),  # per-head q/k norms before the rotation
    ("gemma2", "eager", {}),  # sandwich norms, logit soft-capping, query_pre_attn_scalar
    ("gemma3_text", "sdpa", dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)),
]


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("arch, backend, config", LAYER_CASES, ids=[f"{a}-{b}" for a, b, _ in LAYER_CASES])
def test_layer_follows_eq_6_to_8(arch, backend, config, grad):
    model = tape_model(arch, backend, **config)
    layer = model.model.layers[0]
    block = layer.tape
    cfg = model.config
    g = torch.Generator().manual_seed(3)
    b, s = 2, 9
    n_types = len(cfg.nested_rope_parameter_keys(cfg.rope_parameters) or [None])
    x = torch.randn(b, s, cfg.hidden_size, generator=g, dtype=torch.float64)
    # a random state per token, kv head and layer type: heads differ, so reading the wrong head's state shows
    states = torch.randn(b, s, n_types, cfg.num_key_value_heads, cfg.head_dim, generator=g, dtype=torch.float64)
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[0, :3] = False  # a left-padded row
    mask = causal_mask(valid)
    t = state_index(model, 0)

    x_out, states_out = run_layer(layer, x, states, mask, grad)
    x_ref, e_ref = reference_layer(layer, x, states[:, :, t], mask, block)

    real = valid  # padded queries see no key; their outputs are not defined
    torch.testing.assert_close(x_out[real], x_ref[real], **TOL)
    torch.testing.assert_close(states_out[:, :, t][real], e_ref[real], **TOL)
    others = [i for i in range(n_types) if i != t]
    assert torch.equal(states_out[:, :, others], states[:, :, others])  # the other layer type's state passes by

    # every term of eq. 7-8 moves the state by far more than the tolerance (the test can fail)
    e = states[:, :, t]
    _, no_att = reference_layer(layer, x, e, mask, _with(block, attn_mix=0.0))
    _, no_mlp = reference_layer(layer, x, e, mask, _with(block, w2=0.0))
    for without in (no_att, no_mlp, e):
        assert (without[real] - e_ref[real]).abs().max() > MIN_EFFECT


def _with(block: TapeBlock, **zeroed: float) -> TapeBlock:
    """A copy of ``block`` with the named weights set to a constant."""
    out = copy.deepcopy(block)
    for name, value in zeroed.items():
        getattr(out, name).weight.data.fill_(value)
    return out


# -- the whole model: E₀ from the rotary frequencies, states carried across layers ----------------------------
def initial_state(model, positions: torch.Tensor) -> torch.Tensor:
    """E₀ (§3.3: RoPE as the initial state): z_f = exp(i·pos·θ_f), θ_f = base^(−2f/D), the same for every kv head."""
    cfg = model.config
    d, base = cfg.head_dim, cfg.rope_parameters["rope_theta"]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[..., None] * theta  # [B, S, F]
    e = torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)
    return e[:, :, None, :].expand(-1, -1, cfg.num_key_value_heads, -1)


def reference_model_logits(model, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Llama-family forward with :func:`reference_layer` in every layer (positions 0..S−1, as Transformers)."""
    positions = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
    x = model.model.embed_tokens(ids)
    e = initial_state(model, positions)
    mask = causal_mask(valid)
    layers = model.model.layers
    with torch.no_grad():
        for i, layer in enumerate(layers):
            x, e_next = reference_layer(layer, x, e, mask, getattr(layer, "tape", None))
            assert (e_next is None) == (i == len(layers) - 1)  # only the last layer drops its update
            e = e_next
        return model.lm_head(model.model.norm(x))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_logits_follow_eq_6_to_8_across_layers(arch):
    model = tape_model(arch, "sdpa", num_hidden_layers=3)
    ids = random_ids(2, 12, seed=11)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :4] = False
    with torch.no_grad():
        got = model(ids, attention_mask=valid.long()).logits
    want = reference_model_logits(model, ids, valid)
    torch.testing.assert_close(got[valid], want[valid], **TOL)
    # the positional states matter at this scale: plain RoPE (TAPE weights at zero) is far away
    plain = tiny_model(arch, "sdpa", num_hidden_layers=3).double()
    with torch.no_grad():
        rope = plain(ids, attention_mask=valid.long()).logits
    assert (rope[valid] - want[valid]).abs().max() > MIN_EFFECT
    assert math.isfinite(float(want[valid].abs().max()))
