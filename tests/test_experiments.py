"""Miniature experiments (hf_posenc_experiments): the R data reader against bytes written from R's serialization
spec, the byte tokenizer, the n-gram floors against hand-computed values, the TAPA CPU path with a batch of
position ids (what the trainer passes), the toy experiments end to end through the CLI, the statistics every
comparison carries (t quantiles, paired and Welch intervals against hand-computed values), the rotation angles
behind "cannot be tested at this scale", and the committed reports: each results.md is exactly what its
results.json renders to, ends with one line per paper claim, and docs/experiments.md quotes their intervals.
"""

import dataclasses
import gzip
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from hf_posenc_experiments.claims import CLAIMS_HEADING, STATUSES
from hf_posenc_experiments.config import LengthGeneralisationConfig
from hf_posenc_experiments.corpus import ngram_entropies
from hf_posenc_experiments.rdata import RDataError, read_lazyload, unserialize
from hf_posenc_experiments.runner import fingerprint, mean_sd, scheme_fields
from hf_posenc_experiments.tokenizer import byte_tokenizer

from experiment_cli import austen, run_cli as _run_cli  # noqa: F401 (austen: a fixture)

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
    for grid in ((1e-3,), (1e-3, 1e-3), (1e-3, 0.0)):
        with pytest.raises(ValueError, match="rate_grid must be empty or hold at least two different rates"):
            LengthGeneralisationConfig(**{**small.__dict__, "rate_grid": grid})
    from hf_posenc_experiments.config import PropeGemmaRatioConfig  # its comparison needs the grid: never empty

    gemma = PropeGemmaRatioConfig.preset("toy")
    for grid in ((), (1e-3,)):
        with pytest.raises(ValueError, match=r"rate_grid must hold at least two different rates > 0, got \("):
            PropeGemmaRatioConfig(**{**gemma.__dict__, "rate_grid": grid})


