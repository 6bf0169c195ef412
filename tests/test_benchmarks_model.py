"""The whole-model benchmarks (`benchmarks/train_step.py`, `benchmarks/generate.py`) run end to end on CPU with
``--smoke`` (toy Llama, fp32, TAPA/TAPE through the Triton kernels in the interpreter), as the GPU run starts them
from the repository root; their JSON holds every row with positive times, ratios computed from those times, and for
generation the compiled static-cache greedy tokens equal the eager dynamic-cache ones (fp32 on the toy model: any
difference is a bug in the static cache or the compiled step, not rounding).

The two scripts run as subprocesses at the same time (one core each), started once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCHEMES = ("unpatched", "cope", "tapa", "tape")


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    out = tmp_path_factory.mktemp("bench_model")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = {
        "train_step": [sys.executable, "benchmarks/train_step.py", "--smoke", "--repeats", "1",
                       "--json", str(out / "train_step.json")],
        "generate": [sys.executable, "benchmarks/generate.py", "--smoke", "--json", str(out / "generate.json")],
    }
    procs = {name: subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, cmd in commands.items()}
    runs = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        done = subprocess.CompletedProcess(commands[name], proc.returncode, stdout, stderr)
        path = out / f"{name}.json"
        runs[name] = (done, json.loads(path.read_text()) if path.exists() else {})
    return runs


def check_ok(run: tuple[subprocess.CompletedProcess, dict]) -> dict:
    done, data = run
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert data["smoke"] is True and data["dtype"] == "float32" and data["device"].startswith("CPU")
    assert data["status"] == "complete"
    return data


def check_rows(rows: dict, time_key: str, tokens: int, ratio_of_times) -> None:
    assert set(rows) == set(SCHEMES)
    for name, row in rows.items():
        assert "error" not in row, (name, row.get("error"))
        assert row[time_key] > 0 and all(s > 0 for s in row["samples_s"])
        assert row["min_s"] <= row[time_key] <= row["max_s"]
        assert row["tokens_per_s"] == pytest.approx(tokens / row[time_key])
        assert row["ratio_vs_unpatched"] == pytest.approx(ratio_of_times(row[time_key], rows["unpatched"][time_key]))
        assert row["implementation"]
    for name in ("tapa", "tape"):  # the Triton backend, as on a GPU (interpreted here)
        assert "backend=triton" in rows[name]["implementation"], rows[name]["implementation"]


def test_train_step_smoke_rows(smoke_runs):
    data = check_ok(smoke_runs["train_step"])
    rows = data["results"]
    check_rows(rows, "step_s", data["tokens_per_step"], lambda t, base: t / base)
    assert rows["unpatched"]["ratio_vs_unpatched"] == 1.0
    # LoRA from hf_posenc.adapters.lora_config: attention projections, and TAPE's blocks trained in full
    for name, row in rows.items():
        assert row["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
        assert row["trainable_params"] > 0
        assert row["peak_mem_mib"] is None  # CPU: not per row
    assert rows["tape"]["modules_to_save"] == ["tape"] and rows["tape"]["trainable_scheme_params"] > 0
    assert rows["tapa"]["modules_to_save"] == [] and rows["tapa"]["trainable_scheme_params"] == 0
    assert data["peak_rss_mib"] > 0
    for name, target in data["targets"].items():
        assert target["met"] is None and "not a measurement" in target["note"]
        assert target["ratio"] == rows[name]["ratio_vs_unpatched"]


def test_generate_smoke_rows_and_static_equals_eager(smoke_runs):
    data = check_ok(smoke_runs["generate"])
    tokens = data["batch"] * data["new_tokens"]
    for mode in ("eager", "static"):
        check_rows(data["results"][mode]["rows"], "generate_s", tokens, lambda t, base: base / t)
        assert all(r["new_tokens_made"] == data["new_tokens"] for r in data["results"][mode]["rows"].values())
    for name, row in data["results"]["static"]["rows"].items():
        assert row["compile"]["graphs"] >= 1, (name, row["compile"])  # the decoding step was compiled
        assert row["compile"]["graph_breaks"] == 0, (name, row["compile"])
    assert data["results"]["static"]["during_timing"]["graphs"] == 0  # no recompilation while timing
    agreement = data["agreement_static_vs_eager"]
    assert set(agreement) == set(SCHEMES)
    for name, a in agreement.items():
        assert a["token_fraction"] == 1.0 and a["sequences_identical"] == 1.0, (name, a)
    for mode in ("eager", "static"):
        for target in data["targets"][mode].values():
            assert target["met"] is None and "not a measurement" in target["note"]


def test_a_failing_row_is_recorded_and_fails_the_run(tmp_path, monkeypatch):
    """One row raising leaves its error (type, message, traceback) in the JSON, the others' timings, and exit 1."""
    monkeypatch.syspath_prepend(str(BENCH))
    import model_bench
    import train_step

    real = model_bench.patched_copy

    def patched_copy(base, scheme, device):
        if scheme == "cope":
            raise RuntimeError("deliberate failure of the cope row")
        return real(base, scheme, device)

    monkeypatch.setattr(model_bench, "patched_copy", patched_copy)
    path = tmp_path / "train_step.json"
    assert train_step.main(["--smoke", "--schemes", "unpatched,cope", "--repeats", "1", "--json", str(path)]) == 1
    rows = json.loads(path.read_text())["results"]
    assert rows["cope"]["error"]["type"] == "RuntimeError"
    assert "deliberate failure" in rows["cope"]["error"]["message"]
    assert "Traceback" in rows["cope"]["error"]["traceback"]
    assert rows["unpatched"]["step_s"] > 0 and rows["unpatched"]["ratio_vs_unpatched"] == 1.0
