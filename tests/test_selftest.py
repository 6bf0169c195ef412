"""`hf-posenc selftest` on CPU (Triton interpreter, tiny shapes): it passes on the shipped kernels, fails
naming the case when a kernel is broken (forward or backward only), writes the promised JSON, and re-runs
itself with TRITON_INTERPRET=1 when started without it."""

from __future__ import annotations

import json

import pytest
import torch

from hf_posenc.cli import main as cli
from hf_posenc.kernels import tapa, tape
from hf_posenc.selftest import SelftestReport, run_selftest
from hf_posenc.selftest import checks
from hf_posenc.selftest.checks import GRADIENTS, SHAPES, build_cases, row_relative_error
from hf_posenc.selftest.environment import needs_fresh_process, resolve_device

TINY = dict(size="tiny", dtypes=("fp32",), progress=False)


def test_cpu_selftest_passes_and_writes_the_promised_json(tmp_path):
    path = tmp_path / "report.json"
    report = run_selftest("cpu", **TINY, json_path=path)
    assert report.passed, report.format_checks()
    data = json.loads(path.read_text())
    assert data["passed"] is True and data["failures"] == []
    assert data["device"] == "cpu" and data["device_name"].startswith("CPU:") and data["interpreter"] is True
    assert {"torch", "triton", "transformers", "hf_posenc", "cuda"} <= set(data["versions"])
    assert data["versions"]["torch"] == torch.__version__
    assert "not gpu performance" in data["timing_note"].lower()

    names = {c["name"] for c in data["checks"]}
    assert {n.split("/")[0] for n in names} == {"tapa", "tapa_chunked", "tape"}
    for variant in ("causal-gqa", "key-padding", "packed-segments", "sliding-window", "linear-phase",
                    "chunked-prefill", "decode"):
        assert f"tapa/{variant}/D16/fp32" in names
    for variant in ("causal-gqa", "e-width-scale", "noncausal", "key-padding", "chunked-prefill", "decode"):
        assert f"tape/{variant}/D16/fp32" in names
    check = next(c for c in data["checks"] if c["name"] == "tape/causal-gqa/D16/fp32")
    assert set(check["errors"]) == {"o", "e_out", "dq", "dk", "dv", "de"}
    tolerances = {k: check["gradient_tolerance"] if k in GRADIENTS else check["tolerance"] for k in check["errors"]}
    assert all(0 <= e <= tolerances[k] for k, e in check["errors"].items())
    assert {"name", "kernel", "dtype", "shape", "options", "passed", "tolerance", "gradient_tolerance", "errors",
            "message"} <= set(check)

    rows = {(r["kernel"], r["mode"], r["candidate"]) for r in data["timing"]}
    for mode in ("fwd", "fwd_bwd"):
        assert {("tapa", mode, "TAPA (Triton)"), ("tapa", mode, "RoPE (SDPA flash)"), ("tape", mode, "TAPE (Triton)"),
                ("tape", mode, "RoPE (SDPA flash)")} <= rows
    assert ("tapa", "decode", "TAPA (Triton)") in rows
    for r in data["timing"]:
        assert r["error"] is None and r["median_ms"] > 0 and r["length"] == 32
        assert r["tflops"] > 0 if r["mode"] != "decode" else r["tokens_per_s"] > 0
    assert SelftestReport.from_dict(data).to_dict() == data


def _wrong_forward(q, k, v, **kw):
    return tapa.tapa_attention_reference(q, k, v, **kw) * 1.01  # 1% off: far beyond the fp32 tolerance


def _wrong_backward(q, k, v, e, **kw):
    o, eo = _REAL_TAPE(q, k, v, e, **kw)
    return o, eo.detach() + 0.5 * (eo - eo.detach())  # same forward, Ẽ's gradient halved


_REAL_TAPE = tape.tape_attention_triton


