"""The TAPE arithmetic experiment (hf_posenc_experiments.tape_arithmetic): the reversed-digit addition data against
Python's integers, the answer-only labels, exact match scored teacher-forced against a greedy decoding loop, the
accuracy by length and over the heatmap, the presets, the time budget and the resume from cached runs, and the
toy end to end through the command line (with --render-only)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_posenc_experiments import tape_arithmetic as ta
from hf_posenc_experiments.claims import CLAIMS_HEADING, STATUSES
from hf_posenc_experiments.config import TapeArithmeticConfig

ROOT = Path(__file__).resolve().parents[1]


def _parts(text: str) -> tuple[str, str, str]:
    """``"21+9=03$"`` -> ("21", "9", "03")."""
    assert text.endswith("$") and text.count("+") == 1 and text.count("=") == 1, text
    a, rest = text[:-1].split("+")
    b, c = rest.split("=")
    return a, b, c


def test_reversed_digit_problems_add_up():
    problems = ta.generate(20, np.random.default_rng(7), count=4000)
    for k in range(len(problems)):
        a, b, c = _parts(problems.text(k))
        assert (len(a), len(b)) == (problems.a_digits[k], problems.b_digits[k])
        assert a[-1] != "0" and b[-1] != "0" and c[-1] != "0"  # least significant digit first: no leading zeros
        assert int(a[::-1]) + int(b[::-1]) == int(c[::-1])
        assert problems.tokens[k, problems.prompt_length[k] - 1] == ta.EQUALS  # the answer starts after "="
        assert (problems.tokens[k, problems.length[k]:] == ta.PAD).all()
    assert problems.tokens.shape[1] == ta.sequence_width(20) == 64
    # McLeish et al.'s bucket method: every (i, j) up to 20 equally often (4,000 problems = 10 of each of 400 pairs)
    pairs = np.unique(np.stack([problems.a_digits, problems.b_digits]), axis=1, return_counts=True)[1]
    assert len(pairs) == 400 and set(pairs) == {10}
    # a carry out of the longer operand's last digit makes the sum one digit longer; 1-digit operands are 1-9
    longer = [len(_parts(problems.text(k))[2]) - max(problems.a_digits[k], problems.b_digits[k])
              for k in range(len(problems))]
    assert set(longer) == {0, 1}
    ones = ta.generate(1, np.random.default_rng(0), per_pair=500)
    assert {_parts(ones.text(k))[0] for k in range(500)} == set("123456789")


def test_the_labels_are_the_answer_only():
    problems = ta.generate(4, np.random.default_rng(1), count=64)
    batch = ta.batch_tensors(problems.tokens, problems.prompt_length, problems.length)
    assert batch["input_ids"].shape[1] == problems.length.max()
    for k in range(len(problems)):
        labels, ids = batch["labels"][k], batch["input_ids"][k]
        start, end = problems.prompt_length[k], problems.length[k]
        assert (labels[:start] == ta.IGNORE_INDEX).all() and (labels[end:] == ta.IGNORE_INDEX).all()
        assert torch.equal(labels[start:end], ids[start:end]) and labels[end - 1] == ta.EOS
    assert torch.equal(batch["position_ids"][3], torch.arange(batch["input_ids"].shape[1]))
    assert torch.equal(ta.collate([ta.ProblemDataset(problems)[k] for k in range(64)])["labels"], batch["labels"])


def _perfect_logits(ids: torch.Tensor) -> torch.Tensor:
    """Logits whose argmax at every position is the next token of ``ids`` (PAD at the last)."""
    following = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], ta.PAD)], dim=1)
    return torch.nn.functional.one_hot(following, ta.VOCAB_SIZE).float() * 10.0


def test_score_counts_a_right_answer_and_a_wrong_one_and_never_the_prompt():
    problems = ta.generate(6, np.random.default_rng(2), count=8)
    batch = ta.batch_tensors(problems.tokens, problems.prompt_length, problems.length)
    logits = _perfect_logits(batch["input_ids"])
    correct, nll, scored = ta.score(logits, batch["labels"])
    assert correct.all()
    assert torch.equal(scored, torch.from_numpy((problems.length - problems.prompt_length).astype(np.int64)))
    assert (nll < 1e-3 * scored).all()
    wrong = logits.clone()
    first = int(problems.prompt_length[0]) - 1  # predicts the first answer digit
    wrong[0, first] = wrong[0, first].roll(1)
    last = int(problems.length[1]) - 2  # predicts the EOS: an answer that does not end is wrong too
    wrong[1, last] = wrong[1, last].roll(1)
    wrong[2, 0] = wrong[2, 0].roll(1)  # a prompt position: not scored
    wrong[3, -1] = wrong[3, -1].roll(1)  # after the EOS (or the last position): not scored
    correct, nll_wrong, _ = ta.score(wrong, batch["labels"])
    assert correct.tolist() == [False, False] + [True] * 6
    assert (nll_wrong[:2] > 5).all() and torch.allclose(nll_wrong[2:], nll[2:])


class _Oracle(torch.nn.Module):
    """Predicts the true answer (parsed from the prompt) except for problems whose first operand has an even
    number of digits, where it gets the last answer digit wrong; any token after the answer: EOS."""

    def forward(self, input_ids, position_ids=None, use_cache=False):
        logits = torch.zeros(*input_ids.shape, ta.VOCAB_SIZE)
        for row, ids in enumerate(input_ids.tolist()):
            text = "".join(ta.SYMBOLS[t] for t in ids)
            equals = text.index("=")
            a, b = text[:equals].split("+")
            answer = [int(d) for d in str(int(a[::-1]) + int(b[::-1]))[::-1]]
            if len(a) % 2 == 0:
                answer[-1] = (answer[-1] + 1) % 10
            for t in range(equals, len(ids)):
                k = t - equals
                logits[row, t, answer[k] if k < len(answer) else ta.EOS] = 1.0
        return type("Out", (), {"logits": logits})()


def test_teacher_forced_exact_match_equals_greedy_decoding():
    problems = ta.generate(5, np.random.default_rng(4), per_pair=2)
    oracle = _Oracle()
    found = ta.evaluate(oracle, problems, device="cpu", batch_size=7)  # batches of rows sorted by length
    for k in range(len(problems)):
        ids = torch.tensor(problems.tokens[k, : problems.prompt_length[k]], dtype=torch.long)[None]
        for _ in range(problems.length[k] - problems.prompt_length[k] + 1):  # greedy, until EOS or one too many
            ids = torch.cat([ids, oracle(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            if ids[0, -1] == ta.EOS:
                break
        greedy = torch.equal(ids[0], torch.tensor(problems.tokens[k, : problems.length[k]], dtype=torch.long))
        assert found["correct"][k] == greedy == (problems.a_digits[k] % 2 == 1)


def test_accuracy_by_length_and_over_the_heatmap():
    a, b = ta.grid_lengths(4, 3)
    correct = np.maximum(a, b) <= 2  # right on every problem with both operands of at most 2 digits
    correct[(a == 3) & (b == 1)] = [True, False, False]  # one of the three (3, 1) problems
    grid = ta.heatmap(correct, a, b, 4)
    assert grid[2, 0] == pytest.approx(1 / 3) and grid[0, 2] == 0 and grid[1, 1] == 1
    by_length = ta.accuracy_by_length(grid)  # each cell weighs the same: (3, 1) is one of the 5 cells with n = 3
    assert by_length == pytest.approx({1: 1.0, 2: 1.0, 3: 1 / 15, 4: 0.0})
    assert ta.regions(grid, 2) == pytest.approx({"all": (4 + 1 / 3) / 16, "inside": 1.0, "beyond": (1 / 3) / 12})


def test_presets_refuse_small_and_keep_the_papers_lengths():
    gpu = TapeArithmeticConfig.preset("gpu")
    assert (gpu.train_digits, gpu.test_digits, gpu.train.batch_size, gpu.seeds) == (20, 40, 512, 3)
    assert gpu.model.head_dim == 64 and gpu.model.intermediate_size == 2 * gpu.model.hidden_size
    assert gpu.max_sequence_length == ta.sequence_width(40) == 124 and gpu.budget_seconds
    assert TapeArithmeticConfig.preset("toy", seeds=2).seed_list == [0, 1]
    with pytest.raises(ValueError, match="--size gpu"):
        TapeArithmeticConfig.preset("small")
    with pytest.raises(ValueError, match="'RoPE' and a 'TAPE'"):
        dataclasses.replace(gpu, schemes={"RoPE": "rope"})


def test_a_seed_that_does_not_fit_the_budget_waits_and_a_rerun_resumes(tmp_path):
    config = dataclasses.replace(TapeArithmeticConfig.preset("toy", seeds=2), budget_seconds=1e-3)
    out, work = tmp_path / "out", tmp_path / "work"
    first = ta.run(config, out, work, "test", progress=False)  # seed 0 runs (nothing timed yet), seed 1 waits
    assert [(r["label"], r["seed"]) for r in first["runs"]] == [("RoPE", 0), ("TAPE", 0)]
    assert first["not_run"] == ["RoPE seed 1", "TAPE seed 1"] and "Not run" in first["verdict"][-1]
    cached = work / "runs" / "tape" / "seed0" / "cell.json"
    stamp = cached.stat().st_mtime_ns
    second = ta.run(dataclasses.replace(config, budget_seconds=None), out, work, "test", progress=False)
    assert [(r["label"], r["seed"]) for r in second["runs"]] == [("RoPE", 0), ("TAPE", 0), ("RoPE", 1), ("TAPE", 1)]
    assert cached.stat().st_mtime_ns == stamp and second["runs"][1] == first["runs"][1]  # reused, not retrained
    assert not second["not_run"]


def test_toy_end_to_end_through_the_command_line(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user runs it

    def cli(*extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "hf_posenc_cli", "experiment", "tape_arithmetic", "--size", "toy",
                               "--seeds", "2", "--out", str(out), "--work", str(work), "--no-progress", *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    cli()
    data = json.loads((out / "results.json").read_text())
    assert data["experiment"] == "tape_arithmetic" and data["config"]["train_digits"] == 3
    assert [(r["label"], r["seed"]) for r in data["runs"]] == [("RoPE", 0), ("TAPE", 0), ("RoPE", 1), ("TAPE", 1)]
    for run in data["runs"]:
        assert set(run["accuracy"]) == {str(n) for n in range(1, 7)} and len(run["heatmap"]) == 6
        assert run["problems_scored"] == 2 * 36 and run["device"] == "cpu" and len(run["losses"]) == 4
    tape = json.loads((work / "runs" / "tape" / "seed0" / "cell.json").read_text())
    rope = json.loads((work / "runs" / "rope" / "seed0" / "cell.json").read_text())
    assert tape["losses"][0] == rope["losses"][0] and tape["losses"] != rope["losses"]  # TAPE starts as RoPE
    assert data["verdict"][0].startswith("Tests:") and "paired by seed (n = 2" in data["verdict"][0]
    assert [c["status"] for c in data["claims"]][-1] == "cannot be tested here"
    assert all(c["status"] in STATUSES for c in data["claims"])
    markdown = (out / "results.md").read_text()
    assert "| arm | n = 1 | n = 3 | n = 4 | n = 5 | n = 6 | inside (1-3) |" in markdown and CLAIMS_HEADING in markdown
    for name in ("accuracy_by_length.png", "heatmaps.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (out / "results.md").write_text("stale")
    cli("--render-only")  # rebuilt from results.json alone
    assert (out / "results.md").read_text() == markdown
