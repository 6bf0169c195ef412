"""Sharded training of patched models: FSDP2 and DeepSpeed ZeRO-3, what a sharded run must save, and what
context parallelism can split.

* :func:`shard_fsdp2` shards a (PEFT-wrapped) patched model with PyTorch's ``fully_shard``: each decoder layer,
  then the root — the policy of accelerate's ``TRANSFORMER_BASED_WRAP`` in ``recipes/accelerate/fsdp2.yaml``. The
  Trainer gets the same from ``accelerate launch`` on GPUs; this function is for custom loops, and for CPU runs:
  accelerate (1.15) turns FSDP on only for GPU-type launches, so two CPU processes cannot be sharded through it.
* :func:`gathered_state_dict` gathers the full state dict (FSDP2's DTensor shards, ZeRO-3's partitions) onto the
  main process: a sharded model's own ``state_dict()`` holds only this rank's pieces.
* :func:`missing_from_adapter` names every trainable weight (LoRA factors, ``modules_to_save`` such as TAPE's
  modules) absent from a saved adapter; the Trainer refuses to finish with such an adapter.
* :func:`context_parallel_refusal` says why TAPA and TAPE cannot run with context parallelism (Ulysses sequence
  parallelism, :mod:`~hf_posenc.training.sequence_parallel`, splits their sequences instead).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..decoder_layers import decoder_layers


def shard_fsdp2(model: nn.Module, mesh: Any = None, reshard_after_forward: bool = True) -> nn.Module:
    """Shard ``model`` in place with FSDP2: ``fully_shard`` on every decoder layer, then on the root.

    Call it after ``patch_model`` and ``get_peft_model`` (the scheme's modules, such as TAPE's, live inside the
    decoder layers and are sharded with them) and after enabling gradient checkpointing. Needs an initialised
    process group (``torchrun``)."""
    from torch.distributed.fsdp import fully_shard

    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        raise RuntimeError("shard_fsdp2 needs an initialised process group: launch with torchrun (or accelerate "
                           "launch) and call torch.distributed.init_process_group first.")
    try:
        layers = decoder_layers(model)
    except TypeError as exc:
        raise ValueError(f"shard_fsdp2: {exc} Apply torch.distributed.fsdp.fully_shard to its blocks "
                         "yourself.") from exc
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded (FSDP2 DTensors or DeepSpeed ZeRO-3 partitions)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters())


def gathered_state_dict(model: nn.Module, accelerator: Any = None) -> dict[str, torch.Tensor] | None:
    """The full state dict of a possibly sharded ``model``, on the main process (``None`` elsewhere, and for a
    model that is not sharded: its own ``state_dict()`` is then complete).

    Every process must call it (it is a collective). Under the Trainer pass its ``accelerator`` (FSDP through
    accelerate, DeepSpeed ZeRO-3 with ``zero3_save_16bit_model``: then ``model`` is the wrapped model, the
    Trainer's ``model_wrapped``); for :func:`shard_fsdp2` models leave it out."""
    if accelerator is not None and (accelerator.is_fsdp2 or getattr(accelerator.state, "deepspeed_plugin", None)):
        state = accelerator.get_state_dict(model)
        return state if accelerator.is_main_process else None
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if torch.distributed.get_rank() == 0 else None


def saved_adapter_key(parameter_name: str, adapter_name: str = "default") -> str:
    """The key under which PEFT saves a trainable parameter of a PeftModel: without the adapter name
    (``lora_A.default.weight`` -> ``lora_A.weight``) and, for ``modules_to_save``, without the wrapper
    (``tape.modules_to_save.default.w1.weight`` -> ``tape.w1.weight``)."""
    key = parameter_name.replace(f".modules_to_save.{adapter_name}.", ".")
    key = key.replace(f".{adapter_name}.", ".")
    return key.removesuffix(f".{adapter_name}")


def full_shape(parameter: torch.Tensor) -> tuple[int, ...]:
    """The unsharded shape of a parameter (ZeRO-3 keeps it in ``ds_shape``; a DTensor's shape is global)."""
    return tuple(getattr(parameter, "ds_shape", parameter.shape))


def missing_from_adapter(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default") -> list[str]:
    """Trainable parameters of the PeftModel ``model`` that the adapter saved in ``directory`` does not hold, or
    holds with another shape (one rank's shard)."""
    from safetensors import safe_open

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: save the adapter with safe_serialization (the default).")
    with safe_open(str(path), "pt") as f:
        saved = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    return [name for name, p in model.named_parameters()
            if p.requires_grad and saved.get(saved_adapter_key(name, adapter_name)) != full_shape(p)]


def check_adapter_complete(model: nn.Module, directory: str | os.PathLike, adapter_name: str = "default") -> None:
    """Raise if the adapter saved in ``directory`` lacks any trainable weight of ``model`` (a sharded save that
    kept only this rank's pieces, or modules the scheme added that are not in ``modules_to_save``)."""
    missing = missing_from_adapter(model, directory, adapter_name)
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise RuntimeError(f"the adapter saved in {directory} lacks {len(missing)} trainable weight(s) (or holds "
                           f"a shard of them): {shown}. "
                           "A sharded run must save a gathered state dict (hf_posenc.training.distributed."
                           "gathered_state_dict); new modules must be in LoRA's modules_to_save.")


def context_parallel_refusal(scheme_name: str) -> str | None:
    """Why ``scheme_name`` cannot run with context parallelism (sequence shards over devices with ring attention
    over SDPA), or ``None``: the scheme's own answer (:meth:`~hf_posenc.schemes.SchemeConfig.context_parallel_refusal`)
    with the engines that do work."""
    from ..schemes import SCHEMES

    reason = SCHEMES[scheme_name].context_parallel_refusal()
    return None if reason is None else (f"{reason}. Split the sequence with Ulysses sequence parallelism instead "
                                        "(recipes/accelerate/ulysses-sp-zero3.yaml), or use DDP, FSDP2 or ZeRO-3 "
                                        "without cp_size")


def requested_context_parallel_size(args: Any = None) -> int:
    """The context-parallel size a launch asks for: ``TrainingArguments.parallelism_config`` or accelerate's
    ``PARALLELISM_CONFIG_CP_SIZE``."""
    size = getattr(getattr(args, "parallelism_config", None), "cp_size", None)
    return int(size if size is not None else os.environ.get("PARALLELISM_CONFIG_CP_SIZE", "1"))


__all__ = ["check_adapter_complete", "context_parallel_refusal", "gathered_state_dict", "is_sharded",
           "full_shape", "missing_from_adapter", "requested_context_parallel_size", "saved_adapter_key",
           "shard_fsdp2"]
