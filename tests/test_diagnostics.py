"""Diagnostics: each analysis against a case with a known answer (tiny random models, synthetic data)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from experiment_cli import austen  # noqa: F401 (a fixture: the Austen data, installed on first use)
from tiny import random_ids, tiny_model

from hf_posenc.diagnostics import (
    additive_correlation, closed_form_gap, disentanglement, distance_bias, empirical_gap, frequency_usage,
    model_frequency_sets, perplexity, perturbation_tolerance, plot_disentanglement, plot_distance_bias,
    plot_frequency_usage, plot_perturbation, plot_positional_heads, plot_semantic_decay, positional_heads,
    ringing_index, score_attention_maps, semantic_decay, three_axis_correlation,
)
from hf_posenc.diagnostics.capture import capture_window, layer_frequencies, softmax_scale
from hf_posenc.diagnostics.disentanglement import (
    additive_fit, additive_fit_reference, three_axis_fit, three_axis_reconstruction, three_axis_reference,
)
from hf_posenc.diagnostics.distance_bias import bias_from_logit_fn, scaled_ranges
from hf_posenc.diagnostics.frequency_usage import usage_from_tensors
from hf_posenc.diagnostics.perturbation import offset_positions, transpose_tokens
from hf_posenc.diagnostics.positional_heads import find_heads, high_frequency_share, streamed_scores
from hf_posenc.diagnostics.rope_math import causal_attention_rows, fake_distance_logits, pair_logits, rotate
from hf_posenc.diagnostics.semantic_decay import (
    clipped_frequency_sets, clipping_comparison, default_clip_low_n, empirical_gap_reference, smoothed_closed_form_gap,
)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", max_position_embeddings=256)


def _ids(length: int) -> torch.Tensor:
    return random_ids(1, length, seed=3)


# -- RoPE arithmetic and capture -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "gemma3_text"])
def test_rebuilt_attention_equals_the_models(arch):
    """Captured q/k + the model's frequencies/scale/window/softcap reproduce eager attention exactly."""
    model = tiny_model(arch)
    ids = _ids(20)
    attentions = model(ids, output_attentions=True).attentions
    captured = capture_window(model, ids, None, None, ("q", "k"))
    pos = torch.arange(20)
    for layer in range(2):
        inv_freq, a = layer_frequencies(model, layer)
        q, k = captured[layer]["q"][0], captured[layer]["k"][0]
        attn = model.model.layers[layer].self_attn
        probs = causal_attention_rows(
            rotate(q, pos, inv_freq) * a, rotate(k, pos, inv_freq) * a, pos, softmax_scale(model, layer),
            getattr(attn, "sliding_window", None), getattr(attn, "attn_logit_softcapping", None),
        )
        torch.testing.assert_close(probs, attentions[layer][0], atol=2e-6, rtol=1e-5)


def test_fake_distance_logits_match_explicit_rotation():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 16, generator=g, dtype=torch.float64), torch.randn(3, 10, 16, generator=g, dtype=torch.float64)
    inv_freq = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    d = torch.tensor([0, 1, 7, 500])
    w = fake_distance_logits(q, k, d, inv_freq, scale=0.5)
    for mi, dist in enumerate(d.tolist()):
        # query at position dist + 3, key at position 3: distance dist
        qr = rotate(q[:, None], torch.tensor([dist + 3]), inv_freq)[:, 0]
        kr = rotate(k, torch.full((10,), 3), inv_freq)
        torch.testing.assert_close(w[:, mi], 0.5 * (qr[:, None] * kr).sum(-1))
    torch.testing.assert_close(pair_logits(q, k[:, 4], d[:3].repeat(1)[:3], inv_freq, 0.5), w[torch.arange(3), torch.arange(3), 4])


def test_bad_layers_and_heads_raise(llama):
    ids = _ids(16)
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        frequency_usage(llama, ids, layers=[5], progress=False)
    with pytest.raises(ValueError, match="head 4 does not exist"):
        positional_heads(llama, ids, heads=[4], progress=False)
    with pytest.raises(TypeError, match="integers"):
        frequency_usage(llama, ids, layers=["0"], progress=False)


