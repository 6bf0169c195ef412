"""Run stock checkpoints in vLLM (offline ``LLM`` API, CPU backend) and in the stock Transformers of vLLM's environment.

Runs with the vLLM environment's Python (``scripts/serving/setup_vllm.sh`` builds ``.venv-vllm``), which has no
hf-posenc: what it loads must be a plain stock checkpoint (``hf_posenc.export_stock``). From this repository it
imports only ``reference.py`` beside it (torch-only helpers), so both sides measure the same way.

    .venv-vllm/bin/python scripts/serving/vllm_run.py JOBS.json OUT.json

JOBS.json: ``{"max_tokens": 24, "max_model_len": 2048, "jobs": [{"name": ..., "path": checkpoint dir,
"prompts": [[token ids], ...]}]}``.
OUT.json gets, per job and prompt, vLLM's greedy continuation and prompt log-probabilities (the log-probability of
each prompt token after the ones before it), the same from stock Transformers, the timings and the versions.
Both engines run in float32 with greedy decoding that does not stop at EOS.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import platform
import sys
import time


def vllm_outputs(path: str, prompts: list[list[int]], max_tokens: int, max_model_len: int
                 ) -> tuple[list[dict], float, float]:
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=path, dtype="float32", max_model_len=max_model_len, enforce_eager=True, skip_tokenizer_init=True,
              seed=0, distributed_executor_backend="uni")
    loaded = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, prompt_logprobs=0, detokenize=False,
                            ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for prompt, out in zip(prompts, outs):
        logprobs = [entry[token].logprob for token, entry in zip(prompt[1:], out.prompt_logprobs[1:])]
        results.append({"greedy": list(out.outputs[0].token_ids), "prompt_logprobs": logprobs})
    done = time.perf_counter()
    del llm
    gc.collect()
    return results, loaded - start, done - loaded


def transformers_outputs(path: str, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from reference import model_outputs

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model_outputs(model, prompts, max_tokens)


def versions() -> dict[str, str]:
    import torch
    import transformers
    import vllm

    hf_posenc_installed = importlib.util.find_spec("hf_posenc") is not None  # looked up, never imported
    return {"vllm": vllm.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
            "python": platform.python_version(), "hf_posenc_installed": hf_posenc_installed}


def main(jobs_path: str, out_path: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # The engine core in this process (and, with the "uni" executor of vllm_outputs, its worker too): by default each
    # engine spawns both, and each of those imports torch and vLLM again, 16 s of every checkpoint's 18 s here (2 s
    # in-process, measured on a tiny model on 2 cores). Outputs do not depend on it.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with open(jobs_path) as f:
        spec = json.load(f)
    max_tokens = spec["max_tokens"]
    results = {"versions": versions(), "jobs": {}}
    by_path: dict[str, list[dict]] = {}
    for job in spec["jobs"]:  # one engine per checkpoint: jobs on the same one share it (it starts in about 2 s)
        by_path.setdefault(job["path"], []).append(job)
    for path, jobs in by_path.items():
        prompts = [p for job in jobs for p in job["prompts"]]
        vllm_results, load_s, run_s = vllm_outputs(path, prompts, max_tokens, spec.get("max_model_len", 2048))
        start = time.perf_counter()
        stock = transformers_outputs(path, prompts, max_tokens)
        stock_s = time.perf_counter() - start
        for job in jobs:
            n = len(job["prompts"])
            results["jobs"][job["name"]] = {
                "vllm": vllm_results[:n], "stock_transformers": stock[:n],
                "seconds": {"vllm_load": load_s, "vllm_generate": run_s, "stock_transformers": stock_s},
            }
            vllm_results, stock = vllm_results[n:], stock[n:]
        print(f"vllm_run: {', '.join(j['name'] for j in jobs)} done (load {load_s:.1f}s, generate {run_s:.1f}s)",
              file=sys.stderr, flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":  # where vLLM spawns processes (VLLM_ENABLE_V1_MULTIPROCESSING=1), they do not re-run this
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_run.py JOBS.json OUT.json")
    main(sys.argv[1], sys.argv[2])
