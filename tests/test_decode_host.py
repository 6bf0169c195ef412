"""Host work of one eager decode call (issue: decode is host-bound; benchmarks/decode_host.py measures it).

Pins what one TAPA / TAPE decode call dispatches (ATen ops, by kind, and Triton launches), so a regression that adds
host work fails here; checks what planning keeps per kernel (its parameters, the argument-name check) never hands
back a stale result when a shape, stride, dtype or option changes; and checks the fast host
paths (relative positions, padding tags, the inference path without autograd.Function) against their readable
references, including the exactness of distances at large absolute positions."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_posenc.kernels._triton import launch as _launch
from hf_posenc.kernels._triton.launch import INTERPRETER, LaunchSpec, Target
from hf_posenc.kernels.tapa import tapa_attention_reference, tapa_attention_triton
from hf_posenc.kernels.tapa import triton_tapa
from hf_posenc.kernels.tape import tape_attention_reference, tape_attention_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VIEWS = {"view", "_unsafe_view", "alias", "as_strided", "expand", "slice", "select", "t", "transpose", "detach",
         "unsqueeze", "squeeze"}


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        alloc = name.startswith("empty") or name in ("new_empty", "new_empty_strided")
        kind = "view" if func.is_view or name in VIEWS else "alloc" if alloc else "compute"
        self.kinds[kind] += 1
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _one_call(monkeypatch, target: Target, call) -> tuple[_Count, list[str]]:
    """ATen ops and Triton launches of one call planned for `target`, launches recorded instead of run (after a
    first call, so what is counted is the steady state of a decode loop)."""
    launches: list[str] = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read at call time: the ops' device checks take CPU tensors
    monkeypatch.setattr(LaunchSpec, "launch", lambda self: launches.append(self.name))
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, t: target))
    with torch.no_grad():
        call()
        launches.clear()
        count = _Count()
        with count:
            call()
    return count, launches


def _decode_inputs(B=2, H=8, Hkv=2, L=300, D=64, dtype=torch.bfloat16):
    q = torch.randn(B, H, 1, D, dtype=dtype)
    k, v, e = (torch.randn(B, Hkv, L, D, dtype=dtype) for _ in range(3))
    # positions as the TAPA scheme hands them at a decode step: [B, 1] expanded position ids, keys counted back
    q_pos = torch.tensor([[L - 1]]).expand(B, 1)
    k_pos = q_pos - torch.arange(L - 1, -1, -1)
    return q, k, v, e, q_pos, k_pos


# (compute, alloc, view) ATen ops of one TAPA decode call with split keys. compute: each one a CUDA launch on a GPU
# (before the host-path work: 8 with default positions, 7 with explicit ones, 6 more for the tags of a padding
# mask; views 6 / 4). Planned for sm90, 300 keys are split (split-K + combine: 2 launches, 2 partial buffers); in the
# interpreter a single 16-key block is one split (1 launch, the kernel writes O and LSE itself).
TAPA_CASES = {
    "default-positions": (dict(), (3, 6, 5)),
    "scheme-positions": (dict(positions=True), (2, 6, 3)),
    "padding-mask": (dict(positions=True, padding=True), (4, 7, 1)),
}


@pytest.mark.parametrize("case", list(TAPA_CASES))
@pytest.mark.parametrize("target, L, launches", [(Target.gpu(90), 300, ["tapa_decode", "split_combine"]),
                                                 (INTERPRETER, 16, ["tapa_decode"])], ids=["sm90-split", "one-split"])
def test_tapa_decode_call_dispatches_pinned_ops_and_launches(monkeypatch, case, target, L, launches):
    kw, (compute, alloc, view) = TAPA_CASES[case]
    q, k, v, _, q_pos, k_pos = _decode_inputs(L=L)
    options = {}
    if kw.get("positions"):
        options.update(q_positions=q_pos, k_positions=k_pos)
    if kw.get("padding"):
        kpm = torch.ones(q.shape[0], L, dtype=torch.bool)
        kpm[0, :5] = False
        options.update(key_padding_mask=kpm)
    split = len(launches) == 2
    count, seen = _one_call(monkeypatch, target, lambda: tapa_attention_triton(q, k, v, **options))
    assert seen == launches
    # one split: no partial buffers (2 allocations fewer)
    assert dict(count.kinds) == dict(compute=compute, alloc=alloc - (0 if split else 2), view=view), count.names


@pytest.mark.parametrize("target, L, launches", [(Target.gpu(90), 300, ["tape_decode", "split_combine"]),
                                                 (INTERPRETER, 16, ["tape_decode"])], ids=["sm90-split", "one-split"])
def test_tape_decode_call_dispatches_pinned_ops_and_launches(monkeypatch, target, L, launches):
    q, k, v, e, _, _ = _decode_inputs(L=L)
    count, seen = _one_call(monkeypatch, target, lambda: tape_attention_triton(q, k, v, e, causal=True))
    assert seen == launches
    # no compute op: the int8 stand-in of the padding mask, O/Ẽ/LSE (and the split partials with their views)
    expected = dict(alloc=5, view=4) if len(launches) == 2 else dict(alloc=4)
    assert dict(count.kinds) == expected, count.names


# --------------------------------------------------------------------------------------------------
# planning read once per kernel: never stale
# --------------------------------------------------------------------------------------------------


def _qkv(B, Hq, Hkv, Lq, Lk, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, n, D, generator=g).to(dtype).to(DEVICE) for h, n in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk))]


def test_tapa_plans_follow_every_change_of_shape_stride_dtype_and_option(monkeypatch):
    """One process, a sequence of calls that differ in one thing each (what planning keeps per kernel comes from
    the calls before): every output equals the reference and the derived constexprs follow the call."""
    specs: list[LaunchSpec] = []
    real = triton_tapa.launch_all
    monkeypatch.setattr(triton_tapa, "launch_all", lambda s: (specs.extend(s), real(s)))
    base = dict(B=1, Hq=4, Hkv=2, Lq=1, Lk=40, D=32, dtype=torch.float32)
    steps = [
        (dict(), dict()),
        (dict(Lk=41), dict()),  # the next decode step
        (dict(dtype=torch.float16), dict()),  # IN_PREC and the fp32 / 16-bit tile tables
        (dict(D=64), dict()),  # padded widths
        (dict(), dict(theta=0.25)),  # at D = 32: 8 amplitude / 24 phase columns, padded to 16 / 32
        (dict(), dict(phase="linear")),  # LINEAR, the row sums
        (dict(), dict(causal=False, sliding_window=7)),
        (dict(Lq=3), dict()),
        (dict(Lq=20, Lk=40), dict()),  # prefill: LAZY on
        (dict(Lq=1), dict(transposed=True)),  # non-contiguous k / v (strides)
        (dict(), dict()),  # back to the first: still right
    ]
    for i, (shape, opts) in enumerate(steps):
        cfg = dict(base, **shape)
        q, k, v = _qkv(cfg["B"], cfg["Hq"], cfg["Hkv"], cfg["Lq"], cfg["Lk"], cfg["D"], cfg["dtype"], seed=i)
        opts = dict(opts)
        if opts.pop("transposed", False):  # same values, other strides: [B, Lk, Hkv, D] storage
            k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
            assert not k.is_contiguous()
        specs.clear()
        out = tapa_attention_triton(q, k, v, **opts)
        ref = tapa_attention_reference(q.double(), k.double(), v.double(), **opts)
        tol = 2e-5 if cfg["dtype"] == torch.float32 else 3e-3
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol, msg=f"step {i}: {shape} {opts}")
        fwd = specs[0]
        assert fwd.derived["LAZY"] is (cfg["Lq"] > 16)
        assert fwd.derived["IN_PREC"] == ("ieee" if cfg["dtype"] == torch.float32 else "tf32")


def test_tape_plans_follow_changes():
    for i, (D, De, dtype, Lq) in enumerate([(16, 8, torch.float32, 1), (32, 8, torch.float32, 1),
                                            (16, 24, torch.float16, 1), (16, 8, torch.float32, 18),
                                            (16, 8, torch.float32, 1)]):
        g = torch.Generator().manual_seed(50 + i)
        q = torch.randn(1, 4, Lq, D, generator=g).to(dtype).to(DEVICE)
        k, v = (torch.randn(1, 2, 30, D, generator=g).to(dtype).to(DEVICE) for _ in range(2))
        e = torch.randn(1, 2, 30, De, generator=g).to(dtype).to(DEVICE)
        o, eo = tape_attention_triton(q, k, v, e)
        ro, reo = tape_attention_reference(q.double(), k.double(), v.double(), e.double())
        tol = 2e-5 if dtype == torch.float32 else 3e-3
        torch.testing.assert_close(o.double(), ro, atol=tol, rtol=tol)
        torch.testing.assert_close(eo.double(), reo, atol=tol, rtol=tol)


def test_launch_spec_still_rejects_wrong_arguments_after_a_good_plan():
    q, k, v, _, _, _ = _decode_inputs(L=16, dtype=torch.float32)
    specs, _, _ = triton_tapa.plan_forward(q, k, v, triton_tapa.validate_tapa_args(q, k, v), INTERPRETER)
    spec = specs[0]
    with pytest.raises(TypeError, match="derived"):
        LaunchSpec(spec.name, spec.kernel, spec.grid, dict(spec.args, BDA=64))
    with pytest.raises(TypeError, match="missing"):
        LaunchSpec(spec.name, spec.kernel, spec.grid, {n: a for n, a in spec.args.items() if n != "Lk"})


# --------------------------------------------------------------------------------------------------
# fast host paths against their readable references
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 70_000, 3 * 2**40 + 17, -(2**45)], ids=["0", "70k", "2^41", "-2^45"])
def test_relative_positions_keep_distances_exact_at_large_positions(offset):
    """fp32 positions relative to the row's first key: the same pairwise distances as the readable reference
    (relative to the row's smallest position), exact at any absolute position; and the kernel's output with them
    is the output at offset 0, bit for bit (only distances enter)."""
    B, L = 3, 50
    g = torch.Generator().manual_seed(5)
    k_pos = torch.randint(0, 3000, (B, L), generator=g).sort(1).values + offset
    k_pos[1] = k_pos[1].flip(0)  # not monotone: the first key is not the smallest
    q_pos = k_pos[:, -4:] + torch.tensor([0, 5, -7, 1])
    fast = triton_tapa._Inputs.relative_positions(q_pos, k_pos)
    ref = triton_tapa._Inputs.relative_positions_reference(q_pos, k_pos)
    exact = (q_pos[:, :, None] - k_pos[:, None, :]).double()
    for qr, kr in (fast, ref):
        assert qr.dtype == kr.dtype == torch.float32 and qr.is_contiguous() and kr.is_contiguous()
        assert torch.equal((qr[:, :, None] - kr[:, None, :]).double(), exact)

    q, k, v = _qkv(B, 4, 2, 4, L, 32, torch.float32, seed=9)
    out = tapa_attention_triton(q, k, v, q_positions=q_pos.to(DEVICE), k_positions=k_pos.to(DEVICE))
    at0 = tapa_attention_triton(q, k, v, q_positions=(q_pos - offset).to(DEVICE),
                                k_positions=(k_pos - offset).to(DEVICE))
    assert torch.equal(out, at0)
    ref_out = tapa_attention_reference(q.double(), k.double(), v.double(), q_positions=(q_pos - offset).to(DEVICE),
                                       k_positions=(k_pos - offset).to(DEVICE))
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=2e-5)


def test_fast_positions_and_tags_give_the_reference_inputs_bit_for_bit(monkeypatch):
    """The kernel's output with the fast positions and padding tags equals, bit for bit, its output with the
    readable references of both (same distances, same tags)."""
    B, Lk = 2, 45
    kpm = torch.ones(B, Lk, dtype=torch.bool)
    kpm[0, :9] = False
    k_pos = (torch.cumsum(kpm.long(), 1) - 1).clamp_min(0) + 1000
    q, k, v = _qkv(B, 4, 2, 3, Lk, 32, torch.float32, seed=12)
    kw = dict(key_padding_mask=kpm.to(DEVICE), k_positions=k_pos.to(DEVICE), q_positions=k_pos[:, -3:].to(DEVICE))
    fast_tags = triton_tapa._Inputs.padding_tags(kpm, 3)
    args = triton_tapa.validate_tapa_args(q.cpu(), k.cpu(), v.cpu(), key_padding_mask=kpm, k_positions=k_pos,
                                          q_positions=k_pos[:, -3:])
    ref_tags = triton_tapa._Inputs.tags_reference(args)
    for a, b in zip(fast_tags, ref_tags):
        assert a.dtype == b.dtype == torch.int32 and a.is_contiguous() and torch.equal(a, b)
    out = tapa_attention_triton(q, k, v, **kw)
    monkeypatch.setattr(triton_tapa._Inputs, "relative_positions",
                        staticmethod(triton_tapa._Inputs.relative_positions_reference))
    monkeypatch.setattr(triton_tapa._Inputs, "padding_tags",
                        staticmethod(lambda kpm_, q_len: triton_tapa._Inputs.tags_reference(
                            SimpleNamespace(q_segment_ids=None, k_segment_ids=None, key_padding_mask=kpm_,
                                            q_positions=torch.zeros(kpm_.shape[0], q_len, dtype=torch.long,
                                                                    device=kpm_.device),
                                            k_positions=torch.zeros_like(kpm_, dtype=torch.long)))))
    assert torch.equal(out, tapa_attention_triton(q, k, v, **kw))
    torch.testing.assert_close(out.double(), tapa_attention_reference(q.double(), k.double(), v.double(), **kw),
                               atol=2e-5, rtol=2e-5)


def test_inference_path_matches_the_autograd_path():
    """Without a gradient to build the op runs the forward plan directly (no autograd.Function): the same output,
    bit for bit, as through the Function (inputs that require grad), and no graph attached."""
    q, k, v = _qkv(2, 4, 2, 2, 37, 32, torch.float32, seed=3)
    with torch.no_grad():
        plain = tapa_attention_triton(q, k, v, sliding_window=9)
    graph = tapa_attention_triton(*(t.clone().requires_grad_() for t in (q, k, v)), sliding_window=9)
    assert graph.requires_grad and not plain.requires_grad
    assert torch.equal(plain, graph.detach())
    with torch.inference_mode():
        assert torch.equal(tapa_attention_triton(q, k, v, sliding_window=9), plain)
    e = torch.randn(2, 2, 37, 16)
    with torch.no_grad():
        o, eo = tape_attention_triton(q, k, v, e, causal=True)
    go, geo = tape_attention_triton(*(t.clone().requires_grad_() for t in (q, k, v, e)), causal=True)
    assert go.requires_grad and not o.requires_grad
    assert torch.equal(o, go.detach()) and torch.equal(eo, geo.detach())


def test_host_helpers_match_triton():
    import triton

    for n in [1, 2, 3, 15, 16, 17, 100, 1024, 1025]:
        assert _launch.pow2(n, 1) == triton.next_power_of_2(n)
        assert _launch.pow2(n) == max(16, triton.next_power_of_2(n))
        for b in (1, 7, 16, 64):
            assert _launch.cdiv(n, b) == triton.cdiv(n, b)


def test_benchmark_runs_its_smoke_size():
    """benchmarks/decode_host.py (the before/after figures behind docs/benchmarks.md) still runs: --smoke, no JSON."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "decode_host.py"
    run = subprocess.run([sys.executable, str(script), "--smoke", "--calls", "3"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "tapa_scheme_step" in run.stdout and "triton launches" in run.stdout


@pytest.mark.parametrize("scheme", ["tapa", "tape"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_a_decode_step_reads_the_mask_on_the_host_once(monkeypatch, scheme, static):
    """A host read of the padding mask waits for the device: a decode step of a 4-layer model reads it once (the
    first layer's answer kept on the mask: `schemes.masks.read_once`), not once per layer."""
    import warnings

    import hf_posenc
    from tiny import tiny_model
    from transformers import StaticCache

    monkeypatch.setattr(_launch.LaunchSpec, "launch", lambda self: None)  # planning only: no kernel runs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_posenc.patch_model(tiny_model("llama", num_hidden_layers=4), scheme, backend="triton").eval()
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    cache = StaticCache(config=model.config, max_cache_len=32) if static else None
    with torch.no_grad():
        out = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        step = ids[:, -1:]
        count = _Count()
        with count:
            model(step, attention_mask=torch.cat([mask, torch.ones_like(step)], 1),
                  past_key_values=out.past_key_values, use_cache=True)
    reads = count.names.count("aten.stack.default" if static else "aten.all.default")
    assert reads == 1, collections.Counter(count.names)


@pytest.mark.parametrize("scheme", ["tapa", "tape"])
def test_a_compiled_decoding_step_reads_nothing_on_the_host(monkeypatch, scheme):
    """What a CUDA graph captures must read nothing on the host and launch the same kernels at every step: the op
    of a compiled decoding step (all slots of a static cache: `masks.every_slot`) runs on meta tensors, which have
    no data to read, through its sm_90 plan; the op that reads the written slots on the host cannot, and only it
    is tagged unsafe for CUDA graphs."""
    from hf_posenc.schemes.tapa.attention import tapa_attend, tapa_attend_every_slot
    from hf_posenc.schemes.tape.attention import tape_fused_attend, tape_fused_attend_every_slot

    launches: list[str] = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the ops' device checks take the meta tensors
    monkeypatch.setattr(LaunchSpec, "launch", lambda self: launches.append(self.name))
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, t: Target.gpu(90)))
    B, H, Hkv, L, D = 2, 8, 2, 300, 64
    meta = dict(device="meta", dtype=torch.bfloat16)
    q, k = torch.empty(B, H, 1, D, **meta), torch.empty(B, Hkv, L, D, **meta)
    v = torch.empty(B, Hkv, L, 2 * D if scheme == "tape" else D, **meta)  # TAPE's values are [V | E]
    states = torch.empty(B, L, dtype=torch.int8, device="meta")  # a static cache's key states
    position_ids = torch.empty(B, 1, dtype=torch.long, device="meta")
    if scheme == "tapa":
        args = (q, k, v, states, position_ids, 0.1, 0.5, "quadratic", "triton", None)
        safe, reading = tapa_attend_every_slot, tapa_attend
    else:
        args = (q, k, v, states, position_ids, None)
        safe, reading = tape_fused_attend_every_slot, tape_fused_attend
    with torch.no_grad():
        out = safe(*args)
        assert out.shape == (B, 1, H, v.shape[-1]) and launches == [f"{scheme}_decode", "split_combine"]
        with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):  # its host read
            reading(*args)
    unsafe = torch._C.Tag.cudagraph_unsafe
    assert unsafe not in safe.op._opoverload.tags and unsafe in reading.op._opoverload.tags
