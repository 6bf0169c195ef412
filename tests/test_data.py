"""Tests of ``hf_posenc.training.data``: reading with ``datasets``, packing against a plain-list reference, the corpus
errors, and the cache of ``datasets`` (a second build reuses it; an edited file does not)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import datasets
import pytest
import torch

from hf_posenc.training.config import DataSection, RecipeError
from hf_posenc.training.data import IGNORE_INDEX, build_dataset, pack_concat, pack_restart, read_documents
from test_training import packed, workspace  # noqa: F401  (workspace: the shared fixture, with its datasets cache)


# -- packing against the implementation it replaced ---------------------------------------------------------------
def reference(docs: list[list[int]], length: int, eos_id: int, restart: bool) -> list[tuple[list, list, list]]:
    """(input_ids, labels, position_ids) of each window, as the list-based packing computed them: documents + EOS
    laid into windows of ``length`` (the tail dropped); ``restart`` gives every piece positions 0, 1, … and masks
    its first label, ``concat`` keeps positions 0…L−1 and labels equal to the ids."""
    windows, ids, labels, positions = [], [], [], []
    for doc in docs:
        tokens = doc + [eos_id]
        while tokens:
            take = min(len(tokens), length - len(ids))
            piece, tokens = tokens[:take], tokens[take:]
            ids += piece
            labels += [IGNORE_INDEX] + piece[1:] if restart else piece
            positions += range(take) if restart else range(len(positions), len(positions) + take)
            if len(ids) == length:
                windows.append((ids, labels, positions))
                ids, labels, positions = [], [], []
    return windows


@pytest.mark.parametrize("restart", [False, True], ids=["concat", "restart"])
def test_packing_equals_the_reference(restart):
    rng = random.Random(1234)
    pack = pack_restart if restart else pack_concat
    for _ in range(40):
        docs = [[rng.randrange(3, 60) for _ in range(rng.randrange(0, 14))] for _ in range(rng.randrange(1, 10))]
        length = rng.randrange(1, 11)
        expected = reference(docs, length, 2, restart)
        if not expected:
            continue
        got = packed(pack, docs, length)
        assert [tuple(got[key][i].tolist() for key in ("input_ids", "labels", "position_ids"))
                for i in range(len(got["input_ids"]))] == [tuple(map(list, w)) for w in expected], (docs, length)


def test_restart_masks_each_piece_start_and_never_a_later_token():
    docs = [[7] * 9, [8] * 2, [9] * 6]
    got = packed(pack_restart, docs, length=6)  # windows: 7×6 | 7×3 EOS 8 8 | EOS 9×5 (tail: 9 EOS dropped)
    assert got["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1], [0, 0, 1, 2, 3, 4]]
    assert torch.equal(got["labels"] == IGNORE_INDEX, got["position_ids"] == 0)


# -- reading --------------------------------------------------------------------------------------------------------
def test_documents_keep_the_recipe_order_and_skip_empty_ones(tmp_path):
    (tmp_path / "b.txt").write_text("second file\nstill the same document\n")
    (tmp_path / "blank.txt").write_text("  \n\n")
    (tmp_path / "a.jsonl").write_text('{"body": "one"}\n\n{"body": "  "}\n')
    (tmp_path / "numbers.jsonl").write_text('{"body": 2}\n')
    (tmp_path / "c.json").write_text(json.dumps([{"body": "last"}]))
    names = ("b.txt", "blank.txt", "a.jsonl", "numbers.jsonl", "c.json")
    section = DataSection(files=[str(tmp_path / name) for name in names], text_field="body")
    assert list(read_documents(section)["text"]) == ["second file\nstill the same document\n", "one", "2", "last"]
    section.max_documents = 2
    assert list(read_documents(section)["text"]) == ["second file\nstill the same document\n", "one"]


def test_max_documents_stops_before_later_files(tmp_path):
    (tmp_path / "good.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    (tmp_path / "bad.jsonl").write_text('{"body": "no text key"}\n')
    section = DataSection(files=[str(tmp_path / "good.jsonl"), str(tmp_path / "bad.jsonl")], max_documents=3)
    assert list(read_documents(section)["text"]) == ["doc 0", "doc 1", "doc 2"]  # bad.jsonl is never read
    section.max_documents = None
    with pytest.raises(RecipeError, match=r"data.text_field: 'text' is not a column of .*bad.jsonl"):
        read_documents(section)


def test_json_errors_name_the_file_and_the_text_field(tmp_path):
    cases = {
        "some.jsonl": ('{"text": "a"}\n{"body": "b"}\n', r"some.jsonl: record 2 has no 'text' \(set data.text_field\)"),
        "none.jsonl": ('{"body": "b"}\n', r"data.text_field: 'text' is not a column of .*none.jsonl"),
        "strings.jsonl": ('{"text": "a"}\n"b"\n', r"strings.jsonl: expected JSON objects with key 'text'.*"
                                                    r"data.text_field"),
        "mixed.jsonl": ('{"text": "a"}\n\n{"text": 2}\n', r"mixed.jsonl: expected JSON objects with key 'text'"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(RecipeError, match=message):
            read_documents(DataSection(files=[str(tmp_path / name)]))


def test_saved_dataset_split_and_column(tmp_path):
    path = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"body": ["t1", "t2"]}),
        "validation": datasets.Dataset.from_dict({"body": ["v1", "", "v2"]}),
    }).save_to_disk(str(path))
    section = DataSection(dataset=str(path), split="validation", text_field="body")
    assert list(read_documents(section)["text"]) == ["v1", "v2"]
    with pytest.raises(RecipeError, match=r"data.split: 'test' not in .*splits: \['train', 'validation'\]"):
        read_documents(DataSection(dataset=str(path), split="test", text_field="body"))
    with pytest.raises(RecipeError, match=r"data.text_field: 'text' is not a column of .*saved \(columns: \['body'\]"):
        read_documents(DataSection(dataset=str(path)))


# -- build_dataset: limits, errors, cache ---------------------------------------------------------------------------
def _tokenizer(workspace):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(workspace / "model")


def test_window_limits_and_corpus_errors(workspace, tmp_path):
    tok = _tokenizer(workspace)
    corpus = [str(workspace / "corpus.jsonl")]
    full = build_dataset(DataSection(files=corpus, packing="restart"), tok, 32)
    capped = build_dataset(DataSection(files=corpus, packing="restart", max_windows=3), tok, 32)
    assert len(capped) == 3 < len(full) and all(torch.equal(capped[i]["input_ids"], full[i]["input_ids"])
                                                 for i in range(3))
    assert capped[0]["input_ids"].dtype == torch.long and capped[0]["input_ids"].shape == (32,)
    found = sum(len(tok(line)["input_ids"]) + 1 for line in read_documents(DataSection(files=corpus))["text"])
    assert len(full) == found // 32
    with pytest.raises(RecipeError, match=rf"{found} tokens found in 60 documents .* {(len(full) + 1) * 32} needed "
                                          rf"for {len(full) + 1} window\(s\) of context_length=32"):
        build_dataset(DataSection(files=corpus, min_windows=len(full) + 1), tok, 32)
    assert len(build_dataset(DataSection(files=corpus, min_windows=len(full)), tok, 32)) == len(full)
    (tmp_path / "blank.txt").write_text(" \n")
    with pytest.raises(RecipeError, match="the corpus is empty"):
        build_dataset(DataSection(files=[str(tmp_path / "blank.txt")]), tok, 32)
    tok.eos_token = None
    with pytest.raises(RecipeError, match="no EOS token"):
        build_dataset(DataSection(files=corpus), tok, 32)


def _cache_state(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")}


def test_second_build_reuses_the_cache_and_an_edit_invalidates_it(workspace, tmp_path):
    tok = _tokenizer(workspace)
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    assert cache.is_relative_to(workspace)  # the fixture's cache, not the user's
    path = tmp_path / "corpus.jsonl"
    path.write_text((workspace / "corpus.jsonl").read_text())
    section = DataSection(files=[str(path)], packing="restart")
    first = build_dataset(section, tok, 32)
    state = _cache_state(cache)
    second = build_dataset(section, tok, 32)
    assert second._fingerprint == first._fingerprint and second.cache_files == first.cache_files
    assert _cache_state(cache) == state  # nothing read, tokenized or packed again
    assert all(f["filename"].startswith(str(cache)) for f in second.cache_files)  # memory-mapped Arrow files

    path.write_text(path.read_text().replace("cat", "dog"))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    third = build_dataset(section, tok, 32)
    assert third._fingerprint != first._fingerprint
    assert not torch.equal(third[0]["input_ids"], first[0]["input_ids"])