# -- 1. frequency usage ----------------------------------------------------------------------------------------------
def test_frequency_usage_equals_direct_computation(llama):
    ids = _ids(40)
    res = frequency_usage(llama, ids, layers=[1], heads=[0, 3], window=16, progress=False)  # 3 windows: 16+16+8
    assert res.tokens == 40
    inv_freq, _ = layer_frequencies(llama, 1)
    order = torch.sort(inv_freq, descending=True).indices
    sums = {kind: 0 for kind in "qkv"}
    for start in (0, 16, 32):
        cap = capture_window(llama, ids[:, start : start + 16], [1], [0, 3], "qkv")
        for kind in "qkv":
            sums[kind] = sums[kind] + usage_from_tensors(cap[1][kind]) * cap[1][kind].shape[2]
    for kind, table in (("q", res.query_norms), ("k", res.key_norms), ("v", res.value_norms)):
        torch.testing.assert_close(torch.tensor(table[0], dtype=torch.float64), (sums[kind] / 40)[:, order])
    # GQA: query heads 0 and 3 read key heads 0 and 1; a direct look at k_proj confirms the alignment.
    cap = capture_window(llama, ids[:, :16], [1], [0, 1, 2, 3], "k")
    assert torch.equal(cap[1]["k"][0, 0], cap[1]["k"][0, 1]) and not torch.equal(cap[1]["k"][0, 1], cap[1]["k"][0, 2])
    json.loads(res.to_json())


# -- 2. positional heads ---------------------------------------------------------------------------------------------
def _forced_maps(s: int) -> torch.Tensor:
    """Head 0 diagonal, head 1 previous-token, head 2 uniform over the causal past."""
    eye = torch.eye(s)
    prev = torch.diag(torch.ones(s - 1), -1)
    prev[0, 0] = 1
    uniform = torch.tril(torch.ones(s, s))
    return torch.stack([eye, prev, uniform / uniform.sum(-1, keepdim=True)])


def test_synthetic_positional_heads_are_detected():
    diag, prev = score_attention_maps(_forced_maps(12))
    torch.testing.assert_close(diag, torch.tensor([1.0, 0.0, sum(1 / (i + 1) for i in range(1, 12)) / 11], dtype=torch.float64))
    assert prev[1] == 1 and prev[0] == 0
    usage = torch.tensor([[0.9, 0.1, 0.1]])
    found = find_heads([0], [0, 1, 2], diag[None], prev[None], usage, 0.5, 0.5, 0.25)
    assert [(h.head, h.kinds) for h in found] == [(0, ["diagonal", "high_frequency"]), (1, ["previous_token"])]
    assert find_heads([0], [0, 1, 2], diag[None], prev[None], usage, 1.01, 1.01, 1.01) == []


def test_constructed_rope_heads_are_found_by_streaming():
    """Barbero et al. Thm 5.3: q = k (diagonal) and q = R_{-1}k (previous token) on the highest frequency."""
    s, dim = 40, 8
    inv_freq = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    k = torch.zeros(s, dim, dtype=torch.float64)
    k[:, 0] = 30.0  # only the highest-frequency chunk (dims 0 and 4)
    q_prev = rotate(k, torch.full((s,), -1), inv_freq)
    q, keys = torch.stack([k, q_prev]), torch.stack([k, k])
    diag_sum, prev_sum = streamed_scores(q, keys, inv_freq, scale=1.0, block=16)
    assert diag_sum[0] / (s - 1) > 0.99 and prev_sum[1] / (s - 1) > 0.99
    # streamed sums equal the scores of the full maps
    pos = torch.arange(s)
    full = causal_attention_rows(rotate(q, pos, inv_freq), rotate(keys, pos, inv_freq), pos, 1.0)
    d_ref, p_ref = score_attention_maps(full)
    torch.testing.assert_close(diag_sum / (s - 1), d_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(prev_sum / (s - 1), p_ref, atol=1e-6, rtol=1e-6)
    share = high_frequency_share(torch.tensor([[3.0, 0, 0, 0]]), torch.tensor([[2.0, 0, 0, 0]]), inv_freq, 0.25)
    assert share.item() == 1.0


def test_positional_heads_on_tiny_model(llama, tmp_path):
    res = positional_heads(llama, _ids(30), window=16, diagonal_threshold=0.0, progress=False)
    assert len(res.found) == 2 * 4  # a threshold of 0 lists every head
    assert all(0 <= x <= 1 for row in res.diagonal for x in row)
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        positional_heads(llama, _ids(30), diagonal_threshold=1.5, progress=False)
    assert plot_positional_heads({"a": res, "b": res}, tmp_path / "ph.png").endswith(".png")


# -- 3. disentanglement ----------------------------------------------------------------------------------------------
def test_additive_matrix_has_correlation_one_and_noise_low():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 1, generator=g), torch.randn(1, 60, generator=g)
    assert additive_correlation(a + b) == pytest.approx(1.0, abs=1e-12)
    assert abs(additive_correlation(torch.randn(50, 60, generator=g))) < 0.25
    w = a + b + 0.3 * torch.randn(50, 60, generator=g)
    fit_a, fit_b = additive_fit(w)
    torch.testing.assert_close(fit_a[:, None] + fit_b[None], additive_fit_reference(w))
    # eq. 12: the paper's split puts half the grand mean in each component
    torch.testing.assert_close(fit_a.mean() - w.double().mean() / 2, fit_b.mean() - w.double().mean() / 2)


