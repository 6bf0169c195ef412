"""TAPA attention: reference vs an independent float64 evaluation of eq. (12)/(16), reference gradients
vs finite differences, and the Triton kernel (run under TRITON_INTERPRET=1 on CPU) vs the reference on
fresh random inputs: GQA, ragged lengths, causal/non-causal, key padding, segment ids, decode, both
phase modes, non-default α/θ, sliding windows (including checks that keys / queries outside every
window are never read)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_posenc.kernels.tapa import (
    tapa_attention,
    tapa_attention_reference,
    tapa_attention_triton,
    tapa_split,
    uses_triton,
)
from hf_posenc.kernels._triton.combine import plan_split_combine
from hf_posenc.kernels._triton.launch import INTERPRETER, Target, launch_all
from hf_posenc.kernels.tapa import decode
from hf_posenc.kernels.tapa.triton_tapa import tiles, use_decode_path

# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def _qkv(B, Hq, Hkv, Lq, Lk, D, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Lq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Lk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Lk, D, generator=g).to(dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def _direct_eq12(q, k, v, *, alpha, theta, phase, causal, q_pos, k_pos, kpm=None, q_seg=None, k_seg=None,
                 window=None):
    """Element-by-element float64 evaluation of eq. (12) (or eq. 16), written without the reference;
    `window` is Transformers' sliding-window rule (query i is key i + Lk − Lq; it sees key j iff
    i + Lk − Lq − j < window)."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    da = int(round(theta * D))
    out = torch.zeros(B, Hq, Lq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            for i in range(Lq):
                scores, keep = [], []
                for j in range(Lk):
                    qi, kj = q[b, h, i].double(), k[b, kh, j].double()
                    amp = float(qi[:da] @ kj[:da]) / math.sqrt(da)
                    if phase == "linear":
                        ph = float(qi[da:].sum() + kj[da:].sum())
                    else:
                        ph = float(qi[da:] @ kj[da:])
                    dist = abs(int(q_pos[b, i]) - int(k_pos[b, j]))
                    scores.append(amp * math.cos(2 * math.pi * dist**alpha * ph / math.sqrt(D - da)))
                    ok = (not causal) or j <= i + (Lk - Lq)
                    ok = ok and (kpm is None or bool(kpm[b, j]))
                    ok = ok and (q_seg is None or int(q_seg[b, i]) == int(k_seg[b, j]))
                    ok = ok and (window is None or (i + Lk - Lq) - j < window)
                    keep.append(ok)
                if not any(keep):
                    continue
                mx = max(s for s, ok in zip(scores, keep) if ok)
                w = torch.tensor([math.exp(s - mx) if ok else 0.0 for s, ok in zip(scores, keep)], dtype=torch.float64)
                out[b, h, i] = (w / w.sum()) @ v[b, kh].double()
    return out


def _check(case_kw, B, Hq, Hkv, Lq, Lk, D, *, seed, backward=True, dtype=torch.float32, atol=3e-4, gatol=3e-3,
           deterministic=False):
    q, k, v = _qkv(B, Hq, Hkv, Lq, Lk, D, dtype=dtype, seed=seed, grad=backward)
    out = tapa_attention_triton(q, k, v, deterministic=deterministic, **case_kw)
    ref = tapa_attention_reference(q, k, v, **case_kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)
    if not backward:
        return
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    g_k = torch.autograd.grad(out, (q, k, v), do)
    g_r = torch.autograd.grad(ref, (q, k, v), do)
    for name, a, b in zip("qkv", g_k, g_r):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a / scale, b / scale, atol=gatol, rtol=0, msg=lambda m: f"d{name}: {m}")


def _left_padded(lengths, Lmax, offset=0):
    mask = torch.zeros(len(lengths), Lmax, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, Lmax - n :] = True
    pos = (mask.long().cumsum(-1) - 1).clamp_min(0) + offset
    return mask, pos


