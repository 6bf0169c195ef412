"""Chunked (flash-style) CPU path of TAPA attention vs the float64 reference (the specification), on fresh
random inputs: every combination of causal / phase / sliding window / masks (key padding, packed segments,
explicit positions, per-row offsets) and shapes (GQA prefill, Lq < Lk, decode, MHA), forward and backward,
float64 / float32 / bfloat16 / float16 with per-dtype tolerances, block sizes that do not divide the lengths,
rows that see no key, block skipping (poisoned keys it must never read), worker threads, grad / inference
modes, autocast, bounded memory, dispatch, and the CPU benchmark's smoke mode."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from hf_posenc.kernels import cpu_parallel
from hf_posenc.kernels.tapa import chunked as chunked_module
from hf_posenc.kernels.tapa import tapa_attention, tapa_attention_chunked, tapa_attention_reference

# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

SHAPES = {  # B, Hq, Hkv, Lq, Lk, D
    "gqa_prefill": (2, 4, 2, 37, 37, 16),
    "ragged_lq_lt_lk": (2, 6, 2, 19, 45, 16),
    "decode": (2, 4, 2, 1, 45, 16),
    "mha": (1, 2, 2, 29, 29, 8),
}
MASKS = ["none", "padding", "packed", "positions", "row_offsets", "all"]


def _qkv(B, Hq, Hkv, Lq, Lk, D, *, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, Lq, D, generator=g, dtype=torch.float64) * scale).to(dtype)
    k = torch.randn(B, Hkv, Lk, D, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, Hkv, Lk, D, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _masks(kind: str, B: int, Lq: int, Lk: int, seed: int) -> dict:
    """Mask / position arguments of one kind, random but realistic (queries are the last Lq keys)."""
    g = torch.Generator().manual_seed(seed)
    kw: dict = {}
    if kind in ("padding", "all"):
        kpm = torch.rand(B, Lk, generator=g) > 0.25
        kpm[-1, : Lk // 3] = False  # left padding on the last row
        kw["key_padding_mask"] = kpm
    if kind in ("packed", "all"):  # documents packed in a row: positions restart, attention stays inside one
        seg = torch.zeros(B, Lk, dtype=torch.long)
        pos = torch.zeros(B, Lk, dtype=torch.long)
        for b in range(B):
            cuts = sorted(torch.randperm(Lk - 1, generator=g)[:3].add(1).tolist())
            for s, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, Lk])):
                seg[b, lo:hi] = s
                pos[b, lo:hi] = torch.arange(hi - lo)
        kw.update(q_segment_ids=seg[:, Lk - Lq :], k_segment_ids=seg, q_positions=pos[:, Lk - Lq :], k_positions=pos)
    if kind == "positions":  # arbitrary integer positions (not consecutive): the per-pair lookup
        pos = torch.randint(0, 3 * Lk, (B, Lk), generator=g)
        kw.update(q_positions=pos[:, Lk - Lq :], k_positions=pos)
    if kind == "row_offsets":  # consecutive positions, a different start per row (cached decoding)
        pos = torch.arange(Lk)[None] + torch.tensor([[0], [57]])[:B]
        kw.update(q_positions=pos[:, Lk - Lq :], k_positions=pos)
    return kw


def _grads(out, inputs, seed):
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad(out, inputs, do)


def _error(got, want):
    """max |got − want| / max(1, max |want|)."""
    return (got.double() - want.double()).abs().max().item() / max(1.0, want.abs().max().item())


def _check_against_reference(shape, kw, *, dtype, tol_out, tol_grad, seed, blocks=(5, 8), scale=1.0,
                             fp32_reference_bound=False):
    """Chunked in `dtype` vs the float64 reference on the same (rounded) inputs, output and dq, dk, dv.

    With `fp32_reference_bound`, the tolerance is tol_out / tol_grad plus 4x the error of the reference itself
    run in float32: large phases (α = 0.6, positions far apart: tens of turns) cost fp32 digits in any
    implementation (one ulp of the phase moves a score by ~1e-5), and the chunked path must lose no more than
    the specification does, up to that rounding noise."""
    q, k, v = _qkv(*shape, dtype=dtype, seed=seed, scale=scale)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = tapa_attention_chunked(q, k, v, block_q=blocks[0], block_k=blocks[1], **kw)
    assert out.dtype == dtype and out.shape == q.shape
    grads = _grads(out, (q, k, v), seed + 1)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = tapa_attention_reference(q64, k64, v64, **kw)
    ref_grads = _grads(ref, (q64, k64, v64), seed + 1)
    if fp32_reference_bound:
        ref32 = tapa_attention_reference(q, k, v, **kw)
        tol_out += 4 * _error(ref32, ref)
        tol_grad += 4 * max(_error(a, b) for a, b in zip(_grads(ref32, (q, k, v), seed + 1), ref_grads))
    err = _error(out, ref)
    assert err <= tol_out, f"out: relative error {err:.2e} > {tol_out:.1e}"
    for name, a, b in zip("qkv", grads, ref_grads):
        assert a.dtype == dtype
        err = _error(a, b)
        assert err <= tol_grad, f"d{name}: relative error {err:.2e} > {tol_grad:.1e}"


# --------------------------------------------------------------------------------------------------
# every option combination, float64 and float32, unaligned blocks
# --------------------------------------------------------------------------------------------------

OPTIONS = list(itertools.product([True, False], ["quadratic", "linear"], [None, 6], MASKS))
# every option combination; the shapes take turns, so each shape meets every mask kind
COMBOS = [(list(SHAPES)[(i + i // len(SHAPES)) % len(SHAPES)], *opts) for i, opts in enumerate(OPTIONS)]


@pytest.mark.parametrize("shape,causal,phase,window,mask", COMBOS)
def test_matches_reference_every_option(shape, causal, phase, window, mask):
    seed = COMBOS.index((shape, causal, phase, window, mask))
    B, _, _, Lq, Lk, _ = SHAPES[shape]
    kw = dict(causal=causal, phase=phase, sliding_window=window, alpha=0.1 if phase == "quadratic" else 0.6,
              **_masks(mask, B, Lq, Lk, seed))
    # float64: the same algorithm, so only rounding-level differences
    _check_against_reference(SHAPES[shape], kw, dtype=torch.float64, tol_out=1e-11, tol_grad=1e-10, seed=seed)
    # float32: no worse than the reference in float32 (about 1e-6 at α = 0.1, up to 2e-5 at α = 0.6 here)
    _check_against_reference(SHAPES[shape], kw, dtype=torch.float32, tol_out=2e-6, tol_grad=8e-6, seed=seed,
                             fp32_reference_bound=True)


@pytest.mark.parametrize("blocks", [(1, 1), (3, 7), (16, 5), (64, 64), (None, None)])
def test_block_sizes_do_not_change_results(blocks):
    """Blocks smaller than, unaligned with, or larger than the lengths; defaults too."""
    kw = dict(sliding_window=9, **_masks("all", 2, 19, 45, seed=5))
    _check_against_reference(SHAPES["ragged_lq_lt_lk"], kw, dtype=torch.float64, tol_out=1e-11, tol_grad=1e-10,
                             seed=11, blocks=blocks)


def test_non_default_alpha_theta_and_long_phases():
    """θ = 1/4 (unequal halves), α = 1 and larger q: phases of many turns (range reduction)."""
    kw = dict(alpha=1.0, theta=0.25, **_masks("positions", 2, 37, 37, seed=2))
    _check_against_reference(SHAPES["gqa_prefill"], kw, dtype=torch.float64, tol_out=1e-10, tol_grad=1e-9,
                             seed=12, scale=2.0)
    _check_against_reference(SHAPES["gqa_prefill"], kw, dtype=torch.float32, tol_out=2e-6, tol_grad=8e-6,
                             seed=12, scale=2.0, fp32_reference_bound=True)


def test_position_span_beyond_the_table():
    """Positions spread wider than the distance table covers: c_P·d^α computed directly per block."""
    pos = torch.arange(37)[None].expand(2, 37) * (chunked_module.TABLE_SLACK // 8) + torch.tensor([[0], [5]])
    kw = dict(q_positions=pos, k_positions=pos)
    _check_against_reference(SHAPES["gqa_prefill"], kw, dtype=torch.float64, tol_out=1e-10, tol_grad=1e-9, seed=13)


def test_gradcheck_float64():
    """The recomputing backward against finite differences (independent of the reference's autograd)."""
    q, k, v = _qkv(1, 2, 1, 4, 6, 4, seed=14)
    kw = dict(key_padding_mask=torch.tensor([[True, False, True, True, True, True]]), sliding_window=4,
              block_q=2, block_k=3)
    for phase in ("quadratic", "linear"):
        assert torch.autograd.gradcheck(
            lambda q, k, v: tapa_attention_chunked(q, k, v, phase=phase, alpha=0.5, **kw),
            tuple(t.requires_grad_(True) for t in (q, k, v)),
        )


# --------------------------------------------------------------------------------------------------
# low precision: per-dtype tolerances
# --------------------------------------------------------------------------------------------------

# Outputs and gradients come back in the input dtype (rounding ~2^-8 for bf16, ~2^-11 for fp16) and Δ is taken
# from the rounded output, as in FlashAttention; everything inside runs in fp32.
LOW_PRECISION = {torch.bfloat16: (1.5e-2, 4e-2), torch.float16: (2e-3, 6e-3)}


@pytest.mark.parametrize("dtype", list(LOW_PRECISION))
@pytest.mark.parametrize("shape,mask", [("gqa_prefill", "none"), ("ragged_lq_lt_lk", "all"), ("decode", "padding")])
def test_low_precision(dtype, shape, mask):
    B, _, _, Lq, Lk, _ = SHAPES[shape]
    tol_out, tol_grad = LOW_PRECISION[dtype]
    kw = dict(sliding_window=11, **_masks(mask, B, Lq, Lk, seed=21))
    _check_against_reference(SHAPES[shape], kw, dtype=dtype, tol_out=tol_out, tol_grad=tol_grad, seed=22)


# --------------------------------------------------------------------------------------------------
# rows without keys, block skipping
# --------------------------------------------------------------------------------------------------


def test_rows_that_see_no_key_are_zero_with_zero_grads():
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 9, 12, 8
    q, k, v = (t.requires_grad_(True) for t in _qkv(B, Hq, Hkv, Lq, Lk, D, seed=31))
    kpm = torch.ones(B, Lk, dtype=torch.bool)
    kpm[0] = False  # row 0: every key padded
    kpm[1, :6] = False  # row 1, window 2: query i sees keys i + 2, i + 3, so queries 0..2 see only padding
    seg_q = torch.zeros(B, Lq, dtype=torch.long)
    seg_q[1, -1] = 7  # a query whose segment no key has
    kw = dict(key_padding_mask=kpm, sliding_window=2, q_segment_ids=seg_q, k_segment_ids=torch.zeros(B, Lk).long(),
              block_q=4, block_k=3)
    out = tapa_attention_chunked(q, k, v, **kw)
    empty = torch.zeros(B, Lq, dtype=torch.bool)
    empty[0] = True
    empty[1, :3] = True
    empty[1, -1] = True
    assert torch.isfinite(out).all()
    assert out.permute(0, 2, 1, 3)[empty].abs().max() == 0
    assert out.permute(0, 2, 1, 3)[~empty].abs().min() > 0
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert dq.permute(0, 2, 1, 3)[empty].abs().max() == 0
    assert dk[0].abs().max() == 0 and dv[0].abs().max() == 0
    kw.pop("block_q"), kw.pop("block_k")
    ref = tapa_attention_reference(q, k, v, **kw)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def _poisoned_rows_match(q, k_bad, v_bad, ref, rows, **kw):
    out = tapa_attention_chunked(q, k_bad, v_bad, **kw)
    assert torch.isfinite(out[:, :, rows]).all()
    torch.testing.assert_close(out[:, :, rows], ref[:, :, rows], atol=1e-12, rtol=0)


def test_causal_blocks_skip_future_keys():
    """Keys after a query block's last query are never read: NaN there must not reach earlier blocks."""
    q, k, v = _qkv(1, 4, 2, 40, 40, 8, seed=32)
    ref = tapa_attention_reference(q, k, v)
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, 24:] = float("nan")
    v_bad[:, :, 24:] = float("nan")
    _poisoned_rows_match(q, k_bad, v_bad, ref, list(range(24)), block_q=8, block_k=16)  # blocks end at 8, 16, 24


