"""The measured memory of a sequence-parallel ZeRO-3 training step, for tests/test_sequence_parallel.py: a small
Llama (fp32, 2 layers, hidden 256, 4/2 heads of 64, intermediate 1024, VOCAB tokens) built under ZeRO-3's
``zero.Init`` (as ``zero3_init_flag`` does), patched, with LoRA, DeepSpeed's Ulysses wrapper and data adapter, and
``deepspeed.initialize`` with ZeRO-3 over two CPU processes, as accelerate wires them; 4,096-token sequences (2,048
per process).

    MALLOC_MMAP_THRESHOLD_=65536 python -m torch.distributed.run --nproc_per_node 2 tests/sp_memory_worker.py \
        SCHEME VOCAB OUT

Rank 0 writes OUT/memory.json: the peak of live CPU tensor memory of each process from before the model is built to
the end (the profiler's allocation and free events in order), and the estimate of
:func:`hf_posenc.training.memory.training_memory` for the same run.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

import hf_posenc  # noqa: E402
from hf_posenc.adapters import lora_config  # noqa: E402
from hf_posenc.training.memory import training_memory  # noqa: E402
from hf_posenc.upstream import attn_implementation  # noqa: E402
from tiny import random_ids, tiny_config  # noqa: E402

LENGTH = 4096
SHAPE = {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "max_position_embeddings": LENGTH, "tie_word_embeddings": False}
# recipes/accelerate/ulysses-sp-zero3-cpu.yaml's ZeRO-3 with the sizes the Trainer fills in for "auto" (from the
# hidden size: buckets of hidden² values), every weight partitioned as a 7B model's sizes would be
HIDDEN = SHAPE["hidden_size"]
DS_CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
             "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                   "reduce_bucket_size": HIDDEN * HIDDEN,
                                   "stage3_prefetch_bucket_size": int(0.9 * HIDDEN * HIDDEN)}}


def rss() -> int:
    """This process's resident memory now, in bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_since_reset() -> int:
    """The resident high-water mark since :func:`reset_peak_rss` (``VmHWM``), in bytes."""
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the high-water mark restarts from the current RSS


def partition_bytes(engine) -> int:
    """What ZeRO-3 holds on this process: each parameter's partition, and the optimizer's tensors (its fp32
    gradient partitions, Adam's moments)."""
    total = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in engine.module.parameters())
    for state in engine.optimizer.optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.dim())
    for group in engine.optimizer.fp32_partitioned_groups_flat:
        total += (group.grad.numel() * group.grad.element_size()) if group.grad is not None else 0
    return total


def main() -> None:
    import deepspeed
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    warnings.simplefilter("ignore")
    scheme, vocab, out_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    SHAPE["vocab_size"] = vocab
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
        raise SystemExit("run with MALLOC_MMAP_THRESHOLD_=65536: tensors then live in their own pages, returned on free")
    deepspeed.init_distributed(dist_backend="gloo")
    world = dist.get_world_size()
    ids = random_ids(batch=1, length=LENGTH, seed=3, vocab=SHAPE["vocab_size"])
    with torch.device("meta"):  # the estimate reads shapes only: the same model built on the meta device
        meta = hf_posenc.patch_model(AutoModelForCausalLM.from_config(tiny_config("llama", **SHAPE)), scheme)
        meta = get_peft_model(meta, lora_config(meta, r=4))
    estimate = training_memory(meta, LENGTH, world, world, bytes_per_value=4, carries_states=scheme == "tape")
    torch.manual_seed(0)
    zero3 = HfDeepSpeedConfig(DS_CONFIG)  # noqa: F841  (alive: Transformers then builds under zero.Init)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", **SHAPE), attn_implementation="sdpa")
    hf_posenc.patch_model(model, scheme)
    model = get_peft_model(model, lora_config(model, r=4))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, core_attn_implementation=attn_implementation(model.config),
        sequence_parallel_size=world, micro_batch_size=1, seq_length_is_variable=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=DS_CONFIG, mpu=mpu)
    loader = UlyssesSPDataLoaderAdapter([{"input_ids": ids, "position_ids": torch.arange(LENGTH)[None],
                                          "labels": ids}] * 2, sp_rank=mpu.get_sequence_parallel_rank(),
                                        sp_group=mpu.get_sequence_parallel_group(), sp_world_size=world, device="cpu")

    def step() -> None:
        shard = next(loader)
        out = engine(input_ids=shard["input_ids"], position_ids=shard["position_ids"],
                     labels=shard["shift_labels"], shift_labels=shard["shift_labels"], use_cache=False)
        engine.backward(out.loss)
        engine.step()

    step()  # the first step creates the optimizer's states and finishes DeepSpeed's lazy set-up
    gc.collect()
    held, before = partition_bytes(engine), rss()
    reset_peak_rss()
    step()
    measured = torch.tensor([held, peak_rss_since_reset() - before], dtype=torch.float64)
    gathered = [torch.zeros_like(measured) for _ in range(world)]
    dist.all_gather(gathered, measured)
    if dist.get_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "memory.json").write_text(json.dumps({
            "held": [int(t[0]) for t in gathered], "step_peak": [int(t[1]) for t in gathered],
            "estimate": estimate.__dict__, "estimated_peak": estimate.peak}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
