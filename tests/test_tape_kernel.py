"""TAPE attention op (eq. 6–7): reference vs an independent float64 formula, SDPA fold and Triton kernel
(forward and all four gradients) vs the reference, on fresh random inputs. Triton runs under
TRITON_INTERPRET=1 here (set by conftest.py), so the shapes stay small."""

from __future__ import annotations

import pytest
import torch

from hf_posenc.kernels.tape import (
    tape_attention,
    tape_attention_reference,
    tape_attention_sdpa,
    tape_attention_triton,
    uses_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=3e-3, rtol=3e-3)}

# (B, Hq, Hkv, Lq, Lk, D, De, causal, left_pad)
SHAPES = {
    "mha-37-causal": (1, 2, 2, 37, 37, 16, 8, True, False),
    "gqa2-70-causal-pad": (1, 4, 2, 70, 70, 32, 32, True, True),
    "gqa3-37-noncausal": (2, 3, 1, 37, 37, 16, 8, False, False),
    "gqa3-37-noncausal-pad": (2, 3, 1, 37, 37, 16, 8, False, True),
    "prefill-chunk-20-of-45": (1, 4, 2, 20, 45, 16, 8, True, False),
    "decode-1-of-50": (2, 4, 2, 1, 50, 16, 8, True, False),
    "decode-3-of-50-pad": (2, 4, 2, 3, 50, 32, 32, True, True),
    "decode-3-of-50-noncausal": (1, 3, 1, 3, 50, 16, 8, False, False),
    # the head dims of the supported models, E as wide as the head (as the TAPE scheme stores it)
    "d64-gqa2-37-causal-pad": (1, 4, 2, 37, 37, 64, 64, True, True),
    "d128-21-of-37-noncausal": (1, 2, 1, 21, 37, 128, 128, False, False),
    "d128-decode-2-of-40-pad": (1, 4, 2, 2, 40, 128, 128, True, True),
}