def test_three_axis_fit_matches_dense_least_squares():
    n = 12
    g = torch.Generator().manual_seed(1)
    idx = torch.arange(n)
    a, b, c = (torch.randn(n, generator=g, dtype=torch.float64) for _ in range(3))
    exact = a[(idx[:, None] - idx[None]).clamp_min(0)] + b[:, None] + c[None]
    assert three_axis_correlation(exact) == pytest.approx(1.0, abs=1e-9)
    noisy = exact + torch.randn(n, n, generator=g, dtype=torch.float64)
    ii, jj = torch.tril_indices(n, n)
    torch.testing.assert_close(three_axis_reconstruction(*three_axis_fit(noisy))[ii, jj], three_axis_reference(noisy)[ii, jj],
                               atol=1e-5, rtol=1e-5)
    assert abs(three_axis_correlation(torch.randn(60, 60, generator=g))) < 0.35


def test_disentanglement_on_tiny_model(llama, tmp_path):
    res = disentanglement(llama, _ids(40), length=32, distances=20, layers=[0])
    assert len(res.fake_distance_correlation) == 1 and len(res.fake_distance_correlation[0]) == 4
    assert all(-1 <= x <= 1 for x in res.fake_distance_correlation[0] + res.three_axis_correlation[0])
    # direct recomputation for one head
    cap = capture_window(llama, _ids(40)[:, :32], [0], [2], "qk")
    inv_freq, a = layer_frequencies(llama, 0)
    w = fake_distance_logits(cap[0]["q"][0, 0, -1], cap[0]["k"][0, 0], torch.arange(20), inv_freq)
    assert res.fake_distance_correlation[0][2] == pytest.approx(additive_correlation(w), abs=1e-9)
    with pytest.raises(ValueError, match="at least 64 tokens"):
        disentanglement(llama, _ids(40), length=64)
    plot_disentanglement({"x": res}, tmp_path / "d.png")


# -- 4. distance bias ------------------------------------------------------------------------------------------------
def test_distance_bias_known_mean():
    """A logit falling by 0.01 per token of distance: Δ = 0.01·(Λ − λ), mean 0.01·(10050 − 50) = 100."""
    deltas = bias_from_logit_fn(lambda i, j: -0.01 * (i - j).double(), 20000, (0, 100), (10000, 10100), 20000)
    assert deltas.mean().item() == pytest.approx(100.0, abs=0.1)
    assert deltas.min() >= 0.01 * (10000 - 100) - 1e-9


def test_distance_bias_nope_constant_keys_is_zero(llama):
    q = torch.ones(1, 64, 8, dtype=torch.float64)
    d = pair_logits(q[:, :5], q[:, :5], torch.tensor([0, 3, 9, 30, 60]), torch.zeros(4))
    assert torch.all(d == 8.0)  # no rotation: every distance scores the same, Δ = 0