def test_sliding_window_blocks_skip_keys_left_of_every_window():
    q, k, v = _qkv(1, 4, 2, 40, 40, 8, seed=33)
    W = 5
    ref = tapa_attention_reference(q, k, v, sliding_window=W)
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, :16] = float("nan")
    v_bad[:, :, :16] = float("nan")
    # query block [20, 28) reads keys from 20 − W + 1 = 16 on
    _poisoned_rows_match(q, k_bad, v_bad, ref, list(range(20, 40)), sliding_window=W, block_q=4, block_k=4)


def test_padded_and_foreign_segment_blocks_are_skipped():
    """A key block padded in every row, or whose segments meet none of a query block's, is never read."""
    q, k, v = _qkv(2, 4, 2, 32, 32, 8, seed=34)
    kpm = torch.ones(2, 32, dtype=torch.bool)
    kpm[:, 8:16] = False
    seg = torch.tensor([[0] * 8 + [1] * 24] * 2)
    kw = dict(key_padding_mask=kpm, q_segment_ids=seg, k_segment_ids=seg)
    ref = tapa_attention_reference(q, k, v, **kw)
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, 8:16] = float("nan")  # the queries' own segment, but padded in every row
    v_bad[:, :, 8:16] = float("nan")
    k_bad[:, :, :8] = float("nan")  # segment 0: foreign to the queries of segment 1
    v_bad[:, :, :8] = float("nan")
    _poisoned_rows_match(q, k_bad, v_bad, ref, list(range(16, 32)), block_q=8, block_k=8, **kw)


