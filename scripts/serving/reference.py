"""What the serving checks compare: greedy tokens and prompt log-probabilities, measured the same way everywhere.

Imports only torch at module level, so both the project's environment (Transformers + hf-posenc, the reference) and
vLLM's environment (``vllm_run.py``) use the same code.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# An essay written for this repository (examples/diagnostics-smollm2): prompts for the comparisons.
PROMPT_TEXT = ROOT / "examples" / "diagnostics-smollm2" / "text.txt"
# Another original text of this repository, never used for prompts: held-out perplexity.
HELD_OUT_TEXT = ROOT / "examples" / "train-smollm2" / "corpus.txt"


def scheme_variants() -> dict:
    """The static schemes both serving checks run on SmolLM2 (head dim 64: CoPE/HardClip clip the lowest 10 of 32;
    8k context, so Llama-3 scaling with an original length of 2k changes the lowest frequencies)."""
    from hf_posenc import CoPEConfig, HardClipConfig, PRoPEConfig, RoPEConfig

    return {
        "rope": RoPEConfig(),
        "rope-linear": RoPEConfig(scaling="linear", factor=2.0),
        "rope-yarn": RoPEConfig(scaling="yarn", factor=2.0),
        "rope-llama3": RoPEConfig(scaling="llama3", factor=4.0, original_max_position_embeddings=2048),
        "cope": CoPEConfig(),
        "hardclip": HardClipConfig(),
        "prope": PRoPEConfig(p=0.75),
        "prope-linear": PRoPEConfig(p=0.75, scaling="linear", factor=2.0),
        "cope-yarn": CoPEConfig(scaling="yarn", factor=2.0),
        "hardclip-llama3": HardClipConfig(scaling="llama3", factor=4.0, original_max_position_embeddings=2048),
    }


def prompt_windows(tokenizer, count: int = 3, length: int = 400, text: Path = PROMPT_TEXT) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens, taken from evenly spaced places in ``text``."""
    ids = tokenizer(text.read_text(), add_special_tokens=False).input_ids
    if len(ids) < length:
        raise ValueError(f"{text} has {len(ids)} tokens, fewer than {length}.")
    step = (len(ids) - length) // max(count - 1, 1)
    return [ids[i * step : i * step + length] for i in range(count)]


def scores_of(logits: torch.Tensor, prompt: list[int]) -> dict:
    """From a prompt's logits: log p(x_t | x_<t) for t = 1 … len-1 (float64) and the argmax after each token."""
    logits = logits.double()
    logprobs = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
    return {"prompt_logprobs": logprobs.tolist(), "prompt_argmax": logits.argmax(-1).tolist()}


@torch.no_grad()
def prompt_scores(model, prompt: list[int]) -> dict:
    return scores_of(model(torch.tensor([prompt])).logits[0], prompt)


@torch.no_grad()
def greedy(model, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens with the KV cache, never stopping at EOS (as vLLM with ``ignore_eos``)."""
    ids = torch.tensor([prompt])
    out = model(ids, use_cache=True)
    tokens = [int(out.logits[0, -1].argmax())]
    for _ in range(steps - 1):
        out = model(ids.new_tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def model_outputs(model, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    return [{"greedy": greedy(model, p, max_tokens), **prompt_scores(model, p)} for p in prompts]


def compare(reference: list[dict], other: list[dict]) -> dict:
    """Greedy agreement and prompt log-probability differences, over all prompts."""
    first_diff = []
    for r, o in zip(reference, other, strict=True):
        diff = next((i for i, (a, b) in enumerate(zip(r["greedy"], o["greedy"])) if a != b), None)
        first_diff.append(diff)
    deltas = [abs(a - b) for r, o in zip(reference, other) for a, b in zip(r["prompt_logprobs"], o["prompt_logprobs"],
                                                                             strict=True)]
    result = {
        "greedy_identical": all(d is None for d in first_diff),
        "first_greedy_difference": first_diff,
        "max_abs_dlogprob": max(deltas),
        "mean_abs_dlogprob": sum(deltas) / len(deltas),
        "logprob_sums": [[sum(r["prompt_logprobs"]), sum(o["prompt_logprobs"])] for r, o in zip(reference, other)],
    }
    if all("prompt_argmax" in r and "prompt_argmax" in o for r, o in zip(reference, other)):
        # teacher-forced top-1 agreement: the same next-token choice after every prompt token
        same = [a == b for r, o in zip(reference, other) for a, b in zip(r["prompt_argmax"], o["prompt_argmax"])]
        result["top1_agreement"] = sum(same) / len(same)
    return result


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def llamacpp_outputs(gguf_path, prompts: list[list[int]], max_tokens: int, n_ctx: int = 1024) -> list[dict]:
    """The same measurements in llama.cpp (llama-cpp-python): float32 KV cache, no flash attention, 2 threads."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, logits_all=True, n_threads=2,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False,
                          verbose=False)
    results = []
    for prompt in prompts:
        llm.reset()
        llm.eval(prompt)
        scores = scores_of(torch.from_numpy(np.array(llm.scores[: len(prompt)])), prompt)
        tokens = []
        for _ in range(max_tokens):
            tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([tokens[-1]])
        results.append({"greedy": tokens, **scores})
    llm.close()
    return results