def test_distance_bias_on_tiny_model(llama, tmp_path):
    ids = _ids(200)
    res = distance_bias(llama, ids, samples=300, layers=[1])
    # default: the paper ranges scaled to half the text, so queries spread over its second half
    assert res.short == scaled_ranges(100)[0] and res.long[1] == 99
    assert len(res.mean) == 1 and len(res.mean[0]) == 4 and sum(res.histogram_counts) == 300 * 4
    with pytest.raises(ValueError, match="only 200 tokens"):
        distance_bias(llama, ids, short=(0, 100), long=(10000, 10100))
    with pytest.raises(ValueError, match="both short and long"):
        distance_bias(llama, ids, short=(0, 10))
    plot_distance_bias({"a": res, "b": res}, tmp_path / "b.png")


# -- 5. semantic decay -----------------------------------------------------------------------------------------------
def test_semantic_decay_closed_form_and_empirical():
    inv_freq = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    d = torch.tensor([0, 1, 5, 100, 3000])
    closed = closed_form_gap(inv_freq, d, sigma=0.7)
    assert closed[0] == pytest.approx(2 * 0.49 * 16)
    torch.testing.assert_close(closed, 2 * 0.49 * torch.stack([torch.cos(t * inv_freq).sum() for t in d.double()]))
    fast = empirical_gap(inv_freq, d, sigma=0.7, samples=500, seed=4)
    torch.testing.assert_close(fast, empirical_gap_reference(inv_freq, d, sigma=0.7, samples=500, seed=4))
    few = (empirical_gap(inv_freq, d, 0.7, 200, seed=1) - closed).abs().max()
    many = (empirical_gap(inv_freq, d, 0.7, 40000, seed=1) - closed).abs().max()
    assert many < few and many < 0.15 * closed[0]


