"""Compile lane: every Triton entry kernel, as its host code plans it (hf_posenc.kernels.*.lane_specs),
compiled for A100 (sm_80) and H100 (sm_90) in bf16 and fp16 at head dims 64 / 128 / 256, with no GPU. Fails on
a compile error, on register spills at head dim <= 128, on shared memory above the architecture's limit, and on
a kernel that does not compile with its float arguments typed fp64 (torch.compile's typing; one cell). fp32
inputs are compiled at head dim 128 in a test of their own (shared memory only: their small tiles spill).

The lane runs in a subprocess without TRITON_INTERPRET (conftest sets it for the kernel tests) and uses the
Triton cache (TRITON_CACHE_DIR), seeded from tests/compile_lane_cache.tar.xz (binaries under Triton's own cache
keys: an edited kernel misses and compiles): about 15 seconds. From an empty cache it takes about 5.5 minutes on
2 cores (270 binaries) and the fp32 test 2.5 minutes more; the seed is audited here by compiling one cell from an
empty cache and comparing the binaries byte for byte. The upstream lane (scripts/upstream_lane.py: the newest torch
and the Triton it pins, another build, so the seed does not apply) runs the tests marked ``upstream``: that cell
compiled from an empty cache, and the checks that need no seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_posenc.kernels import tapa, tape
from hf_posenc.kernels._triton.launch import INTERPRETER, LaunchSpec, Target, pow2
from hf_posenc.kernels.dev.binaries import compile_inputs
from hf_posenc.kernels.dev.compile_lane import (DTYPES, FAMILIES, HEAD_DIMS, STANDARD_RUNS, code_path, read_cache,
                                               read_manifest, run_lane_subprocess, triton_build)
from hf_posenc.kernels.tapa import triton_tapa

FIXTURES = str(Path(__file__).with_name("lane_fixture_kernels.py"))
SEED = Path(__file__).with_name("compile_lane_cache.tar.xz")
REFRESH = "python -m hf_posenc.kernels.dev.compile_lane --write-cache tests/compile_lane_cache.tar.xz"


def _seed_matches_this_triton() -> None:
    """The seed's keys can only match the Triton build it was compiled with (the locked wheel, CPython 3.11);
    with another build the lane compiles everything (minutes, still correct) and the seed's tests skip."""
    if read_manifest(SEED) != triton_build():
        pytest.skip(f"{SEED.name} was compiled with another Triton build (seed: {read_manifest(SEED)}; this "
                    f"machine: {triton_build()}), so the lane compiles from scratch; `{REFRESH}` makes a seed for "
                    "this build")

TAPA_KERNELS = {"tapa_fwd", "tapa_decode", "split_combine", "row_dot", "tapa_bwd", "tapa_bwd_dkdv", "tapa_bwd_dq"}
TAPE_KERNELS = {"tape_fwd", "tape_decode", "split_combine", "row_dot", "tape_bwd_dvde", "tape_bwd_dkdq", "tape_bwd_dkdv",
                "tape_bwd_dq"}
FUSED_BWD = {"tapa_bwd", "tape_bwd_dvde", "tape_bwd_dkdq"}  # the fused backwards' launches (sm_90, D <= 128)


@pytest.fixture(scope="module")
def lane():
    return run_lane_subprocess(timeout=1800, seed=SEED, **STANDARD_RUNS["16-bit"])


@pytest.fixture(scope="module")
def fp32_lane():
    return run_lane_subprocess(archs=(80, 90), timeout=1200, seed=SEED, **STANDARD_RUNS["fp32"])


def test_seed_holds_exactly_the_standard_binaries(lane, fp32_lane):
    """Every binary the suite compiles comes from the committed seed (so CI does not spend 8 minutes compiling),
    and the seed holds nothing else. After a kernel change this fails until the seed is refreshed."""
    _seed_matches_this_triton()
    records = lane + fp32_lane
    missed = sorted({f"{r.launches[0]} sm_{r.arch} {r.dtype} D={r.head_dim}" for r in records
                     if r.error is None and not r.cache_hit})
    assert not missed, f"{len(missed)} binaries are not in {SEED.name} (refresh it: `{REFRESH}`): {missed[:8]}"
    used = {k for r in records for k in r.triton_keys}
    stale = set(read_cache(SEED)) - used
    assert not stale, f"{len(stale)} binaries in {SEED.name} that no standard run compiles: `{REFRESH}`"


