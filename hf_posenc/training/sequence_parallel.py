"""Ulysses sequence parallelism for patched models: DeepSpeed's ALST (``UlyssesSPAttentionHF``) through accelerate's
``ParallelismConfig(sp_backend="deepspeed")`` and Transformers' Trainer, with nothing of its own on the wire.

Each process holds 1/N of every sequence (DeepSpeed's ``UlyssesSPDataLoaderAdapter`` shards input ids, labels and
position ids); DeepSpeed's wrapper, registered over the model's attention function in ``ALL_ATTENTION_FUNCTIONS``,
exchanges Q, K and V so that each process attends over the whole sequence for 1/N of the heads, with the gathered
position ids, and a second all-to-all returns the output. What each scheme needs from that:

* frequency schemes (CoPE, p-RoPE, ...): each shard is rotated with its own slice of the position ids before the
  exchange, so nothing changes;
* TAPA is itself an attention function registered with Transformers: the wrapper wraps it, and TAPA reads
  |m − n| from the gathered (global) position ids it is called with (eq. 12), packed documents included;
* TAPE (``backend="auto"``): the states E ride through the same wrapper as a second value beside V (eq. 7 mixes them
  with the same attention map), so the wrapper's rule that a value is as wide as its key holds; the fused kernel's
  single [V | E] call does not fit it and is refused (:meth:`~hf_posenc.schemes.SchemeConfig.sequence_parallel_refusal`).

The one adaptation: accelerate's ``DeepSpeedSequenceParallelConfig`` accepts only the names of Transformers' own
kernels for the attention to wrap, while DeepSpeed's registration accepts any function in ``ALL_ATTENTION_FUNCTIONS``
and requires it to be the one the model runs; :func:`sequence_parallel_config` names the patched model's attention
(TAPA's, for example) after accelerate's check, whatever the launch config says.
"""

from __future__ import annotations

import os
from typing import Any

# Measured (two CPU processes, ZeRO-3): with several sequences per device, the wrapper's output is sequence-major,
# ZeRO-3's linear layers carry that layout to the logits, and Transformers' causal-LM loss cannot view them.
MAX_SEQUENCES_PER_DEVICE = 1
FLASH_KERNELS = ("flash_attention_2", "flash_attention_3")  # their varlen path reads the gathered position ids


def requested_sequence_parallel_size(args: Any = None) -> int:
    """The Ulysses size a launch asks for: ``TrainingArguments.parallelism_config.sp_size`` or accelerate's
    ``PARALLELISM_CONFIG_SP_SIZE`` (written by ``accelerate launch`` from a config's ``parallelism_config``)."""
    size = getattr(getattr(args, "parallelism_config", None), "sp_size", None)
    return int(size if size is not None else os.environ.get("PARALLELISM_CONFIG_SP_SIZE", "1"))


def sequence_parallel_refusal(config: Any, scheme: Any, attention: str, size: int, *, world_size: int,
                              deepspeed: bool, sequences_per_device: int, packed_documents: bool) -> str | None:
    """Why a run cannot train with the sequence split over ``size`` processes, or ``None``; every answer is known
    from the model's config before any weight loads.

    ``attention``: the attention implementation the patched model computes through; ``packed_documents``: the data
    restart positions at document starts (``data.packing: restart``)."""
    if not deepspeed:
        return ("Ulysses sequence parallelism runs inside DeepSpeed (accelerate hands sp_size to DeepSpeed only): "
                "launch with recipes/accelerate/ulysses-sp-zero3.yaml (GPUs) or ulysses-sp-zero3-cpu.yaml (CPU)")
    if world_size % size:
        return f"{world_size} processes cannot be split into sequence-parallel groups of {size}"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if heads % size:
        return (f"the model's {heads} attention heads cannot be split over {size} processes (each attends over the "
                "whole sequence for an equal share of the heads): choose a sequence-parallel size that divides "
                f"{heads}")
    if kv_heads % size and size % kv_heads:
        return (f"the model's {kv_heads} key/value heads neither divide nor are divided by the sequence-parallel "
                f"size {size} (DeepSpeed splits or replicates them)")
    if attention in ("eager", "paged|eager", "flex_attention"):
        return (f"attn_implementation={attention!r} builds a full attention mask per sequence, which the sharded "
                "run cannot pass; load the model with attn_implementation='sdpa' or 'flash_attention_2'")
    if sequences_per_device > MAX_SEQUENCES_PER_DEVICE:
        return (f"per_device_train_batch_size is {sequences_per_device}: under Ulysses each process holds a slice of "
                "one sequence, and with several DeepSpeed's wrapper returns the attention output sequence-major, a "
                "layout ZeRO-3's linear layers carry to the logits, which Transformers' loss cannot read; set "
                "per_device_train_batch_size: 1 and raise gradient_accumulation_steps")
    if packed_documents and not scheme.separates_packed_documents and attention not in FLASH_KERNELS:
        return (f"data.packing is 'restart', but {attention!r} sees the gathered sequence as one causal sequence "
                "(DeepSpeed's wrapper drops the mask; only flash attention's varlen path reads document starts "
                "from the position ids): use attn_implementation='flash_attention_2' or data.packing: concat")
    own = scheme.sequence_parallel_refusal(config)
    return None if own is None else f"{scheme.name}: {own}"


def sequence_parallel_config(attention: str, size: int) -> Any:
    """accelerate's ``ParallelismConfig`` for Ulysses over ``size`` processes, wrapping ``attention`` (the function
    the patched model computes attention through) with DeepSpeed's all-to-all.

    accelerate validates the name against Transformers' own kernels when the handler is built; the name is set
    after that check because DeepSpeed, which does the wrapping, accepts any registered attention function that the
    model runs (it refuses any other) and TAPA's is one. Sequence lengths may vary between batches."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True, sp_attn_implementation="sdpa")
    handler.sp_attn_implementation = attention
    return ParallelismConfig(sp_size=size, sp_backend="deepspeed", sp_handler=handler)


def resume_past_trained_shards(trainer: Any, checkpoint: str | os.PathLike) -> None:
    """Make a resumed sequence-parallel run start where the checkpoint stopped.

    Transformers (5.23-5.24) skips a resumed epoch's trained batches with accelerate's ``skip_first_batches``,
    which rebuilds a ``DataLoader`` and fails on DeepSpeed's adapter ("'UlyssesSPDataLoaderAdapter' object has no
    attribute 'dataset'", measured). So the Trainer is told not to skip (``ignore_data_skip``; it then restores the
    checkpoint's RNG state at the epoch's start, after this skip) and the adapter accelerate builds
    (``Accelerator.deepspeed_ulysses_dl_adapter``) is advanced past the trained micro-batches instead: the Trainer's
    own count, (global step mod steps per epoch) × accumulation, every process alike (each advance is DeepSpeed's
    collective refill)."""
    import json
    from pathlib import Path

    global_step = json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"]
    accumulate = trainer.args.gradient_accumulation_steps
    build = trainer.accelerator.deepspeed_ulysses_dl_adapter

    def adapter_past_trained_steps(dataloader: Any, model: Any) -> Any:
        adapted = build(dataloader, model)
        per_epoch = max(len(adapted) // accumulate + int(len(adapted) % accumulate > 0), 1)
        for _ in range((global_step % per_epoch) * accumulate):
            next(adapted)
        return adapted

    trainer.accelerator.deepspeed_ulysses_dl_adapter = adapter_past_trained_steps
    trainer.args.ignore_data_skip = True


__all__ = ["requested_sequence_parallel_size", "resume_past_trained_shards", "sequence_parallel_config",
           "sequence_parallel_refusal"]
