"""SmolLM2-135M's stock exports (``hf_posenc.export_stock``) served by vLLM, compared with Transformers + hf-posenc.

    .venv/bin/python scripts/serving/vllm_compare.py [--out DIR] [--vllm-python .venv-vllm/bin/python]

(``scripts/serving/setup_vllm.sh`` builds the vLLM environment first.) For each scheme: patch SmolLM2, export it,
compute the reference here (greedy tokens and prompt log-probabilities in float32 over prompts of several hundred
tokens), then run the export in vLLM's own environment (``vllm_run.py``: vLLM, CPU backend, and the stock
Transformers vLLM pins, without hf-posenc) and compare. ``cope-yarn-attention-factor`` is the export as it was
before the attention factor was folded into q/k (``attention_factor`` left in the ``longrope`` config), kept to show
what vLLM does with it; ``rope-dynamic`` is exported with its warning (vLLM computes dynamic NTK differently), to
measure the difference the warning announces. Writes ``benchmarks/results/serving-vllm-<device>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from reference import PROMPT_TEXT, ROOT, compare, model_outputs, prompt_windows, scheme_variants  # noqa: E402

# Per-token |Δ log p| allowed between vLLM (or stock Transformers) and Transformers + hf-posenc, both float32: the
# engines sum in different orders (measured: at most 8e-5 on SmolLM2); a changed scheme moves log-probs by ~0.1-1.
LOGPROB_TOLERANCE = 5e-4
MAX_TOKENS = 24
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def export_unfolded(model, path: Path) -> None:
    """The stock export with the ``longrope`` attention factor left in the config (no folding into q/k)."""
    from transformers import PreTrainedModel

    from hf_posenc.export import stock_config

    PreTrainedModel.save_pretrained(model, path)  # Transformers' own save: no remote code
    stock_config(model).to_json_file(path / "config.json")


def run_vllm(jobs: list[dict], work: Path, vllm_python: Path = VLLM_PYTHON, max_tokens: int = MAX_TOKENS,
             max_model_len: int = 2048) -> tuple[dict, float]:
    """Run ``vllm_run.py`` on ``jobs`` in the vLLM environment; its measurements and the wall time."""
    spec, out = work / "jobs.json", work / "vllm.json"
    spec.write_text(json.dumps({"max_tokens": max_tokens, "max_model_len": max_model_len, "jobs": jobs}))
    start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of this environment leaks in
    subprocess.run([str(vllm_python), str(Path(__file__).parent / "vllm_run.py"), str(spec), str(out)], check=True,
                   env=env)
    return json.loads(out.read_text()), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep the exports here (default: a temporary directory)")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--length", type=int, default=400, help="tokens per prompt")
    args = parser.parse_args()
    if not args.vllm_python.exists():
        sys.exit(f"{args.vllm_python} not found: run scripts/serving/setup_vllm.sh first")

    import transformers

    import hf_posenc
    from common import write_results
    from hf_posenc.models import load_smollm2

    start = time.perf_counter()
    base, tokenizer = load_smollm2(dtype=torch.float32)
    prompts = prompt_windows(tokenizer, args.prompts, args.length)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        jobs, references, exported, export_warnings = [], {}, {}, {}
        from hf_posenc import RoPEConfig

        variants = {**scheme_variants(), "rope-dynamic": RoPEConfig(scaling="dynamic", factor=2.0)}
        for name, scheme in variants.items():
            model = hf_posenc.patch_model(copy.deepcopy(base), scheme)
            references[name] = model_outputs(model, prompts, MAX_TOKENS)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                hf_posenc.export_stock(model, work / name, tokenizer=tokenizer)
            export_warnings[name] = [str(w.message) for w in caught if "vLLM" in str(w.message)]
            jobs.append({"name": name, "path": str(work / name), "prompts": prompts})
            if name == "cope-yarn":
                export_unfolded(model, work / f"{name}-attention-factor")
                references[f"{name}-attention-factor"] = references[name]
                jobs.append({"name": f"{name}-attention-factor", "path": str(work / f"{name}-attention-factor"),
                             "prompts": prompts})
            del model
        for job in jobs:
            config = json.loads((Path(job["path"]) / "config.json").read_text())
            exported[job["name"]] = {k: v for k, v in config["rope_parameters"].items()
                                     if k not in ("short_factor", "long_factor")}
        reference_s = time.perf_counter() - start
        measured, vllm_s = run_vllm(jobs, work, args.vllm_python)

    results = {}
    for name, ref in references.items():
        got = measured["jobs"][name]
        vs_vllm, vs_stock = compare(ref, got["vllm"]), compare(ref, got["stock_transformers"])
        results[name] = {
            "exported_rope_parameters": exported[name],
            "export_warnings": export_warnings.get(name, []),
            "vllm_vs_reference": vs_vllm,
            "stock_transformers_vs_reference": vs_stock,
            "vllm_identical": vs_vllm["greedy_identical"] and vs_vllm["max_abs_dlogprob"] <= LOGPROB_TOLERANCE,
            "seconds": got["seconds"],
        }
        print(f"{name:28s} vLLM: greedy identical {vs_vllm['greedy_identical']!s:5s} max |Δ log p| "
              f"{vs_vllm['max_abs_dlogprob']:.2e}; stock Transformers {measured['versions']['transformers']}: "
              f"greedy identical {vs_stock['greedy_identical']!s:5s} max |Δ log p| {vs_stock['max_abs_dlogprob']:.2e}")
    path = write_results("serving-vllm", torch.device("cpu"), {
        "what": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32) patched with each scheme, written by "
                "export_stock, run in vLLM (CPU backend, float32, greedy) and in the stock Transformers of vLLM's "
                "environment, compared with Transformers + hf-posenc",
        "versions": {"reference": {"transformers": transformers.__version__, "hf_posenc": hf_posenc.__version__},
                     "vllm_environment": measured["versions"]},
        "prompts": {"count": len(prompts), "tokens": args.length, "text": str(PROMPT_TEXT.relative_to(ROOT)),
                    "greedy_tokens": MAX_TOKENS},
        "logprob_tolerance": LOGPROB_TOLERANCE,
        "seconds": {"reference_and_exports": reference_s, "vllm_environment": vllm_s,
                    "total": time.perf_counter() - start},
        "results": results,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