@pytest.fixture(scope="module")
def one_cell(tmp_path_factory):
    """One cell (H100, bf16, head dim 64, both families, with the fp64-argument compiles) compiled from an empty
    Triton cache, its binaries written out: about 40 compiles, under a minute on 2 cores."""
    tmp = tmp_path_factory.mktemp("one-cell")
    return run_lane_subprocess(archs=(90,), dtypes=(DTYPES[0],), head_dims=(min(HEAD_DIMS),), timeout=900,
                               cubin_dir=str(tmp / "cubins"), cache_dir=str(tmp / "empty-cache"))


@pytest.mark.upstream
def test_one_cell_compiles_on_this_triton(one_cell):
    """Every entry kernel of the cell compiles with the Triton installed, the newest torch's in the upstream lane
    (where the seed, keyed by the locked build, does not apply), with none of the problems the lane flags
    (compile errors, spills, shared memory above the limit, fp64 float arguments)."""
    assert len(one_cell) >= 20 and not [(r.launches, r.problems) for r in one_cell if r.problems]
    assert {n for r in one_cell for n in r.launches} == TAPA_KERNELS | TAPE_KERNELS  # sm_90, D = 64: fused bwd too
    for r in one_cell:
        assert r.cache_hit is False and r.triton_keys, r  # compiled here, not read from a cache


def test_seed_binaries_are_what_the_compiler_makes_now(one_cell):
    """The seed is audited: the cell compiled from an empty Triton cache gives the seed's cache keys and, byte for
    byte, its binaries."""
    _seed_matches_this_triton()
    seed = read_cache(SEED)
    for r in one_cell:
        assert all(k in seed for k in r.triton_keys), (r.launches, r.triton_keys)
        binary = next(data for name, data in seed[r.triton_keys[0]].items() if name.endswith(".cubin"))
        assert Path(r.cubin).read_bytes() == binary, (r.launches, r.constexprs)


@pytest.mark.upstream
def test_the_kernel_packages_name_what_the_lane_compiles():
    """The lane names no scheme: it compiles the modules each kernel package lists in LANE_FAMILIES."""
    assert FAMILIES == tapa.LANE_FAMILIES + tape.LANE_FAMILIES == (
        "hf_posenc.kernels.tapa.triton_tapa", "hf_posenc.kernels.tape.triton_tape")


@pytest.mark.upstream
def test_a_damaged_seed_is_refused_with_the_fix(tmp_path):
    bad = tmp_path / "seed.tar.xz"
    bad.write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="--write-cache"):
        read_cache(bad)


def test_every_kernel_compiles_for_a100_and_h100(lane):
    problems = [f"{r.launches} sm_{r.arch} {r.dtype} D={r.head_dim} {r.constexprs.get('LINEAR', '')}: "
                f"{'; '.join(r.problems)}" for r in lane if r.problems]
    assert not problems, "\n".join(problems)