def test_broken_kernel_fails_and_names_the_case(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tapa, "tapa_attention_triton", _wrong_forward)
    monkeypatch.setattr(tape, "tape_attention_triton", _wrong_backward)
    path = tmp_path / "r.json"
    code = cli(["selftest", "--device", "cpu", "--size", "tiny", "--dtypes", "fp32", "--no-timing", "--no-progress",
                "--only", "tapa/causal-gqa", "--only", "tape/causal-gqa", "--only", "tape/decode/",
                "--json", str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "FAILED: tapa/causal-gqa/D16/fp32, tape/causal-gqa/D16/fp32" in err
    data = json.loads(path.read_text())
    by_name = {c["name"]: c for c in data["checks"]}
    assert data["failures"] == ["tapa/causal-gqa/D16/fp32", "tape/causal-gqa/D16/fp32"]
    assert "out: row-relative error" in by_name["tapa/causal-gqa/D16/fp32"]["message"]
    tape_case = by_name["tape/causal-gqa/D16/fp32"]
    assert tape_case["errors"]["o"] < 1e-4 and tape_case["errors"]["e_out"] < 1e-4  # forward untouched ...
    assert tape_case["errors"]["dq"] > 1e-3 and "de" in tape_case["message"]  # ... the backward is caught
    assert by_name["tape/decode/D16/fp32"]["passed"]  # forward-only case: the break does not show


def test_kernel_exception_is_reported_as_that_case(monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("compilation failed: Cannot access global variable TWO_PI")

    monkeypatch.setattr(tape, "tape_attention_triton", crash)
    report = run_selftest("cpu", **TINY, timing=False, only=("tape/decode-padded",))
    assert not report.passed and report.failures == ["tape/decode-padded/D16/fp32"]
    assert report.checks[0].message == "RuntimeError: compilation failed: Cannot access global variable TWO_PI"
    assert "crash" in report.checks[0].traceback


def test_timing_errors_fail_the_selftest(monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(tapa, "tapa_attention_triton", crash)
    report = run_selftest("cpu", **TINY, checks=False, lengths=(16,))
    assert not report.passed
    assert report.failures == ["timing/tapa/fwd/L16", "timing/tapa/fwd_bwd/L16", "timing/tapa/decode/L16"]
    assert "out of resources" in report.format_timing()


def test_row_relative_error_is_scale_free_and_strict_on_zero_rows():
    ref = torch.ones(3, 8, dtype=torch.float64)
    ref[1] *= 0.2  # a short row: its 1% error counts against its own norm (plus the 5% floor) ...
    x = ref.clone()
    x[1] *= 1.01
    rms = ref.norm(dim=-1).pow(2).mean().sqrt().item()
    n1 = ref[1].norm().item()
    assert row_relative_error(x, ref, 0.05) == pytest.approx(0.01 * n1 / (n1 + 0.05 * rms))
    assert row_relative_error(x, ref, 0.05) > 2.5 * (x - ref).norm(dim=-1).max().item() / rms  # ... not the rms
    assert row_relative_error(x * 100, ref * 100, 0.05) == pytest.approx(row_relative_error(x, ref, 0.05))
    zero = ref.clone()
    zero[2] = 0.0  # a fully masked row: any output there is an error of the size of a typical row
    bad = zero.clone()
    bad[2] = 0.1 * zero.norm(dim=-1).pow(2).mean().sqrt() / 8**0.5
    assert row_relative_error(bad, zero, 0.05) == pytest.approx(2.0)
    assert row_relative_error(x.clone().fill_(float("nan")), ref, 0.05) == float("inf")


def test_case_list_covers_every_situation_and_bad_options_are_refused():
    cases = build_cases(SHAPES["realistic"], ("bf16", "fp16"), torch.device("cuda"))
    names = {c.name for c in cases}
    assert "tapa/causal-gqa/D128/bf16" in names and "tapa/causal-gqa/D64/fp16" in names
    assert all(c.q_heads > c.kv_heads for c in cases)  # every case is grouped-query attention
    assert any(c.q_len < c.k_len and c.backward for c in cases)
    assert any(c.q_len == 1 for c in cases)
    with pytest.raises(ValueError, match="bf16 needs a GPU"):
        run_selftest("cpu", size="tiny", dtypes=("bf16",))
    with pytest.raises(ValueError, match="no check name contains"):
        run_selftest("cpu", **TINY, only=("nope",))
    assert cli(["selftest", "--device", "cpu", "--size", "tiny", "--only", "nope", "--no-progress"]) == 2


def test_the_registered_schemes_name_what_is_checked_and_timed(monkeypatch):
    """The selftest names no scheme: it runs the modules the registered schemes declare (SchemeConfig.selftest),
    in registration order, with the CPU's own paths on CPU only."""
    from hf_posenc.schemes import SCHEMES

    assert [f.__name__ for f in checks.families()] == ["hf_posenc.kernels.tapa.selftest", "hf_posenc.kernels.tape.selftest"]
    assert {c.kernel for c in build_cases(SHAPES["tiny"], ("fp32",), torch.device("cuda"))} == {"tapa", "tape"}
    monkeypatch.setattr(SCHEMES["tape"], "selftest", None)
    assert {c.kernel for c in build_cases(SHAPES["tiny"], ("fp32",), torch.device("cpu"))} == {"tapa", "tapa_chunked"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusals")
def test_device_rules(monkeypatch):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert needs_fresh_process(torch.device("cpu")) is False
    with pytest.raises(ValueError, match="unset it"):  # the GPU selftest must test compiled kernels
        needs_fresh_process(torch.device("cuda"))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert needs_fresh_process(torch.device("cpu")) is True


def test_cli_reruns_itself_under_the_interpreter(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("TRITON_INTERPRET")  # as in a fresh shell: this process cannot interpret any more
    path = tmp_path / "r.json"
    code = cli(["selftest", "--device", "cpu", "--size", "tiny", "--dtypes", "fp32", "--no-timing", "--no-progress",
                "--only", "tape/decode/", "--json", str(path)])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "fresh process with TRITON_INTERPRET=1" in err and "1/1 checks passed" in out
    data = json.loads(path.read_text())
    assert data["interpreter"] is True and [c["name"] for c in data["checks"]] == ["tape/decode/D16/fp32"]


def _dq_error_from_rounded_outputs(case, dtype: torch.dtype) -> float:
    """The dq error (selftest measure) of an exact TAPE backward whose only rounding is the flash-style one:
    Δ = rowsum(dO∘O) + rowsum(dẼ∘Ẽ) formed from O and Ẽ rounded to `dtype`, on the case's own inputs and
    cotangents (same generator, same order as the selftest). Through the float64 reference: dq = P∘(dP − Δ)·K·scale,
    so an error δ in Δ moves dq by −δ·(P·K)·scale, and P·K is the reference's output with K as the values."""
    import zlib

    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    tensors, extra = checks._inputs(case, gen)
    q, k, v, e = (t.to(dtype).double().requires_grad_() for t in tensors)
    o, e_out = tape.tape_attention_reference(q, k, v, e, **extra)
    do, de = (torch.randn(t.shape, generator=gen).to(dtype).double() for t in (o, e_out))
    (dq,) = torch.autograd.grad((o, e_out), q, (do, de))
    with torch.no_grad():
        rounding = ((do * (o.to(dtype).double() - o)).sum(-1, keepdim=True)
                    + (de * (e_out.to(dtype).double() - e_out)).sum(-1, keepdim=True))
        pk, _ = tape.tape_attention_reference(q, k, k, e, **extra)
        dq_rounded = dq - rounding * pk * q.shape[-1] ** -0.5
    return row_relative_error(dq_rounded, dq, checks.GRADIENT_FLOOR)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gradient_tolerance_covers_the_rounding_of_delta(dtype):
    """The realistic TAPE key-padding case (left padding: many causal rows see few keys) loses this much dq
    accuracy to Δ formed from rounded outputs alone -- more, in bf16, than the outputs' tolerance. The gradient
    tolerance must leave the kernel room above it (an H200 measured 1.9e-2 bf16, 2.6e-3 fp16)."""
    case = next(c for c in build_cases(SHAPES["realistic"], (dtype,), torch.device("cuda"))
                if c.kernel == "tape" and c.variant == "key-padding")
    floor = _dq_error_from_rounded_outputs(case, checks.DTYPES[dtype])
    assert floor > checks.TOLERANCES[dtype] / 4  # the effect is real: gradients need a tolerance of their own
    assert 2 * floor <= checks.GRADIENT_TOLERANCES[dtype]
