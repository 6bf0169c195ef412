"""Training data: read documents, tokenize, and pack them into windows of the target context length.

Two packings (``data.packing``):

* ``concat``: documents joined with EOS into one token stream, cut into non-overlapping windows of L tokens;
  positions run 0…L−1 in every window, so the model learns to attend across document boundaries (the usual
  continued-pretraining setup of PI, YaRN, LongLoRA and CoPE).
* ``restart``: documents (each followed by EOS) are laid into windows greedily; every piece gets positions
  0, 1, … of its own and the label of its first token is masked (-100), so neither the loss nor attention
  crosses documents. Transformers' SDPA/flash/flex masks detect the boundaries from the position ids when no
  attention mask is passed; TAPA reads them directly. A document longer than the room left is split, and its
  continuation starts again at position 0 in the next window.

A window's labels equal its input ids except for masked positions; the model (or the chunked loss) shifts them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .config import DataSection, RecipeError, data_files

IGNORE_INDEX = -100


# -- reading ----------------------------------------------------------------------------------------------------
def _read_file(path: str, text_field: str) -> Iterable[str]:
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or text_field not in row:
                    raise RecipeError(f"{path}:{lineno}: expected a JSON object with key {text_field!r} "
                                      "(set data.text_field).")
                yield str(row[text_field])
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as fh:
            rows = json.load(fh)
        if not isinstance(rows, list):
            raise RecipeError(f"{path}: a .json data file must hold a list of objects with key {text_field!r}.")
        for row in rows:
            yield str(row[text_field]) if isinstance(row, dict) else str(row)
    else:
        with open(path, encoding="utf-8", errors="replace") as fh:
            yield fh.read()


def _read_dataset(section: DataSection) -> Iterable[str]:
    import datasets

    path = os.path.expanduser(section.dataset)
    if os.path.isdir(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if section.split not in ds:
                raise RecipeError(f"data.split: {section.split!r} not in {path} (splits: {sorted(ds)}).")
            ds = ds[section.split]
    else:
        ds = datasets.load_dataset(section.dataset, section.dataset_config, split=section.split)
    if section.text_field not in ds.column_names:
        raise RecipeError(f"data.text_field: {section.text_field!r} is not a column of {section.dataset} "
                          f"(columns: {ds.column_names}).")
    for row in ds:
        yield str(row[section.text_field])


def read_documents(section: DataSection) -> list[str]:
    """All non-empty documents of the data section, in a fixed order (files sorted, then the dataset)."""
    docs: list[str] = []
    sources: list[Iterable[str]] = [_read_file(p, section.text_field) for p in data_files(section)]
    if section.dataset is not None:
        sources.append(_read_dataset(section))
    for source in sources:
        for text in source:
            if text.strip():
                docs.append(text)
                if section.max_documents is not None and len(docs) >= section.max_documents:
                    return docs
    return docs


def tokenize_documents(docs: Sequence[str], tokenizer: Any, batch_size: int = 256) -> list[list[int]]:
    """Token ids of each document, without special tokens (packing adds EOS)."""
    out: list[list[int]] = []
    for start in range(0, len(docs), batch_size):
        enc = tokenizer(list(docs[start : start + batch_size]), add_special_tokens=False)
        out.extend(list(ids) for ids in enc["input_ids"])
    return out


# -- packing ----------------------------------------------------------------------------------------------------
def _too_short(found: int, needed: int, docs: int, length: int) -> RecipeError:
    return RecipeError(
        f"the corpus is too short: {found} tokens found in {docs} documents (EOS included), {needed} needed for "
        f"{max(1, needed // length)} window(s) of context_length={length}. Add data, or lower context_length."
    )


def pack_concat(documents: Sequence[Sequence[int]], length: int, eos_id: int) -> list[dict[str, torch.Tensor]]:
    """Join documents with EOS and cut the stream into windows of ``length`` (positions 0…L−1 each)."""
    stream: list[int] = []
    for doc in documents:
        stream.extend(doc)
        stream.append(eos_id)
    n = len(stream) // length
    if n == 0:
        raise _too_short(len(stream), length, len(documents), length)
    ids = torch.tensor(stream[: n * length], dtype=torch.long).view(n, length)
    positions = torch.arange(length, dtype=torch.long)
    return [{"input_ids": row, "labels": row.clone(), "position_ids": positions.clone()} for row in ids]


def pack_restart(documents: Sequence[Sequence[int]], length: int, eos_id: int) -> list[dict[str, torch.Tensor]]:
    """Lay documents (+EOS) into windows; positions restart at 0 per piece and each piece's first label is -100."""
    windows: list[dict[str, torch.Tensor]] = []
    ids: list[int] = []
    pos: list[int] = []
    labels: list[int] = []
    total = 0
    for doc in documents:
        tokens = list(doc) + [eos_id]
        total += len(tokens)
        while tokens:
            take = min(len(tokens), length - len(ids))
            piece, tokens = tokens[:take], tokens[take:]
            ids.extend(piece)
            pos.extend(range(take))
            labels.extend([IGNORE_INDEX] + piece[1:])
            if len(ids) == length:
                windows.append({
                    "input_ids": torch.tensor(ids, dtype=torch.long),
                    "labels": torch.tensor(labels, dtype=torch.long),
                    "position_ids": torch.tensor(pos, dtype=torch.long),
                })
                ids, pos, labels = [], [], []
    if not windows:
        raise _too_short(total, length, len(documents), length)
    return windows


class PackedDataset(torch.utils.data.Dataset):
    """A list of packed windows (``input_ids``, ``labels``, ``position_ids``, each [L])."""

    def __init__(self, windows: list[dict[str, torch.Tensor]]):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.windows[index]


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack windows; no attention mask, so packed documents are found from the position ids."""
    return {key: torch.stack([item[key] for item in batch]) for key in batch[0]}


def build_dataset(section: DataSection, tokenizer: Any, length: int) -> PackedDataset:
    """Read, tokenize and pack the corpus of ``section`` into windows of ``length`` tokens."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise RecipeError("the tokenizer has no EOS token, which packing needs between documents; use a tokenizer "
                          "with one (or set tokenizer.eos_token).")
    docs = read_documents(section)
    if not docs:
        raise RecipeError("the corpus is empty: data.files/data.dataset gave no non-empty document.")
    tokens = tokenize_documents(docs, tokenizer)
    pack = pack_concat if section.packing == "concat" else pack_restart
    windows = pack(tokens, length, eos)
    if len(windows) < section.min_windows:
        found = sum(len(t) + 1 for t in tokens)
        raise _too_short(found, section.min_windows * length, len(docs), length)
    if section.max_windows is not None:
        windows = windows[: section.max_windows]
    return PackedDataset(windows)
