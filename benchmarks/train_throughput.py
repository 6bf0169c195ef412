"""Training throughput and peak memory per scheme vs unpatched RoPE, side by side in one run.

Each candidate is the same model (LoRA on q/k/v/o, gradient checkpointing, the chunked cross-entropy of
``hf_posenc.training.loss``) trained for a few steps on random windows of one length; steps are timed round-robin
so drift hits every candidate alike. Reports tokens/s (median step) and the peak memory of a step (CUDA: max
allocated; CPU: peak RSS growth is not per-candidate, so it is reported as null).
Usage: python benchmarks/train_throughput.py [--device cuda] [--length 4096] [--steps 5] [--smollm2]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import hf_posenc  # noqa: E402
from common import time_interleaved, write_results  # noqa: E402
from tiny import tiny_model  # noqa: E402

from hf_posenc.training.loss import chunked_linear_cross_entropy, shift_for_causal_lm  # noqa: E402

SCHEMES = {
    "unpatched": None,
    "rope-yarn": dict(scheme="rope", scaling="yarn", factor=4.0),
    "cope": dict(scheme="cope"),
    "prope": dict(scheme="prope", p=0.75),
    "tapa": dict(scheme="tapa"),
    "tape": dict(scheme="tape"),
}


def make_step(model, ids: torch.Tensor, chunk: int):
    """One optimiser step of a LoRA-wrapped model with the chunked loss, LoRA set up as `hf-posenc train` does
    (`hf_posenc.adapters.lora_config`: the scheme's own modules, such as TAPE's, in ``modules_to_save``)."""
    from peft import get_peft_model

    from hf_posenc.adapters import lora_config

    peft_model = get_peft_model(model, lora_config(model, r=8, lora_alpha=16))
    peft_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft_model.train()
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    causal = peft_model.get_base_model()

    def step():
        out = causal.model(input_ids=ids, use_cache=False).last_hidden_state
        h, y = shift_for_causal_lm(out, ids)
        loss = chunked_linear_cross_entropy(h, causal.lm_head.weight, y, chunk_size=chunk) / y.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bench(label: str, model, length: int, batch: int, steps: int, device: torch.device, vocab: int, chunk: int,
          dtype: torch.dtype) -> dict:
    model = model.to(device=device, dtype=dtype)
    ids = torch.randint(3, vocab, (batch, length), device=device)
    fns, errors = {}, {}
    for name, kw in SCHEMES.items():
        candidate = copy.deepcopy(model)
        if kw is not None:
            kw = dict(kw)
            try:
                hf_posenc.patch_model(candidate, kw.pop("scheme"), **kw)
            except (ValueError, TypeError) as exc:  # reported in the JSON, never hidden
                errors[name] = str(exc)
                continue
        fns[name] = make_step(candidate, ids, chunk)
    peaks = {}
    if device.type == "cuda":
        for name, fn in fns.items():
            torch.cuda.reset_peak_memory_stats(device)
            fn()
            torch.cuda.synchronize(device)
            peaks[name] = torch.cuda.max_memory_allocated(device) / 2**20
    medians, _ = time_interleaved(fns, device, steps, warmup=1)
    tokens = batch * length
    base = medians["unpatched"]
    rows = {k: {"step_s": v, "tokens_per_s": tokens / v, "ratio_vs_unpatched": v / base,
                "peak_mem_mib": peaks.get(k)} for k, v in medians.items()}
    print(f"\n{label} (length {length}, batch {batch}, {dtype}, median of {steps} steps)")
    for k, r in rows.items():
        mem = "" if r["peak_mem_mib"] is None else f"   peak {r['peak_mem_mib']:8.0f} MiB"
        print(f"  {k:<10} {r['tokens_per_s']:10.0f} tok/s   ratio {r['ratio_vs_unpatched']:.3f}{mem}")
    for k, e in errors.items():
        print(f"  {k:<10} skipped: {e}")
    return {"model": label, "length": length, "batch": batch, "dtype": str(dtype), "steps": steps,
            "results": rows, "skipped": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=None, help="default: 4096 on CUDA, 256 on CPU")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--smollm2", action="store_true", help="also benchmark SmolLM2-135M")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    length = args.length or (4096 if cuda else 256)
    dtype = torch.bfloat16 if cuda else torch.float32
    import warnings

    warnings.filterwarnings("ignore", message=".*needs training before it is useful.*")
    size = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=length) if cuda else \
        dict(max_position_embeddings=length)
    runs = [bench("llama" + (" 8x512" if cuda else " tiny 2x64"), tiny_model("llama", "sdpa", **size), length,
                  args.batch, args.steps, device, size.get("vocab_size", 128), args.chunk, dtype)]
    if args.smollm2:
        from hf_posenc.models import load_smollm2

        model, _ = load_smollm2(attn_implementation="sdpa")
        runs.append(bench("SmolLM2-135M", model, length, args.batch, args.steps, device, model.config.vocab_size,
                          args.chunk, dtype))
    path = write_results("train_throughput", device, {"runs": runs})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
