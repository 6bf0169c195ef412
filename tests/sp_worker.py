"""Gradients under Ulysses sequence parallelism, for tests/test_sequence_parallel.py: every scheme's tiny patched
Llama (LoRA + the scheme's modules, TAPE's with trained-like nonzero weights, gradient checkpointing: reentrant for
TAPE), one forward
and backward of the same sequence in one process and split over the processes through DeepSpeed's own pieces
(``UlyssesSPAttentionHF.register_with_transformers`` over the attention the patched model runs, and
``UlyssesSPDataLoaderAdapter`` for the shards, as accelerate wires them).

    python -m torch.distributed.run --nproc_per_node 2 tests/sp_worker.py OUT

Rank 0 writes OUT/sp.json: per scheme and case, the mean loss over the sequence and the largest gradient
difference of any trainable weight, against the single-process run. Cases: ``unpacked`` (positions 0..L-1),
``packed`` (two documents restarting at position 0), ``local_positions`` (a negative control: every shard gets
positions 0..L/N-1, as a data pipeline without global position ids would give it; the losses must then differ).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

import hf_posenc  # noqa: E402
from hf_posenc.adapters import lora_config  # noqa: E402
from hf_posenc.upstream import attn_implementation  # noqa: E402
from tiny import random_ids, tiny_model  # noqa: E402

OPTIONS = {"cope": {"clip_low_n": 4}, "prope": {"p": 0.5}, "tapa": {}, "tape": {}}
LENGTH = 32


def build(scheme: str):
    from peft import get_peft_model

    model = hf_posenc.patch_model(tiny_model("llama", attn_implementation="sdpa"), scheme, **OPTIONS[scheme])
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # TAPE's zero-initialised maps as after training: eq. 7-8 act
        if ".tape." in name:
            p.data.normal_(0.0, 0.3)
    model = get_peft_model(model, lora_config(model, r=4))
    for name, p in model.named_parameters():  # LoRA's B as after training, so its gradient path is not trivial
        if "lora_B" in name:
            p.data.normal_(0.0, 0.05)
    # TAPE with reentrant checkpointing: its forward runs without gradients, where TAPE must not leave the
    # registered attention function (DeepSpeed's wrapper) for its CPU one-map path
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": scheme == "tape"})
    if scheme == "tape":
        model.enable_input_require_grads()
    model.train()
    return model


def loss_and_grads(model, batch: dict, group=None) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean next-token loss of the whole sequence and its gradients. With ``group``, ``batch`` is this process's
    shard (``shift_labels`` from DeepSpeed's adapter): the loss is each shard's sum over the global token count, and
    the gradients are summed over the processes (what ZeRO's reduction gives, up to its averaging factor)."""
    model.zero_grad(set_to_none=True)
    labels = batch.get("shift_labels")
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    logits = out.logits.float()
    if labels is None:
        logits, labels = logits[:, :-1], batch["input_ids"][:, 1:]
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                              ignore_index=-100, reduction="sum")
    count = (labels != -100).sum()
    if group is not None:
        dist.all_reduce(count, group=group)
    (total / count).backward()
    loss = (total / count).detach()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    if group is not None:
        dist.all_reduce(loss, group=group)
        for g in grads.values():
            dist.all_reduce(g, group=group)
    return float(loss), grads


def main() -> None:
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    warnings.simplefilter("ignore")
    out_dir = Path(sys.argv[1])
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")  # DeepSpeed's communication layer over torch's process group
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = random_ids(batch=1, length=LENGTH, seed=5, vocab=128)
    unpacked = torch.arange(LENGTH)[None]
    packed = torch.cat([torch.arange(LENGTH // 2 + 3), torch.arange(LENGTH // 2 - 3)])[None]  # across the cut
    results: dict = {}
    for scheme in OPTIONS:
        model = build(scheme)
        name = attn_implementation(model.config)
        single = {case: loss_and_grads(model, {"input_ids": ids, "position_ids": pos})
                  for case, pos in (("unpacked", unpacked), ("packed", packed))}
        stock = ALL_ATTENTION_FUNCTIONS[name]
        parallel_state_sp._release_sequence_parallel_groups()  # one registration per scheme in this process
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation=name, sequence_parallel_size=world,
            micro_batch_size=1, seq_length_is_variable=True)
        group = mpu.get_sequence_parallel_group()
        results[scheme] = {}
        try:
            for case, pos in (("unpacked", unpacked), ("packed", packed), ("local_positions", unpacked)):
                loader = [{"input_ids": ids, "position_ids": pos, "labels": ids}]
                shard = next(iter(UlyssesSPDataLoaderAdapter(loader, sp_rank=mpu.get_sequence_parallel_rank(),
                                                             sp_group=group, sp_world_size=world, device="cpu")))
                assert shard["input_ids"].shape[1] == LENGTH // world  # each process holds its slice only
                if case == "local_positions":
                    shard["position_ids"] = torch.arange(LENGTH // world)[None]
                loss, grads = loss_and_grads(model, shard, group)
                want_loss, want = single["unpacked" if case == "local_positions" else case]
                results[scheme][case] = {
                    "loss": loss, "single_loss": want_loss,
                    "max_grad_diff": max(float((grads[n] - want[n]).abs().max()) for n in want),
                    "max_grad": max(float(g.abs().max()) for g in want.values()),
                    "weights": len(want),
                }
        finally:
            ALL_ATTENTION_FUNCTIONS[name] = stock
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "sp.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
