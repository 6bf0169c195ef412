"""The static report's per-pipe issue model (benchmarks/kernels_static.py) on synthetic SASS: no compiler, no GPU.

Covers the pipe each opcode issues to, the bounds in SM clocks per score element, the binding pipe, the path
choice through a loop's tile-uniform branches, the conversion of measured timings to clocks per score element
and the ranking check, and that the committed sm_90 report ranks the measured rows as the GPU did.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def ks():
    saved = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    spec = importlib.util.spec_from_file_location("kernels_static", ROOT / "benchmarks" / "kernels_static.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through the module
    spec.loader.exec_module(mod)
    assert {k: os.environ.get(k) for k in saved} == saved  # importing it leaves the interpreter setting alone
    return mod


def sass(*lines: str) -> str:
    """nvdisasm-style text: instructions get addresses, labels (".L_x_N:") stay as they are."""
    out, addr = [], 0
    for line in lines:
        if line.startswith(".L_x_"):
            out.append(line)
        else:
            out.append(f"        /*{addr:04x}*/                   {line} ;")
            addr += 16
    return "\n".join(out)


# 4 warps (one warpgroup, 128 threads) on a 64 x 64 tile: 32 score elements per thread per iteration
RECORD = SimpleNamespace(constexprs={"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, arch=90)
PER_THREAD = 64 * 64 // 128


def test_opcodes_issue_to_their_pipes(ks):
    assert ks.pipe_of("MUFU") == "xu" and ks.pipe_of("F2I") == "xu" and ks.pipe_of("FRND") == "frnd"
    assert ks.pipe_of("F2FP") == "alu" and ks.pipe_of("FMNMX") == "alu" and ks.pipe_of("IADD3") == "alu"
    assert ks.pipe_of("FFMA") == "fp32" and ks.pipe_of("IMAD") == "imad"
    assert ks.pipe_of("HGMMA") == ks.pipe_of("HMMA") == "tensor"
    assert ks.pipe_of("UIADD3") == "uniform" and ks.pipe_of("LDS") == "other"
    assert ks.mma_flops("HGMMA", ".64x128x16.F32.BF16") == ("wgmma", 2 * 64 * 128 * 16)
    assert ks.mma_flops("HMMA", ".16816.F32.BF16") == ("mma_sync", 2 * 16 * 8 * 16)
    with pytest.raises(ValueError):
        ks.mma_flops("HMMA", ".999.F32")
    # FRND's pipe is the machine's call: ALU by default (an H100 A/B), the special-function pipe in the other reading
    frnd = dict(lanes={"frnd": 16.0, "total": 16.0}, flops={})
    assert ks.pipe_bounds(frnd, ks.H100)["clocks_per_element"]["alu"] == pytest.approx(0.25)
    assert ks.pipe_bounds(frnd, ks.H100)["clocks_per_element"]["special_function"] == 0
    assert ks.pipe_bounds(frnd, ks.H100_FRND_ON_XU)["clocks_per_element"]["special_function"] == pytest.approx(1.0)


def test_four_mufu_per_element_bind_the_special_function_pipe(ks):
    """4 MUFU per score element cost 4/16 = 0.25 clk; 16 HGMMA.64x64x16 per 64x64 tile are 512 FLOP per element,
    0.125 clk at 4096 FLOP/clk: the special-function pipe binds, at 0.25."""
    text = sass(".L_x_0:", *["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24"] * 16,
                *["MUFU.EX2 R1, R2"] * (4 * PER_THREAD), "@P0 BRA `(.L_x_0)")
    out = ks.analyse(RECORD, text, ks.H100)
    far = out["steady_state_loop"]["pipe_model"]["far_tile_path"]
    assert far["binding"] == "special_function" and far["bound"] == pytest.approx(0.25)
    assert far["clocks_per_element"]["tensor_core"] == pytest.approx(0.125)
    assert far["tensor_flops_per_element"]["wgmma"] == pytest.approx(512)
    # the same work on mma.sync: 4 warps x 4096 FLOP per HMMA.16816, at half the warpgroup rate on sm_90
    hmma = sass(".L_x_0:", *["HMMA.16816.F32.BF16 R24, R4, R8, R24"] * 128, "MUFU.EX2 R1, R2", "@P0 BRA `(.L_x_0)")
    far = ks.analyse(RECORD, hmma, ks.H100)["steady_state_loop"]["pipe_model"]["far_tile_path"]
    assert far["binding"] == "tensor_core" and far["bound"] == pytest.approx(128 * 4 * 4096 / 4096 / 2048)
    # FP32 at 128 lanes, IMAD on the heavy half only (64 lanes), issue 128 lanes of anything
    prof = dict(lanes={"fp32": 64.0, "imad": 64.0, "total": 128.0}, flops={})
    clk = ks.pipe_bounds(prof, ks.H100)["clocks_per_element"]
    assert clk["fma"] == pytest.approx(1.0) and clk["issue"] == pytest.approx(1.0)
    assert ks.pipe_bounds(prof, ks.A100)["clocks_per_element"]["fma"] == pytest.approx(2.0)
    assert ks.pipe_bounds(prof, ks.H100, memory_bytes=ks.H100.hbm_bytes_per_clk)["clocks_per_element"][
        "memory"] == pytest.approx(1.0)


def two_branch_loop(series_ffma: int) -> str:
    """A loop whose tile-uniform branch takes a series (FFMAs, no MUFU) or an exact path (lg2 + ex2), then
    cos and the softmax ex2 on both: per thread, 32 score elements."""
    n = PER_THREAD
    return sass(".L_x_0:", *["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24"] * 8,
                "@P1 BRA `(.L_x_1)",
                *["MUFU.LG2 R1, R2"] * n, *["MUFU.EX2 R1, R2"] * n,  # exact distance power
                "BRA `(.L_x_2)",
                ".L_x_1:", *["FFMA R1, R2, R3, R1"] * (series_ffma * n),  # binomial series
                ".L_x_2:", *["MUFU.COS R1, R2"] * n, *["MUFU.EX2 R1, R2"] * n,
                "@P0 BRA `(.L_x_0)")


def test_path_choice_takes_the_series_branch_when_it_is_cheaper(ks):
    items, labels = ks.parse_sass(two_branch_loop(7))
    (a, b), = ks.inner_loops(items, labels)
    paths = ks.loop_paths(items, labels, a, b)
    assert len(paths) == 2
    assert ks.shortest_path(items, labels, a, b) == min(paths, key=len)  # the exact path: fewer instructions
    pm = ks.analyse(RECORD, two_branch_loop(7), ks.H100)["steady_state_loop"]["pipe_model"]
    # series: 2 MUFU (0.125 clk) and 7 FFMA + 2 + ... issued (~0.07 clk): the special-function pipe still binds
    assert pm["far_tile_path"]["lanes_per_element"].get("xu") == pytest.approx(2.0)
    assert pm["cheapest_path"]["bound"] == pytest.approx(0.125)
    assert pm["most_expensive_path"]["bound"] == pytest.approx(0.25)  # exact: 4 MUFU
    assert pm["near_diagonal_path"]["bound"] == pytest.approx(0.25)  # 2 special-function instructions more
    assert pm["far_tile_is_cheapest"] and pm["far_tile_path"]["bound"] == pm["cheapest_path"]["bound"]
    assert pm["cheapest_path"]["instructions"] > pm["most_expensive_path"]["instructions"]  # not the shortest


def test_far_tile_path_is_reported_where_the_series_costs_more(ks):
    """With 40 FFMA per element the series path is issue-bound above the exact path's MUFU bound: the cheapest
    path is then the exact one, and the far-tile (series) path is reported beside it."""
    pm = ks.analyse(RECORD, two_branch_loop(40), ks.H100)["steady_state_loop"]["pipe_model"]
    assert pm["cheapest_path"]["binding"] == "special_function" and pm["cheapest_path"]["bound"] == pytest.approx(0.25)
    assert pm["far_tile_path"]["binding"] == "issue" and pm["far_tile_path"]["bound"] > 0.3
    assert not pm["far_tile_is_cheapest"]
    assert pm["most_expensive_path"]["instructions"] == pm["far_tile_path"]["instructions"]


def test_decode_bounds_count_real_rows_only(ks):
    model = {p: dict(clocks_per_element={"tensor_core": 0.25, "issue": 0.5})
             for p in ("far_tile_path", "near_diagonal_path", "cheapest_path", "most_expensive_path")}
    out = ks.decode_per_valid_row(model, block_m=16, rows=4)
    assert out["far_tile_path"]["clocks_per_element"] == {"tensor_core": 1.0, "issue": 2.0}
    assert out["far_tile_path"]["binding"] == "issue"
    out = ks.decode_per_valid_row(model, 16, 4, memory_bytes=9 * ks.H100.hbm_bytes_per_clk, machine=ks.H100)
    assert out["far_tile_path"]["clocks_per_element"]["memory"] == pytest.approx(9.0)
    assert out["far_tile_path"]["binding"] == "memory"
    tapa = dict(DA=64, DP=64, DV=128)
    assert ks.decode_bytes_per_key(tapa, "bfloat16") == 2 * 256 + 4


def timing(rows: dict[tuple[str, str, str], float], L: int = 16384) -> dict:
    return dict(timing_shape=dict(q_heads=32), device_name="test",
                timing=[dict(kernel=k, mode=m, candidate=c, length=L, batch=1, median_ms=ms)
                        for (k, m, c), ms in rows.items()])


MEASURED = {("tapa", "fwd", "RoPE (SDPA flash)"): 7.5, ("tapa", "fwd", "TAPA (Triton)"): 12.1,
            ("tapa", "fwd_bwd", "TAPA (Triton)"): 50.2, ("tape", "fwd", "TAPE (Triton)"): 7.8,
            ("tape", "fwd_bwd", "TAPE (Triton)"): 67.4}


def test_measured_medians_become_clocks_per_score_element(ks):
    clocks = ks.measured_clocks(timing(MEASURED), ks.H100)[16384]
    elements = 32 * 16384 * 16385 / 2
    assert clocks["sdpa_baseline_fwd"] == pytest.approx(7.5e-3 * 1.83e9 * 132 / elements)
    assert clocks["tapa_fwd"] == pytest.approx(0.68, abs=0.01)  # the notes' figure for the H100 row


def test_rank_check_reports_a_planted_misordered_row(ks):
    model = dict(sdpa_baseline_fwd=0.125, tape_fwd=0.19, tapa_fwd=0.31, tapa_fwd_bwd=0.81, tape_fwd_bwd=1.19)
    measured = ks.measured_clocks(timing(MEASURED), ks.H100)[16384]
    assert ks.rank_check(model, measured)["matches"]
    planted = dict(measured, tape_fwd_bwd=0.5)  # the GPU says TAPE fwd+bwd beats the TAPA forward
    check = ks.rank_check(model, planted)
    assert not check["matches"]
    assert {(p["faster_on_gpu"], p["slower_on_gpu"]) for p in check["pairs_out_of_order"]} == {
        ("tape_fwd_bwd", "tapa_fwd"), ("tape_fwd_bwd", "tapa_fwd_bwd")}


def test_series_check_compares_directions(ks):
    bounds = dict(tapa_fwd=dict(bound=0.235), tapa_fwd_exact=dict(bound=0.252),
                  tapa_fwd_bwd=dict(bound=0.83), tapa_fwd_bwd_exact=dict(bound=0.79))
    out = ks.series_check(bounds, dict(tapa_fwd=0.66, tapa_fwd_exact=0.71, tapa_fwd_bwd=3.02, tapa_fwd_bwd_exact=3.06))
    assert out["fwd"]["same_direction"] and not out["fwd_bwd"]["same_direction"]


def test_committed_sm90_report_binds_and_ranks(ks):
    """The committed report carries the pipe model: a binding pipe per kernel, and the measured rows at 16k
    ranked as the GPU ranked them (with the binaries that were measured where they were compiled)."""
    report = json.loads((ROOT / "benchmarks" / "results" / "kernels-static-sm90.json").read_text())
    pm = report["pipe_model"]
    rows = {r["kernel"]: r for r in pm["table"] if r["head_dim"] == 128}
    assert {"flash_fwd", "tapa_fwd", "tapa_bwd", "tape_fwd", "tape_bwd_dkdv", "tapa_decode"} <= set(rows)
    for r in rows.values():
        assert r["binding"] in ks.PIPES and r["bound"] == max(r["clocks_per_element"].values())
    assert rows["flash_fwd"]["binding"] == "tensor_core"
    assert rows["tapa_decode"]["binding"] == rows["tape_decode"]["binding"] == "memory"
    for device in ("H100", "H200"):
        checks = pm["measured_check"]["devices"][device]
        check = checks["measured_binaries"] if "measured_binaries" in checks else checks["current_tree_prediction"]
        assert check["ranking_matches_at_check_length"] is True