# --------------------------------------------------------------------------------------------------
# threads and modes
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def threads():
    before = torch.get_num_threads()

    def set_threads(n):
        torch.set_num_threads(n)

    yield set_threads
    torch.set_num_threads(before)


def test_worker_threads_give_the_single_thread_result(threads, monkeypatch):
    monkeypatch.setattr(chunked_module, "PARALLEL_MIN_SCORES", 0)  # small shapes use the workers too
    q, k, v = _qkv(2, 4, 2, 37, 37, 16, dtype=torch.float32, seed=41)
    kw = _masks("all", 2, 37, 37, seed=42)
    results = []
    for n in (1, 3):
        threads(n)
        qi, ki, vi = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = tapa_attention_chunked(qi, ki, vi, block_q=4, block_k=8, **kw)
        results.append((out, *_grads(out, (qi, ki, vi), 43)))
        assert torch.get_num_threads() == n  # the caller's setting survives the workers
    one, three = results
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])  # forward and dq: same arithmetic
    # dk, dv: the 10 query blocks' partial sums, added per worker and then across workers in another order, so
    # they differ by float32 rounding of the partials' size (measured up to 1.3e-6, 6.4e-6 relative, on 2 cores);
    # one worker's partial sums dropped moves an element by up to 21 here
    for a, b in zip(one[2:], three[2:]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "autocast_bf16"])