# --------------------------------------------------------------------------------------------------
# reference = the specification
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize(
    "kw",
    [
        dict(alpha=0.1, theta=0.5, phase="quadratic", causal=True),
        dict(alpha=0.7, theta=0.25, phase="linear", causal=False),
    ],
)
def test_reference_matches_direct_float64(kw, window):
    q, k, v = _qkv(2, 4, 2, 5, 7, 8, dtype=torch.float64, seed=3)
    q = q * 1.5  # larger phases: several turns, so range reduction is exercised
    k_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [100, 103, 104, 107, 111, 112, 130]])
    q_pos = k_pos[:, 2:]
    kpm = torch.tensor([[True] * 7, [False, True, True, True, True, False, True]])
    q_seg = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    k_seg = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0] * 7])
    extra = dict(q_positions=q_pos, k_positions=k_pos, key_padding_mask=kpm, q_segment_ids=q_seg, k_segment_ids=k_seg)
    want = _direct_eq12(q, k, v, q_pos=q_pos, k_pos=k_pos, kpm=kpm, q_seg=q_seg, k_seg=k_seg, window=window, **kw)
    extra["sliding_window"] = window
    got64 = tapa_attention_reference(q, k, v, **kw, **extra)
    torch.testing.assert_close(got64, want, atol=1e-10, rtol=1e-10)
    got32 = tapa_attention_reference(q.float(), k.float(), v.float(), **kw, **extra)
    torch.testing.assert_close(got32.double(), want, atol=2e-5, rtol=2e-5)


def test_reference_row_without_keys_is_zero():
    q, k, v = _qkv(1, 2, 2, 4, 4, 8, seed=1)
    kpm = torch.tensor([[False, False, True, True]])
    out = tapa_attention_reference(q, k, v, key_padding_mask=kpm)
    assert torch.isfinite(out).all()
    assert out[:, :, :2].abs().max() == 0
    assert out[:, :, 2:].abs().min() > 0


@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_reference_gradcheck(phase):
    q, k, v = _qkv(1, 2, 1, 4, 6, 8, dtype=torch.float64, seed=5, grad=True)
    kpm = torch.tensor([[False, True, True, True, True, True]])
    k_pos = torch.tensor([[0, 0, 1, 2, 3, 4]])

    def fn(q, k, v):
        return tapa_attention_reference(q, k, v, alpha=0.3, phase=phase, key_padding_mask=kpm, k_positions=k_pos)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# kernel vs reference
# --------------------------------------------------------------------------------------------------

KERNEL_CASES = {
    "gqa2-causal-37": (dict(), (2, 4, 2, 37, 37, 32)),
    "gqa3-causal-70": (dict(), (1, 3, 1, 70, 70, 32)),
    "noncausal-ragged": (dict(causal=False), (1, 4, 2, 37, 70, 32)),
    "chunked-prefill": (dict(), (1, 2, 1, 20, 66, 32)),  # Lk - Lq = 46: diagonal one short of a block edge
    "linear-gqa": (dict(phase="linear"), (1, 4, 2, 37, 37, 32)),
    "alpha-theta": (dict(alpha=0.5, theta=0.25), (1, 2, 1, 37, 37, 32)),
    "linear-noncausal-theta": (dict(phase="linear", theta=0.75, causal=False), (1, 2, 2, 21, 37, 64)),
    "decode-1": (dict(), (2, 4, 2, 1, 50, 32)),
    "decode-3-gqa3": (dict(), (1, 3, 1, 3, 50, 32)),
    "decode-3-linear-noncausal": (dict(phase="linear", causal=False), (1, 4, 2, 3, 50, 32)),
    # sliding windows (interpreter blocks are 16 wide: 1 < block, 7 straddles block edges, 16 = block)
    "window1-gqa2-37": (dict(sliding_window=1), (1, 4, 2, 37, 37, 32)),
    "window7-gqa3-70": (dict(sliding_window=7), (1, 3, 1, 70, 70, 32)),
    "window16-70": (dict(sliding_window=16), (1, 2, 1, 70, 70, 32)),
    "window7-chunked-37-70": (dict(sliding_window=7), (1, 2, 1, 37, 70, 32)),
    "window16-noncausal-37-70": (dict(sliding_window=16, causal=False), (1, 2, 1, 37, 70, 32)),
    "window36-edge-37": (dict(sliding_window=36), (1, 2, 1, 37, 37, 32)),  # one key short of inert
    "window7-linear": (dict(sliding_window=7, phase="linear"), (1, 2, 1, 37, 37, 32)),
    "window8-decode-1-gqa2": (dict(sliding_window=8), (1, 4, 2, 1, 50, 32)),
    "window8-decode-3-gqa3": (dict(sliding_window=8), (1, 3, 1, 3, 50, 32)),
}


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_kernel_matches_reference(name, deterministic):
    kw, shape = KERNEL_CASES[name]
    _check(kw, *shape, seed=100 + list(KERNEL_CASES).index(name), deterministic=deterministic)


