"""One training step of a ~1B Llama (forward, backward, optimizer step) per positional-encoding scheme, side by
side in one run (issue #31 §4, "the whole job, not just the kernel").

Measured: the wall time of one whole step — forward, the chunked cross-entropy of `hf_posenc.training.loss` (chunk
4096, as the recipes), backward, AdamW step — on one sequence of 16,384 tokens, with gradient checkpointing
(non-reentrant, as `hf-posenc train`) and LoRA set up by `hf_posenc.adapters.lora_config` (the function
`hf-posenc train` uses: LoRA r 8 / alpha 16 on q/k/v/o, the recipes' default, plus the scheme's own modules fully
trained, i.e. TAPE's ``tape`` blocks in ``modules_to_save``). The model is Llama-3.2-1B's shape (hidden 2048,
16 layers, 32 query / 8 KV heads, head dim 64, intermediate 8192, vocabulary 128256, tied embeddings; 1.24B
parameters) with random weights, bf16 on the GPU; ``--shape tinyllama-1.1b`` for TinyLlama's.

Rows: unpatched (RoPE + SDPA), CoPE (SDPA), TAPA and TAPE through their Triton kernels (``backend="triton"``).
Steps run round-robin (`common.time_interleaved`), so drift hits every row alike, after one warmup step per row
(its time, Triton JIT included, is recorded as ``first_step_s``). Per row: median step time and the spread (min,
max, every sample), tokens/s, peak memory (CUDA: ``torch.cuda.max_memory_allocated`` over a step, absolute and
above what was allocated before the step; CPU: null per row, the process's peak RSS is at the top level) and
the ratio to unpatched.

Targets (issue #31): TAPA and TAPE at most 1.25x the unpatched step at 16k tokens, CoPE at most 1.02x. Only a
full-size CUDA run measures them; CPU results say "cpu: not a measurement of the targets".

A row that fails records its error (type, message, traceback) and the others still run; the exit code is then 1.

Usage:
  python benchmarks/train_step.py [--tokens 16384] [--repeats 3] [--warmup 1] [--schemes unpatched,cope,tapa,tape]
  python benchmarks/train_step.py --smoke --json /tmp/train_step.json   # toy Llama on CPU, fp32, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).parent))

import model_bench  # noqa: E402  (imports torch only)

if __name__ == "__main__":
    model_bench.interpret_if_cpu(sys.argv[1:])  # before anything imports Triton

STEM = "train_step"
TARGETS = {"tapa": 1.25, "tape": 1.25, "cope": 1.02}  # max step-time ratio to unpatched at 16k tokens
LEARNING_RATE = 2e-5  # the recipes'


class Row:
    """One scheme's model, optimiser and step; a failure at any point is kept in ``error`` and stops the row."""

    def __init__(self, scheme: str, device: torch.device):
        self.scheme = scheme
        self.device = device
        self.step: Callable[[], float] | None = None
        self.error: dict[str, str] | None = None
        self.info: dict[str, Any] = {"implementation": model_bench.implementation(scheme, device)}
        self.peak_abs: list[int] = []
        self.peak_extra: list[int] = []

    def fail(self, exc: BaseException) -> None:
        self.error = model_bench.error_record(exc)
        self.step = None
        model_bench.free_device_memory(self.device)

    def run(self) -> None:
        """One step; on CUDA also its peak memory. Called by the timer, so a failure is recorded, not raised."""
        if self.step is None:
            return
        try:
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            self.step()
            if cuda:
                peak = torch.cuda.max_memory_allocated(self.device)
                self.peak_abs.append(peak)
                self.peak_extra.append(peak - before)
        except Exception as exc:  # noqa: BLE001 -- recorded in the row and the exit code
            self.fail(exc)