def test_grad_inference_and_autocast_modes(threads, monkeypatch, mode):
    monkeypatch.setattr(chunked_module, "PARALLEL_MIN_SCORES", 0)
    threads(2)
    q, k, v = _qkv(1, 4, 2, 33, 33, 16, dtype=torch.float32, seed=44)
    want = tapa_attention_chunked(q, k, v, block_q=4)
    ctx = {"no_grad": torch.no_grad(), "inference_mode": torch.inference_mode(),
           "autocast_bf16": torch.autocast("cpu", dtype=torch.bfloat16)}[mode]
    with ctx:
        got = tapa_attention_chunked(q, k, v, block_q=4)
    assert torch.equal(got, want)  # fp32 inside whatever the ambient mode


def test_run_tasks_order_errors_and_thread_setting(threads):
    threads(2)
    assert cpu_parallel.run_tasks([lambda i=i: i * i for i in range(7)]) == [i * i for i in range(7)]
    assert cpu_parallel.run_tasks([lambda: torch.get_num_threads()] * 4) == [1] * 4  # workers: single-threaded

    def boom():
        raise RuntimeError("task failed")

    with pytest.raises(RuntimeError, match="task failed"):
        cpu_parallel.run_tasks([lambda: 1, boom])
    assert torch.get_num_threads() == 2
    assert cpu_parallel.run_tasks([torch.get_num_threads] * 3, threads=1) == [1] * 3  # inline, single-threaded
    with pytest.raises(RuntimeError, match="task failed"):
        cpu_parallel.run_tasks([boom], threads=1)
    assert torch.get_num_threads() == 2
    q, k, v = _qkv(1, 2, 1, 5, 9, 8, dtype=torch.float32, seed=45)
    assert chunked_module.is_small(q, k)
    tapa_attention_chunked(q, k, v)  # small: planning and blocks single-threaded, then the setting is back
    assert torch.get_num_threads() == 2