@pytest.mark.parametrize("growth", [0.05, 3.0])
def test_kernel_lazy_rescaling_matches_reference(growth):
    """Amplitudes that grow along the keys: the row maxima move by less than 2^8 between key blocks (the kernel
    keeps its stale reference maximum) or by far more (it rescales; scores in the hundreds, which would overflow
    fp32 without rescaling). Forward (prefill and decode) and gradients against the reference."""
    for lq in (70, 3):
        q, k, v = _qkv(1, 4, 2, lq, 70, 32, seed=31 + lq)
        k[..., :16] *= (1.0 + growth * torch.arange(70, dtype=k.dtype))[:, None]
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        out = tapa_attention_triton(q, k, v)
        ref = tapa_attention_reference(q.double(), k.double(), v.double())
        torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
        for name, a, b in zip("qkv", torch.autograd.grad(out, (q, k, v), do),
                              torch.autograd.grad(ref, (q, k, v), do.double())):
            scale = max(1.0, b.abs().max().item())
            # scores in the hundreds: one fp32 ulp of a score is ~3e-5, so gradients agree to ~3e-4 (also when
            # the kernel rescales at every block)
            torch.testing.assert_close(a.double() / scale, b.double() / scale, atol=1e-3, rtol=0,
                                       msg=lambda m: f"d{name}: {m}")


def test_decode_shapes_take_decode_path():
    assert use_decode_path(1) and use_decode_path(3) and use_decode_path(16)
    assert not use_decode_path(17) and not use_decode_path(37)


@pytest.mark.parametrize("lk, splits", [(12, 1), (50, 4)], ids=["one-split", "split-k"])
def test_decode_plan_splits_keys_only_when_there_are_several_blocks(monkeypatch, lk, splits):
    """decode.plan_decode (interpreter: 16-key blocks, 8 programs): one key block, one split, and the decode
    launch writes the results itself; 50 keys for 2 row-tile programs, 4 splits of 16 keys, their partials merged
    by the combine. Both match the reference; only prefill tiles rescale lazily (the kernel's LAZY heuristic)."""
    import hf_posenc.kernels.tapa.triton_tapa as tt

    seen = []
    real = tt.launch_all
    monkeypatch.setattr(tt, "launch_all", lambda specs: (seen.append(specs), real(specs)))
    q, k, v = _qkv(1, 4, 2, 2, lk, 32, seed=80 + lk)
    out = tapa_attention_triton(q, k, v)
    fwd = seen[-1][0]
    assert [s.name for s in seen[-1]] == ["tapa_decode"] + (["split_combine"] if splits > 1 else [])
    assert fwd.grid == (1, 2, splits) and fwd.args["GP"] == 2 and fwd.derived["LAZY"] is False
    torch.testing.assert_close(out, tapa_attention_reference(q, k, v), atol=2e-5, rtol=2e-5)
    q, k, v = _qkv(1, 4, 2, 17, lk + 17, 32, seed=81)
    tapa_attention_triton(q, k, v)
    assert [s.name for s in seen[-1]] == ["tapa_fwd"] and seen[-1][0].derived["LAZY"] is True


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("lq", [37, 3])
def test_kernel_key_padding_and_segments(lq, window):
    B, Lk = 2, 45
    kpm, k_pos = _left_padded([30, 45], Lk)
    k_seg = torch.zeros(B, Lk, dtype=torch.long)
    k_seg[0, 33:] = 1
    k_seg[1, 20:] = 1
    k_seg[1, 38:] = 2
    kw = dict(
        key_padding_mask=kpm, k_positions=k_pos, q_positions=k_pos[:, Lk - lq :],
        k_segment_ids=k_seg, q_segment_ids=k_seg[:, Lk - lq :], sliding_window=window,
    )
    _check(kw, B, 4, 2, lq, Lk, 32, seed=11 + lq)


@pytest.mark.upstream
def test_kernel_fp16_forward():
    _check(dict(), 1, 4, 2, 37, 37, 32, seed=21, backward=False, dtype=torch.float16, atol=3e-3)
    _check(dict(phase="linear"), 1, 2, 1, 3, 40, 32, seed=22, backward=False, dtype=torch.float16, atol=3e-3)