def make_step(model: torch.nn.Module, ids: torch.Tensor, chunk: int, lora_r: int,
              info: dict[str, Any]) -> Callable[[], float]:
    """LoRA-wrap ``model`` as `hf-posenc train` does, switch on gradient checkpointing, and return one optimiser
    step (returns the loss)."""
    from peft import get_peft_model

    from hf_posenc.adapters import lora_config
    from hf_posenc.training.loss import chunked_linear_cross_entropy, shift_for_causal_lm

    config = lora_config(model, r=lora_r, lora_alpha=2 * lora_r)
    peft_model = get_peft_model(model, config)
    causal = peft_model.get_base_model()
    checkpointing = {"use_reentrant": False}  # hf-posenc train's default (TrainingSection)
    if hasattr(causal, "activation_checkpointing_enable"):  # Transformers >= 5.2x; the older name is deprecated
        causal.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing)
    else:
        causal.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
    peft_model.train()
    params = [p for p in peft_model.parameters() if p.requires_grad]
    saved = sorted(config.modules_to_save or [])  # lora_config puts the scheme's own modules (TAPE's tape) here
    info.update(lora_r=lora_r, lora_alpha=2 * lora_r, target_modules=sorted(config.target_modules),
                modules_to_save=saved, trainable_params=sum(p.numel() for p in params),
                trainable_scheme_params=sum(p.numel() for n, p in peft_model.named_parameters()
                                            if p.requires_grad and any(f".{m}." in n for m in saved)))
    if saved and not info["trainable_scheme_params"]:
        raise RuntimeError(f"modules_to_save {saved}, yet none of their parameters is trainable")
    opt = torch.optim.AdamW(params, lr=LEARNING_RATE)

    def step() -> float:
        hidden = causal.model(input_ids=ids, use_cache=False).last_hidden_state
        h, y = shift_for_causal_lm(hidden, ids)
        loss = chunked_linear_cross_entropy(h, causal.lm_head.weight, y, chunk_size=chunk) / y.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())  # the host reads the loss, as a training loop logging it does

    return step