# --------------------------------------------------------------------------------------------------
# memory, dispatch, arguments, benchmark
# --------------------------------------------------------------------------------------------------


def test_no_score_matrix_is_allocated():
    """The largest tensor the chunked path allocates is a block, not [B, H, Lq, Lk] (the reference's)."""
    from torch.profiler import ProfilerActivity, profile

    L, H = 1024, 2
    q, k, v = (t.requires_grad_(True) for t in _qkv(1, H, 1, L, L, 16, dtype=torch.float32, seed=51))
    score_bytes = H * L * L * 4

    def largest_allocation(fn):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn(q, k, v)
            out.backward(torch.ones_like(out))
        return max(e.cpu_memory_usage for e in prof.events())

    assert largest_allocation(tapa_attention_reference) >= score_bytes  # the probe sees the O(L²) tensors
    chunked = largest_allocation(lambda q, k, v: tapa_attention_chunked(q, k, v, block_q=64, block_k=64))
    assert chunked < score_bytes / 16


def test_cpu_dispatch_runs_the_chunked_path(monkeypatch):
    import hf_posenc.kernels.tapa as tapa_kernels

    calls = []
    real = tapa_kernels.tapa_attention_chunked.with_args

    def spy(q, k, v, args, **kwargs):  # the dispatcher hands over the options it validated
        calls.append(args)
        return real(q, k, v, args, **kwargs)

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(tapa_kernels.tapa_attention_chunked, "with_args", spy)
    q, k, v = _qkv(1, 2, 1, 5, 5, 8, dtype=torch.float32, seed=52)
    out = tapa_attention(q, k, v, sliding_window=3)
    assert len(calls) == 1 and calls[0].sliding_window == 3
    torch.testing.assert_close(out, tapa_attention_reference(q, k, v, sliding_window=3), atol=1e-5, rtol=1e-5)


def test_inputs_are_not_modified():
    """Even where a slice of q is already contiguous (one batch row, one head, one query)."""
    for shape in ((1, 1, 1, 1, 9, 8), (2, 4, 2, 7, 9, 8)):
        q, k, v = _qkv(*shape, dtype=torch.float32, seed=54)
        before = [t.clone() for t in (q, k, v)]
        tapa_attention_chunked(q, k, v)
        assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # GQA; Gemma2 alternates sliding-window layers