# the head dims of the supported models (64: SmolLM2 / small Llamas, 128: Llama, Qwen, Mistral), short sequences
HEAD_DIM_CASES = {
    "d64-gqa2-causal": (dict(), (1, 4, 2, 37, 37, 64)),
    "d64-linear-padded": (dict(phase="linear"), (1, 2, 1, 29, 37, 64)),
    "d128-gqa2-causal": (dict(), (1, 4, 2, 21, 37, 128)),
    "d128-window-noncausal": (dict(sliding_window=9, causal=False), (1, 2, 1, 21, 37, 128)),
    "d128-decode-2": (dict(), (1, 4, 2, 2, 40, 128)),
}


@pytest.mark.parametrize("name", list(HEAD_DIM_CASES))
def test_kernel_head_dims_64_128(name):
    kw, shape = HEAD_DIM_CASES[name]
    _check(kw, *shape, seed=300 + list(HEAD_DIM_CASES).index(name))


@pytest.mark.upstream
@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
@pytest.mark.parametrize("D, kw", [(32, dict()), (64, dict(phase="linear", sliding_window=11)), (128, dict())])
def test_kernel_fp16_backward(D, kw, deterministic):
    """fp16 inputs: the kernel's fp16 dots (fp32 accumulation) against the reference (fp32 math on the same
    fp16 inputs), forward and the three gradients."""
    _check(kw, 1, 4, 2, 29, 29, D, seed=400 + D, dtype=torch.float16, atol=4e-3, gatol=1e-2,
           deterministic=deterministic)


