"""One FSDP2 training run of a tiny patched Llama with LoRA (+ the scheme's modules in modules_to_save) and
gradient checkpointing, for tests/test_distributed.py. Under ``torchrun --nproc_per_node 2`` the model is sharded
with :func:`hf_posenc.training.distributed.shard_fsdp2` and each rank takes half of every global batch; run
directly it trains the same global batches in one process.

    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp2_worker.py SCHEME OUT [--steps N]
        [--checkpoint-at K [--die]] [--resume-from DIR]

Writes OUT/losses.json (global mean loss per step), OUT/adapter (gathered, checked complete) and OUT/logits.pt
(the final model's logits on fixed ids). ``--checkpoint-at K`` saves a sharded DCP checkpoint of model and
optimizer after step K (``--die``: then every rank exits at once, as a killed job would).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, str(Path(__file__).parent))

import hf_posenc  # noqa: E402
from hf_posenc.adapters import lora_config, save_adapter  # noqa: E402
from hf_posenc.training.distributed import check_adapter_complete, gathered_state_dict, shard_fsdp2  # noqa: E402
from tiny import random_ids, tiny_model  # noqa: E402

# TAPA on its CPU path, as in test_distributed.SCHEMES (the Triton kernel in the interpreter would take minutes)
OPTIONS = {"cope": {"clip_low_n": 4}, "prope": {"p": 0.5}, "tapa": {"backend": "chunked"}, "tape": {}}
GLOBAL_BATCH, LENGTH = 4, 32


def build(scheme: str):
    from peft import get_peft_model

    model = hf_posenc.patch_model(tiny_model("llama", attn_implementation="sdpa"), scheme, **OPTIONS[scheme])
    torch.manual_seed(0)  # LoRA's random init
    model = get_peft_model(model, lora_config(model, r=4))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scheme", choices=sorted(OPTIONS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--checkpoint-at", type=int)
    ap.add_argument("--die", action="store_true")
    ap.add_argument("--resume-from", type=Path)
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    model = build(args.scheme)
    if world > 1:
        shard_fsdp2(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    start, losses = 0, []
    if args.resume_from is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(args.resume_from))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        meta = json.loads((args.resume_from / "progress.json").read_text())
        start, losses = meta["step"], meta["losses"]

    per = GLOBAL_BATCH // world
    for step in range(start, args.steps):
        ids = random_ids(batch=GLOBAL_BATCH, length=LENGTH, seed=100 + step)[rank * per:(rank + 1) * per]
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()  # FSDP2 averages the gradients over ranks: the mean over the global batch
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
        if args.checkpoint_at == step + 1:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            ckpt = args.out / f"checkpoint-{step + 1}"
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(ckpt))
            if rank == 0:
                (ckpt / "progress.json").write_text(json.dumps({"step": step + 1, "losses": losses}))
            if world > 1:
                dist.barrier()
            if args.die:
                os._exit(137)

    state = gathered_state_dict(model) if world > 1 else None  # a collective: every rank
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=random_ids(batch=2, length=24, seed=7), use_cache=False).logits
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        save_adapter(model, args.out / "adapter", **({} if state is None else {"state_dict": state}))
        check_adapter_complete(model, args.out / "adapter")
        torch.save(logits, args.out / "logits.pt")
        (args.out / "losses.json").write_text(json.dumps(losses))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