def test_an_optional_setting_at_its_default_leaves_the_settings_and_their_fingerprint_as_without_it():
    """The length-generalisation rate grid is an optional setting: the experiments that nest these settings
    without a grid (tapa_depth's ``base``, and the others) write and fingerprint the same settings as without the
    field, so their committed reports stay valid; a grid, at any depth, is written and fingerprinted."""
    from hf_posenc_experiments.config import TapaDepthConfig, settings_dict

    small, shared = LengthGeneralisationConfig.preset("small"), LengthGeneralisationConfig.shared_preset("small")
    assert small.rate_grid == (1e-3, 3e-3, 1e-2) and shared.rate_grid == ()
    assert "rate_grid" not in shared.to_dict() and small.to_dict()["rate_grid"] == (1e-3, 3e-3, 1e-2)
    assert settings_dict(shared) == {k: v for k, v in dataclasses.asdict(shared).items() if k != "rate_grid"}
    assert fingerprint(shared.to_dict()) != fingerprint(small.to_dict())
    depth = TapaDepthConfig.preset("small")
    assert depth.base.rate_grid == () and "rate_grid" not in depth.to_dict()["base"]
    gridded = dataclasses.replace(depth, base=dataclasses.replace(depth.base, rate_grid=(1e-3, 3e-3)))
    assert gridded.to_dict()["base"]["rate_grid"] == (1e-3, 3e-3)
    assert fingerprint(gridded.to_dict()) != fingerprint(depth.to_dict())


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
    # the rate grid: every row at each rate with seed 0, on the validation text; each row's seeds at its choice
    assert data["rate_grid"] == list(config.rate_grid) and set(data["chosen_rates"]) == set(config.schemes)
    assert {(r["label"], r["learning_rate"]) for r in data["grid"]} == {
        (label, rate) for label in config.schemes for rate in config.rate_grid}
    for run in data["runs"]:
        assert run["learning_rate"] == data["chosen_rates"][run["label"]]
        chosen = min((r for r in data["grid"] if r["label"] == run["label"]),
                     key=lambda r: (math.inf if r["validation"] is None else r["validation"], r["learning_rate"]))
        assert chosen["learning_rate"] == run["learning_rate"]
    judged = [c for c in data["claims"] if c["tuning"] is not None]
    assert judged and all(c["tuning"]["validated"] and all(tuple(r) == tuple(sorted(config.rate_grid))
                                                           for r in c["tuning"]["rates"].values()) for c in judged)
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
    assert "Rate grid at the final budget" in markdown and "each row's peak rate chosen by the rate grid" in markdown
    assert (out / "heldout_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    stamps = {p: p.stat().st_mtime_ns for p in work.rglob("cell.json")}
    assert len(stamps) == len(config.schemes) * (len(config.rate_grid) + 1)  # the grid's, and seed 1 at the choice
    again = _run_cli(*args)  # a rerun reuses every finished run
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in work.rglob("cell.json")} == stamps
    assert json.loads((out / "results.json").read_text())["summary"] == data["summary"]

    # the diagnostics of the first seed of every row ("why"), with their plots
    assert set(data["why"]) == set(config.schemes)
    assert data["why"]["TAPA linear"]["disentanglement"] is None and data["why"]["RoPE"]["disentanglement"]
    assert (out / "diagnostics" / "perturbation.png").is_file() and "## Why" in markdown

    # other seeds, compared with this report; the committed report is never the output
    refused = _run_cli("experiment", "length_generalisation", "--size", "toy", "--seeds", "1", "--first-seed", "2",
                       "--out", str(out), "--work", str(work), "--check-against", str(out / "results.json"))
    assert refused.returncode != 0 and "--out must differ" in refused.stderr
    rerun = tmp_path / "rerun"
    proc = _run_cli("experiment", "length_generalisation", "--size", "toy", "--seeds", "1", "--first-seed", "2",
                    "--out", str(rerun), "--work", str(work), "--check-against", str(out / "results.json"),
                    "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((rerun / "reproducibility.json").read_text())
    assert {r["seed"] for r in json.loads((rerun / "results.json").read_text())["runs"]} == {2}
    assert check["total"] == len(config.schemes) * len(lengths) and check["committed_seeds"] == 2
    assert "cells inside" in (rerun / "reproducibility.md").read_text()


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


# -- TAPA trainability sweep ------------------------------------------------------------------------------------
def _runs(rows: dict[str, dict[int, list[float]]]) -> list[dict]:
    """Runs as results.json stores them: per label, one run per seed (0, 1, ...) with its loss at each length."""
    return [{"label": label, "seed": seed, "final_train_loss": None, "seconds": 1.0,
             "perplexity": {str(n): {"nll": values[seed]} for n, values in row.items()}}
            for label, row in rows.items() for seed in range(len(next(iter(row.values()))))]


def _summary(rows: dict[str, dict[int, list[float]]]):
    from hf_posenc_experiments.runner import Summary

    return Summary.from_results(_runs(rows), sorted(next(iter(rows.values()))))


def test_tapa_sweep_classifies_match_and_flatness():
    from hf_posenc_experiments.tapa_trainability import classify, verdict

    floors = {"unigram": 3.0, "bigram": 2.4}
    rope = {64: [1.79, 1.80, 1.81], 512: [2.15, 2.20, 2.25]}  # grows by 0.36, 0.40, 0.44
    summary = _summary({
        "RoPE": rope,
        # differences from RoPE at L +0.01, +0.02, -0.02: the interval contains 0; growth minus a quarter of
        # RoPE's: -0.06, -0.07, -0.07, an interval below 0 (flat)
        "TAPA close and flat": {64: [1.80, 1.82, 1.79], 512: [1.83, 1.85, 1.83]},
        # growth 0.20, 0.22, 0.21 minus 0.09, 0.10, 0.11: above 0 (not flat)
        "TAPA close, grows": {64: [1.80, 1.79, 1.81], 512: [2.00, 2.01, 2.02]},
        "TAPA flat but worse": {64: [2.40, 2.41, 2.39], 512: [2.41, 2.42, 2.40]},
    })
    v = classify(summary, 64)
    assert set(v) == {"TAPA close and flat", "TAPA close, grows", "TAPA flat but worse"}
    assert (v["TAPA close and flat"]["in_distribution"], v["TAPA close and flat"]["flat"]) == \
        ("no difference detected", True)
    assert (v["TAPA close, grows"]["in_distribution"], v["TAPA close, grows"]["flat"]) == \
        ("no difference detected", False)
    assert (v["TAPA flat but worse"]["in_distribution"], v["TAPA flat but worse"]["flat"]) == ("worse", True)
    assert v["TAPA close and flat"]["vs_rope"].estimate == pytest.approx(0.01 / 3)
    assert v["TAPA close and flat"]["vs_rope"].test == "paired"
    lines = verdict(summary, floors, 64)
    assert lines[-1] == ("Answer: no difference from RoPE detected at L (or lower loss) and flat to 8L: "
                         "TAPA close and flat.")
    assert "TAPA close and flat - RoPE at L +0.003 [" in "\n".join(lines)
    negative = verdict(_summary({"RoPE": rope, "TAPA x": {64: [2.40, 2.41, 2.39], 512: [2.41, 2.42, 2.40]}}),
                       floors, 64)
    assert negative[-1].startswith("Answer (negative, for this regime): no TAPA setting") and \
        "The lowest mean at L is TAPA x" in negative[-1]


def test_sweep_variants_change_only_their_setting():
    from hf_posenc_experiments.config import TAPA_VARIANTS, TapaTrainabilityConfig, Variant

    config = TapaTrainabilityConfig.preset("small")
    arms = config.arms()
    base_model, base_train = config.base.model, config.base.train
    assert arms["TAPA paper"] == ("tapa", base_model, base_train)
    assert arms["TAPA lr=1e-2"][2].learning_rate == 1e-2 and arms["TAPA lr=1e-2"][1] == base_model
    assert arms["TAPA warm-up=200"][2].warmup_steps == 200
    assert arms["TAPA init=0.1"][1].initializer_range == 0.1 and arms["TAPA init=0.1"][2] == base_train
    assert arms["TAPA init=0.1"][1].llama_config(257, 256, 64)["initializer_range"] == 0.1
    assert Variant("tapa").apply(base_model, base_train) == (base_model, base_train)
    with pytest.raises(ValueError, match="alpah"):
        Variant("tapa:alpah=0.5")  # a typo fails when the sweep is defined, not after hours of training
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        Variant("tapa", learning_rate=0.0)
    with pytest.raises(ValueError, match="cop"):
        LengthGeneralisationConfig(**{**LengthGeneralisationConfig.preset("toy").__dict__, "schemes": {"x": "cop"}})
    labels = [label for label in TAPA_VARIANTS]
    from hf_posenc_experiments.runner import slug

    assert len({slug(label) for label in labels}) == len(labels)  # one run directory per arm


def _toy_experiment(name: str, tmp_path: Path) -> tuple[dict, Path, Path]:
    """``hf-posenc experiment NAME --size toy --seeds 1`` as a user runs it: (results.json, out, work)."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = _run_cli("experiment", name, "--size", "toy", "--seeds", "1", "--out", str(out), "--work", str(work),
                    "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), out, work


def test_tapa_trainability_toy_end_to_end(austen, tmp_path):
    from hf_posenc_experiments.config import TapaTrainabilityConfig

    data, out, work = _toy_experiment("tapa_trainability", tmp_path)
    config = TapaTrainabilityConfig.preset("toy", seeds=1)
    assert [r["label"] for r in data["runs"]] == list(config.variants)
    by_label = {r["label"]: r for r in data["runs"]}
    # the knobs reach the training: a 10x learning rate and a 5x initial scale change the loss curve
    assert by_label["TAPA lr=1e-2"]["losses"] != by_label["TAPA paper"]["losses"]
    assert by_label["TAPA init=0.1"]["losses"][0] != by_label["TAPA paper"]["losses"][0]
    saved = json.loads((work / "runs" / "tapa-init-0.1" / "seed0" / "run" / "model" / "config.json").read_text())
    assert saved["initializer_range"] == 0.1
    assert data["verdict"][-1].startswith("Answer")  # one seed: no intervals, and it says so
    markdown = (out / "results.md").read_text()
    assert "| TAPA alpha=1 |" in markdown and "one run per row" in markdown
    assert CLAIMS_HEADING in markdown and data["claims"]


# -- context extension ------------------------------------------------------------------------------------------
class _Oracle(torch.nn.Module):
    """Ranks first the true next token of ``ids`` (or always ``constant``): the two ends of key_digit_accuracy."""

    def __init__(self, ids, vocab, constant=None, letter_above=None):
        super().__init__()
        self.ids, self.vocab, self.constant, self.letter_above = ids, vocab, constant, letter_above
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        n = input_ids.shape[1]
        logits = torch.zeros(1, n, self.vocab)
        for i in range(n - 1):
            logits[0, i, self.constant if self.constant is not None else self.ids[i + 1]] = 1.0
            if self.letter_above is not None:  # a letter ranked above everything: the digits still decide
                logits[0, i, self.letter_above] = 2.0
        return type("Out", (), {"logits": logits})()


def test_key_digit_accuracy_counts_digits_ranked_first():
    from hf_posenc.evaluation.passkey import build_passkey_prompt, key_digit_accuracy

    tok = byte_tokenizer()
    prompt = build_passkey_prompt(tok, 300, 0.5, 12345)
    ids = tok(f"{prompt.text} {prompt.key}", add_special_tokens=False).input_ids
    assert key_digit_accuracy(_Oracle(ids, 257), tok, prompt) == 1.0
    assert key_digit_accuracy(_Oracle(ids, 257, constant=ord("3")), tok, prompt) == pytest.approx(1 / 5)
    assert key_digit_accuracy(_Oracle(ids, 257, constant=ord("9")), tok, prompt) == 0.0
    assert key_digit_accuracy(_Oracle(ids, 257, letter_above=ord("e")), tok, prompt) == 1.0  # among the digits


def test_context_extension_toy_end_to_end(austen, tmp_path):
    import yaml

    from hf_posenc_experiments.config import ContextExtensionConfig
    from hf_posenc_experiments.context_extension import BASE_LABEL

    data, out, work = _toy_experiment("context_extension", tmp_path)
    config = ContextExtensionConfig.preset("toy", seeds=1)
    assert [r["label"] for r in data["runs"]] == [BASE_LABEL, *config.schemes]
    base_model = str(work / "runs" / "base" / "run" / "model")
    for label, spec in config.schemes.items():
        from hf_posenc_experiments.runner import slug

        run_dir = work / "runs" / slug(label) / "seed0" / "run"
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
        assert recipe["model"]["path"] == base_model and recipe["context_length"] == config.extended_length
        assert recipe["scheme"]["replace"] is True
        saved = json.loads((run_dir / "model" / "config.json").read_text())
        assert saved["hf_posenc"]["scheme"] == spec.split(":")[0]
    for r in data["runs"]:
        assert sorted(r["perplexity"], key=int) == [str(n) for n in config.eval_lengths]
        for n in config.passkey_lengths:
            p = r["passkey"][str(n)]
            assert 0.0 <= p["exact"] <= 1.0 and 0.0 <= p["digits"] <= 1.0 and p["prompts"] == 1
    assert data["passkey"][BASE_LABEL][str(config.passkey_lengths[0])]["digits"] == \
        data["runs"][0]["passkey"][str(config.passkey_lengths[0])]["digits"]
    # The smoke size learns little (its base sits near the byte floor), so the schemes score alike to 3 decimals;
    # an applied scheme still moves the score (a scheme silently not applied would reproduce RoPE's bit for bit,
    # same seed and data): PI rescales every position, TAPA replaces the score.
    nll = {r["label"]: r["perplexity"][str(config.eval_lengths[-1])]["nll"] for r in data["runs"]}
    for label in ("PI", "TAPA"):
        assert abs(nll[label] - nll["RoPE"]) > 1e-6, (label, nll)
    markdown = (out / "results.md").read_text()
    assert "Passkey retrieval" in markdown and "| TAPE |" in markdown
    assert (out / "heldout_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- p-RoPE at Gemma's ratio, TAPA by depth (issue #33) ---------------------------------------------------------
def test_prope_gemma_ratio_toy_end_to_end(austen, tmp_path):
    from hf_posenc_experiments.config import PropeGemmaRatioConfig
    from hf_posenc_experiments.runner import slug

    data, out, work = _toy_experiment("prope_gemma_ratio", tmp_path)
    config = PropeGemmaRatioConfig.preset("toy", seeds=1)
    assert [r["label"] for r in data["runs"]] == list(config.schemes) == ["RoPE", "p-RoPE 0.75", "p-RoPE 0.25", "NoPE"]
    assert all(list(r["perplexity"]) == [str(config.context_length)] for r in data["runs"])  # scored at L only
    # the rate grid: every row at each rate with seed 0, scored on the validation text; each row at its choice
    grid = {(r["label"], r["learning_rate"]): r for r in data["grid"]}
    assert set(grid) == {(label, rate) for label in config.schemes for rate in config.rate_grid}
    for label in config.schemes:
        validation = {rate: grid[label, rate]["validation"] for rate in config.rate_grid}
        assert all(v is not None and 0 < v < 10 for v in validation.values()), validation
        scored = {rate: grid[label, rate]["perplexity"][str(config.context_length)]["nll"] for rate in config.rate_grid}
        assert all(abs(validation[r] - scored[r]) > 1e-6 for r in config.rate_grid)  # another text than the scored
        assert data["chosen_rates"][label] == min(validation, key=validation.get)
    for run in data["runs"]:  # the row's seed-0 run is the grid's run at the chosen rate, not a retraining
        assert run["learning_rate"] == data["chosen_rates"][run["label"]]
        assert run["perplexity"] == grid[run["label"], run["learning_rate"]]["perplexity"]
    rate = data["chosen_rates"]["p-RoPE 0.75"]
    saved = json.loads((work / "runs" / slug("p-RoPE 0.75") / f"lr{rate:g}" / "seed0" / "run" / "model" /
                        "config.json").read_text())
    assert saved["rope_parameters"]["rope_theta"] == config.model.rope_theta == 20  # Gemma's θ / L = 1.22 at L = 16
    nll = {r["label"]: r["perplexity"][str(config.context_length)]["nll"] for r in data["runs"]}
    assert len(set(nll.values())) == len(nll)  # each scheme applied: no two rows score alike bit for bit
    markdown = (out / "results.md").read_text()
    assert "Setting: θ = 20 at L = 16" in markdown and "| p-RoPE 0.75 |" in markdown
    assert "Rate grid at the final budget" in markdown and "| row | validation at lr 0.001 |" in markdown
    starts = ("NoPE has the highest", "0.25-RoPE has a higher", "0.75-RoPE is no worse", "0.75-RoPE has a lower")
    claims = [c["claim"] for c in data["claims"]][:4]
    assert len(claims) == 4 and all(c.startswith(s) for c, s in zip(claims, starts)), claims
    for claim in data["claims"][:4]:  # each comparison's record: every row tried the grid, chosen on validation
        tuning = claim["tuning"]
        assert tuning["validated"] and set(tuning["rates"]) == set(config.schemes), tuning
        assert all(tuple(r) == tuple(sorted(config.rate_grid)) for r in tuning["rates"].values())
    for name in ("heldout_loss.png", "difference_from_rope.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prope_gemma_ratio_settings_and_what_the_design_can_detect():
    from hf_posenc_experiments.claims import angle, turns
    from hf_posenc_experiments.config import PropeGemmaRatioConfig
    from hf_posenc_experiments.prope_gemma_ratio import P75, paper_claims, paper_relative, sensitivity
    from hf_posenc_experiments.report import Tests
    from hf_posenc_experiments.stats import paired, t_quantile

    config = PropeGemmaRatioConfig.preset("small")
    assert (config.context_length, config.model.rope_theta, config.seeds, config.eval_lengths) == (64, 78, 10, [64])
    assert config.model.rope_theta / 64 == pytest.approx(10000 / 8192, rel=0.02)
    stopped = turns(config.schemes[P75], 32, 78, 64)  # omega_i = 78^(-i/16), i = 12..15, times 64
    assert [angle(a) for a in stopped] == ["2.44", "1.86", "1.41", "1.08"]
    assert paper_relative(P75) == pytest.approx(math.log(4.4414) / math.log(4.4627) - 1) == pytest.approx(-0.0032,
                                                                                                            abs=1e-4)
    # differences 0.002, -0.002, 0.004, 0: mean 0.001, sd 0.002582; se = sd / 2; t_{0.975,3} = 3.182
    d = paired([1.802, 1.798, 1.804, 1.800], [1.8, 1.8, 1.8, 1.8])
    se = statistics.stdev([0.002, -0.002, 0.004, 0.0]) / 2
    s = sensitivity(d, 1.8, paper_relative(P75))
    assert s["half_width"] == pytest.approx(t_quantile(0.975, 3) * se)
    assert s["detectable"] == pytest.approx((t_quantile(0.975, 3) + t_quantile(0.8, 3)) * se)
    assert s["effect"] == pytest.approx(1.8 * paper_relative(P75))  # -0.0058: above the 0.0054 detectable
    assert s["effect_detectable"]
    # the claims: NoPE worst and 0.25 worse detected; 0.75 - RoPE within the paper's effect size (non-inferior)
    rows = {"RoPE": {64: [1.800, 1.810, 1.790, 1.805]}, "p-RoPE 0.75": {64: [1.801, 1.809, 1.791, 1.806]},
            "p-RoPE 0.25": {64: [1.85, 1.87, 1.84, 1.86]}, "NoPE": {64: [2.35, 2.36, 2.34, 2.35]}}
    claims = paper_claims(_summary(rows), {"bigram": 2.4}, config, {}, Tests())
    assert [c.status for c in claims] == ["confirmed", "confirmed", "confirmed", "cannot be tested at this scale"]
    assert "non-inferiority" in claims[2].reason and "outside the interval" in claims[3].reason
    # 0.75-RoPE detectably worse: "refuted" only where every row tried the same rate grid (the report's grid)
    worse = {**rows, "p-RoPE 0.75": {64: [1.850, 1.861, 1.842, 1.853]}}
    grid = {"grid": [{"label": label, "learning_rate": rate} for label in worse for rate in config.rate_grid]}
    no_worse = paper_claims(_summary(worse), {"bigram": 2.4}, config, {}, Tests(), grid)[2]
    assert no_worse.status == "refuted" and no_worse.tuning.fair and no_worse.tuning.validated
    assert no_worse.tuning.rates["p-RoPE 0.75"] == tuple(sorted(config.rate_grid))
    unfair = paper_claims(_summary(worse), {"bigram": 2.4}, config, {}, Tests())[2]  # one rate each, no grid
    assert unfair.status == "not tested fairly at this scale" and "learning-rate grid" in unfair.reason
    # models that do not use context (RoPE not below the bigram floor) test nothing about positions
    claims = paper_claims(_summary(rows), {"bigram": 1.7}, config, {}, Tests())
    assert {c.status for c in claims} == {"cannot be tested at this scale"}
    assert claims[0].reason.startswith("RoPE is not detectably below the bigram floor")


def test_tapa_depth_toy_end_to_end(austen, tmp_path):
    from hf_posenc_experiments.config import TAPA_DEPTH_ARM, TapaDepthConfig
    from hf_posenc_experiments.runner import slug

    data, out, work = _toy_experiment("tapa_depth", tmp_path)
    config = TapaDepthConfig.preset("toy", seeds=1)
    assert [r["label"] for r in data["runs"]] == list(config.arms()) == [
        config.label(v, d) for d in (1, 2) for v in config.variants]
    for depth in config.depths:
        run = work / "runs" / slug(config.label(TAPA_DEPTH_ARM, depth)) / "seed0" / "run"
        saved = json.loads((run / "model" / "config.json").read_text())
        assert saved["num_hidden_layers"] == depth and saved["hf_posenc"]["scheme"] == "tapa"
    losses = {r["label"]: r["losses"] for r in data["runs"]}
    assert losses["RoPE lr=1e-3, 2 layers"] != losses["RoPE, 2 layers"]  # the arm's learning rate reaches training
    markdown = (out / "results.md").read_text()
    assert "| TAPA lr=1e-3 theta=0.75 - RoPE |" in markdown and "| arm | 1 layer | 2 layers |" in markdown
    assert data["verdict"][-1].startswith("Answer: one run per row")  # one seed: no test, and it says so
    assert [c["paper"] for c in data["claims"]] == ["TAPA", "TAPA", "Han & Ji (position generalization)"]
    for name in ("heldout_loss.png", "gap_by_depth.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tapa_depth_trains_the_sweeps_best_setting_and_reads_the_change_with_depth():
    from hf_posenc_experiments.config import TAPA_DEPTH_ARM, TapaDepthConfig
    from hf_posenc_experiments.tapa_depth import answer, gaps

    sweep = json.loads((ROOT / "examples" / "experiments" / "tapa-trainability" / "results.json").read_text())
    nll = {k: v["64"]["mean"] for k, v in sweep["summary"]["heldout_nll"].items() if k.startswith("TAPA")}
    config = TapaDepthConfig.preset("small")
    best = sweep["config"]["variants"][min(nll, key=nll.get)]
    arm = config.variants[TAPA_DEPTH_ARM]
    assert (arm.spec, arm.learning_rate, arm.warmup_steps, arm.initializer_range) == \
        (best["spec"], best["learning_rate"], best["warmup_steps"], best["initializer_range"])
    assert (config.depths, config.base.train.steps, config.base.seeds) == ((2, 4), 1500, 3)
    assert config.arms()["RoPE lr=1e-3, 4 layers"][1].num_layers == 4
    with pytest.raises(ValueError, match="depths"):
        TapaDepthConfig(base=config.base, depths=(4, 2))
    # TAPA - RoPE: 0.40, 0.42, 0.38 at 2 layers, 0.20, 0.23, 0.19 at 4: the gap shrinks by about half
    label = config.label
    rows = {label("RoPE", 2): {64: [1.80, 1.81, 1.79]}, label(TAPA_DEPTH_ARM, 2): {64: [2.20, 2.23, 2.17]},
            label("RoPE", 4): {64: [1.70, 1.70, 1.71]}, label(TAPA_DEPTH_ARM, 4): {64: [1.90, 1.93, 1.90]}}
    small = TapaDepthConfig(base=dataclasses.replace(config.base, eval_multiples=(1,)), depths=(2, 4),
                            variants={k: config.variants[k] for k in ("RoPE", TAPA_DEPTH_ARM)})
    summary = _summary(rows)
    found = gaps(summary, small)[f"{TAPA_DEPTH_ARM} - RoPE"]
    assert found[2] == pytest.approx({0: 0.40, 1: 0.42, 2: 0.38}) and found[4] == pytest.approx({0: 0.2, 1: 0.23,
                                                                                                  2: 0.19})
    text = answer(summary, small)
    assert text.startswith("Answer: TAPA's gap to RoPE shrinks with depth (-0.193 [")
    assert "48% of the 2-layer gap" in text and "partly a scale effect" in text
    assert "still detectably above RoPE" in text


# -- reproducibility --------------------------------------------------------------------------------------------
def _report(seeds, rows):
    return {"config": {"seeds": seeds}, "summary": {"heldout_nll": {
        label: {str(n): {"mean": m, "sd": s} for n, (m, s) in row.items()} for label, row in rows.items()}}}


def test_reproducibility_uses_the_prediction_interval_of_a_mean():
    from hf_posenc_experiments.reproduce import compare

    committed = _report(3, {"RoPE": {64: (1.80, 0.01), 128: (1.90, 0.01)}, "NoPE": {64: (2.40, 0.0)}})
    # half width for n = 3 committed, m = 1 new seed: 4.303 * 0.01 * sqrt(1/3 + 1) = 0.0497
    rerun = _report(1, {"RoPE": {64: (1.849, 0.0), 128: (1.951, 0.0)}, "NoPE": {64: (2.40, 0.0)}, "New": {64: (1, 0)}})
    result = compare(committed, rerun)
    cells = {(c["label"], c["length"]): c for c in result["cells"]}
    assert set(cells) == {("RoPE", 64), ("RoPE", 128), ("NoPE", 64)}
    assert cells[("RoPE", 64)]["half_width"] == pytest.approx(4.3027 * 0.01 * math.sqrt(4 / 3), rel=1e-4)
    assert cells[("RoPE", 64)]["inside"] and not cells[("RoPE", 128)]["inside"] and cells[("NoPE", 64)]["inside"]
    assert (result["inside"], result["total"]) == (2, 3)
    with pytest.raises(ValueError, match="one seed"):
        compare(_report(1, {"RoPE": {64: (1.8, 0.0)}}), rerun)


def test_tapa_phase_scale_reads_the_phase_half_of_q_and_k():
    """Doubling the phase half of W_q doubles every quadratic phase; doubling the amplitude half changes none;
    the d = 1 -> 2 change is the phase times 2^alpha - 1."""
    import hf_posenc
    from hf_posenc_experiments.why import tapa_phase_scale
    from hf_posenc.patching import scheme_record
    from tiny import random_ids, tiny_model

    with pytest.warns(UserWarning):
        model = hf_posenc.patch_model(tiny_model("llama", num_hidden_layers=1), "tapa", alpha=0.5)  # one layer:
        # editing its W_q changes no other layer's input
    scheme = scheme_record(model).scheme
    ids = random_ids(1, 16)
    before = tapa_phase_scale(model, ids, scheme)
    head_dim = model.config.head_dim
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.q_proj.weight.view(-1, head_dim, model.config.hidden_size)
            w[:, head_dim // 2:] *= 2  # the phase half of every head
    after = tapa_phase_scale(model, ids, scheme)
    assert after["median_phase_rad"] == pytest.approx(2 * before["median_phase_rad"], rel=1e-5)
    assert before["median_change_d1_to_d2_rad"] == pytest.approx(before["median_phase_rad"] * (2 ** 0.5 - 1))
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.q_proj.weight.view(-1, head_dim, model.config.hidden_size)
            w[:, : head_dim // 2] *= 3  # the amplitude half
    assert tapa_phase_scale(model, ids, scheme)["median_phase_rad"] == pytest.approx(after["median_phase_rad"],
                                                                                    rel=1e-5)


def test_tapa_recipe_ships_the_settings_the_committed_sweep_found():
    """recipes/scratch-tiny-llama-tapa.yaml against examples/experiments/tapa-trainability: TAPA's learning rate
    relative to RoPE's is the best row's, and the paper's theta kept there is within noise of the best row's."""
    import yaml

    data = json.loads((ROOT / "examples" / "experiments" / "tapa-trainability" / "results.json").read_text())
    nll = data["summary"]["heldout_nll"]
    tapa_rows = {k: v["64"] for k, v in nll.items() if k.startswith("TAPA")}
    best = min(tapa_rows, key=lambda k: tapa_rows[k]["mean"])
    variant = data["config"]["variants"][best]
    base_lr = data["config"]["base"]["train"]["learning_rate"]
    ratio = (variant["learning_rate"] or base_lr) / base_lr
    rope = yaml.safe_load((ROOT / "recipes" / "scratch-tiny-llama.yaml").read_text())
    tapa = yaml.safe_load((ROOT / "recipes" / "scratch-tiny-llama-tapa.yaml").read_text())
    assert tapa["training"]["learning_rate"] / rope["training"]["learning_rate"] == pytest.approx(ratio, rel=0.02)
    assert tapa["scheme"]["name"] == "tapa" and tapa["scheme"]["alpha"] == 0.1
    same_lr = [k for k in tapa_rows if data["config"]["variants"][k]["learning_rate"] == variant["learning_rate"]
               and data["config"]["variants"][k]["spec"] == "tapa"]  # the paper's alpha, theta and phase
    assert same_lr, "the sweep has no row at the best learning rate with the paper's theta"
    other = tapa_rows[same_lr[0]]
    assert tapa["scheme"]["theta"] == 0.5 and tapa["scheme"]["phase"] == "quadratic"
    assert abs(other["mean"] - tapa_rows[best]["mean"]) <= 2 * math.hypot(other["sd"], tapa_rows[best]["sd"])
    assert {k: v for k, v in tapa["model"]["config"].items()} == rope["model"]["config"]


# -- the tests every comparison carries (stats), and the claims -------------------------------------------------
def test_t_distribution_matches_the_tables_and_mpmath():
    from hf_posenc_experiments.stats import t_cdf, t_quantile

    for df, value in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-4)
    assert t_quantile(0.025, 2) == pytest.approx(-4.3027, abs=1e-4) and t_quantile(0.5, 3) == 0.0
    assert t_quantile(0.95, 2) == pytest.approx(2.9200, abs=1e-4)  # one-sided 95% (the tables' 0.05 column)
    assert t_cdf(0.0, 5) == 0.5 and t_cdf(2.0, 3) + t_cdf(-2.0, 3) == pytest.approx(1.0)
    mpmath = pytest.importorskip("mpmath")  # an independent t quantile for Welch's non-integer df
    for df in (2.5, 4.0755, 17.3):
        reference = mpmath.findroot(lambda x: mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True) / 2
                                    - 0.025, 2.5)
        assert t_quantile(0.975, df) == pytest.approx(float(reference), rel=1e-9)


def test_paired_interval_by_hand():
    from hf_posenc_experiments.stats import compare, paired

    # differences 0.5, 1.0, 0.9: mean 0.8, sd sqrt(0.07), half width t_{0.975,2} sqrt(0.07 / 3)
    d = paired([1.0, 2.0, 3.0], [0.5, 1.0, 2.1])
    half = 4.302652729749 * math.sqrt(0.07 / 3)
    assert (d.test, d.n, d.df) == ("paired", 3, 2)
    assert (d.estimate, d.low, d.high) == pytest.approx((0.8, 0.8 - half, 0.8 + half), abs=1e-12)
    assert d.detected and d.label == "paired by seed, n = 3"
    # by seed, whatever the order the runs came in
    assert compare({2: 3.0, 0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.0, 2: 2.1}) == d


def test_welch_interval_by_hand():
    from hf_posenc_experiments.stats import compare, welch

    # equal variances (1) and sizes (3): se = sqrt(2/3), df = 2 (n - 1) = 4, t_{0.975,4} = 2.776445
    d = welch([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    half = 2.776445105198 * math.sqrt(2 / 3)
    assert (d.estimate, d.low, d.high, d.df) == pytest.approx((-2.0, -2.0 - half, -2.0 + half, 4.0), abs=1e-9)
    assert not d.detected  # the interval [-4.267, +0.267] contains 0
    # unequal: var 1 (n 3) and 20/3 (n 4): se^2 = 1/3 + 5/3 = 2, df = 4 / ((1/3)^2/2 + (5/3)^2/3) = 216/53
    d = welch([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    assert d.df == pytest.approx(216 / 53, rel=1e-12)
    t = 2.7562848743596  # t_{0.975, 216/53} (mpmath, 30 digits)
    assert (d.low, d.high) == pytest.approx((-3.0 - t * math.sqrt(2), -3.0 + t * math.sqrt(2)), abs=1e-9)
    assert d.label == "Welch, n = 3 and 4, df = 4.1"
    # different seeds: Welch; a constant or a single run: one-sample
    assert compare({0: 1.0, 1: 2.0, 2: 3.0}, {3: 3.0, 4: 4.0, 5: 5.0}).test == "welch"
    one = compare({0: 1.0, 1: 2.0, 2: 3.0}, 1.5)
    assert (one.test, one.estimate, one.df) == ("one-sample", 0.5, 2)
    assert one.high - one.low == pytest.approx(2 * 4.302652729749 / math.sqrt(3), abs=1e-9)
    assert compare({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.5}) == one
    assert not compare({0: 1.0}, {0: 2.0}).finite  # one run each: an estimate, no interval


def test_an_interval_containing_zero_reads_no_difference_never_a_ranking():
    from hf_posenc_experiments.length_generalisation import verdict
    from hf_posenc_experiments.report import Tests, markdown_table
    from hf_posenc_experiments.stats import NO_DIFFERENCE, welch

    text = Tests().item("A - B", welch([1.0, 2.0, 3.0], [3.0, 4.0, 5.0]), "higher loss than B", "lower loss than B")
    assert text == f"A - B -2.000 [-4.267, +0.267] (Welch, n = 3 and 3, df = 4.0): {NO_DIFFERENCE}"
    assert "lower loss" not in text
    detected = Tests().item("A - B", welch([1.0, 1.1, 1.2], [3.0, 3.1, 3.2]), "higher loss than B", "lower loss than B")
    assert detected.endswith(": lower loss than B")
    tiny = Tests().item("A - B", welch([1.0, 1.0001, 1.0002], [1.0005, 1.0006, 1.0007]), "higher", "lower")
    assert tiny.endswith("lower, by less than 0.001: negligible")
    # in a report: CoPE's 8L mean is higher than RoPE's, but its seeds overlap RoPE's: no ranking, in the verdict or
    # in the table's bold (the best mean and every row not detectably different from it)
    summary = _summary({"RoPE": {64: [1.77, 1.78, 1.76], 512: [2.11, 2.19, 2.26]},
                        "CoPE": {64: [1.80, 1.75, 1.79], 512: [2.36, 2.20, 2.26]},
                        "NoPE": {64: [2.36, 2.35, 2.36], 512: [2.46, 2.46, 2.45]}})
    lines = verdict(summary, {"unigram": 3.0, "bigram": 2.4}, 64)
    cope = next(line for line in lines if line.startswith("CoPE:"))
    assert f"at 8L +0.087 [" in cope and cope.count(NO_DIFFERENCE) == 3 and "higher loss" not in cope
    assert "NoPE - RoPE at L +0.587 [" in next(line for line in lines if line.startswith("NoPE:"))
    table = markdown_table(summary, ["L", "8L"], {"bigram": 2.4})
    assert "| CoPE | **1.780 ± 0.026** | **2.273 ± 0.081** |" in table and "| NoPE | 2.357 ± 0.006 |" in table


def test_rotation_angles_behind_cannot_be_tested():
    from hf_posenc_experiments.claims import PROPE_PAPER, angle, changed_frequencies, reach, turn

    assert changed_frequencies("cope", 32) == [11, 12, 13, 14, 15]  # 20 of 64 scaled to 16 frequencies
    assert changed_frequencies("prope:p=0.75", 32) == [12, 13, 14, 15] and changed_frequencies("tapa", 32) == []
    # omega_11 = 1e4^(-22/32) = 0.00178: 0.114 rad over 64 positions, 0.911 over 512
    assert turn("cope", 32, 1e4, 64) == pytest.approx(64 * 1e4 ** (-22 / 32))
    assert angle(turn("cope", 32, 1e4, 64)) == "0.11"
    assert angle(turn("cope", 32, 1e4, 512)) == "0.91" and angle(turn("hardclip", 32, 1e4, 64)) == "0.11"
    assert angle(turn("prope:p=0.75", 32, 1e4, 64)) == "0.064"  # omega_12 = 1e-3
    assert angle(turn("cope:rope_theta=1000000", 32, 1e4, 1024)) == "0.077"  # ABF: the spec's own base
    gemma = turn("prope:p=0.75", PROPE_PAPER.head_dim, PROPE_PAPER.rope_theta, PROPE_PAPER.length)
    assert gemma == pytest.approx(8192 * 1e4 ** (-192 / 256))  # about 8 rad
    assert reach("cope", 32, 1e4, {"L": 64}).startswith("the 5 of 16 frequencies CoPE's clip range covers turn at "
                                                        "most 0.11 rad over L")


COMMITTED = ("length-generalisation", "length-generalisation/reproduction", "tapa-trainability", "context-extension",
             "prope-gemma-ratio", "tapa-depth", "tape-peft", "cope-passkey")
# reports whose experiment exists before its committed run (issue #47): checked like the others once committed
COMMITTED += tuple(f for f in ("tapa-curves",) if (ROOT / "examples" / "experiments" / f / "results.json").is_file())
# claim lines a report must end with (the claims each experiment speaks to; 4 where not named)
CLAIM_LINES = {"tapa-depth": 3, "tape-peft": 2, "cope-passkey": 2,  # depth: two TAPA claims + Han & Ji
               "tapa-curves": 1}  # the TAPA in-distribution claim, judged with the grid's tuning record


@pytest.mark.parametrize("folder", COMMITTED)
def test_committed_results_md_is_what_its_json_renders(folder):
    """Every number in a committed results.md comes from its results.json: the summary follows from the runs, the
    analysis stored in the JSON is what the runs give now, and the Markdown is exactly the rendering."""
    import importlib

    from hf_posenc_experiments.report import ANALYSIS_FIELDS, config_of
    from hf_posenc_experiments.runner import Summary
    from hf_posenc.results_io import dumps

    out = ROOT / "examples" / "experiments" / folder
    payload = json.loads((out / "results.json").read_text())
    assert json.loads(dumps(Summary.from_results(payload["runs"], payload["summary"]["lengths"]).to_dict())) == \
        payload["summary"]
    module = importlib.import_module(f"hf_posenc_experiments.{payload['experiment']}")
    config = config_of(payload)
    analysis = json.loads(dumps(module.analyse(payload, config)))
    assert {k: payload[k] for k in ANALYSIS_FIELDS} == analysis
    assert module.render(payload, config) == (out / "results.md").read_text()


@pytest.mark.parametrize("folder", COMMITTED)
def test_committed_reports_end_with_one_line_per_paper_claim(folder):
    text = (ROOT / "examples" / "experiments" / folder / "results.md").read_text()
    assert text.count(CLAIMS_HEADING) == 1
    section = text[text.index(CLAIMS_HEADING):]
    claims = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(claims) >= CLAIM_LINES.get(folder, 4)
    for line in claims:
        status = [s for s in STATUSES if f": **{s}**: " in line]
        assert len(status) == 1, line
        assert len(line.split(f"**{status[0]}**: ", 1)[1]) > 40, f"no reason given: {line}"
    payload = json.loads((ROOT / "examples" / "experiments" / folder / "results.json").read_text())
    assert len(claims) == len(payload["claims"])
    assert "Tests: each interval is the 95% t interval" in text


def test_render_only_rewrites_results_md_without_training(tmp_path):
    import shutil

    committed = ROOT / "examples" / "experiments" / "context-extension"
    shutil.copy(committed / "results.json", tmp_path / "results.json")
    (tmp_path / "results.md").write_text("stale")
    proc = _run_cli("experiment", "context_extension", "--render-only", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "results.md").read_text() == (committed / "results.md").read_text()
    assert (tmp_path / "results.json").read_text() == (committed / "results.json").read_text()
    assert not (tmp_path / "work").exists() and not (tmp_path / "heldout_loss.png").exists()
    refused = _run_cli("experiment", "length_generalisation", "--render-only", "--out", str(tmp_path))
    assert refused.returncode != 0 and "not a 'length_generalisation' report" in refused.stderr


def test_docs_quote_the_committed_intervals():
    """Every interval docs/experiments.md quotes ("+0.086 [-0.282, +0.455]") is one a committed report prints."""
    import re

    folders = (*COMMITTED, "tapa-scale", "tape-arithmetic")  # with the GPU experiments (their own tests)
    reports = "\n".join((ROOT / "examples" / "experiments" / f / "results.md").read_text() for f in folders)
    docs = (ROOT / "docs" / "experiments.md").read_text().replace("−", "-")
    quoted = re.findall(r"[+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\]", docs)
    assert len(quoted) >= 10
    assert [q for q in quoted if q not in reports] == []


def test_a_missing_text_is_installed_on_first_use_in_a_source_checkout(tmp_path, monkeypatch, capsys):
    """The experiments install Jane Austen's novels themselves where they are missing (the install script of the
    checkout, here a stand-in that unpacks a placeholder); a failing install names the script and apt-get."""
    from hf_posenc_experiments import corpus

    assert corpus.INSTALL_SCRIPT == ROOT / "scripts" / "data" / "install_austen.sh" and corpus.INSTALL_SCRIPT.is_file()
    monkeypatch.setenv("HF_POSENC_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(corpus, "_RDATA", Path("pkg/Rdata"))
    script = tmp_path / "install.sh"
    script.write_text(f'mkdir -p "$HF_POSENC_DATA/{corpus.DEBIAN_PACKAGE}/pkg" && touch '
                      f'"$HF_POSENC_DATA/{corpus.DEBIAN_PACKAGE}/pkg/Rdata.rdb"\n')
    monkeypatch.setattr(corpus, "INSTALL_SCRIPT", script)
    assert corpus.ensure_janeaustenr() == tmp_path / "data" / corpus.DEBIAN_PACKAGE / "pkg" / "Rdata"
    assert "is not installed: running scripts/data/install_austen.sh" in capsys.readouterr().err
    monkeypatch.setenv("HF_POSENC_DATA", str(tmp_path / "other"))
    script.write_text("echo no network >&2; exit 1\n")
    with pytest.raises(FileNotFoundError, match="installing r-cran-janeaustenr failed .*no network.*apt-get install"):
        corpus.ensure_janeaustenr()
