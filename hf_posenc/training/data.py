"""Training data: read documents with ``datasets``, tokenize them and pack them into windows of the target length.

Two packings (``data.packing``):

* ``concat``: documents joined with EOS into one token stream, cut into non-overlapping windows of L tokens (TRL's
  "wrapped" packing); positions run 0…L−1 in every window, so the model learns to attend across document
  boundaries (the usual continued-pretraining setup of PI, YaRN, LongLoRA and CoPE).
* ``restart``: the same windows, but every document piece gets positions 0, 1, … of its own and the label of its
  first token is masked (-100), as ``transformers.DataCollatorWithFlattening`` lays out sequences, so neither the
  loss nor attention crosses documents. Transformers' SDPA/flash/flex masks detect the boundaries from the position
  ids when no attention mask is passed; TAPA reads them directly. A document longer than the room left is split,
  and its continuation starts again at position 0 in the next window.

Every step is a ``Dataset.map``/``filter`` cached by ``datasets`` under the input's fingerprint: a second build from the
same corpus and tokenizer reuses the Arrow files, and the windows are memory-mapped, not held in RAM. Packing reads the
whole token stream as one batch (4 bytes a token), so windows run on across batches as in one stream; the short tail is
dropped. :func:`collate` makes the labels: the input ids but for masked positions (the model shifts them).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from trl.data_utils import pack_dataset

from .config import DataSection, RecipeError, data_files

IGNORE_INDEX = -100
# int32 ids; large lists (64-bit offsets) because packing sees the whole stream at once.
TOKENS = datasets.Features({"input_ids": datasets.LargeList(datasets.Value("int32"))})


# -- reading ----------------------------------------------------------------------------------------------------
def _text_column(ds: datasets.Dataset, field: str, where: str) -> datasets.Dataset:
    """``ds`` reduced to its ``field`` column, renamed ``text`` and cast to strings; every row must have one."""
    if field not in ds.column_names:
        raise RecipeError(f"data.text_field: {field!r} is not a column of {where} (columns: {ds.column_names}).")
    column = ds.data.column(field)
    if column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise RecipeError(f"{where}: record {row + 1} has no {field!r} (set data.text_field).")
    ds = ds.select_columns([field])
    if field != "text":
        ds = ds.rename_column(field, "text")
    return ds if ds.features["text"] == datasets.Value("string") else ds.cast_column("text", datasets.Value("string"))


def _json_file(path: str, field: str) -> datasets.Dataset:
    try:
        ds = datasets.load_dataset("json", data_files=path, split="train")
    except (datasets.exceptions.DatasetGenerationError, ValueError) as err:  # the JSON does not parse to a table
        raise RecipeError(f"{path}: expected JSON objects with key {field!r}, one a line or in a list (set "
                          f"data.text_field): {err.__cause__ or err}") from err
    return _text_column(ds, field, path)


def _hub_or_disk(section: DataSection) -> datasets.Dataset:
    path = os.path.expanduser(section.dataset)
    if os.path.isdir(path):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if section.split not in ds:
                raise RecipeError(f"data.split: {section.split!r} not in {path} (splits: {sorted(ds)}).")
            ds = ds[section.split]
    else:
        ds = datasets.load_dataset(section.dataset, section.dataset_config, split=section.split)
    return _text_column(ds, section.text_field, section.dataset)


@contextlib.contextmanager
def _without_progress_bars():
    """``datasets``' progress bars off inside (unless already off, or forced on by
    ``HF_DATASETS_DISABLE_PROGRESS_BARS=0``), as they were after."""
    if datasets.utils.are_progress_bars_disabled() or datasets.config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:
        yield
        return
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()


def _text_files(paths: list[str]) -> datasets.Dataset:
    """Text files, one document each. ``datasets`` "downloads" 16 files or more with a progress bar ("Downloading
    data: 0/103 files") though they are local: its bars are off meanwhile (then "tokenizing" shows the progress)."""
    with _without_progress_bars():
        return datasets.load_dataset("text", data_files=paths, split="train", sample_by="document",
                                     encoding_errors="replace")


def _sources(section: DataSection) -> Iterator[datasets.Dataset]:
    """The corpus in order, one ``text`` column each: data.files as listed (runs of text files, one document a
    file, load together; each JSON file alone, so that errors name it), then data.dataset."""
    for is_json, paths in itertools.groupby(data_files(section), key=lambda p: p.endswith((".json", ".jsonl"))):
        if is_json:
            yield from (_json_file(path, section.text_field) for path in paths)
        else:
            yield _text_files(list(paths))
    if section.dataset is not None:
        yield _hub_or_disk(section)


def read_documents(section: DataSection) -> datasets.Dataset:
    """The non-empty documents of the data section (column ``text``) in a fixed order, at most data.max_documents;
    later sources are not loaded once that many documents are found."""
    parts: list[datasets.Dataset] = []
    found = 0
    for source in _sources(section):
        parts.append(source.filter(lambda texts: [bool(t.strip()) for t in texts], batched=True, input_columns="text",
                                   desc="dropping empty documents"))
        found += len(parts[-1])
        if section.max_documents is not None and found >= section.max_documents:
            break
    if not found:
        raise RecipeError("the corpus is empty: data.files/data.dataset gave no non-empty document.")
    docs = datasets.concatenate_datasets(parts)
    return docs if section.max_documents is None else docs.select(range(min(len(docs), section.max_documents)))


def tokenize_documents(docs: datasets.Dataset, tokenizer: Any) -> datasets.Dataset:
    """Column ``input_ids``: each document's token ids without special tokens, followed by EOS."""
    eos = tokenizer.eos_token_id

    def tokenize(texts: list[str]) -> dict[str, list[list[int]]]:
        return {"input_ids": [ids + [eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]}

    return docs.map(tokenize, batched=True, input_columns="text", remove_columns=["text"], features=TOKENS,
                    desc="tokenizing")


def _num_tokens(tokens: datasets.Dataset) -> int:
    return pc.sum(pc.list_value_length(tokens.with_format("arrow")[:]["input_ids"])).as_py() or 0


# -- packing ----------------------------------------------------------------------------------------------------
def pack_concat(tokens: datasets.Dataset, length: int) -> datasets.Dataset:
    """TRL's wrapped packing of the documents' ``input_ids`` (EOS included) and of any other list column, over the
    whole stream at once; the short tail is dropped."""
    packed = pack_dataset(tokens, length, strategy="wrapped", map_kwargs={"batch_size": None, "desc": "packing"})
    return packed.select(range(_num_tokens(tokens) // length))


def _document_positions(batch: pa.Table) -> pa.Table:
    lengths = pc.list_value_length(batch["input_ids"]).to_numpy()
    ends = np.cumsum(lengths)
    positions = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths, lengths)
    offsets = np.concatenate([[0], ends])
    return batch.append_column("position_ids", pa.LargeListArray.from_arrays(offsets, pa.array(positions, pa.int32())))


def pack_restart(tokens: datasets.Dataset, length: int) -> datasets.Dataset:
    """The windows of :func:`pack_concat` with ``position_ids`` restarting at 0 at every document and window start."""
    with_positions = tokens.with_format("arrow").map(_document_positions, batched=True, desc="document positions")
    windows = pack_concat(with_positions, length).with_format("numpy")
    # The piece a window starts with continues a document: its positions run 0, 1, … from the window's start.
    return windows.map(lambda pos: {"position_ids": np.minimum(pos, np.arange(length, dtype=pos.dtype))},
                       batched=True, input_columns="position_ids", desc="restarting positions").with_format()


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack windows; no attention mask, so packed documents are found from the position ids. Windows without
    ``position_ids`` (concat) get 0…L−1 and labels equal to their ids; otherwise the label where the positions
    restart (a document piece's first token) is masked, as ``DataCollatorWithFlattening`` does."""
    ids = torch.stack([item["input_ids"] for item in batch])
    if "position_ids" not in batch[0]:
        return {"input_ids": ids, "labels": ids.clone(),
                "position_ids": torch.arange(ids.shape[1]).repeat(len(batch), 1)}
    positions = torch.stack([item["position_ids"] for item in batch])
    return {"input_ids": ids, "labels": ids.masked_fill(positions == 0, IGNORE_INDEX), "position_ids": positions}


def build_dataset(section: DataSection, tokenizer: Any, length: int) -> datasets.Dataset:
    """Read, tokenize and pack the corpus of ``section`` into windows of ``length`` tokens (torch format; batch them
    with :func:`collate`)."""
    if tokenizer.eos_token_id is None:
        raise RecipeError("the tokenizer has no EOS token, which packing needs between documents; use a tokenizer "
                          "with one (or set tokenizer.eos_token).")
    docs = read_documents(section)
    tokens = tokenize_documents(docs, tokenizer)
    found, needed = _num_tokens(tokens), section.min_windows * length
    if found < needed:
        raise RecipeError(f"the corpus is too short: {found} tokens found in {len(docs)} documents (EOS included), "
                          f"{needed} needed for {section.min_windows} window(s) of context_length={length}. Add data, "
                          "or lower context_length.")
    windows = (pack_concat if section.packing == "concat" else pack_restart)(tokens, length)
    if section.max_windows is not None:
        windows = windows.select(range(min(len(windows), section.max_windows)))
    return windows.with_format("torch")
