"""PEFT helpers: LoRA configs that keep a scheme's own weights, and adapter loading that refuses a wrong base.

PEFT saves only the adapter weights and ``modules_to_save``: new parameters that merely have
``requires_grad=True`` are silently dropped, and an adapter with ``modules_to_save`` loaded onto a base that lacks
those modules silently drops them too. :func:`lora_config` puts a scheme's modules (TAPE's ``tape`` blocks) in
``modules_to_save``; :func:`save_adapter` records the scheme next to the adapter; :func:`check_adapter_base`
refuses a base without them, and :func:`guard_peft_loading` makes ``PeftModel.from_pretrained`` run that check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from .patching import scheme_record

ADAPTER_RECORD = "hf_posenc_adapter.json"
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _norm_names(model: Any) -> list[str]:
    names = set()
    for name, module in model.named_modules():
        if type(module).__name__.endswith("RMSNorm") and "." in name:
            names.add(name.rsplit(".", 1)[1])
    return sorted(names)


def lora_config(
    model: Any,
    r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    target_modules: Sequence[str] = ATTENTION_PROJECTIONS,
    train_embeddings: bool = False,
    train_norms: bool = False,
    **kwargs: Any,
):
    """A ``peft.LoraConfig`` for a patched model: LoRA on ``target_modules`` plus, fully trained and saved, the
    scheme's own modules (TAPE), and optionally the embeddings and norms (LongLoRA's "LoRA+", the TAPE recipe).

    Patched models have their own model type, for which PEFT has no default target modules, so they are explicit.
    """
    from peft import LoraConfig, TaskType

    if not target_modules:
        raise ValueError("lora_config: PEFT needs at least one LoRA target; e.g. target_modules=('q_proj', 'v_proj').")
    record = scheme_record(model)
    modules_to_save = list(record.scheme.trainable_modules) if record is not None else []
    if train_embeddings:
        modules_to_save.append("embed_tokens")
    if train_norms:
        modules_to_save.extend(_norm_names(model))
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
        target_modules=list(target_modules), modules_to_save=modules_to_save or None, **kwargs,
    )


def save_adapter(peft_model: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """``peft_model.save_pretrained(path)`` plus a record of the base's scheme, checked by :func:`load_adapter`."""
    path = Path(path)
    peft_model.save_pretrained(path, **kwargs)
    record = scheme_record(peft_model.get_base_model())
    (path / ADAPTER_RECORD).write_text(json.dumps({"hf_posenc": None if record is None else record.to_dict()}, indent=2))
    return path


def check_adapter_base(base: Any, model_id: str | os.PathLike, config: Any = None, **kwargs: Any) -> None:
    """Raise if ``base`` lacks the scheme modules (TAPE's ``tape``) or the scheme an adapter was trained with, where
    PEFT would silently drop those weights. Other adapters pass untouched."""
    from peft import PeftConfig

    from .schemes import SCHEMES

    if config is None:
        hub = {k: kwargs[k] for k in ("subfolder", "revision", "token", "cache_dir") if kwargs.get(k) is not None}
        config = PeftConfig.from_pretrained(model_id, **hub)
    scheme_modules = {m for cls in SCHEMES.values() for m in cls.trainable_modules}
    names = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    missing = [m for m in (config.modules_to_save or []) if m in scheme_modules and m not in names]
    record_file = Path(model_id) / kwargs.get("subfolder", "") / ADAPTER_RECORD
    trained = json.loads(record_file.read_text())["hf_posenc"] if record_file.is_file() else None
    current = scheme_record(base)
    mismatch = trained is not None and (current is None or current.scheme.name != trained["scheme"])
    if missing or mismatch:
        scheme = trained["scheme"] if trained else "tape"
        raise ValueError(
            f"this adapter was trained on a model patched with {scheme!r} (modules {missing} are missing from the "
            f"base); patch the base first: `hf_posenc.patch_model(base, {scheme!r}, ...)`, or load the base from a "
            "checkpoint saved after patching. PEFT would otherwise drop the scheme's weights silently."
        )


def guard_peft_loading() -> None:
    """Make ``PeftModel.from_pretrained`` (and the ``AutoPeftModel`` classes, which call it) run
    :func:`check_adapter_base` first. PEFT has no registration hook for such a check, so its classmethod is wrapped
    once; the check only ever raises for adapters carrying hf-posenc scheme modules. Installed by
    ``import hf_posenc`` when PEFT is available."""
    import functools

    from peft import PeftModel

    original = PeftModel.__dict__["from_pretrained"].__func__
    if getattr(original, "_hf_posenc_guard", False):
        return

    @functools.wraps(original)
    def from_pretrained(cls, model, model_id, *args, **kwargs):
        check_adapter_base(model, model_id, config=kwargs.get("config"), **kwargs)
        return original(cls, model, model_id, *args, **kwargs)

    from_pretrained._hf_posenc_guard = True
    PeftModel.from_pretrained = classmethod(from_pretrained)


def load_adapter(base: Any, path: str | os.PathLike, **kwargs: Any):
    """``PeftModel.from_pretrained(base, path)``, refusing a base that lacks the modules or scheme the adapter was
    trained with (see :func:`check_adapter_base`)."""
    from peft import PeftModel

    guard_peft_loading()
    return PeftModel.from_pretrained(base, path, **kwargs)
