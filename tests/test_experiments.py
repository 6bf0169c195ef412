"""Miniature experiments (hf_posenc.experiments): the R data reader against bytes written from R's serialization
spec, the byte tokenizer, the n-gram floors against hand-computed values, the TAPA CPU path with a batch of
position ids (what the trainer passes), and the toy length-generalisation experiment end to end through the CLI.
"""

import gzip
import json
import math
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from hf_posenc.experiments.config import LengthGeneralisationConfig
from hf_posenc.experiments.corpus import find_janeaustenr, ngram_entropies
from hf_posenc.experiments.rdata import RDataError, read_lazyload, unserialize
from hf_posenc.experiments.runner import mean_sd, scheme_fields
from hf_posenc.experiments.tokenizer import byte_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _i(*values: int) -> bytes:
    return b"".join(struct.pack(">i", v) for v in values)


def _char(text: str) -> bytes:  # CHARSXP, UTF-8 flag (gp bit 3 -> 1 << 15) as R writes it
    raw = text.encode()
    return _i(0x00008009, len(raw)) + raw


# XDR version 3 header: 'X\n', format 3, R 4.2.1 (0x040201), min reader 3.5.0 (0x030500), native encoding UTF-8
HEADER = b"X\n" + _i(3, 0x040201, 0x030500, 5) + b"UTF-8"
# c(a = "ab", b = NA): STRSXP (16) with the attribute bit (1 << 9), then a pairlist (2) with a tag (1 << 10)
# holding `names` (SYMSXP 1 of a CHARSXP) = STRSXP c("a", "b"), closed by NILVALUE_SXP (254)
NAMED_STRINGS = (HEADER + _i(16 | 1 << 9, 2) + _char("ab") + _i(9, -1)
                 + _i(2 | 1 << 10) + _i(1) + _char("names") + _i(16, 2) + _char("a") + _char("b") + _i(254))


def test_rdata_reads_a_named_character_vector_written_by_the_spec():
    obj = unserialize(NAMED_STRINGS)
    assert obj.value == ["ab", None]
    assert obj.names == ["a", "b"]


def test_rdata_refuses_what_it_cannot_read():
    with pytest.raises(RDataError, match="XDR"):
        unserialize(b"A\n" + NAMED_STRINGS[2:])
    with pytest.raises(RDataError, match="type 3 is not supported"):  # a closure
        unserialize(HEADER + _i(3))
    with pytest.raises(RDataError, match="truncated"):
        unserialize(NAMED_STRINGS[:-6])


def test_rdata_lazyload_pair(tmp_path):
    """A .rdx index (list(variables = list(x = c(offset, length)), references = list(), compressed = TRUE)) over a
    .rdb holding one zlib entry (4-byte length, zlib stream), as R's makeLazyLoadDB writes them."""
    payload = HEADER + _i(16, 1) + _char("Call me Ishmael.")
    entry = struct.pack(">I", len(payload)) + zlib.compress(payload)
    index = (HEADER + _i(19 | 1 << 9, 3)
             + _i(19 | 1 << 9, 1) + _i(13, 2, 0, len(entry))  # variables = list(x = c(0L, len))
             + _i(2 | 1 << 10) + _i(1) + _char("names") + _i(16, 1) + _char("x") + _i(254)
             + _i(19, 0) + _i(10, 1, 1)  # references = list(), compressed = TRUE
             + _i(2 | 1 << 10) + _i(1) + _char("names") + _i(16, 3) + _char("variables") + _char("references")
             + _char("compressed") + _i(254))
    (tmp_path / "Rdata.rdb").write_bytes(entry)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(index))
    objects = read_lazyload(tmp_path / "Rdata")
    assert list(objects) == ["x"] and objects["x"].value == ["Call me Ishmael."]


def test_byte_tokenizer_is_the_utf8_bytes():
    tok = byte_tokenizer()
    text = "Emma Woodhouse, handsome,\n clever é\x00"
    assert tok(text).input_ids == list(text.encode("utf-8"))
    assert tok.decode(tok(text).input_ids) == text
    assert (len(tok), tok.eos_token_id) == (257, 256)