def make_inputs(B, Hq, Hkv, Lq, Lk, D, De, left_pad, dtype=torch.float32, seed=None):
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    q = torch.randn(B, Hq, Lq, D, generator=g)
    k = torch.randn(B, Hkv, Lk, D, generator=g)
    v = torch.randn(B, Hkv, Lk, D, generator=g)
    e = torch.randn(B, Hkv, Lk, De, generator=g)
    kpm = None
    if left_pad:
        kpm = torch.ones(B, Lk, dtype=torch.bool)
        kpm[0, : Lk // 3] = False  # first sequence left-padded (its early causal rows see no key at all)
        if B > 1:
            kpm[1, :2] = False
        kpm = kpm.to(DEVICE)
    return [t.to(DEVICE, dtype) for t in (q, k, v, e)], kpm


def float64_formula(q, k, v, e, scale, causal, kpm):
    """softmax(scale·q kᵀ + masks)·[V | E] in float64, with the mask built entry by entry."""
    q, k, v, e = (t.detach().cpu().double() for t in (q, k, v, e))
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    o = torch.zeros(B, Hq, Lq, D, dtype=torch.float64)
    eo = torch.zeros(B, Hq, Lq, e.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kvh = h // group
            for i in range(Lq):
                keys = [j for j in range(Lk) if (not causal or j <= i + Lk - Lq) and (kpm is None or bool(kpm[b, j]))]
                if not keys:
                    continue
                s = torch.stack([scale * torch.dot(q[b, h, i], k[b, kvh, j]) for j in keys])
                p = torch.softmax(s, dim=0)
                ve = torch.cat([v[b, kvh, keys], e[b, kvh, keys]], dim=-1)
                out = p @ ve
                o[b, h, i], eo[b, h, i] = out[:D], out[D:]
    return o, eo


def test_reference_matches_float64_formula():
    (q, k, v, e), kpm = make_inputs(2, 4, 2, 5, 9, 8, 6, left_pad=True)
    for causal in (True, False):
        o, eo = tape_attention_reference(q.double(), k.double(), v.double(), e.double(), scale=0.3, causal=causal,
                                         key_padding_mask=kpm)
        ro, reo = float64_formula(q, k, v, e, 0.3, causal, None if kpm is None else kpm.cpu())
        torch.testing.assert_close(o.cpu(), ro, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(eo.cpu(), reo, atol=1e-12, rtol=1e-12)
        # fp32 reference (fp32 accumulation) agrees too, and fully padded rows are zero, not NaN
        o32, eo32 = tape_attention_reference(q, k, v, e, scale=0.3, causal=causal, key_padding_mask=kpm)
        torch.testing.assert_close(o32.cpu().double(), ro, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(eo32.cpu().double(), reo, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(o).all() and torch.isfinite(eo).all()


def test_reference_default_scale_and_empty_rows():
    (q, k, v, e), _ = make_inputs(1, 2, 1, 4, 6, 16, 4, left_pad=False)
    kpm = torch.zeros(1, 6, dtype=torch.bool, device=DEVICE)
    kpm[0, 4:] = True  # causal rows 0 and 1 (absolute positions 2, 3) see no unpadded key
    o, eo = tape_attention_reference(q, k, v, e, key_padding_mask=kpm)
    ro, reo = float64_formula(q, k, v, e, 16**-0.5, True, kpm.cpu())
    torch.testing.assert_close(o.cpu().double(), ro, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eo.cpu().double(), reo, atol=1e-5, rtol=1e-5)
    assert (o[:, :, :2] == 0).all() and (eo[:, :, :2] == 0).all()
    assert (o[:, :, 2:].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("name", ["gqa2-70-causal-pad", "gqa3-37-noncausal-pad", "decode-3-of-50-pad",
                                  "prefill-chunk-20-of-45", "mha-37-causal"])
def test_sdpa_fold_matches_reference(name):
    B, Hq, Hkv, Lq, Lk, D, De, causal, pad = SHAPES[name]
    (q, k, v, e), kpm = make_inputs(B, Hq, Hkv, Lq, Lk, D, De, pad)
    q, k, v, e = (t.double().requires_grad_() for t in (q, k, v, e))
    o, eo = tape_attention_sdpa(q, k, v, e, causal=causal, key_padding_mask=kpm)
    ro, reo = tape_attention_reference(q, k, v, e, causal=causal, key_padding_mask=kpm)
    torch.testing.assert_close(o, ro, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(eo, reo, atol=1e-10, rtol=1e-10)
    go, ge = torch.randn_like(o), torch.randn_like(eo)
    grads = torch.autograd.grad((o * go).sum() + (eo * ge).sum(), (q, k, v, e))
    ref = torch.autograd.grad((ro * go).sum() + (reo * ge).sum(), (q, k, v, e))
    for g, r in zip(grads, ref):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("several", [False, True], ids=["one-split", "split-k"])
def test_decode_plan_splits_keys_only_when_there_are_several_blocks(monkeypatch, several):
    """decode.plan_decode: 12 keys are one key block, one split, and the decode launch writes O and Ẽ itself; many
    key blocks (interpreter: 50 keys in 16-key blocks for 2 row-tile programs, 4 splits; GPU: 2048 keys, at
    least 4 blocks per split) are split, and one combine merges the [O | Ẽ] partials. Both match the reference."""
    import hf_posenc.kernels.tape.triton_tape as tt

    lk = (2048 if DEVICE == "cuda" else 50) if several else 12
    seen = []
    real = tt.launch_all
    monkeypatch.setattr(tt, "launch_all", lambda specs: (seen.append(specs), real(specs)))
    (q, k, v, e), _ = make_inputs(1, 4, 2, 2, lk, 16, 8, left_pad=False, seed=90 + lk)
    o, eo = tape_attention_triton(q, k, v, e)
    fwd = seen[-1][0]
    assert [s.name for s in seen[-1]] == ["tape_decode"] + (["split_combine"] if several else [])
    splits = fwd.grid[2]
    assert (splits > 1) == several and (DEVICE == "cuda" or splits == (4 if several else 1))
    assert fwd.grid[:2] == (1, 2) and fwd.args["GP"] == 2 and fwd.derived["LAZY"] is False
    ro, reo = tape_attention_reference(q, k, v, e)
    torch.testing.assert_close(o, ro, **TOL[torch.float32])
    torch.testing.assert_close(eo, reo, **TOL[torch.float32])


def _forward_backward(fn, inputs, kpm, causal, go, ge, **options):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    o, eo = fn(*leaves, causal=causal, key_padding_mask=kpm, **options)
    grads = torch.autograd.grad((o * go).sum() + (eo * ge).sum(), leaves)
    return o.detach(), eo.detach(), grads


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_triton_forward_and_gradients_match_reference(name, deterministic):
    B, Hq, Hkv, Lq, Lk, D, De, causal, pad = SHAPES[name]
    inputs, kpm = make_inputs(B, Hq, Hkv, Lq, Lk, D, De, pad)
    go = torch.randn(B, Hq, Lq, D, device=DEVICE)
    ge = torch.randn(B, Hq, Lq, De, device=DEVICE)
    o, eo, grads = _forward_backward(tape_attention_triton, inputs, kpm, causal, go, ge, deterministic=deterministic)
    # fp32 inputs: compare with the reference run in float64 (fp32 kernel dots are exact, not tf32)
    ro, reo, ref = _forward_backward(tape_attention_reference, [t.double() for t in inputs], kpm, causal,
                                     go.double(), ge.double())
    tol = TOL[torch.float32]
    torch.testing.assert_close(o, ro.float(), **tol)
    torch.testing.assert_close(eo, reo.float(), **tol)
    for label, g, r in zip("q k v e".split(), grads, ref):
        assert torch.isfinite(g).all(), f"d{label} has non-finite entries"
        torch.testing.assert_close(g, r.float(), atol=1e-4, rtol=1e-4, msg=lambda m: f"d{label}: {m}")


@pytest.mark.parametrize("growth", [0.05, 3.0])
def test_triton_lazy_rescaling_matches_reference(growth):
    """Keys whose scores grow along the sequence: the row maxima move by less than 2^8 between key blocks (the
    kernel keeps its stale reference maximum; growth 0.05) or by far more (it rescales; growth 3, scores in the
    hundreds, so a kernel that never rescaled would overflow fp32). Both must equal the reference, forward and
    backward."""
    inputs, kpm = make_inputs(1, 4, 2, 70, 70, 32, 32, False, seed=7)
    q, k, v, e = inputs
    k = k * (1.0 + growth * torch.arange(70, device=DEVICE, dtype=k.dtype))[:, None]
    go = torch.randn(1, 4, 70, 32, device=DEVICE)
    ge = torch.randn(1, 4, 70, 32, device=DEVICE)
    o, eo, grads = _forward_backward(tape_attention_triton, [q, k, v, e], None, True, go, ge)
    ro, reo, ref = _forward_backward(tape_attention_reference, [t.double() for t in (q, k, v, e)], None, True,
                                     go.double(), ge.double())
    torch.testing.assert_close(o, ro.float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(eo, reo.float(), atol=1e-4, rtol=1e-4)
    for label, g, r in zip("q k v e".split(), grads, ref):
        scale = max(1.0, r.abs().max().item())
        torch.testing.assert_close(g / scale, (r / scale).float(), atol=1e-4, rtol=0, msg=lambda m: f"d{label}: {m}")


@pytest.mark.upstream
def test_positional_output_gradient_reaches_dq_and_dk():
    """With dO = 0 and only dẼ non-zero, dq and dk must still be non-zero (dP = dẼ·Eᵀ, Δ = rowsum(dẼ∘Ẽ)).

    The released fused kernel dropped these terms, which would give dq = dk = 0 here."""
    B, Hq, Hkv, Lq, Lk, D, De = 1, 4, 2, 37, 37, 16, 8
    inputs, _ = make_inputs(B, Hq, Hkv, Lq, Lk, D, De, left_pad=False)
    go = torch.zeros(B, Hq, Lq, D, device=DEVICE)
    ge = torch.randn(B, Hq, Lq, De, device=DEVICE)
    _, _, (dq, dk, dv, de) = _forward_backward(tape_attention_triton, inputs, None, True, go, ge)
    _, _, (rq, rk, rv, re) = _forward_backward(tape_attention_reference, [t.double() for t in inputs], None, True,
                                               go.double(), ge.double())
    assert dq.abs().max() > 1e-2 and dk.abs().max() > 1e-2
    assert (dv == 0).all()  # no value gradient without dO
    for g, r in ((dq, rq), (dk, rk), (de, re)):
        torch.testing.assert_close(g, r.float(), atol=1e-4, rtol=1e-4)
    # and the positional path changes dq: adding dẼ to a fixed dO changes the query gradient
    go2 = torch.randn_like(go)
    _, _, (dq_o, dk_o, _, _) = _forward_backward(tape_attention_triton, inputs, None, True, go2, torch.zeros_like(ge))
    _, _, (dq_oe, dk_oe, _, _) = _forward_backward(tape_attention_triton, inputs, None, True, go2, ge)
    torch.testing.assert_close(dq_oe - dq_o, dq, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dk_oe - dk_o, dk, atol=1e-4, rtol=1e-4)


@pytest.mark.upstream
def test_triton_fp16_forward():
    B, Hq, Hkv, Lq, Lk, D, De = 1, 4, 2, 37, 37, 32, 16
    inputs, kpm = make_inputs(B, Hq, Hkv, Lq, Lk, D, De, left_pad=True, dtype=torch.float16)
    o, eo = tape_attention_triton(*inputs, key_padding_mask=kpm)
    ro, reo = tape_attention_reference(*inputs, key_padding_mask=kpm)
    assert o.dtype == torch.float16 and eo.dtype == torch.float16
    torch.testing.assert_close(o, ro, **TOL[torch.float16])
    torch.testing.assert_close(eo, reo, **TOL[torch.float16])


@pytest.mark.upstream
@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-bwd", "deterministic-bwd"])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_triton_fp16_backward(D, deterministic):
    """fp16 inputs: forward and all four gradients against the reference on the same fp16 inputs."""
    B, Hq, Hkv, Lq, Lk = 1, 4, 2, 29, 29
    inputs, kpm = make_inputs(B, Hq, Hkv, Lq, Lk, D, D, left_pad=True, dtype=torch.float16, seed=D)
    g = torch.Generator().manual_seed(D + 1)
    go = torch.randn(B, Hq, Lq, D, generator=g).to(DEVICE, torch.float16)
    ge = torch.randn(B, Hq, Lq, D, generator=g).to(DEVICE, torch.float16)
    o, eo, grads = _forward_backward(tape_attention_triton, inputs, kpm, True, go, ge, deterministic=deterministic)
    ro, reo, ref = _forward_backward(tape_attention_reference, inputs, kpm, True, go, ge)
    torch.testing.assert_close(o, ro, **TOL[torch.float16])
    torch.testing.assert_close(eo, reo, **TOL[torch.float16])
    for label, a, b in zip("q k v e".split(), grads, ref):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.float() / scale, b.float() / scale, atol=1e-2, rtol=0,
                                   msg=lambda m: f"d{label}: {m}")


def test_backward_path_follows_torch_determinism(monkeypatch):
    """The fused backward (dv/de in one key-side launch, dk with atomic dq in the other) is the default where the
    target's tile table lists a fused tile (the interpreter, and 16-bit inputs on Hopper; fp16 inputs on a GPU
    here, since the fp32 and sm_80 tables list none and run the two-kernel backward by default);
    torch.use_deterministic_algorithms(True) or deterministic=True selects the two-kernel backward, whose dq is
    bitwise reproducible."""
    import hf_posenc.kernels.tape.triton_tape as tt
    from hf_posenc.kernels._triton.launch import Target

    names = []
    real = tt.launch_all
    monkeypatch.setattr(tt, "launch_all", lambda specs: (names.append([s.name for s in specs]), real(specs)))
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    inputs, kpm = make_inputs(1, 4, 2, 37, 37, 32, 16, left_pad=True, dtype=dtype, seed=11)
    go = torch.randn(1, 4, 37, 32, device=DEVICE, dtype=dtype)
    ge = torch.randn(1, 4, 37, 16, device=DEVICE, dtype=dtype)
    target = Target.of(inputs[0])
    fused_listed = "dkdq" in tt.tiles(target, 32, 16, inputs[0].element_size())
    if target.interpreter or target.hopper:  # the tables that list a fused tile for these (16-bit on a GPU) inputs
        assert fused_listed

    def grads(**kw):
        names.clear()
        return names, _forward_backward(tape_attention_triton, inputs, kpm, True, go, ge, **kw)[2]

    seen, fused = grads()
    two_kernel = ["row_dot", "tape_bwd_dkdv", "tape_bwd_dq"]
    assert seen[-1] == (["row_dot", "tape_bwd_dvde", "tape_bwd_dkdq"] if fused_listed else two_kernel)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        seen, g1 = grads()
        assert seen[-1] == two_kernel
    finally:
        torch.use_deterministic_algorithms(was)
    seen, g2 = grads(deterministic=True)
    assert seen[-1] == two_kernel
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    # the two backwards sum over other tiles, so in another order: fp32 rounding apart, or fp16's (on an H200, one
    # element of de 1.5e-5 apart at 0.03, one ulp)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else TOL[torch.float16]
    for label, a, b in zip("q k v e".split(), fused, g2):
        torch.testing.assert_close(a, b, **tol, msg=lambda m: f"d{label}: {m}")


@pytest.mark.parametrize("arch, fused", [(90, True), (80, False)])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_backward_plan(arch, fused, D):
    """On Hopper the fused backward is planned at head dims <= 128 (its tiles: key blocks of 64+, so every product
    can run on the warpgroup MMA), the two-kernel one at D = 256 and on Ampere; deterministic=True always plans
    the two-kernel backward. Planned on meta tensors, nothing runs."""
    from hf_posenc.kernels._triton.launch import Target
    from hf_posenc.kernels.tape.args import validate_tape_args
    from hf_posenc.kernels.tape.triton_tape import plan_backward

    def meta(*shape, dt=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dt)

    q, o, do = (meta(2, 8, 1024, D) for _ in range(3))
    k, v, e = (meta(2, 2, 1024, D) for _ in range(3))
    args = validate_tape_args(q, k, v, e)
    target = Target.gpu(arch)
    plan = plan_backward(do, do, q, k, v, e, o, o, meta(2, 8, 1024, dt=torch.float32), args, target)
    names = [s.name for s in plan.specs]
    if fused and D <= 128:
        assert names == ["row_dot", "tape_bwd_dvde", "tape_bwd_dkdq"]
        assert plan.dq.dtype == torch.float32 and plan.dq_scale == args.scale
        assert all(s.args["BLOCK_N"] >= 64 for s in plan.specs[1:])
    else:
        assert names == ["row_dot", "tape_bwd_dkdv", "tape_bwd_dq"]
        assert plan.dq.dtype == torch.bfloat16 and plan.dq_scale is None
    det = plan_backward(do, do, q, k, v, e, o, o, meta(2, 8, 1024, dt=torch.float32), args, target, True)
    assert [s.name for s in det.specs] == ["row_dot", "tape_bwd_dkdv", "tape_bwd_dq"]


@pytest.mark.upstream
def test_triton_non_contiguous_inputs_and_custom_scale():
    """Token-major views (what HF attention passes), forward and backward: the row strides of q/k/v/e then differ
    from those of dO/dẼ, which the backward tiles must keep apart."""
    B, Hq, Hkv, L, D, De = 1, 4, 2, 21, 16, 8
    leaves = [torch.randn(B, L, h, w, device=DEVICE).transpose(1, 2).requires_grad_()  # [B, H, L, ·] views
              for h, w in ((Hq, D), (Hkv, D), (Hkv, D), (Hkv, De))]
    assert not leaves[0].is_contiguous()
    o, eo = tape_attention_triton(*leaves, scale=0.7)
    ro, reo = tape_attention_reference(*leaves, scale=0.7)
    torch.testing.assert_close(o, ro, **TOL[torch.float32])
    torch.testing.assert_close(eo, reo, **TOL[torch.float32])
    go, ge = torch.randn_like(o), torch.randn_like(eo)
    grads = torch.autograd.grad((o * go).sum() + (eo * ge).sum(), leaves)
    ref = torch.autograd.grad((ro * go).sum() + (reo * ge).sum(), leaves)
    for label, g, r in zip("q k v e".split(), grads, ref):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{label}: {m}")


@pytest.mark.upstream
def test_dispatch(monkeypatch):
    """Which path `tape_attention` takes (spied, not inferred from equal outputs): the Triton kernel on CUDA or
    under the interpreter, the reference for float64 (the kernel takes no float64)."""
    import hf_posenc.kernels.tape as tape_ops

    (q, k, v, e), _ = make_inputs(1, 2, 1, 5, 7, 16, 8, left_pad=False)
    calls = []
    for name in ("tape_attention_triton", "tape_attention_reference"):  # the dispatcher hands over validated args
        real = getattr(tape_ops, name).with_args
        monkeypatch.setattr(getattr(tape_ops, name), "with_args", lambda *a, _real=real, _name=name:
                            calls.append(_name) or _real(*a))
    assert uses_triton(q)  # CUDA, or the interpreter set by conftest.py
    assert not uses_triton(q.double())
    o, eo = tape_attention(q, k, v, e)
    assert calls == ["tape_attention_triton"]
    ro, reo = tape_attention_reference(q, k, v, e)
    torch.testing.assert_close(o, ro, **TOL[torch.float32])
    torch.testing.assert_close(eo, reo, **TOL[torch.float32])
    calls.clear()
    o64, _ = tape_attention(q.double(), k.double(), v.double(), e.double())
    assert calls == ["tape_attention_reference"] and o64.dtype == torch.float64


@pytest.mark.parametrize("fn", [tape_attention_reference, tape_attention_sdpa, tape_attention_triton])
def test_bad_arguments_raise(fn):
    (q, k, v, e), _ = make_inputs(1, 3, 1, 4, 6, 16, 8, left_pad=False)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        fn(q, torch.cat([k, k], 1), torch.cat([v, v], 1), torch.cat([e, e], 1))
    with pytest.raises(ValueError, match="Lq=6 > Lk=4"):
        fn(torch.randn(1, 3, 6, 16, device=DEVICE), k[:, :, :4], v[:, :, :4], e[:, :, :4])
    with pytest.raises(ValueError, match="e must be"):
        fn(q, k, v, e[:, :, :5])
    with pytest.raises(ValueError, match="4-D"):
        fn(q[0], k, v, e)
    with pytest.raises(TypeError, match="share one dtype"):
        fn(q, k, v, e.half())
    with pytest.raises(ValueError, match="head width"):
        fn(q, k[..., :8], v[..., :8], e)
    with pytest.raises(TypeError, match="bool tensor"):
        fn(q, k, v, e, key_padding_mask=torch.ones(1, 6, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[B, Lk\]"):
        fn(q, k, v, e, key_padding_mask=torch.ones(1, 5, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="finite positive"):
        fn(q, k, v, e, scale=-1.0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        fn(q, k, v, e, causal=1)


def test_triton_rejects_float64():
    (q, k, v, e), _ = make_inputs(1, 2, 1, 4, 6, 16, 8, left_pad=False)
    with pytest.raises(TypeError, match="float64"):
        tape_attention_triton(q.double(), k.double(), v.double(), e.double())
