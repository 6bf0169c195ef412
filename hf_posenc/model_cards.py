"""Model cards and loading snippets: the README.md of a patched checkpoint, a PEFT adapter or a stock export, and
the code in it that loads the model (``import hf_posenc`` first, the base patched with the adapter's scheme).

:func:`hf_posenc.hub.push_to_hub` publishes a card with each upload; :func:`hf_posenc.adapters.save_adapter` writes
one into a local adapter folder. ``huggingface_hub``'s ``ModelCardData`` writes the metadata and ``ModelCard``
parses the result, so a card the Hub would reject fails here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .record import FORMAT_VERSION, LIBRARY_VERSION, patch_call


def adapter_warning(scheme: Any) -> str:
    """The sentence an adapter's card leads its loading section with: what goes wrong without ``import hf_posenc``."""
    drop = " and silently drops its TAPE weights on an unpatched base" if scheme.trainable_modules else ""
    return (f"**Run `import hf_posenc` before loading this adapter**: only then do `PeftModel.from_pretrained`, "
            f"`model.load_adapter` and `hf_posenc.adapters.load_adapter` refuse a base that is not patched with "
            f"`{scheme.name}` with the options above; without it, PEFT loads the adapter onto any base without a "
            f"word{drop}, and the outputs are wrong.")


def hub_base_model(name: str | None) -> str | None:
    """The card's ``base_model``: a Hub id the Hub can link (it rejects others), never a local folder's name."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or os.path.exists(name) or os.path.isabs(name) or "/" not in name:
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def nested_headings(markdown: str, parent: str) -> str:
    """``markdown`` with its headings moved below ``parent`` (``## Evaluation``: a report's ``# Title`` becomes
    ``###``), and a first heading that repeats the parent's title dropped. Fenced code is left alone."""
    depth = len(parent) - len(parent.lstrip("#"))
    title = parent.lstrip("#").strip().lower()
    lines, fenced, out = markdown.splitlines(), False, []
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        level = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < level <= 6 and line[level:level + 1] == " ":
            if not out and line[level:].strip().lower() == title:
                continue
            line = "#" * min(6, level + depth) + line[level:]
        out.append(line)
    return "\n".join(out).strip()


def adapter_load_code(record: Any, adapter: str, base: str | None) -> str:
    """The lines that load an adapter trained on a base patched with ``record``'s scheme: ``import hf_posenc``
    first, the base (``base``: a Hub id, folder, GGUF file or ``@smollm2``; a placeholder when unknown) patched
    with the same scheme and options (a no-op on a checkpoint saved patched), then ``PeftModel.from_pretrained``."""
    load_base = "hf_posenc.load_model(" + json.dumps(base or "BASE") + ")"
    placeholder = "  # BASE: the model the adapter was trained on" if base is None else ""
    return ("import hf_posenc  # first: only then does PEFT check the base's scheme\n"
            "from peft import PeftModel\n\n"
            f"base = {patch_call(record.to_dict(), model=load_base)}{placeholder}\n"
            f"model = PeftModel.from_pretrained(base, {json.dumps(adapter)})")


def model_card(repo_id: str, record: Any, *, kind: str, base_model: str | None, base_repo: str | None = None,
               evaluation: str | None = None, plots: list[str] | None = None, local: bool = False) -> str:
    """README.md for a published checkpoint (``kind``: "model", "adapter" or "stock"): ``huggingface_hub``'s
    ``ModelCardData`` writes the metadata (the Hub's own YAML conventions) and ``ModelCard`` parses the result, so
    a card the Hub would reject fails here.

    An adapter's card loads it onto ``base_repo`` (a patched base on the Hub) as it is, or else onto its base
    patched at load time. ``local``: the card of a folder on this machine (:func:`hf_posenc.adapters.save_adapter`):
    ``repo_id`` is then that folder and ``base_model`` where its base loads from (a Hub id, a local folder,
    ``@smollm2``), shown as is; a published card names only Hub ids."""
    from huggingface_hub import ModelCard, ModelCardData

    scheme = record.scheme
    hub_base = hub_base_model(base_repo or base_model)
    base = base_model if local else hub_base
    metadata = ModelCardData(
        library_name="peft" if kind == "adapter" else "transformers",
        pipeline_tag="text-generation",
        tags=["hf-posenc", scheme.name, "positional-encoding", "long-context"] + (["stock-export"] if kind == "stock" else []),
        base_model=hub_base,
        hf_posenc={"scheme": scheme.name, "options": scheme.to_dict(), "paper": scheme.paper,
                   "format_version": FORMAT_VERSION, "library_version": LIBRARY_VERSION},
    )
    if kind == "model":
        load = (f'import hf_posenc  # registers the scheme; no trust_remote_code needed\n'
                f'from transformers import AutoModelForCausalLM\n'
                f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")')
        other = (f'Without hf-posenc: `AutoModelForCausalLM.from_pretrained("{repo_id}", trust_remote_code=True)` '
                 "runs the hf-posenc modules shipped in this repo (`hf_posenc_*.py`, readable).")
    elif kind == "adapter":
        if base_repo is not None:  # published patched: it loads with its scheme
            load = (f"import hf_posenc\nfrom hf_posenc.adapters import load_adapter\n"
                    f"from transformers import AutoModelForCausalLM\n"
                    f'model = load_adapter(AutoModelForCausalLM.from_pretrained("{base_repo}"), "{repo_id}")')
        else:
            load = adapter_load_code(record, repo_id, base)
        other = adapter_warning(scheme)
    else:
        load = f'from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained("{repo_id}")'
        other = ("This is a stock-Transformers export: no plugin and no remote code are needed "
                 "(p-RoPE as `proportional`, CoPE/HardClip as per-dimension `longrope` factors).")
    options = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in scheme.to_dict().items())
    parts = [
        f"---\n{metadata.to_yaml()}\n---\n",
        f"# {repo_id.rstrip('/').split('/')[-1]}\n",
        (f"A PEFT adapter for {hub_base or (f'`{base}`' if base else 'a model')}" if kind == "adapter"
         else hub_base or "A model") + f" with its positional encoding switched to **{scheme.name}** by `hf-posenc` "
        f"{LIBRARY_VERSION}.\n",
        f"Paper: {scheme.paper}.\n",
        f"## Scheme options\n\n| option | value |\n|---|---|\n{options}\n",
        (f"## Load it\n\n{other}\n\n```python\n{load}\n```\n" if kind == "adapter"  # read before loading
         else f"## Load it\n\n```python\n{load}\n```\n\n{other}\n"),
    ]
    if evaluation:  # the report's own headings sit below the card's "## Evaluation"
        parts.append(f"## Evaluation\n\n{nested_headings(evaluation.strip(), '## Evaluation')}\n")
    for plot in plots or []:
        parts.append(f"![{Path(plot).stem}]({plot})\n")
    return str(ModelCard("\n".join(parts)))