def test_ngram_entropies_by_hand():
    # "abab...": two symbols equally often, each determines the next
    assert ngram_entropies([0, 1] * 50) == pytest.approx({"unigram": math.log(2), "bigram": 0.0}, abs=1e-12)
    # "aab": unigram p = (2/3, 1/3); pairs (a,a), (a,b): after 'a' each half -> bigram = ln 2
    h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert ngram_entropies([0, 0, 1]) == pytest.approx({"unigram": h, "bigram": math.log(2)}, abs=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        ngram_entropies([1])


def test_mean_sd_and_scheme_fields():
    assert mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_sd([4.0]) == (4.0, 0.0)
    assert scheme_fields("prope:p=0") == {"name": "prope", "p": 0}
    assert scheme_fields("tapa:phase=linear") == {"name": "tapa", "phase": "linear"}
    with pytest.raises(ValueError, match="unknown size"):
        LengthGeneralisationConfig.preset("huge")
    small = LengthGeneralisationConfig.preset("small")
    with pytest.raises(ValueError, match="eval_tokens"):
        LengthGeneralisationConfig(**{**small.__dict__, "eval_tokens": 100})


@pytest.fixture(scope="module")
def austen():
    try:
        return find_janeaustenr()
    except FileNotFoundError:
        subprocess.run(["bash", str(ROOT / "scripts" / "data" / "install_austen.sh")], check=True)
        return find_janeaustenr()


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    # as a user runs it: a fresh process without the test suite's TRITON_INTERPRET (TAPA takes its CPU path)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "hf_posenc.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def test_length_generalisation_toy_end_to_end(austen, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    args = ("experiment", "length_generalisation", "--size", "toy", "--seeds", "2", "--out", str(out), "--work",
            str(work), "--no-progress")
    proc = _run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    config = LengthGeneralisationConfig.preset("toy", seeds=2)
    assert data["command"] == f"hf-posenc experiment length_generalisation --size toy --seeds 2 --out {out}"
    assert len(data["runs"]) == len(config.schemes) * 2
    assert {r["spec"] for r in data["runs"]} == set(config.schemes.values())
    lengths = [str(n) for n in config.eval_lengths]
    for label in config.schemes:
        row = data["summary"]["heldout_nll"][label]
        assert list(row) == lengths
        mine = [r for r in data["runs"] if r["label"] == label]
        for n in lengths:
            values = [r["perplexity"][n]["nll"] for r in mine]
            assert row[n]["mean"] == pytest.approx(sum(values) / 2)
            assert row[n]["sd"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
            assert all(math.isfinite(v) and 0 < v < 10 for v in values)
    assert set(data["floors"]) == {"unigram", "bigram"} and data["floors"]["bigram"] < data["floors"]["unigram"]
    markdown = (out / "results.md").read_text()
    assert data["command"] in markdown and "| RoPE |" in markdown and "bigram floor" in markdown
    assert (out / "heldout_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    stamps = {p: p.stat().st_mtime_ns for p in work.rglob("cell.json")}
    assert len(stamps) == len(data["runs"])
    again = _run_cli(*args)  # a rerun reuses every finished run
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in work.rglob("cell.json")} == stamps
    assert json.loads((out / "results.json").read_text())["summary"] == data["summary"]


def test_long_context_smollm2_example_smoke(austen, tmp_path):
    """examples/long_context_smollm2.py at toy lengths, through the code path of the committed 12k/16k run: every
    scheme at every length, the unpatched model at the reference length, timings recorded."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "long_context_smollm2.py"), "--lengths", "48", "64",
                           "--reference", "32", "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "examples"))
    from long_context_smollm2 import SCHEMES

    data = json.loads((tmp_path / "results.json").read_text())
    cells = {(r["model"], r["context_length"]): r for r in data["perplexity"]}
    assert set(cells) == {("rope (unpatched)", 32)} | {(name, n) for name in SCHEMES for n in (48, 64)}
    assert all(math.isfinite(r["perplexity"]) and r["seconds"] > 0 and r["num_scored"] == r["context_length"] - 1
               for r in cells.values())
    assert cells[("PI x2", 64)]["nll"] != cells[("rope (unpatched)", 64)]["nll"]  # the schemes were applied
    assert json.loads((tmp_path / "run.json").read_text())["total_seconds"] > 0
    assert "| p-RoPE (p=0.75) |" in (tmp_path / "report.md").read_text()
