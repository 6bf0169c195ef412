"""Scheme configs and the frequencies they produce, checked against formulas written independently here."""

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import hf_posenc
from hf_posenc import CoPEConfig, HardClipConfig, PRoPEConfig, RoPEConfig
from tiny import random_ids, tiny_model

D = 16  # head dim of the tiny models
N = D // 2


def default_inv_freq(theta: float, d: int = D) -> torch.Tensor:
    return torch.tensor([theta ** (-2.0 * j / d) for j in range(d // 2)], dtype=torch.float64)


def cope_weights(n: int, c: int) -> list[float]:
    """Eq. 10 in index form: 1 before the onset n − c, then ½(1 + cos(π·k/(c−1))) for k = 0..c−1."""
    w = [1.0] * n
    for k in range(c):
        w[n - c + k] = 1.0 if c == 1 else 0.5 * (1 + math.cos(math.pi * k / (c - 1)))
    return w


def inv_freq(model) -> torch.Tensor:
    return model.model.rotary_emb.inv_freq.double()


@pytest.mark.parametrize("c", [0, 1, 3, N])
def test_cope_frequencies_follow_eq10(c):
    model = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=c)
    expected = default_inv_freq(10000.0) * torch.tensor(cope_weights(N, c), dtype=torch.float64)
    got = inv_freq(model)
    torch.testing.assert_close(got, expected, rtol=2e-7, atol=0)
    if c > 1:
        assert got[-1] == 0.0 and got[N - c] == pytest.approx(expected[N - c].item(), rel=1e-7)


@pytest.mark.parametrize("c", [1, 3, N])
def test_hardclip_zeroes_lowest_frequencies(c):
    unpatched = inv_freq(tiny_model("llama"))
    got = inv_freq(hf_posenc.patch_model(tiny_model("llama"), "hardclip", clip_low_n=c))
    assert torch.equal(got[: N - c], unpatched[: N - c])
    assert torch.all(got[N - c :] == 0)


def test_cope_default_clip_scales_the_papers_setting():
    scheme = hf_posenc.get_scheme(hf_posenc.patch_model(tiny_model("llama"), "cope"))
    assert scheme.clip_low_n == round(20 * N / 64)  # 20 of 64 frequencies, scaled to 8


def apply_p_rope_paper(inputs, positions, head_dim, max_wavelength, rope_percentage):
    """The paper's Appendix D algorithm (JAX), transcribed to torch in float64."""
    rope_angles = int(rope_percentage * head_dim // 2)
    nope_angles = head_dim // 2 - rope_angles
    fraction = 2.0 * torch.arange(0, rope_angles, dtype=torch.float64) / head_dim
    timescale = torch.cat([max_wavelength**fraction, torch.full((nope_angles,), math.inf, dtype=torch.float64)])
    sinusoid = positions[..., None] / timescale[None, None, :]
    sinusoid = sinusoid[..., None, :]  # [B, L, 1, D/2]: broadcast over heads of inputs [B, L, H, D]
    sin, cos = torch.sin(sinusoid), torch.cos(sinusoid)
    first, second = torch.chunk(inputs, 2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_prope_equals_the_papers_apply_p_rope(p):
    model = hf_posenc.patch_model(tiny_model("llama"), "prope", p=p)
    assert model.config.rope_parameters["rope_type"] == "proportional"
    q = torch.randn(1, 12, 4, D, dtype=torch.float64)  # [B, L, H, D]
    positions = torch.arange(12)[None]
    cos, sin = model.model.rotary_emb(q.float(), positions)
    ours, _ = apply_rotary_pos_emb(q, q, cos.double(), sin.double(), unsqueeze_dim=2)
    paper = apply_p_rope_paper(q, positions.double(), D, 10000.0, p)
    torch.testing.assert_close(ours, paper, rtol=1e-5, atol=1e-5)


def test_cope_composes_with_abf_and_yarn():
    """The paper's CoPE + ABF + YaRN setup: the taper multiplies YaRN's frequencies and keeps its scaling."""
    scheme = CoPEConfig(clip_low_n=3, rope_theta=1e6, scaling="yarn", factor=4.0)
    patched = hf_posenc.patch_model(tiny_model("llama"), scheme)
    yarn = hf_posenc.patch_model(tiny_model("llama"), RoPEConfig(rope_theta=1e6, scaling="yarn", factor=4.0))
    w = torch.tensor(cope_weights(N, 3), dtype=torch.float32)
    assert torch.equal(patched.model.rotary_emb.inv_freq, yarn.model.rotary_emb.inv_freq * w)
    assert patched.model.rotary_emb.attention_scaling == yarn.model.rotary_emb.attention_scaling != 1.0
    params = patched.config.rope_parameters
    assert (params["rope_type"], params["base_rope_type"], params["rope_theta"]) == ("cope", "yarn", 1e6)


@pytest.mark.parametrize("scaling", ["linear", "llama3"])
def test_cope_over_other_static_scalings(scaling):
    scheme = RoPEConfig(scaling=scaling, factor=2.0)
    base = hf_posenc.patch_model(tiny_model("llama"), scheme).model.rotary_emb.inv_freq
    got = hf_posenc.patch_model(tiny_model("llama"), CoPEConfig(clip_low_n=4, scaling=scaling, factor=2.0))
    assert torch.equal(got.model.rotary_emb.inv_freq, base * torch.tensor(cope_weights(N, 4)).float())


def test_cope_over_dynamic_ntk_follows_the_sequence_length():
    model = hf_posenc.patch_model(tiny_model("llama", max_position_embeddings=32), "cope", clip_low_n=3,
                                  scaling="dynamic", factor=2.0)
    assert model.config.rope_parameters["rope_type"] == "cope_dynamic"
    before = model.model.rotary_emb.inv_freq.clone()
    with torch.no_grad():
        model(random_ids(1, 64))
    after = model.model.rotary_emb.inv_freq
    # Dynamic NTK at length 64 with factor 2 over 32 positions: base' = θ·((f·L/L0) − (f − 1))^(d/(d−2)).
    theta = 10000.0 * ((2.0 * 64 / 32) - 1.0) ** (D / (D - 2))
    expected = default_inv_freq(theta) * torch.tensor(cope_weights(N, 3), dtype=torch.float64)
    torch.testing.assert_close(after.double(), expected, rtol=1e-5, atol=0)
    assert not torch.equal(before, after)


def test_cope_over_longrope_folds_the_taper_into_both_factor_lists():
    short, long = [1.0 + 0.1 * j for j in range(N)], [2.0 + 0.1 * j for j in range(N)]
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": 128}
    model = hf_posenc.patch_model(tiny_model("llama", rope_parameters=rope), "hardclip", clip_low_n=2)
    params = model.config.rope_parameters
    assert params["rope_type"] == "longrope"
    assert params["short_factor"][: N - 2] == short[: N - 2] and params["long_factor"][: N - 2] == long[: N - 2]
    assert torch.all(model.model.rotary_emb.inv_freq[N - 2 :] == 0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(scheme="nope"), ValueError, r"valid schemes are \['cope', 'hardclip', 'prope', 'rope', 'tapa', 'tape'\]"),
        (dict(scheme="prope", p=1.5), ValueError, r"p must be in \[0, 1\]"),
        (dict(scheme="prope", p=-0.1), ValueError, r"p must be in \[0, 1\]"),
        (dict(scheme="prope", p="0.5"), TypeError, "'p' must be int or float"),
        (dict(scheme="cope", clip_low_n=-1), ValueError, "clip_low_n must be >= 0"),
        (dict(scheme="cope", clip_low_n=2.5), TypeError, "'clip_low_n' must be int"),
        (dict(scheme="cope", clip_low_n=True), TypeError, "'clip_low_n' must be int"),
        (dict(scheme="cope", clip_low_n=N + 1), ValueError, f"exceeds the model's {N} RoPE frequencies"),
        (dict(scheme="cope", clip=3), ValueError, "unknown option"),
        (dict(scheme="rope", scaling="yarn"), ValueError, "needs factor >= 1"),
        (dict(scheme="rope", scaling="ntk", factor=2.0), ValueError, "scaling must be one of"),
        (dict(scheme="rope", factor=2.0), ValueError, "need a scaling type"),
        (dict(scheme="rope", scaling="yarn", factor=2.0, scaling_options={"low_freq_factor": 1}), ValueError,
         "not used by 'yarn'"),
        (dict(scheme="prope", scaling="yarn", factor=2.0), ValueError, "only scaling='linear'"),
        (dict(scheme="cope", layers="local"), ValueError, "layers must be 'global' or 'all'"),
        (dict(scheme=PRoPEConfig(p=0.5), p=0.25), TypeError, "not both"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        hf_posenc.patch_model(tiny_model("llama"), **kwargs)


def test_configs_round_trip_through_dicts():
    for scheme in (CoPEConfig(clip_low_n=3, rope_theta=1e6, scaling="yarn", factor=4.0, scaling_options={"beta_fast": 16}),
                   HardClipConfig(clip_low_n=1), PRoPEConfig(p=0.25), RoPEConfig(scaling="llama3", factor=8.0)):
        assert type(scheme).from_dict(scheme.to_dict()) == scheme
        assert hf_posenc.make_scheme(scheme.name, **scheme.to_dict()) == scheme