def test_backward_path_follows_torch_determinism(monkeypatch):
    """The fused backward (atomic dQ) is the default; torch.use_deterministic_algorithms(True) or
    deterministic=True selects the two-kernel backward, whose dQ is bitwise reproducible."""
    import hf_posenc.kernels.tapa.triton_tapa as tt

    names = []
    real = tt.launch_all
    monkeypatch.setattr(tt, "launch_all", lambda specs: (names.append([s.name for s in specs]), real(specs)))
    q, k, v = _qkv(1, 2, 1, 20, 20, 32, seed=5, grad=True)

    def grads(**kw):
        names.clear()
        out = tapa_attention_triton(q, k, v, **kw)
        g = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        return names[-1], g

    assert grads()[0] == ["row_dot", "tapa_bwd"]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        seen, g1 = grads()
    finally:
        torch.use_deterministic_algorithms(was)
    assert seen == ["row_dot", "tapa_bwd_dkdv", "tapa_bwd_dq"]
    seen, g2 = grads(deterministic=True)
    assert seen == ["row_dot", "tapa_bwd_dkdv", "tapa_bwd_dq"]
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    fused = grads(deterministic=False)[1]
    for a, b in zip(fused, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _fast_math_model(q, k, v, q_pos, k_pos, alpha, block_m, block_n, margin, seed=0):
    """float64 TAPA forward (causal, θ = 0.5) following the CUDA fast path step by step, each approximate
    instruction perturbed by `margin` times its documented error bound (uniform random in ±bound; margin 0 =
    exact): lg2 of d / r (absolute 2^-22 on [0.5, 2], 2 ulp of the result elsewhere) plus the exact log2 r, r the
    power of two at or below the kernel's per-tile reference distance, ex2 (2 ulp), cos of the exactly reduced
    phase (absolute 2^-21), and the softmax's ex2."""
    g = torch.Generator().manual_seed(seed)
    Lq, Lk, D = q.shape[2], k.shape[2], q.shape[3]
    da = D // 2
    c_a, c_p = da**-0.5, (D - da) ** -0.5

    def noise(shape, bound):
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound * margin

    amp = q[..., :da] @ k[..., :da].transpose(-1, -2)
    ph = q[..., da:] @ k[..., da:].transpose(-1, -2)
    qp, kp = q_pos.double(), k_pos.double()
    d = (qp[:, None, :, None] - kp[:, None, None, :]).abs()
    qi, kj = torch.arange(Lq), torch.arange(Lk)
    q_mid = torch.clamp((qi // block_m) * block_m + block_m // 2, max=Lq - 1)
    k_mid = torch.clamp((kj // block_n) * block_n + block_n // 2, max=Lk - 1)
    r = (qp[:, q_mid][:, :, None] - kp[:, k_mid][:, None, :]).abs().clamp_min(1.0)[:, None]
    r = torch.exp2(torch.floor(torch.log2(r)))
    lx = torch.log2((d / r).clamp_min(1e-300))
    near_one = (d / r >= 0.5) & (d / r <= 2.0)
    lx = lx + noise(lx.shape, 1.0) * torch.where(near_one, torch.full_like(lx, 2.0**-22), 2.0**-22 * lx.abs())
    lr = torch.log2(r)
    dpow = torch.exp2(alpha * (lx + lr) + math.log2(c_p)) * (1 + noise(d.shape, 2.0**-22))
    dpow = torch.where(d > 0, dpow, torch.zeros_like(dpow))
    t = dpow * ph
    s = c_a * amp * (torch.cos(2 * math.pi * (t - torch.round(t))) + noise(t.shape, 2.0**-21))
    s = s.masked_fill(kj[None, :] > qi[:, None] + Lk - Lq, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True)) * (1 + noise(s.shape, 2.0**-22))
    return (p / p.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("alpha", [0.1, 0.5])
@pytest.mark.parametrize("keys", ["contiguous", "every-128th"])
def test_fast_math_error_stays_inside_bf16_resolution(alpha, keys):
    """The interpreter cannot run the CUDA fast path (inline PTX), so its error is bounded by emulation: four
    times the documented error of every approximate instruction, at distances up to 2^17 and the H100 forward
    tiles, moves the float64 output by less than half a bf16 step (2^-9 of the output's scale)."""
    k_pos = torch.arange(2**17 - 1024, 2**17) if keys == "contiguous" else torch.arange(0, 2**17, 128)
    Lq, Lk = 128, k_pos.numel()
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g, dtype=torch.float64) for n in (Lq, Lk, Lk))
    t = tiles(Target.gpu(90), 64)["fwd"]
    k_pos = k_pos[None]
    q_pos = k_pos[:, -Lq:]
    exact = _fast_math_model(q, k, v, q_pos, k_pos, alpha, t.block_m, t.block_n, margin=0.0)
    ref = tapa_attention_reference(q, k, v, alpha=alpha, q_positions=q_pos, k_positions=k_pos)
    torch.testing.assert_close(exact, ref, atol=1e-10, rtol=1e-10)  # the model with margin 0 is eq. (12)
    fast = _fast_math_model(q, k, v, q_pos, k_pos, alpha, t.block_m, t.block_n, margin=4.0)
    err = (fast - exact).abs().max().item()
    assert 0 < err < 2.0**-9 * exact.abs().max().item(), err


@pytest.mark.upstream
def test_split_combine_many_splits():
    """The split-K combine reads the splits 16 at a time: 37 partials (some empty) against a direct merge."""
    g = torch.Generator().manual_seed(9)
    B, H, S, Lq, W = 1, 2, 37, 3, 40
    parts = torch.randn(B, H, S, Lq, W, generator=g)
    lse_parts = torch.randn(B, H, S, Lq, generator=g) * 3
    lse_parts[:, :, ::5] = float("-inf")  # empty splits
    lse_parts[0, 1, :, 2] = float("-inf")  # a row with no visible key at all
    out = torch.empty(B, H, Lq, W)
    lse = torch.empty(B, H, Lq)
    launch_all([plan_split_combine(parts, lse_parts, out, lse)])
    w = torch.softmax(lse_parts * math.log(2), dim=2).nan_to_num(0.0)
    want = (w[..., None] * parts).sum(2)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[0, 0], torch.logsumexp(lse_parts[0, 0] * math.log(2), dim=0) / math.log(2))
    assert lse[0, 1, 2] == float("inf") and (out[0, 1, 2] == 0).all()  # +inf: no visible key (P = 0)


def test_left_padded_batch_equals_unpadded_runs():
    lengths, Lmax = [19, 33], 33
    q, k, v = _qkv(2, 2, 1, Lmax, Lmax, 32, seed=31)
    kpm, pos = _left_padded(lengths, Lmax)
    out = tapa_attention_triton(q, k, v, key_padding_mask=kpm, k_positions=pos, q_positions=pos)
    assert torch.isfinite(out).all()
    for b, n in enumerate(lengths):
        sl = slice(Lmax - n, Lmax)
        alone = tapa_attention_triton(q[b : b + 1, :, sl], k[b : b + 1, :, sl], v[b : b + 1, :, sl])
        torch.testing.assert_close(out[b : b + 1, :, sl], alone, atol=1e-5, rtol=1e-5)
        assert torch.all(out[b, :, : Lmax - n] == 0)  # pad queries see only pads -> zeros


def test_packed_segments_equal_separate_runs():
    q, k, v = _qkv(1, 4, 2, 40, 40, 32, seed=41)
    seg = torch.tensor([[0] * 15 + [1] * 25])
    pos = torch.cat([torch.arange(15), torch.arange(25)])[None]
    out = tapa_attention_triton(q, k, v, q_positions=pos, k_positions=pos, q_segment_ids=seg, k_segment_ids=seg)
    for sl in (slice(0, 15), slice(15, 40)):
        alone = tapa_attention_triton(q[:, :, sl], k[:, :, sl], v[:, :, sl])
        torch.testing.assert_close(out[:, :, sl], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.upstream
@pytest.mark.parametrize("lq, window", [(1, None), (3, None), (3, 8)])
def test_decode_rows_equal_full_pass(lq, window):
    q, k, v = _qkv(2, 4, 2, 40, 40, 32, seed=51)
    kpm, pos = _left_padded([29, 40], 40, offset=70_000)  # large absolute positions: only distances matter
    kw = dict(key_padding_mask=kpm, k_positions=pos, sliding_window=window)
    full = tapa_attention_triton(q, k, v, q_positions=pos, **kw)
    step = tapa_attention_triton(q[:, :, -lq:], k, v, q_positions=pos[:, -lq:], **kw)
    torch.testing.assert_close(step, full[:, :, -lq:], atol=1e-5, rtol=1e-5)


@pytest.mark.upstream
def test_kernel_empty_rows_zero_and_finite_grads():
    q, k, v = _qkv(1, 2, 1, 20, 20, 32, seed=61, grad=True)
    kpm = torch.ones(1, 20, dtype=torch.bool)
    kpm[0, :6] = False
    out = tapa_attention_triton(q, k, v, key_padding_mask=kpm)
    assert out[:, :, :6].abs().max() == 0
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[0][:, :, :6].abs().max() == 0


@pytest.mark.parametrize("fn", [tapa_attention_reference, tapa_attention_triton])
def test_window_covering_all_keys_equals_no_window(fn):
    q, k, v = _qkv(1, 2, 1, 21, 37, 32, seed=65)
    base = fn(q, k, v)
    for w in (37, 1000):
        assert torch.equal(fn(q, k, v, sliding_window=w), base)
    assert not torch.allclose(fn(q, k, v, sliding_window=36), base)  # one key fewer does change rows


def _first_key_read(start, off, window, block_n):
    """First key a forward / dQ tile starting at query `start` reads with a window (kernel block rule)."""
    return (max(start + off - window + 1, 0) // block_n) * block_n


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
def test_window_skips_keys_left_of_every_window(deterministic):
    """Keys before a tile's window are never loaded: NaN there must not reach the rows (fwd and dQ)."""
    B, Hq, Hkv, L, D, W, bad = 1, 2, 1, 70, 32, 7, 16
    q, k, v = _qkv(B, Hq, Hkv, L, L, D, seed=66, grad=True)
    ref = tapa_attention_reference(q, k, v, sliding_window=W)
    do = torch.randn(ref.shape, generator=torch.Generator().manual_seed(67))
    dq_ref = torch.autograd.grad(ref, q, do)[0]
    k_bad, v_bad = k.detach().clone(), v.detach().clone()
    k_bad[:, :, :bad] = float("nan")
    v_bad[:, :, :bad] = float("nan")
    q_in = q.detach().clone().requires_grad_(True)
    out = tapa_attention_triton(q_in, k_bad, v_bad, sliding_window=W, deterministic=deterministic)
    t = tiles(INTERPRETER, D)["fwd"]
    bm, bn = t.block_m, t.block_n
    clean = [i for i in range(L) if _first_key_read((i // bm) * bm, 0, W, bn) >= bad]
    assert len(clean) >= 32  # the check has teeth: most rows lie in tiles that skip the poisoned block
    torch.testing.assert_close(out[:, :, clean], ref[:, :, clean].detach(), atol=3e-4, rtol=3e-4)
    dq = torch.autograd.grad(out, q_in, do)[0]
    t = tiles(INTERPRETER, D)["dq" if deterministic else "bwd"]
    bm, bn = t.block_m, t.block_n
    clean = [i for i in range(L) if _first_key_read((i // bm) * bm, 0, W, bn) >= bad]
    assert len(clean) >= 32
    torch.testing.assert_close(dq[:, :, clean], dq_ref[:, :, clean], atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
def test_window_dkdv_skips_queries_past_the_window(deterministic):
    """The dK/dV kernel never reads query rows past a key block's window: NaN there stays out."""
    B, Hq, Hkv, L, D, W, bad = 1, 2, 1, 70, 32, 7, 48
    q, k, v = _qkv(B, Hq, Hkv, L, L, D, seed=68, grad=True)
    do = torch.randn(B, Hq, L, D, generator=torch.Generator().manual_seed(69))
    ref = tapa_attention_reference(q, k, v, sliding_window=W)
    dk_ref, dv_ref = torch.autograd.grad(ref, (k, v), do)
    q_bad, do_bad = q.detach().clone(), do.clone()
    q_bad[:, :, bad:] = float("nan")
    do_bad[:, :, bad:] = float("nan")
    k_in, v_in = k.detach().clone().requires_grad_(True), v.detach().clone().requires_grad_(True)
    out = tapa_attention_triton(q_bad, k_in, v_in, sliding_window=W, deterministic=deterministic)
    dk, dv = torch.autograd.grad(out, (k_in, v_in), do_bad)
    t = tiles(INTERPRETER, D)["dkdv" if deterministic else "bwd"]
    bm, bn = t.block_m, t.block_n
    # key block [s, s + bn) reads query rows < ceil((s + bn − 1 + W) / bm)·bm
    clean = [j for j in range(L) if -(-((j // bn) * bn + bn - 1 + W) // bm) * bm <= bad]
    assert len(clean) >= 16
    torch.testing.assert_close(dk[:, :, clean], dk_ref[:, :, clean], atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(dv[:, :, clean], dv_ref[:, :, clean], atol=3e-3, rtol=3e-3)


def test_window_decode_reads_only_the_window():
    """Decode splits cover only the key blocks that hold the window: NaN keys before them are harmless."""
    q, k, v = _qkv(1, 4, 2, 1, 200, 32, seed=70)
    W = 8
    ref = tapa_attention_reference(q, k, v, sliding_window=W)
    bn = decode.tile(INTERPRETER, 32).block_n
    first = ((200 - 1 - W + 1) // bn) * bn
    assert first >= 128
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, :first] = float("nan")
    v_bad[:, :, :first] = float("nan")
    out = tapa_attention_triton(q, k_bad, v_bad, sliding_window=W)
    torch.testing.assert_close(out, ref, atol=3e-4, rtol=3e-4)


@pytest.mark.upstream
def test_dispatch(monkeypatch):
    """Which path `tapa_attention` takes (spied, not inferred from equal outputs), and that it returns that path's
    result: Triton under the interpreter / on CUDA, and on CPU the chunked path for float64 (the kernel takes no
    float64) or without the interpreter."""
    import hf_posenc.kernels.tapa.dispatch as tapa_ops

    q, k, v = _qkv(1, 2, 1, 5, 5, 16, seed=71)
    calls = []

    def spy(name):
        real = getattr(tapa_ops, name)

        def wrapped(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        def with_args(*args, **kwargs):  # the dispatcher hands over the options it validated
            calls.append(name)
            return real.with_args(*args, **kwargs)

        wrapped.with_args = with_args
        monkeypatch.setattr(tapa_ops, name, wrapped)

    for name in ("tapa_attention_triton", "tapa_attention_chunked", "tapa_attention_reference"):
        spy(name)
    assert uses_triton(q)  # conftest sets TRITON_INTERPRET=1 on CPU-only machines
    out = tapa_attention(q, k, v)
    assert calls == ["tapa_attention_triton"]
    torch.testing.assert_close(out, tapa_attention_reference(q, k, v), atol=2e-5, rtol=2e-5)
    calls.clear()
    out64 = tapa_attention(q.double(), k.double(), v.double())
    assert calls[0] == "tapa_attention_chunked" and out64.dtype == torch.float64
    calls.clear()
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU machine without the interpreter: the chunked path
    assert not uses_triton(q)
    tapa_attention(q, k, v)
    assert calls[0] == "tapa_attention_chunked"


# --------------------------------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------------------------------


def test_tapa_split():
    assert tapa_split(64, 0.5) == (32, 32)
    assert tapa_split(128, 0.25) == (32, 96)
    with pytest.raises(ValueError, match="whole number"):
        tapa_split(64, 0.3)
    with pytest.raises(ValueError, match="whole number"):
        tapa_split(4, 0.1)  # 0.4 dims
    with pytest.raises(ValueError, match="strictly between"):
        tapa_split(64, 1.0)
    with pytest.raises(ValueError, match="positive int"):
        tapa_split(0, 0.5)


def test_tapa_split_empty_part():
    with pytest.raises(ValueError, match="empty"):
        tapa_split(64, 1e-9)  # rounds to 0 amplitude dims


@pytest.mark.parametrize("fn", [tapa_attention_reference, tapa_attention_triton, tapa_attention])
def test_bad_arguments(fn):
    q, k, v = _qkv(2, 4, 2, 6, 8, 16, seed=81)
    with pytest.raises(ValueError, match="multiple"):
        fn(q, k[:, :1].expand(2, 3, 8, 16), v[:, :1].expand(2, 3, 8, 16))
    with pytest.raises(ValueError, match="Lq"):
        fn(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match="phase"):
        fn(q, k, v, phase="cubic")
    with pytest.raises(ValueError, match="alpha"):
        fn(q, k, v, alpha=0.0)
    with pytest.raises(ValueError, match="whole number"):
        fn(q, k, v, theta=0.3)
    with pytest.raises(TypeError, match="dtype"):
        fn(q, k.half(), v)
    with pytest.raises(ValueError, match="k_positions"):
        fn(q, k, v, q_positions=torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(TypeError, match="integers"):
        fn(q, k, v, k_positions=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="shape"):
        fn(q, k, v, k_positions=torch.zeros(2, 7, dtype=torch.long))
    with pytest.raises(TypeError, match="bool"):
        fn(q, k, v, key_padding_mask=torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="both"):
        fn(q, k, v, q_segment_ids=torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="4-D"):
        fn(q[0], k, v)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="sliding_window must be >= 1"):
            fn(q, k, v, sliding_window=bad)
    for bad in (2.5, True, "8"):
        with pytest.raises(TypeError, match="sliding_window must be a positive int"):
            fn(q, k, v, sliding_window=bad)


def test_benchmark_smoke(tmp_path):
    """The GPU benchmark runs a tiny case through the same code paths on CPU and writes its JSON."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "tapa_attention.py"
    spec = importlib.util.spec_from_file_location("tapa_attention_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--smoke", "--out", str(tmp_path / "tapa.json")])
    data = json.loads(out.read_text())
    modes = [r["mode"] for r in data["records"]]
    assert modes == ["fwd", "fwd_bwd", "decode"]
    for rec in data["records"]:
        assert rec["ratios"]["kernel_over_sdpa"] > 0
        assert all(r["median_ms"] > 0 for r in rec["results"].values())


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
def test_kernel_strided_inputs(deterministic):
    """HF attention passes q/k/v as transposed views of [B, L, H, D]; the kernels read strides, forward and
    backward (the row strides of q/k then differ from those of dO and v, which the backward tiles must keep apart)."""
    g = torch.Generator().manual_seed(91)
    q = torch.randn(2, 37, 4, 32, generator=g).transpose(1, 2).requires_grad_(True)
    k = torch.randn(2, 37, 2, 32, generator=g).transpose(1, 2).requires_grad_(True)
    v = torch.randn(2, 37, 2, 32, generator=g).transpose(1, 2).requires_grad_(True)
    assert not q.is_contiguous()
    out = tapa_attention_triton(q, k, v, deterministic=deterministic)
    ref = tapa_attention_reference(q, k, v)
    torch.testing.assert_close(out, ref, atol=3e-4, rtol=3e-4)
    do = torch.randn(out.shape, generator=g)
    for name, a, b in zip("qkv", torch.autograd.grad(out, (q, k, v), do), torch.autograd.grad(ref, (q, k, v), do)):
        torch.testing.assert_close(a, b, atol=3e-3, rtol=3e-3, msg=lambda m: f"d{name}: {m}")
