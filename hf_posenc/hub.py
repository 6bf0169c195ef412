"""Publishing to the Hugging Face Hub: a patched checkpoint, a PEFT adapter on a patched base, or a stock export,
each with a model card.

Everything up to the HTTP call is what a user's machine really does: ``save_pretrained`` (weights as safetensors,
``config.json`` carrying the scheme, the remote code and ``auto_map``), the tokenizer, the model card, and one
``HfApi.create_commit`` with every file. One commit on purpose: a published checkpoint is all or nothing (with
``hf_xet`` installed, ``upload_folder`` splits a folder over several commits that a reader could see half done).
Pass ``api=`` to use another ``HfApi`` (another endpoint, a token).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .families.base import register_publisher
from .model_cards import model_card
from .patching import check_patchable, scheme_record
from .upstream import name_or_path

# Formats that execute code when loaded (pickle) are never published.
UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _stage(model: Any, folder: Path, tokenizer: Any, stock: bool,
           base_repo: str | None = None) -> tuple[str, Any, str | None]:
    """Write what gets published into ``folder``; returns (kind, scheme record, base model name)."""
    is_peft = hasattr(model, "get_base_model") and hasattr(model, "peft_config")
    base = model.get_base_model() if is_peft else model
    check_patchable(base)
    record = scheme_record(base)
    if record is None:
        raise ValueError("push_to_hub: this model carries no hf-posenc scheme; patch it first, or publish it with "
                         "Transformers' own `push_to_hub`.")
    base_model = name_or_path(base.config)
    if is_peft:
        if stock:
            raise ValueError("push_to_hub: stock=True exports full checkpoints, not adapters.")
        from .adapters import save_adapter

        save_adapter(model, folder, base_name=base_repo)  # its adapter_config.json names the patched base
        kind = "adapter"
    elif stock:
        from .export import export_stock

        export_stock(model, folder)
        kind = "stock"
    else:
        model.save_pretrained(folder)
        kind = "model"
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return kind, record, base_model


def push_to_hub(
    model: Any,
    repo_id: str,
    *,
    tokenizer: Any = None,
    stock: bool = False,
    eval_dir: str | os.PathLike | None = None,
    base_repo: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    api: Any = None,
):
    """Publish a patched model (or a PEFT adapter on a patched base) to ``repo_id`` with a model card.

    Args:
        tokenizer: saved alongside (recommended for full checkpoints).
        stock: publish the stock-Transformers export instead (CoPE/HardClip/p-RoPE/RoPE only).
        eval_dir: a folder written by ``hf_posenc.evaluation.write_report``: its ``report.md`` becomes the card's
            evaluation section and its PNG plots are uploaded and shown.
        base_repo: the Hub id of the base model (the card's ``base_model``; for adapters, the patched base to load
            them onto); without it, where the model was loaded from, when that is a Hub id (never a local folder).
        api: an ``huggingface_hub.HfApi`` (default: a new one with ``token``).

    Returns the ``CommitInfo`` of the commit. A model still quantized from GGUF is refused with the fix named;
    nothing is ever written with pickle."""
    from huggingface_hub import CommitOperationAdd, HfApi

    if not isinstance(repo_id, str) or not repo_id.strip("/"):
        raise ValueError(f"push_to_hub: repo_id must be 'user/name', got {repo_id!r}.")
    evaluation, plots = None, []
    if eval_dir is not None:
        eval_dir = Path(eval_dir)
        if not (eval_dir / "report.md").exists():
            raise FileNotFoundError(f"push_to_hub: {eval_dir}/report.md not found; write it with "
                                    "hf_posenc.evaluation.write_report (or `hf-posenc eval --out DIR`).")
        evaluation = (eval_dir / "report.md").read_text()
        plots = sorted(p.name for p in eval_dir.glob("*.png"))
    with tempfile.TemporaryDirectory(prefix="hf-posenc-push-") as tmp:
        folder = Path(tmp)
        kind, record, base_model = _stage(model, folder, tokenizer, stock, base_repo)
        for name in plots:
            shutil.copy(eval_dir / name, folder / name)
        (folder / "README.md").write_text(model_card(repo_id, record, kind=kind, base_model=base_model,
                                                     base_repo=base_repo, evaluation=evaluation, plots=plots))
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        unsafe = [p.name for p in files if p.suffix in UNSAFE_SUFFIXES]
        if unsafe:
            raise RuntimeError(f"push_to_hub: refusing to publish pickle files {unsafe}.")
        api = api or HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        operations = [CommitOperationAdd(path_in_repo=p.relative_to(folder).as_posix(), path_or_fileobj=str(p))
                      for p in files]
        return api.create_commit(
            repo_id, operations, commit_message=commit_message or f"Upload {kind} patched with {record.scheme.name}",
            revision=revision, create_pr=create_pr, repo_type="model",
        )


register_publisher("push_to_hub", push_to_hub)