def test_ringing_of_a_hard_spectral_cut():
    """CoPE Fig. 4: a hard cut of the lowest half of a dense RoPE spectrum rings more than the cosine taper."""
    from hf_posenc.schemes.cope import taper_weights

    n = 512
    theta = 10000.0 ** (-torch.arange(n, dtype=torch.float64) / n)
    period = 2 * math.pi / theta[n // 2]  # slowest clipped frequency
    d = torch.arange(0, int(8 * period))
    smooth = int(period / 8)
    hard = ringing_index(closed_form_gap(theta * taper_weights(n, n // 2, hard=True), d) / (2 * n), smooth)
    soft = ringing_index(closed_form_gap(theta * taper_weights(n, n // 2), d) / (2 * n), smooth)
    assert hard > 1.2 * soft > 0
    assert ringing_index(torch.exp(-torch.arange(50.0))) == 0.0
    res = semantic_decay({"hard": theta[:8] * 0, "rope": theta[:8]}, max_distance=200, points=50, samples=64)
    assert set(res.ringing) == {"hard", "rope"} and res.curves["hard"] == [1.0] * len(res.distances)


def test_semantic_decay_reads_model_frequencies(tmp_path):
    model = tiny_model("gemma3_text")
    sets = model_frequency_sets(model)
    assert len(sets) == 2  # sliding and full attention layers rotate differently
    res = semantic_decay(sets, max_distance=256, points=64, samples=256)
    assert all(err < 0.5 for err in res.max_abs_error.values())
    json.loads(res.to_json())
    plot_semantic_decay({"gemma3": res}, tmp_path / "s.png")
    with pytest.raises(ValueError, match="finite"):
        semantic_decay({"bad": torch.tensor([float("nan")])})


def _rope(base: float, n: int) -> torch.Tensor:
    return base ** (-torch.arange(n, dtype=torch.float64) / n)


def test_clipped_closed_forms_follow_the_paper():
    """CoPE paper eq. 6 (Thm 3.2) on the frequencies of eq. 10 (CoPE) and of HardClip: equal at Δt = 0, and different
    from RoPE only through the clipped terms, each of which is written out here from the paper's formulas."""
    n, sigma = 32, 0.8
    theta = _rope(1e5, n)  # SmolLM2-135M: θ_base = 1e5, head dim 64
    c = default_clip_low_n(n)
    assert c == 10  # the paper's 20 of 64, scaled
    sets = clipped_frequency_sets(theta)
    j = torch.arange(n - c, n, dtype=torch.float64)
    w = 0.5 * (1 + torch.cos(math.pi * (j - (n - c)) / (c - 1)))  # eq. 10, index form: w = 1 at the onset, 0 at the end
    torch.testing.assert_close(sets["CoPE"][n - c :], theta[n - c :] * w)
    assert (sets["HardClip"][n - c :] == 0).all()
    for label in ("HardClip", "CoPE"):
        assert torch.equal(sets[label][: n - c], theta[: n - c])
    d = torch.tensor([0, 1, 7, 1000, 9000, 40000])
    gap = {label: closed_form_gap(f, d, sigma) for label, f in sets.items()}
    for label in sets:
        assert gap[label][0] == pytest.approx(2 * sigma**2 * n)  # every cosine is 1 at Δt = 0
    for k, dt in enumerate(d.double().tolist()):
        removed = sum(math.cos(dt * t) for t in theta[n - c :].tolist())
        tapered = sum(math.cos(dt * t) for t in (theta[n - c :] * w).tolist())
        assert gap["HardClip"][k] - gap["RoPE"][k] == pytest.approx(2 * sigma**2 * (c - removed), abs=1e-9)
        assert gap["CoPE"][k] - gap["RoPE"][k] == pytest.approx(2 * sigma**2 * (tapered - removed), abs=1e-9)
    assert gap["RoPE"][3] < 0.5 * gap["RoPE"][0]  # Thm 3.2: the gap decays with Δt


def test_clipped_sets_are_the_patched_models_frequencies():
    import copy

    import hf_posenc

    model = tiny_model("llama")
    theta = layer_frequencies(model, 0)[0]
    sets = clipped_frequency_sets(theta)
    for scheme, label in (("cope", "CoPE"), ("hardclip", "HardClip")):
        patched = hf_posenc.patch_model(copy.deepcopy(model), scheme)
        torch.testing.assert_close(layer_frequencies(patched, 0)[0], sets[label], rtol=1e-6, atol=0)


@pytest.mark.parametrize("base, n", [(1e5, 32), (5e5, 64), (1e4, 64), (1e7, 64)])
def test_hard_clipping_rings_and_soft_clipping_does_not(base, n):
    """CoPE paper Thm 4.1 / Fig. 4 on real head sizes: over three periods of the cut, HardClip − RoPE oscillates
    and CoPE − RoPE rises monotonically (SmolLM2, Llama-3's 5e5, the paper's ABF 1e7)."""
    theta = _rope(base, n)
    cmp = clipping_comparison(theta)
    c = cmp.clip_low_n
    assert cmp.cut_frequency == theta[n - c].item()  # the fastest frequency HardClip zeroes
    assert cmp.cut_period == pytest.approx(2 * math.pi / theta[n - c].item())
    assert cmp.distances[-1] == pytest.approx(3 * cmp.cut_period, abs=1)
    assert cmp.differences["HardClip"][0] == 0 and cmp.differences["CoPE"][0] == 0
    assert cmp.ringing["HardClip"] > 0.05 and cmp.ringing["CoPE"] < 0.005
    hard = torch.tensor(cmp.differences["HardClip"])
    assert 0.4 * c / n < hard[len(hard) // 2 :].mean() < 1.2 * c / n  # the clipped terms' cosines average out
    with pytest.raises(ValueError, match="already clipped"):
        clipping_comparison(torch.cat([theta[:-1], torch.zeros(1)]))


def test_smoothing_is_the_gaussian_moving_average():
    theta = _rope(1e4, 16)
    d, s = torch.tensor([0, 40, 333]), 12.0
    u = torch.arange(-8 * s, 8 * s + 1e-9, 0.02, dtype=torch.float64)
    g = torch.exp(-0.5 * (u / s) ** 2)
    g = g / g.sum()
    numeric = torch.stack([(closed_form_gap(theta, dt + u) * g).sum() for dt in d.double()])
    torch.testing.assert_close(smoothed_closed_form_gap(theta, d, s), numeric, rtol=1e-6, atol=1e-6)
    raw = torch.stack([(empirical_gap(theta, dt + u, samples=300, seed=2) * g).sum() for dt in d.double()])
    torch.testing.assert_close(empirical_gap(theta, d, samples=300, seed=2, smooth=s), raw, rtol=1e-6, atol=1e-6)
    res = semantic_decay({"rope": theta, "clipped": theta * (theta > 0.01)}, max_distance=400, points=64, samples=64,
                         smooth=s)
    assert set(res.clipping) == {"rope"}  # a set with zero frequencies is already clipped
    assert res.smoothed["rope"][0] == pytest.approx(float(numeric[0]) / 32, rel=1e-6)  # normalised by 2σ²·n


def test_semantic_decay_plot_with_and_without_clipping(tmp_path):
    theta = _rope(1e4, 16)
    with_rope = semantic_decay({"model": theta}, max_distance=300, points=64, samples=64, name="rope")
    clipped = semantic_decay({"model": theta * (theta > 0.01)}, max_distance=300, points=64, samples=64, name="hard")
    assert set(with_rope.clipping) == {"model"} and not clipped.clipping
    json.loads(with_rope.to_json())
    for results, name in (({"rope": with_rope, "hard": clipped}, "both"), (clipped, "alone")):
        assert plot_semantic_decay(results, tmp_path / f"{name}.png") == str(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


# -- 6. perturbation -------------------------------------------------------------------------------------------------
def test_perturbation_fraction_zero_is_plain_perplexity(llama, tmp_path):
    ids = _ids(48)
    with torch.no_grad():
        loss = llama(ids, labels=ids).loss
    assert perplexity(llama, ids, window=64) == pytest.approx(math.exp(loss.item()), rel=1e-5)
    res = perturbation_tolerance(llama, ids, fractions=[0.0, 0.25], max_distances=[3], trials=2, window=64, progress=False)
    zero = [p for p in res.points if p.fraction == 0.0]
    assert all(p.perplexity == pytest.approx(res.baseline_perplexity, rel=1e-9) for p in zero)
    moved = [p for p in res.points if p.fraction == 0.25]
    assert all(p.perplexity != pytest.approx(res.baseline_perplexity, rel=1e-6) for p in moved)
    plot_perturbation({"a": res}, tmp_path / "p.png")
    with pytest.raises(ValueError, match="does not fit"):
        perturbation_tolerance(llama, ids, max_distances=[100], window=64, progress=False)
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        perplexity(llama, ids, mode="transpose", fraction=2.0)


def test_perturbation_scores_only_unperturbed_targets_paired_with_the_clean_text(llama):
    """The paper's scoring: perplexity over the targets a draw left alone, beside the clean text's over the same
    ones. Rebuilt here from the same draw (the generator's sequence) and the clean per-target NLLs."""
    from hf_posenc.diagnostics.perturbation import paired_perplexities, token_nll

    ids = _ids(48)
    for mode in ("transpose", "position_offset"):
        perturbed, clean = paired_perplexities(llama, ids, 64, mode, 0.25, 3, seed=5)
        g = torch.Generator().manual_seed(5)
        row = ids[0]
        if mode == "transpose":
            text = transpose_tokens(row, 0.25, 3, g)
            kept, nll = (text == row)[1:], token_nll(llama, text)
        else:
            positions = offset_positions(row.numel(), 0.25, 3, g)
            kept, nll = (positions == torch.arange(row.numel()))[1:], token_nll(llama, row, positions)
        assert 0 < int(kept.sum()) < kept.numel()
        assert perturbed == pytest.approx(math.exp(float(nll[kept].mean())), rel=1e-6)
        assert clean == pytest.approx(math.exp(float(token_nll(llama, row)[kept].mean())), rel=1e-6)
        assert perplexity(llama, ids, 64, mode, 0.25, 3, seed=5, score="unperturbed") == pytest.approx(perturbed,
                                                                                                       rel=1e-9)
    res = perturbation_tolerance(llama, ids, fractions=[0.0, 0.25], max_distances=[3], trials=2, window=64,
                                 progress=False, score="unperturbed")
    assert res.score == "unperturbed"
    for p in res.points:
        if p.fraction == 0.0:
            assert p.perplexity == pytest.approx(res.baseline_perplexity, rel=1e-9)
            assert p.baseline_same_targets == pytest.approx(res.baseline_perplexity, rel=1e-9)
        else:
            assert p.baseline_same_targets != pytest.approx(res.baseline_perplexity, rel=1e-6)
    with pytest.raises(ValueError, match="score must be one of"):
        perplexity(llama, ids, score="moved")


@pytest.mark.parametrize("batch_tokens", [4096, 40])
def test_batched_windows_score_as_each_window_alone(llama, monkeypatch, batch_tokens):
    """windows_token_nll (the windows of one length as one batch, at most BATCH_TOKENS tokens; 40 splits a group of
    16-token windows into batches of 2) gives every window what token_nll gives it alone, in the order given; and a
    perturbed perplexity over several windows (the last one shorter) is the one rebuilt window by window from the
    same draws."""
    from hf_posenc.diagnostics import perturbation
    from hf_posenc.diagnostics.perturbation import token_nll, windows_token_nll

    monkeypatch.setattr(perturbation, "BATCH_TOKENS", batch_tokens)
    g = torch.Generator().manual_seed(1)
    chunks = [random_ids(1, n, seed=10 + i)[0] for i, n in enumerate((16, 16, 9, 16, 9, 16, 16))]
    positions = [None if i % 2 else offset_positions(c.numel(), 0.3, 4, g) for i, c in enumerate(chunks)]
    got = windows_token_nll(llama, chunks, positions)
    assert len(got) == len(chunks)
    for chunk, pos, nll in zip(chunks, positions, got):
        torch.testing.assert_close(nll, token_nll(llama, chunk, pos), rtol=1e-5, atol=1e-5)

    ids = _ids(100)  # windows of 16: six whole ones and one of 4
    for mode in ("transpose", "position_offset"):
        g = torch.Generator().manual_seed(7)
        total, count = 0.0, 0
        for start in range(0, 100, 16):
            chunk, pos, _ = perturbation.perturb(ids[0, start:start + 16], mode, 0.25, 3, g)
            nll = token_nll(llama, chunk, pos)
            total, count = total + float(nll.sum()), count + nll.numel()
        assert perplexity(llama, ids, 16, mode, 0.25, 3, seed=7) == pytest.approx(math.exp(total / count), rel=1e-5)

    with pytest.raises(ValueError, match="one entry .* per window: 2 windows, 1 entries"):
        windows_token_nll(llama, chunks[:2], positions[:1])
    with pytest.raises(ValueError, match="one position id per token"):
        windows_token_nll(llama, chunks[:1], [torch.arange(5)])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        windows_token_nll(llama, [chunks[0][None]], [None])


def test_perturbation_helpers():
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(100)
    out = transpose_tokens(ids, 0.1, 4, g)
    assert sorted(out.tolist()) == ids.tolist() and not torch.equal(out, ids)
    assert ((out - ids).abs().max() <= 4 * 10)
    pos = offset_positions(100, 0.2, 5, g)
    moved = (pos != torch.arange(100)).sum().item()
    assert 0 < moved <= 20 and (pos - torch.arange(100)).abs().max() <= 5 and pos.min() >= 0


# -- plots / JSON / CLI ----------------------------------------------------------------------------------------------
def test_frequency_usage_plot_and_json(llama, tmp_path):
    res = frequency_usage(llama, _ids(20), progress=False, name="tiny")
    data = json.loads(res.to_json())
    assert data["analysis"] == "frequency_usage" and len(data["query_norms"]) == 2
    plot_frequency_usage(res, tmp_path / "f.png")
    plot_frequency_usage({"a": res, "b": res}, tmp_path / "f2.png", per_head_layer=1)
    with pytest.raises(ValueError, match="was not analysed"):
        plot_frequency_usage(res, tmp_path / "f3.png", per_head_layer=7)


def test_cli_writes_json_and_png_for_two_models(llama, tmp_path):
    from hf_posenc.diagnostics.cli import run_diagnose
    from hf_posenc_cli.arguments import command_parser
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(128)}
    vocab["[UNK]"] = 0
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for name in ("m1", "m2"):
        llama.save_pretrained(tmp_path / name)
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / name)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"w{(7 * i) % 120 + 3}" for i in range(80)))
    parser = command_parser("diagnose")
    args = parser.parse_args([
        f"a={tmp_path / 'm1'}", f"b={tmp_path / 'm2'}", "--text", str(text), "--out", str(tmp_path / "out"),
        "--analyses", "frequency_usage,distance_bias,semantic_decay", "--samples", "64", "--no-progress",
    ])
    assert run_diagnose(args) == 0
    for analysis in ("frequency_usage", "distance_bias", "semantic_decay"):
        data = json.loads((tmp_path / "out" / f"{analysis}.json").read_text())
        assert set(data) == {"a", "b"} and (tmp_path / "out" / f"{analysis}.png").stat().st_size > 1000
    bad = parser.parse_args([str(tmp_path / "m1"), "--text", str(text), "--out", str(tmp_path / "o"), "--layers", "9"])
    with pytest.raises(SystemExit, match="layer 9 does not exist"):
        run_diagnose(bad)
    with pytest.raises(SystemExit):
        parser.parse_args(["m", "--text", "t", "--out", "o", "--analyses", "nonsense"])


def test_cli_summary_names_every_file_written(llama, tmp_path, capsys):
    """All six analyses on a tiny model: summary.md sits beside their files, names each one, and is printed."""
    from hf_posenc.diagnostics.cli import run_diagnose
    from hf_posenc_cli.arguments import ANALYSES, command_parser
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(128)}
    vocab["[UNK]"] = 0
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    llama.save_pretrained(tmp_path / "m")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "m")
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"w{(7 * i) % 120 + 3}" for i in range(80)))
    out = tmp_path / "out"
    args = command_parser("diagnose").parse_args([
        f"tiny={tmp_path / 'm'}", "--text", str(text), "--out", str(out), "--samples", "64", "--length", "24",
        "--trials", "1", "--fractions", "0.1", "--max-distances", "3", "--no-progress",
    ])
    assert run_diagnose(args) == 0
    summary = (out / "summary.md").read_text()
    written = sorted(p.name for p in out.iterdir() if p.name != "summary.md")
    assert written == sorted(f"{a}.{ext}" for a in ANALYSES for ext in ("json", "png"))
    for name in written:
        assert f"`{name}`" in summary
    for analysis in ANALYSES:
        assert f"**{analysis}**" in summary
    bias = json.loads((out / "distance_bias.json").read_text())["tiny"]
    assert f"μ {bias['pooled_mean']:.3g}, σ {bias['pooled_std']:.3g}" in summary
    decay = json.loads((out / "semantic_decay.json").read_text())["tiny"]
    assert f"HardClip − RoPE {decay['clipping']['model']['ringing']['HardClip']:.3f}" in summary
    printed = capsys.readouterr().out
    assert str(out / "summary.md") in printed
    for line in summary.splitlines()[2:]:
        assert line in printed


def test_offset_positions_are_not_read_as_packed_documents(llama):
    """A jump in position ids must shift positions, not split attention into blocks (Transformers infers packed
    documents from such jumps unless an attention mask is given)."""
    from hf_posenc.diagnostics.perturbation import window_nll

    ids = _ids(40)[0]
    positions = torch.arange(40)
    positions[20:] += 7
    with torch.no_grad():
        full = llama(ids[None], position_ids=positions[None], attention_mask=torch.ones(1, 40, dtype=torch.long))
    nll = torch.nn.functional.cross_entropy(full.logits[0, :-1], ids[1:], reduction="sum")
    got, count = window_nll(llama, ids, positions)
    assert count == 39 and got == pytest.approx(float(nll), rel=1e-6)


def test_han_ji_smollm2_example_smoke(austen, tmp_path):
    """examples/han_ji_smollm2.py at its smoke size, through the code path of the committed run: the trained and the
    random-weight SmolLM2 fitted, both perturbations scored on unperturbed targets beside the clean text, and
    ``--render-only`` rewriting the same report from results.json."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "han_ji_smollm2.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(tmp_path), "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    fits = data["disentanglement"]
    assert all(-1 <= fits[k] <= 1 for k in ("trained", "random_init", "trained_window", "random_init_window"))
    assert fits["window_length"] == data["settings"]["window"] and fits["random_init"] != fits["trained"]
    assert {r["mode"] for r in data["perturbation"]} == {"transpose", "position_offset"}
    for r in data["perturbation"]:
        assert r["clean_perplexity_same_targets"] > 1 and r["increase"] == pytest.approx(
            r["perturbed_perplexity"] - r["clean_perplexity_same_targets"])
    report = (tmp_path / "results.md").read_text()
    assert "random weights" in report and "| transpose |" in report
    proc = subprocess.run([sys.executable, str(script), "--render-only", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and (tmp_path / "results.md").read_text() == report