def test_model_backend_chunked_equals_reference(arch):
    """patch_model(..., "tapa", backend="chunked"): logits of a left-padded batch and parameter gradients."""
    import hf_posenc
    from tiny import random_ids, tiny_model

    def model(backend):
        extra = {"attn_logit_softcapping": None, "final_logit_softcapping": None} if arch == "gemma2" else {}
        with pytest.warns(UserWarning, match="needs training"):
            return hf_posenc.patch_model(tiny_model(arch, seed=3, sliding_window=6, **extra), "tapa", backend=backend)

    ids = random_ids(2, 20)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    results = []
    for backend in ("reference", "chunked"):
        m = model(backend)
        out = m(ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        results.append((out.logits, [p.grad for p in m.parameters() if p.grad is not None]))
    (ref_logits, ref_grads), (logits, grads) = results
    real = mask.bool()
    torch.testing.assert_close(logits[real], ref_logits[real], rtol=1e-5, atol=1e-5)
    assert len(grads) == len(ref_grads) > 0
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_cpu_path_without_triton():
    """Triton is optional: without it `tapa_attention` runs the chunked path on CPU and the Triton entry point
    raises an ImportError naming the fix (fresh interpreter, Triton import blocked)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = f"""
import sys, types
sys.modules["triton"] = None  # import triton -> ModuleNotFoundError
pkg = types.ModuleType("hf_posenc"); pkg.__path__ = [{str(root / "hf_posenc")!r}]; sys.modules["hf_posenc"] = pkg
import torch
from hf_posenc.kernels import tapa
q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8)
assert not tapa.uses_triton(q)
torch.testing.assert_close(tapa.tapa_attention(q, k, v), tapa.tapa_attention_reference(q, k, v), atol=1e-5, rtol=1e-5)
try:
    tapa.tapa_attention_triton(q, k, v)
except ImportError as exc:
    assert "pip install hf-posenc[triton]" in str(exc)
    print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_bad_block_sizes():
    q, k, v = _qkv(1, 2, 1, 5, 5, 8, seed=53)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="block_q must be a positive int"):
            tapa_attention_chunked(q, k, v, block_q=bad)
        with pytest.raises(ValueError, match="block_k must be a positive int"):
            tapa_attention_chunked(q, k, v, block_k=bad)
    with pytest.raises(ValueError, match="Lq"):  # argument checks are the reference's
        tapa_attention_chunked(q, k[:, :, :3], v[:, :, :3])


def test_benchmark_smoke(tmp_path):
    """The CPU benchmark runs its tiny case end to end (timing, fresh-process memory, ratios, JSON)."""
    import json
    import runpy
    from pathlib import Path

    bench = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "tapa_cpu_attention.py"))
    out = bench["main"](["--smoke", "--out", str(tmp_path / "cpu.json")])
    data = json.loads(out.read_text())
    assert data["device"].startswith("CPU") and len(data["load_average"]["before"]) == 3
    modes = {r["mode"] for r in data["records"]}
    assert modes == {"fwd", "fwd_bwd"}
    for rec in data["records"]:
        for name in ("sdpa_rope", "tapa_reference", "tapa_chunked"):
            row = rec["results"][name]
            assert row["median_s"] > 0
            if rec["mode"] == "fwd":  # measured in a fresh process
                assert row["peak_rss_bytes"] >= row["rss_inputs_bytes"] > 0
        assert math.isfinite(rec["ratios"]["chunked_over_sdpa_time"])


def test_tapa_cpu_path_with_a_batch_of_position_ids_matches_the_reference():
    """The trainer passes position ids [B, L] with B > 1; Transformers' keys are a transposed view, which the
    chunked path must lay out before flattening batch and heads (it raised a view error before)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posenc import patch_model

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 64, (3, 24))
    positions = torch.arange(24).expand(3, 24).contiguous()
    outs = {}
    for backend in ("chunked", "reference"):
        model = copy.deepcopy(base)
        with pytest.warns(UserWarning, match="needs training"):
            patch_model(model, "tapa", backend=backend)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        logits.square().mean().backward()
        outs[backend] = (logits.detach(), model.model.layers[0].self_attn.k_proj.weight.grad)
    torch.testing.assert_close(outs["chunked"][0], outs["reference"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["chunked"][1], outs["reference"][1], rtol=1e-4, atol=1e-9)
