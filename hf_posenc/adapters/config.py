"""PEFT configs for a patched model, and the rule that keeps a scheme's own modules trainable under any config.

A scheme may add modules of its own that must train for the scheme to do anything (TAPE's ``tape`` blocks: zero
initialised, so frozen they leave the model the unpatched one). PEFT trains and saves only its adapters and
``modules_to_save``, so a hand-written ``LoraConfig(target_modules=[...])`` (TRL's usual recipe) would leave them
frozen without a word.

* :func:`lora_config` builds hf-posenc's LoRA setup, the scheme's modules in ``modules_to_save``.
* :func:`scheme_modules_left_frozen` says which of the scheme's modules a config would leave frozen, and
  :func:`train_scheme_modules` returns the config with them added to ``modules_to_save`` and says so once. PEFT's
  adapter injection runs it for every config (see :mod:`hf_posenc.adapters.guard`), as TRL's ``SFTTrainer`` adds
  ``lm_head`` to ``modules_to_save`` when it adds tokens: the modules a model cannot do without are trained.
  A config that names them in ``exclude_modules`` (``lora_config(model, scheme_modules=False)`` does) keeps them
  frozen on purpose.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any, Sequence

from ..patching import scheme_record

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


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
    scheme's own modules (TAPE's ``tape`` blocks), ``modules_to_save``, and optionally the embeddings (with an
    untied output head) and every norm (LongLoRA's "LoRA+", the TAPE recipe). The one LoRA setup of hf-posenc:
    ``hf-posenc train`` builds its adapter with it.

    ``scheme_modules=False`` keeps the scheme's modules frozen on purpose (an ablation): they go to the config's
    ``exclude_modules``, which PEFT saves with the adapter and :func:`train_scheme_modules` respects.

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
    own = [] if record is None else [m for m in record.scheme.trainable_modules if m in present]
    if scheme_modules:
        save.extend(own)
    elif own:
        kwargs["exclude_modules"] = [*(kwargs.get("exclude_modules") or []), *own]
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


# -- a scheme's own modules under any PEFT config --------------------------------------------------------------------
def _saved(config: Any, key: str) -> bool:
    """Whether ``modules_to_save`` covers the module ``key`` (PEFT's matching: a name equal to the key's last
    component or to any dotted part of it, as in ``check_target_module_exists``)."""
    return any(re.match(rf"(^|.*\.){re.escape(m)}($|\..*)", key) for m in getattr(config, "modules_to_save", None) or [])


def _excluded(config: Any, key: str) -> bool:
    """Whether ``exclude_modules`` names the module ``key`` (PEFT's matching: a regex over the whole key, or a list
    of names the key equals or ends with)."""
    exclude = getattr(config, "exclude_modules", None)
    if not exclude:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, key) is not None
    return key in exclude or any(key.endswith(f".{name}") for name in exclude)


def scheme_modules_left_frozen(model: Any, config: Any) -> list[str]:
    """The scheme's own modules (``SchemeConfig.trainable_modules``, e.g. TAPE's ``tape``) present in the patched
    ``model`` that the PEFT ``config`` would leave frozen: not in its ``modules_to_save`` and not excluded on
    purpose (``exclude_modules``). Empty for an unpatched model, a scheme without modules of its own, and a
    config loaded for inference (``inference_mode``: an adapter being loaded, not trained)."""
    record = scheme_record(model)
    if record is None or getattr(config, "inference_mode", False):
        return []
    keys = [name for name, _ in model.named_modules()]
    frozen = []
    for module in record.scheme.trainable_modules:
        ours = [k for k in keys if k == module or k.endswith(f".{module}")]
        if ours and not any(_saved(config, k) or _excluded(config, k) for k in ours):
            frozen.append(module)
    return frozen


def train_scheme_modules(model: Any, config: Any) -> Any:
    """``config``, or a copy of it whose ``modules_to_save`` adds the scheme's modules it would leave frozen
    (:func:`scheme_modules_left_frozen`), with one warning naming them and how to keep them frozen. The caller's
    config object is not changed. A PEFT method without ``modules_to_save`` cannot train them: the warning then
    names the fix instead."""
    frozen = scheme_modules_left_frozen(model, config)
    if not frozen:
        return config
    scheme = scheme_record(model).scheme.name
    what = (f"this model's scheme {scheme!r} has modules of its own, {frozen}, which train with the adapter for the "
            f"scheme to do anything, and this {type(config).__name__} leaves them frozen")
    if not hasattr(config, "modules_to_save"):
        warnings.warn(f"hf-posenc: {what}; {type(config).__name__} has no modules_to_save, so they stay frozen and the "
                      "model computes as without them. Fix: train with a LoRA config, "
                      "`hf_posenc.adapters.lora_config(model)`.", UserWarning, stacklevel=4)
        return config
    trained = copy.copy(config)
    trained.modules_to_save = [*(config.modules_to_save or []), *frozen]
    warnings.warn(f"hf-posenc: {what}; they were added to its modules_to_save (now {trained.modules_to_save}), so "
                  "they train and are saved with the adapter, as `hf_posenc.adapters.lora_config(model)` does. To keep "
                  f"them frozen on purpose, pass exclude_modules={frozen} (or "
                  "`hf_posenc.adapters.lora_config(model, scheme_modules=False)`).", UserWarning, stacklevel=4)
    return trained
