"""TAPE's default path (backend="auto" through SDPA) against the unpatched model: whole-model forward on CPU.

TAPE needs Ẽ = P·E (eq. 7) beside O = P·V, in every layer whose state a later layer reads (the last layer computes
no Ẽ). On CPU in inference both come from one attention map per block of query rows
(hf_posenc.schemes.tape.one_map; the CPU flash kernel refuses a value wider than the query). Two TAPE models are
timed: "tape" with its zero-initialised maps W_att and W₂ set to small random values, as after fine-tuning, so Ẽ
is computed and used, and "tape_at_init" as patch_model returns it, where W_att = 0 and Ẽ is skipped (it would be
multiplied by zero; the model is then bit-identical to the stock one). All models run side by side in one process
(round-robin repeats, medians of wall time and of the process's CPU time, the steadier of the two on a shared
machine; also the median of the ratios of samples taken back to back, which drift on a shared machine cancels).
The target is TAPE ≤ 1.2× the unpatched forward at hidden 256, 4 layers, 1k tokens, judged on the fine-tuned-like
"tape" row (ratio of the wall-time medians).

Writes benchmarks/results/tape_cpu_forward-<device>.json (the device name includes the thread count).
Usage: python benchmarks/tape_cpu_forward.py [--threads 1] [--length 1024] [--repeats 15]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import hf_posenc  # noqa: E402
from hf_posenc.schemes.tape import TapeBlock  # noqa: E402
from common import time_interleaved, write_results  # noqa: E402

TARGET_RATIO = 1.2
WARMUP = 2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise SystemExit("--hidden must be a multiple of --heads, and --heads a multiple of --kv-heads")
    if min(args.length, args.batch, args.layers, args.repeats) < 1:
        raise SystemExit("--length, --batch, --layers and --repeats must be >= 1")
    return args


def build(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        vocab_size=args.vocab, max_position_embeddings=max(4096, args.length),
    )
    torch.manual_seed(0)
    unpatched = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    tape = hf_posenc.patch_model(copy.deepcopy(unpatched), "tape")
    trained = copy.deepcopy(tape)
    generator = torch.Generator().manual_seed(1)
    for block in (m for m in trained.modules() if isinstance(m, TapeBlock)):
        for zero_init in (block.attn_mix, block.w2):  # as after fine-tuning: eq. 7 and eq. 8 act
            zero_init.weight.data.normal_(0.0, 0.02, generator=generator)
    return {"unpatched": unpatched, "tape": trained, "tape_at_init": tape}


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    models = build(args)
    ids = torch.randint(3, args.vocab, (args.batch, args.length))

    cpu: dict[str, list[float]] = {k: [] for k in models}

    def forward(name, model):
        def run():
            start = time.process_time()
            with torch.inference_mode():
                model(ids)
            cpu[name].append(time.process_time() - start)
        return run

    medians, samples = time_interleaved({k: forward(k, m) for k, m in models.items()}, device, args.repeats,
                                        warmup=WARMUP)
    cpu_medians = {k: statistics.median(v[WARMUP:]) for k, v in cpu.items()}
    rows = {
        k: {"median_s": medians[k], "ratio_vs_unpatched": medians[k] / medians["unpatched"],
            "paired_ratio_median": statistics.median(a / b for a, b in zip(samples[k], samples["unpatched"])),
            "cpu_median_s": cpu_medians[k], "cpu_ratio_vs_unpatched": cpu_medians[k] / cpu_medians["unpatched"],
            "samples_s": samples[k]}
        for k in models
    }
    ratio = rows["tape"]["ratio_vs_unpatched"]
    print(f"llama hidden {args.hidden}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, "
          f"{args.batch}x{args.length} tokens, SDPA, {torch.get_num_threads()} threads, median of {args.repeats}")
    for k, r in rows.items():
        print(f"  {k:<10} wall {r['median_s'] * 1e3:8.1f} ms  ratio {r['ratio_vs_unpatched']:.3f} "
              f"(paired {r['paired_ratio_median']:.3f})   "
              f"cpu {r['cpu_median_s'] * 1e3:8.1f} ms  ratio {r['cpu_ratio_vs_unpatched']:.3f}")
    print(f"  target tape <= {TARGET_RATIO}x (wall): {'met' if ratio <= TARGET_RATIO else 'NOT met'}")
    path = write_results("tape_cpu_forward", device, {
        "config": {k: getattr(args, k) for k in ("hidden", "layers", "heads", "kv_heads", "vocab", "batch", "length")}
        | {"intermediate": 4 * args.hidden, "attn_implementation": "sdpa", "threads": torch.get_num_threads()},
        "repeats": args.repeats, "target_ratio": TARGET_RATIO, "target_met": ratio <= TARGET_RATIO,
        "results": rows,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
