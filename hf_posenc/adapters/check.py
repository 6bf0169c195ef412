"""The check that an adapter is loaded onto the base it was trained on.

:func:`check_adapter_base` compares the adapter record (:mod:`hf_posenc.adapters.record`) with the base's scheme
record (scheme, options, model type and the rope parameters before patching) and refuses a mismatch, naming both
records and the fix; :func:`load_adapter` is ``PeftModel.from_pretrained`` behind that check. PEFT's and
Transformers' own loading run it too after ``import hf_posenc`` (:mod:`hf_posenc.adapters.guard`).
"""

from __future__ import annotations

import contextvars
import json
import os
from typing import Any

from ..patching import scheme_record
from ..record import IMPLEMENTATION_OPTIONS, compact, patch_call
from .record import AdapterRecord, read_adapter_record

# Record keys that describe the base model itself rather than the scheme applied to it.
BASE_KEYS = ("stock_model_type", "original_rope_parameters")
HUB_KEYS = ("subfolder", "revision", "token", "cache_dir", "local_files_only")
# Set while a checked load runs: PeftModel.from_pretrained calls load_adapter, and the check runs once.
CHECKED = contextvars.ContextVar("hf_posenc_adapter_checked", default=False)


def hub_kwargs(*sources: dict[str, Any] | None) -> dict[str, Any]:
    """The Hub download options (:data:`HUB_KEYS`) among ``sources``, the later ones winning, ``None`` left out."""
    out: dict[str, Any] = {}
    for source in sources:
        out.update({k: v for k, v in (source or {}).items() if k in HUB_KEYS and v is not None})
    return out


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
    return [] if adapter == base else [f"{key}: adapter {compact(adapter)!r}, base {compact(base)!r}"]


def record_differences(adapter: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    """Where the base's scheme record differs from the adapter's (``key: adapter X, base Y``); empty when they
    agree. ``None`` stands for an unpatched model."""
    a, b = _comparable(adapter), _comparable(base)
    if a is None or b is None:
        name = {True: "none (unpatched)"}
        return [] if a is b else [f"scheme: adapter {name.get(a is None) or repr(a['scheme'])}, "
                                  f"base {name.get(b is None) or repr(b['scheme'])}"]
    return _differences(a, b, "")


def _patch_call(record: dict[str, Any], replace: bool) -> str:
    return f"`{patch_call(record, replace)}`"


def _describe(record: dict[str, Any] | None) -> str:
    if record is None:
        return "an unpatched model"
    return f"a base patched with {record['scheme']!r} (scheme record {json.dumps(compact(_comparable(record)))})"


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
    from ..schemes import SCHEMES

    hub = hub_kwargs(hub)
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
    from ..schemes import SCHEMES

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
            "`hf_posenc.adapters.unguard_peft()` first.")


def load_adapter(base: Any, path: str | os.PathLike, **kwargs: Any):
    """``PeftModel.from_pretrained(base, path, **kwargs)``, refusing a base the adapter was not trained on (see
    :func:`check_adapter_base`), whether or not the PEFT methods are guarded."""
    from peft import PeftModel

    check_adapter_base(base, path, config=kwargs.get("config"), **hub_kwargs(kwargs))
    token = CHECKED.set(True)
    try:
        return PeftModel.from_pretrained(base, path, **kwargs)
    finally:
        CHECKED.reset(token)
