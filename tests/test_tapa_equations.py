"""TAPA models checked against the paper's score, written here in float64 without the implementation's maths.

Token-Aware Phase Attention (``tapa-token-aware-phase-attention.md``): with q = (q_A, q_P), k = (k_A, k_P) split at
θD dimensions (eq. 11),

    eq. 12   s(m, n) = q_A·k_A / √(θD) · cos(2π |m − n|^α · q_P·k_P / √((1−θ)D))
    eq. 16   linear phase (§4.5): q_P·k_P replaced by (q_P, k_P)·1 = Σ q_P + Σ k_P

then the causal softmax over real (unpadded) keys and P·V. The whole forward of Llama-style models (Llama, Qwen2,
Qwen3) is rebuilt here from the stock sub-modules (norms, projections, MLP) with this score, and compared with the
patched model. Non-default α, θ and phases, and query/key weights scaled so that the phase is of order 1 rad (at
the default initialisation it is ~0.1 rad, small enough to hide a wrong distance), make a wrong option, a wrong
key position or a dropped padding mask visible: each test checks that the mistake it guards moves the logits by
far more than its tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch

import hf_posenc
from tiny import random_ids, tiny_model

FAMILIES = ["llama", "qwen2", "qwen3"]
# Multipliers of the query/key weights (of the per-head q/k norms for Qwen3, whose norms undo a projection scale)
# giving a median phase 2π·q_P·k_P/√((1−θ)D) of about 0.5-1 rad per unit distance in the first layer.
PHASE_SCALE = {"llama": 3.0, "qwen2": 3.0, "qwen3": 0.4}
OPTIONS = [
    dict(alpha=0.7, theta=0.25, phase="quadratic"),
    dict(alpha=0.4, theta=0.75, phase="linear"),
]
DEFAULTS = dict(alpha=0.1, theta=0.5, phase="quadratic")
# float64 throughout, except the Llama-family RMSNorm, which computes in float32: an input differing in the last
# float64 bits can round to a neighbouring float32 (relative 6e-8). Guarded effects are >= 1e-2.
TOL64 = dict(rtol=1e-6, atol=1e-6)
# the Triton kernel (float32, under the interpreter on CPU) against the float64 reference
TOL32 = dict(rtol=1e-4, atol=2e-4)
MIN_EFFECT = 1e-2


# -- models ------------------------------------------------------------------------------------------------------
def scaled_tapa_model(arch: str, backend: str = "reference", dtype=torch.float64, seed: int = 0, **options):
    with pytest.warns(UserWarning, match="needs training"):
        model = hf_posenc.patch_model(tiny_model(arch, seed=seed), "tapa", backend=backend, **options)
    for layer in model.model.layers:
        attn = layer.self_attn
        for module in (attn.q_norm, attn.k_norm) if hasattr(attn, "q_norm") else (attn.q_proj, attn.k_proj):
            module.weight.data *= PHASE_SCALE[arch]
    return model.to(dtype)


# -- the paper's attention and the model around it, written independently --------------------------------------
def eq12_attention(q, k, v, q_pos, k_pos, allowed, alpha: float, theta: float, phase: str):
    """q [B, S, Hq, D]; k, v [B, T, Hkv, D]; positions [B, S], [B, T]; allowed [B, S, T] bool -> [B, S, Hq, D]."""
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    kv_of = torch.arange(hq) // (hq // hkv)
    k, v = k[:, :, kv_of], v[:, :, kv_of]
    a = round(theta * d)  # eq. 11: θD amplitude dims, then (1−θ)D phase dims
    q_a, q_p, k_a, k_p = q[..., :a], q[..., a:], k[..., :a], k[..., a:]
    amplitude = torch.einsum("bihc,bjhc->bhij", q_a, k_a) / math.sqrt(a)
    if phase == "quadratic":  # eq. 10/12
        phi = torch.einsum("bihc,bjhc->bhij", q_p, k_p) / math.sqrt(d - a)
    else:  # eq. 16
        phi = (q_p.sum(-1).transpose(1, 2)[..., :, None] + k_p.sum(-1).transpose(1, 2)[..., None, :]) / math.sqrt(d - a)
    distance = (q_pos[:, :, None] - k_pos[:, None, :]).abs().double() ** alpha  # |m − n|^α, 0 at m = n
    scores = amplitude * torch.cos(2 * math.pi * distance[:, None] * phi)
    scores = scores.masked_fill(~allowed[:, None], -math.inf)
    p = torch.softmax(scores, dim=-1)
    p = torch.where(allowed[:, None].any(-1, keepdim=True), p, torch.zeros_like(p))  # rows with no key: zeros
    return torch.einsum("bhij,bjhc->bihc", p, v)


def reference_logits(model, ids: torch.Tensor, valid: torch.Tensor, shift_keys_after: int | None = None,
                     **options) -> torch.Tensor:
    """Llama-family forward with eq. 12/16 attention; positions count real tokens (distances need nothing else).

    ``shift_keys_after=p`` moves every key one position further from the queries after index p (what a decode step
    with an off-by-one key position would compute), to size that mistake."""
    options = {**DEFAULTS, **options}
    b, s = ids.shape
    positions = valid.long().cumsum(-1) - 1
    allowed = torch.ones(s, s, dtype=torch.bool).tril()[None] & valid[:, None, :]
    cfg = model.config
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    with torch.no_grad():
        x = model.model.embed_tokens(ids)
        for layer in model.model.layers:
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = attn.q_proj(h).view(b, s, hq, d), attn.k_proj(h).view(b, s, hkv, d), attn.v_proj(h).view(b, s, hkv, d)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            o = eq12_attention(q, k, v, positions, positions, allowed, **options)
            if shift_keys_after is not None:
                p = shift_keys_after
                late = eq12_attention(q[:, p:], k, v, positions[:, p:], positions - 1, allowed[:, p:], **options)
                o = torch.cat([o[:, :p], late], dim=1)
            x = x + attn.o_proj(o.reshape(b, s, hq * d))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return model.lm_head(model.model.norm(x))


def model_logits(model, ids, **kw):
    with torch.no_grad():
        return model(ids, **kw).logits


def first_layer_phase(model, ids: torch.Tensor, theta: float) -> torch.Tensor:
    """|2π q_P·k_P / √((1−θ)D)| of every query/key pair of the first layer (the phase per unit distance)."""
    attn, layer = model.model.layers[0].self_attn, model.model.layers[0]
    b, s = ids.shape
    d = attn.head_dim
    with torch.no_grad():
        h = layer.input_layernorm(model.model.embed_tokens(ids))
        q, k = attn.q_proj(h).view(b, s, -1, d), attn.k_proj(h).view(b, s, -1, d)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
    a = round(theta * d)
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    return (2 * math.pi * torch.einsum("bihc,bjhc->bhij", q[..., a:], k[..., a:]) / math.sqrt(d - a)).abs()


# -- full passes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", OPTIONS, ids=["quadratic", "linear"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_full_pass_follows_eq_12_and_16(arch, options):
    model = scaled_tapa_model(arch, **options)
    ids = random_ids(2, 16, seed=21)
    valid = torch.ones_like(ids, dtype=torch.bool)
    want = reference_logits(model, ids, valid, **options)
    torch.testing.assert_close(model_logits(model, ids), want, **TOL64)

    median_phase = float(first_layer_phase(model, ids, options["theta"]).median())
    assert 0.2 < median_phase < 3.0, median_phase  # positions matter: the phase is of order 1 rad
    # every option matters here: the paper's defaults, or any one of them, give other logits
    for changed in (DEFAULTS, dict(options, alpha=0.1), dict(options, theta=0.5),
                    dict(options, phase="linear" if options["phase"] == "quadratic" else "quadratic")):
        other = reference_logits(model, ids, valid, **changed)
        assert (other - want).abs().max() > MIN_EFFECT, changed


@pytest.mark.parametrize("options", OPTIONS, ids=["quadratic", "linear"])
def test_triton_kernel_in_the_model_follows_eq_12_and_16(options):
    model = scaled_tapa_model("llama", "triton", torch.float32, **options)
    ids = random_ids(2, 16, seed=22)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding through the kernel's key padding mask
    got = model_logits(model, ids, attention_mask=mask)
    want = reference_logits(model.double(), ids, mask.bool(), **options)
    torch.testing.assert_close(got.double()[mask.bool()], want[mask.bool()], **TOL32)


# -- padding -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("explicit_positions", [False, True], ids=["index-positions", "generate-positions"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_left_padding_equals_unpadded_rows(arch, explicit_positions):
    options = OPTIONS[0]
    model = scaled_tapa_model(arch, **options)
    pads = 5
    a, b = random_ids(1, 11, seed=23), random_ids(1, 16, seed=24)
    batch = torch.cat([torch.cat([torch.full((1, pads), 7), a], dim=1), b])  # pad ids are ordinary tokens
    mask = torch.ones_like(batch)
    mask[0, :pads] = 0
    kw = dict(attention_mask=mask)
    if explicit_positions:  # what `generate` passes for left-padded rows
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model_logits(model, batch, **kw)
    torch.testing.assert_close(out[0, pads:], model_logits(model, a)[0], **TOL64)
    torch.testing.assert_close(out[1], model_logits(model, b)[0], **TOL64)
    torch.testing.assert_close(out[0, pads:], reference_logits(model, a, torch.ones_like(a, dtype=torch.bool),
                                                               **options)[0], **TOL64)
    # attending to the padding would change the padded row by far more than the tolerance
    unmasked = reference_logits(model, batch[:1], torch.ones(1, batch.shape[1], dtype=torch.bool), **options)
    assert (unmasked[0, pads:] - out[0, pads:]).abs().max() > MIN_EFFECT


# -- decoding with the KV cache ---------------------------------------------------------------------------------
DECODE_CASES = [
    ("reference", torch.float64, TOL64, DEFAULTS),  # α = 0.1: the distance enters only through |m − n|^0.1
    ("reference", torch.float64, TOL64, OPTIONS[1]),
    ("triton", torch.float32, TOL32, OPTIONS[0]),
]


@pytest.mark.parametrize("backend, dtype, tol, options", DECODE_CASES, ids=["reference-default", "reference-linear",
                                                                           "triton-quadratic"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_decode_equals_the_full_pass(arch, backend, dtype, tol, options):
    """Prefix, then one token, then three tokens at once, each against the cache; compared with one full pass
    and with the reference."""
    model = scaled_tapa_model(arch, backend, dtype, **options)
    ids = random_ids(1, 15, seed=25)
    full = model_logits(model, ids)
    with torch.no_grad():
        out = model(ids[:, :11], use_cache=True)
        one = model(ids[:, 11:12], past_key_values=out.past_key_values, use_cache=True)
        three = model(ids[:, 12:], past_key_values=one.past_key_values, use_cache=True)
    steps = torch.cat([one.logits, three.logits], dim=1).double()
    torch.testing.assert_close(steps, full[:, 11:].double(), **tol)
    model.double()
    want = reference_logits(model, ids, torch.ones_like(ids, dtype=torch.bool), **options)
    torch.testing.assert_close(steps, want[:, 11:], **tol)
    # keys one position off would change the decoded logits by far more than the tolerance
    shifted = reference_logits(model, ids, torch.ones_like(ids, dtype=torch.bool), shift_keys_after=11, **options)
    assert (shifted[:, 11:] - want[:, 11:]).abs().max() > 10 * tol["atol"]


def test_decode_of_a_left_padded_batch_equals_unpadded_rows():
    model = scaled_tapa_model("llama", **OPTIONS[0])
    pads = 4
    a, b = random_ids(1, 10, seed=26), random_ids(1, 14, seed=27)
    batch = torch.cat([torch.cat([torch.full((1, pads), 9), a], dim=1), b])
    mask = torch.ones_like(batch)
    mask[0, :pads] = 0
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        out = model(batch[:, :-2], attention_mask=mask[:, :-2], position_ids=positions[:, :-2], use_cache=True)
        step = model(batch[:, -2:], attention_mask=mask, position_ids=positions[:, -2:],
                     past_key_values=out.past_key_values, use_cache=True).logits
    torch.testing.assert_close(step[0], model_logits(model, a)[0, -2:], **TOL64)
    torch.testing.assert_close(step[1], model_logits(model, b)[0, -2:], **TOL64)
