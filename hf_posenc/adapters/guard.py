"""What ``import hf_posenc`` adds to PEFT and Transformers, so that no path of theirs loses a scheme silently.

Neither library has a hook for these, so :func:`guard_peft` wraps their methods (idempotent;
:func:`unguard_peft` restores them; ``HF_POSENC_GUARD_PEFT=0`` keeps ``import hf_posenc`` from wrapping them):

* **loading**: ``PeftModel.from_pretrained`` (and the ``AutoPeftModel`` classes), ``PeftModel.load_adapter`` and
  Transformers' ``model.load_adapter`` (also used by ``from_pretrained`` on an adapter folder) run
  :func:`hf_posenc.adapters.check_adapter_base` before they touch the base;
* **wrapping**: PEFT's adapter injection (``BaseTuner.inject_adapter``, which ``get_peft_model``, ``PeftModel``,
  ``inject_adapter_in_model``, ``PeftModel.add_adapter``, Transformers' ``model.add_adapter`` and TRL's
  ``SFTTrainer(peft_config=...)`` all reach) trains the scheme's own modules a config leaves frozen
  (:func:`hf_posenc.adapters.config.train_scheme_modules`, with a warning);
* **saving**: ``PeftModel.save_pretrained`` (the Trainer's and TRL's ``save_model``) over a patched base writes the
  adapter record and model card (:func:`hf_posenc.adapters.describe_adapter`), as
  :func:`hf_posenc.adapters.save_adapter` does. Transformers' ``model.save_pretrained`` of a patched model with an
  adapter added does the same through the patched class's own ``save_pretrained`` (no wrapping needed).
"""

from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path
from typing import Any, Callable

from ..families.base import register_publisher
from ..patching import scheme_record
from .check import CHECKED, check_adapter_base, hub_kwargs
from .config import train_scheme_modules
from .record import caller_is_describing, describe_adapter

GUARD_ENV = "HF_POSENC_GUARD_PEFT"
_ORIGINALS: dict[tuple[type, str], Any] = {}


# -- loading ----------------------------------------------------------------------------------------------------------
def _checked(original: Callable, check: Callable[[inspect.BoundArguments], None]) -> Callable:
    """Wrap ``original`` so that ``check`` (given its bound arguments) runs first, once per outermost call."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if CHECKED.get():
            return original(*args, **kwargs)
        check(signature.bind(*args, **kwargs))
        token = CHECKED.set(True)  # PeftModel.from_pretrained calls load_adapter: check once
        try:
            return original(*args, **kwargs)
        finally:
            CHECKED.reset(token)

    return wrapper


def _check_peft_from_pretrained(bound: inspect.BoundArguments) -> None:
    a = bound.arguments
    check_adapter_base(a["model"], a["model_id"], config=a.get("config"), **hub_kwargs(a.get("kwargs")))


def _check_peft_load_adapter(bound: inspect.BoundArguments) -> None:
    a = bound.arguments
    check_adapter_base(a["self"].get_base_model(), a["model_id"], **hub_kwargs(a.get("kwargs")))


def _check_transformers_load_adapter(bound: inspect.BoundArguments) -> None:
    a = bound.arguments
    load_config = a.get("load_config")
    download = getattr(load_config, "download_kwargs", None)
    model_id = a.get("peft_model_id") or getattr(load_config, "pretrained_model_name_or_path", None)
    hub = hub_kwargs(download, a.get("kwargs"), a.get("adapter_kwargs"))
    if a.get("local_files_only"):
        hub["local_files_only"] = True
    config = a.get("peft_config")
    check_adapter_base(a["self"], model_id if config is None else None, config=config, **hub)


# -- wrapping ---------------------------------------------------------------------------------------------------------
def _training_scheme_modules(original: Callable) -> Callable:
    """Wrap ``BaseTuner.inject_adapter`` so that the config it injects trains the scheme's own modules
    (:func:`train_scheme_modules`: a copy of the config, stored under the adapter's name before injection)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        a = signature.bind(*args, **kwargs).arguments
        tuner, name = a["self"], a["adapter_name"]
        config = tuner.peft_config[name]
        trained = train_scheme_modules(a["model"], config)
        if trained is not config:
            tuner.peft_config[name] = trained
        return original(*args, **kwargs)

    return wrapper


# -- saving -----------------------------------------------------------------------------------------------------------
def describe_if_patched(model: Any, directory: str | os.PathLike, *, selected_adapters: Any = None) -> None:
    """After an adapter save into ``directory``: :func:`describe_adapter` when the adapter's base is patched and no
    caller describes it itself (:func:`hf_posenc.adapters.record.caller_describes`). A save that wrote no
    ``adapter_config.json`` (an FSDP sharded state dict) is left alone."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if caller_is_describing() or scheme_record(base) is None:
        return
    if not (Path(directory) / "adapter_config.json").is_file():
        return
    describe_adapter(model, directory, selected_adapters=selected_adapters)


def _describing_saves(original: Callable) -> Callable:
    """Wrap ``PeftModel.save_pretrained`` so that an adapter over a patched base is saved with its adapter record."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        result = original(*args, **kwargs)
        if a.arguments["is_main_process"]:
            describe_if_patched(a.arguments["self"], a.arguments["save_directory"],
                                selected_adapters=a.arguments["selected_adapters"])
        return result

    return wrapper


register_publisher("adapter_record", describe_if_patched)


# -- installing -------------------------------------------------------------------------------------------------------
def _targets() -> list[tuple[type, str, bool, Callable[[Callable], Callable]]]:
    """(class, method, is a classmethod, wrapper factory) of every method :func:`guard_peft` wraps."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner
    from transformers.integrations.peft import PeftAdapterMixin

    def checking(check):
        return lambda original: _checked(original, check)

    return [
        (PeftModel, "from_pretrained", True, checking(_check_peft_from_pretrained)),
        (PeftModel, "load_adapter", False, checking(_check_peft_load_adapter)),
        (PeftAdapterMixin, "load_adapter", False, checking(_check_transformers_load_adapter)),
        (BaseTuner, "inject_adapter", False, _training_scheme_modules),
        (PeftModel, "save_pretrained", False, _describing_saves),
    ]


def guard_peft() -> None:
    """Install the loading check, the scheme-module rule and the adapter record on save (see the module's
    docstring) in PEFT and Transformers. Idempotent; run by ``import hf_posenc`` unless ``HF_POSENC_GUARD_PEFT=0``;
    undone by :func:`unguard_peft`."""
    for cls, name, is_classmethod, wrap in _targets():
        current = cls.__dict__[name]
        function = current.__func__ if is_classmethod else current
        if getattr(function, "_hf_posenc_guard", False):
            continue
        _ORIGINALS[(cls, name)] = current
        wrapped = wrap(function)
        wrapped._hf_posenc_guard = True
        setattr(cls, name, classmethod(wrapped) if is_classmethod else wrapped)


def unguard_peft() -> None:
    """Restore PEFT's and Transformers' own methods (no base check, no scheme-module rule, no adapter record on a
    plain save); :func:`guard_peft` re-installs them."""
    for (cls, name), original in list(_ORIGINALS.items()):
        setattr(cls, name, original)
        del _ORIGINALS[(cls, name)]


def guard_enabled_by_environment() -> bool:
    """``False`` when ``HF_POSENC_GUARD_PEFT`` is ``0``/``false``/``no``/``off``: ``import hf_posenc`` then leaves
    PEFT and Transformers unwrapped."""
    return os.environ.get(GUARD_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