def test_lane_covers_every_entry_kernel_and_flag(lane):
    scalar_cell = [r for r in lane if (r.arch, r.dtype, r.head_dim) == (90, DTYPES[0], min(HEAD_DIMS))]
    # compiled as Inductor types floats: every kernel and code path (boolean flags) of the cell, once
    paths = {(r.family, code_path(r)) for r in scalar_cell}
    typed = [(r.family, code_path(r)) for r in scalar_cell if r.fp64_scalars is not None]
    assert scalar_cell and all(r.fp64_scalars in (None, "ok") for r in scalar_cell)
    assert sorted(typed) == sorted(paths)  # each path exactly once
    assert all(r.fp64_scalars is None for r in lane if r not in scalar_cell)
    for family, expected in (("tapa", TAPA_KERNELS), ("tape", TAPE_KERNELS)):
        for arch in (80, 90):
            for dtype in DTYPES:
                for d in HEAD_DIMS:
                    cell = [r for r in lane if f"triton_{family}" in r.family and r.arch == arch
                            and r.dtype == dtype and r.head_dim == d]
                    names = {n for r in cell for n in r.launches}
                    fused = arch == 90 and d <= 128  # where the tile tables list the fused backward
                    assert names == (expected if fused else expected - FUSED_BWD), (family, arch, dtype, d, names)
                    if family == "tapa":  # both phase modes × θ = 0.5 (and 0.25 at D <= 128), every kernel
                        das = (d // 2, d // 4) if d <= 128 else (d // 2,)
                        planned = {(lin, da) for lin in (True, False) for da in das}
                        for name in names - {"split_combine", "row_dot"}:
                            flags = {(r.constexprs["LINEAR"], r.constexprs["DA"]) for r in cell if name in r.launches}
                            want = planned if name != "tapa_bwd" else {  # the fused backward where its table has it
                                (lin, da) for lin, da in planned if "bwd" in triton_tapa.tiles(
                                    Target.gpu(arch), max(pow2(da) + (0 if lin else pow2(d - da)), pow2(d)))}
                            assert flags == want, (name, arch, dtype, d, flags)
                    for r in cell:
                        assert r.registers is not None and r.shared is not None and r.shared <= r.shared_limit
                        if family == "tapa" and "DA" in r.constexprs:  # compiled with the heuristics' values
                            assert r.constexprs["BDA"] == pow2(r.constexprs["DA"]), r.constexprs
                            assert r.constexprs["IN_PREC"] == "tf32", r.constexprs


def test_fp32_inputs_fit_shared_memory(fp32_lane):
    """fp32 inputs (exact "ieee" dots) take the fp32 tile tables: every kernel compiles for A100 and
    H100 within shared memory at head dim 128 (the 16-bit tiles asked an H200 for 294912 B of its 232448 B in
    TAPE's dQ kernel); their spills are reported, not flagged."""
    records = fp32_lane
    assert {(r.arch, r.dtype, r.head_dim) for r in records} == {(a, "float32", 128) for a in (80, 90)}
    assert not [(r.launches, r.arch, r.problems) for r in records if r.problems]
    assert all(r.error is None and r.shared <= r.shared_limit for r in records)
    assert {n for r in records for n in r.launches} == (TAPA_KERNELS | TAPE_KERNELS) - FUSED_BWD  # no fused bwd


def test_masks_are_runtime_arguments(lane):
    """Causal / window / padding / packing variants are planned by lane_specs but share their binaries:
    one binary per (kernel, phase mode, θ) in every cell."""
    for r in lane:
        if r.family.endswith("triton_tapa") and r.launches[0].startswith("tapa"):
            twins = [o for o in lane if o.family == r.family and o.arch == r.arch and o.dtype == r.dtype
                     and o.head_dim == r.head_dim and o.launches == r.launches
                     and o.constexprs.get("LINEAR") == r.constexprs.get("LINEAR")
                     and o.constexprs.get("DA") == r.constexprs.get("DA")]
            assert len(twins) == 1, [t.constexprs for t in twins]


@pytest.mark.upstream
def test_lane_flags_a_non_constexpr_global_and_spills():
    """A module-level float read inside @triton.jit (what the interpreter accepts and the shipped TAPA kernel
    did) fails the lane; the tl.constexpr version passes; a kernel that cannot fit its registers is flagged."""
    records = run_lane_subprocess(families=(FIXTURES,), archs=(90,), dtypes=("float16",), head_dims=(64,),
                                  timeout=600)
    by_name = {r.launches[0]: r for r in records}
    bad = by_name["reads_float_global"]
    assert bad.error is not None and "HALF" in bad.error and "global" in bad.error.lower(), bad.error
    assert bad.problems and bad.problems[0].startswith("compile failed")
    good = by_name["reads_constexpr_global"]
    assert good.error is None and not good.problems and good.registers > 0
    spill = by_name["spills"]
    assert spill.error is None and spill.spills > 0
    assert any("register spills" in p for p in spill.problems)
    unsafe, safe = by_name["scales_loop_state"], by_name["scales_loop_state_fp32"]
    assert unsafe.error is None and unsafe.registers > 0  # fp32 argument, as Triton's launcher passes it
    assert unsafe.fp64_scalars not in (None, "ok") and "fp64" in unsafe.fp64_scalars, unsafe.fp64_scalars
    assert any("fp64 float arguments" in p for p in unsafe.problems)
    assert safe.fp64_scalars == "ok" and not safe.problems


@pytest.mark.upstream
def test_compile_inputs_refuses_interpreter_kernels():
    q = torch.empty(1, 2, 32, 64, device="meta", dtype=torch.bfloat16)
    args = triton_tapa.validate_tapa_args(q, q[:, :1], q[:, :1], alpha=0.1, theta=0.5, phase="quadratic",
                                          causal=True, q_positions=None, k_positions=None, key_padding_mask=None,
                                          q_segment_ids=None, k_segment_ids=None)
    spec = triton_tapa.plan_forward(q, q[:, :1], q[:, :1], args, Target.gpu(90))[0][0]
    assert spec.constexprs["FAST"] is True and spec.grid[1] == 2
    with pytest.raises(TypeError, match="TRITON_INTERPRET"):
        compile_inputs(spec, 90)  # conftest set TRITON_INTERPRET=1: the kernels are interpreter objects here
    interp = triton_tapa.plan_forward(q, q[:, :1], q[:, :1], args, INTERPRETER)[0][0]
    assert interp.constexprs["FAST"] is False  # no inline assembly in the interpreter


@pytest.mark.upstream
def test_launch_spec_derives_the_kernels_heuristics():
    """Constexprs the kernels declare with triton.heuristics are not planned: the spec evaluates the kernel's
    own rules (the values the launch binds and the lane compiles); a plan that sets one is refused."""
    q = torch.empty(1, 4, 40, 96, device="meta", dtype=torch.bfloat16)
    k = torch.empty(1, 2, 40, 96, device="meta", dtype=torch.bfloat16)
    for lq, lazy in ((40, True), (1, False)):
        args = triton_tapa.validate_tapa_args(q[:, :, :lq], k, k, alpha=0.1, theta=0.25, phase="quadratic",
                                              causal=True, q_positions=None, k_positions=None,
                                              key_padding_mask=None, q_segment_ids=None, k_segment_ids=None)
        spec = triton_tapa.plan_forward(q[:, :, :lq], k, k, args, Target.gpu(90))[0][0]
        assert spec.derived == dict(BDA=32, BDP=128, IN_PREC="tf32", BDV=128, LAZY=lazy)  # DA 24, DP 72, D 96
        assert not set(spec.derived) & set(spec.args)
        assert {n: spec.constexprs[n] for n in spec.derived} == spec.derived
    fp32 = triton_tapa.plan_forward(q[:, :, :1].float(), k.float(), k.float(), args, Target.gpu(90))[0][0]
    assert fp32.derived["IN_PREC"] == "ieee"
    with pytest.raises(TypeError, match="triton.heuristics"):
        LaunchSpec(spec.name, spec.kernel, spec.grid, dict(spec.args, BDA=64))


@pytest.mark.upstream
def test_launch_spec_checks_arguments_and_targets():
    with pytest.raises(TypeError, match="missing"):
        LaunchSpec("fwd", triton_tapa._tapa_fwd_kernel, (1,), dict(Q=None))
    with pytest.raises(ValueError, match="sm_75"):
        Target.gpu(75)
    assert Target.gpu(80).sm_count == 108 and Target.gpu(90).hopper


@pytest.mark.upstream
def test_baseline_kernel_is_causal_flash_attention():
    """The static report's baseline (benchmarks/flash_baseline.py) computes causal attention (interpreter)."""
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / "flash_baseline.py"
    spec = importlib.util.spec_from_file_location("flash_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 37, 32, generator=g).half()
    k, v = (torch.randn(2, 2, 45, 32, generator=g).half() for _ in range(2))
    out = mod.flash_attention_baseline(q, k, v)
    visible = torch.ones(37, 45, dtype=torch.bool).tril(45 - 37)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1), attn_mask=visible)
    torch.testing.assert_close(out.float(), want, atol=3e-3, rtol=3e-3)