def summarise(rows: list[Row], samples: dict[str, list[float]], tokens: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    medians = {r.scheme: statistics.median(samples[r.scheme]) for r in rows
               if r.error is None and samples.get(r.scheme)}
    base = medians.get("unpatched")
    for r in rows:
        entry: dict[str, Any] = dict(r.info)
        if r.error is not None or r.scheme not in medians:
            entry["error"] = r.error or {"type": "NoSamples", "message": "no timed step"}
            out[r.scheme] = entry
            continue
        s, med = samples[r.scheme], medians[r.scheme]
        entry.update(
            step_s=med, min_s=min(s), max_s=max(s), spread=(max(s) - min(s)) / med, samples_s=s,
            tokens_per_s=tokens / med, ratio_vs_unpatched=None if base is None else med / base,
            peak_mem_mib=max(r.peak_abs) / 2**20 if r.peak_abs else None,
            peak_mem_above_resident_mib=max(r.peak_extra) / 2**20 if r.peak_extra else None,
        )
        out[r.scheme] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_bench.add_common_arguments(ap)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per step, one sequence (default 16384; "
                                                             "64 under --smoke)")
    ap.add_argument("--repeats", type=int, default=None, help="timed steps per row (default 3; 2 under --smoke)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per row first (Triton JIT)")
    ap.add_argument("--chunk", type=int, default=4096, help="rows of logits per loss chunk (the recipes' 4096)")
    ap.add_argument("--lora-r", type=int, default=8, help="LoRA rank (alpha = 2r; the recipes' default r 8)")
    args = ap.parse_args(argv)
    args.argv = argv
    # Transformers' own calls of its deprecated checkpointing names (PEFT and the layers), once per row: noise here
    warnings.filterwarnings("ignore", message=".*deprecated and will be removed in v6.*", category=FutureWarning)
    schemes = model_bench.parse_schemes(args.schemes)
    device, dtype = model_bench.resolve_device_dtype(args)
    tokens = args.tokens or (64 if args.smoke else 16384)
    repeats = args.repeats or (2 if args.smoke else 3)
    shape_name, shape = model_bench.model_shape(args)
    out_path = model_bench.output_path(STEM, device, args)

    from common import sync, time_interleaved

    t0 = time.perf_counter()
    base = model_bench.build_base(shape, device, dtype, args.seed)
    shape_info = {"params": model_bench.parameter_count(base), "build_s": time.perf_counter() - t0}
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, shape["vocab_size"], (1, tokens), generator=g).to(device)
    payload: dict[str, Any] = {
        **model_bench.header(device, dtype, args, shape_name, shape),
        "measured": "one training step: forward + chunked cross-entropy + backward + AdamW step, LoRA "
                    "(hf_posenc.adapters.lora_config), non-reentrant gradient checkpointing",
        "tokens_per_step": tokens, "batch": 1, "repeats": repeats, "warmup": args.warmup, "loss_chunk": args.chunk,
        "optimizer": f"torch.optim.AdamW lr {LEARNING_RATE}", "timing": "round-robin medians (common.time_interleaved)",
        "peak_memory": ("torch.cuda.max_memory_allocated over a step (absolute; and above the memory allocated "
                        "before the step, which holds every row's model)") if device.type == "cuda" else
                       "null per row on CPU (one process holds every row); peak_rss_mib is the process's",
        "targets_spec": {k: f"step time <= {v}x unpatched" for k, v in TARGETS.items()},
        "model_info": shape_info,
    }
    print(f"{STEM}: {shape_name} ({shape_info['params'] / 1e9:.3f}B params, {shape['num_hidden_layers']} layers), "
          f"{tokens} tokens/step, {str(dtype).removeprefix('torch.')} on {payload['device']}", flush=True)

    rows = [Row(s, device) for s in schemes]
    for row in rows:  # each row's model, patched, LoRA-wrapped, with its optimiser
        try:
            model = model_bench.patched_copy(base, row.scheme, device)
            row.step = make_step(model, ids, args.chunk, args.lora_r, row.info)
        except Exception as exc:  # noqa: BLE001 -- recorded in the row and the exit code
            row.fail(exc)
    del base
    model_bench.free_device_memory(device)
    for row in rows:  # warmup: Triton JIT, optimiser state
        for i in range(args.warmup):
            sync(device)
            start = time.perf_counter()
            row.run()
            sync(device)
            if i == 0 and row.error is None:
                row.info["first_step_s"] = time.perf_counter() - start
                print(f"  {row.scheme}: first step {row.info['first_step_s']:.2f} s", flush=True)
        row.peak_abs.clear()  # memory from the timed steps only (the first allocates the optimiser state)
        row.peak_extra.clear()
    # a run cut short keeps the warmup (first-step times, errors)
    payload.update(status="warmed up; timing", results={r.scheme: {**r.info, **({"error": r.error} if r.error else {})}
                                                        for r in rows}, wall_s=time.perf_counter() - t0)
    model_bench.write_json(out_path, payload)
    live = {r.scheme: r.run for r in rows if r.step is not None}
    samples: dict[str, list[float]] = {}
    if live:
        _, samples = time_interleaved(live, device, repeats, warmup=0)
    results = summarise(rows, samples, tokens)
    ratios = {k: v.get("ratio_vs_unpatched") for k, v in results.items()}
    payload.update(status="complete", results=results, peak_rss_mib=model_bench.peak_rss_mib(),
                   targets=model_bench.target_verdicts(ratios, {k: v for k, v in TARGETS.items() if k in results},
                                                       False, device, args.smoke),
                   wall_s=time.perf_counter() - t0)
    model_bench.write_json(out_path, payload)

    print(f"{'row':<10} {'step s':>9} {'min':>8} {'max':>8} {'tok/s':>10} {'ratio':>7} {'peak MiB':>9}  impl")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<10} ERROR {r['error']['type']}: {r['error']['message'][:200]}")
            continue
        ratio = "-" if r["ratio_vs_unpatched"] is None else f"{r['ratio_vs_unpatched']:.3f}"
        peak = "-" if r["peak_mem_mib"] is None else f"{r['peak_mem_mib']:.0f}"
        print(f"{name:<10} {r['step_s']:9.4f} {r['min_s']:8.4f} {r['max_s']:8.4f} {r['tokens_per_s']:10.0f} "
              f"{ratio:>7} {peak:>9}  {r['implementation']}")
    for name, t in payload["targets"].items():
        verdict = t.get("note") or ("met" if t["met"] else "NOT met" if t["met"] is False else "no ratio")
        print(f"target {name}: ratio <= {t['max_ratio']}: {verdict}")
    print(f"wrote {out_path}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
