"""CoPE's claim where it can show (hf_posenc_experiments.cope_passkey, issue #33 §2): the toy end to end through the
command line (every arm evaluated beyond 4L with YaRN x4 whose original length is 4L), the passkey training
windows (whole, aligned, one in four, keys disjoint from the evaluation's), the angles that decide what can show,
and the claim lines on planted results."""

import dataclasses
import json
import math
import re

import pytest

from hf_posenc_experiments import cope_passkey
from hf_posenc_experiments.claims import CONFIRMED, UNFAIR, UNTESTABLE_SCALE
from hf_posenc_experiments.config import COPE_PAPER_LENGTH, COPE_PAPER_THETA, CopePasskeyConfig
from experiment_cli import austen, run_cli  # noqa: F401 (austen: a fixture)

KEY = re.compile(r"The pass key is (\d+)\. Remember it\. \1 is the pass key\.")


def test_cope_passkey_toy_end_to_end(austen, tmp_path):
    import yaml

    from hf_posenc.evaluation.passkey import QUESTION

    out, work = tmp_path / "out", tmp_path / "work"
    proc = run_cli("experiment", "cope_passkey", "--size", "toy", "--seeds", "2", "--out", str(out), "--work",
                   str(work), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    config = CopePasskeyConfig.preset("toy", seeds=2)
    trained, beyond = 256, [512, 1024]
    assert config.extended_length == trained and config.passkey_lengths == [trained, *beyond]
    assert [r["label"] for r in data["runs"]] == [cope_passkey.BASE_LABEL] + [l for l in config.schemes
                                                                              for _ in range(2)]
    evaluation_keys = cope_passkey.evaluation_keys(config)
    for run in data["runs"][1:]:
        spec = config.schemes[run["label"]]
        trained_rope, yarn = run["trained"]["rope_parameters"], run["yarn"]["rope_parameters"]
        # trained with ABF only; evaluated beyond 4L with YaRN x4 over θ', its original length the trained 4L
        assert trained_rope["rope_theta"] == yarn["rope_theta"] == 39062.5 and "factor" not in trained_rope
        assert yarn["factor"] == 4.0 and yarn["original_max_position_embeddings"] == trained
        assert "yarn" in (yarn["rope_type"], yarn.get("base_rope_type"))
        assert run["yarn"]["spec"] == spec + ",scaling=yarn,factor=4,original_max_position_embeddings=256"
        assert run["yarn"]["attention_scaling"] == pytest.approx(0.1 * math.log(4) + 1)
        # the frequencies the model used: YaRN keeps the fastest, interpolates every other by at most 4, the slowest
        # (wavelength beyond 4L) by exactly 4
        plain, scaled = run["trained"]["inv_freq"], run["yarn"]["inv_freq"]
        assert scaled[0] == pytest.approx(plain[0])
        assert all(p / 4 * (1 - 1e-6) <= s <= p * (1 + 1e-6) for p, s in zip(plain, scaled))
        assert scaled[-3] == pytest.approx(plain[-3] / 4)
        if run["label"] == "RoPE":
            assert scaled[-1] == pytest.approx(plain[-1] / 4)
        else:  # CoPE's / HardClip's clip range applied over YaRN's frequencies too
            assert plain[-1] == scaled[-1] == 0.0
        # the reported condition: as trained up to 4L, YaRN beyond it
        assert run["perplexity"]["256"] == run["perplexity_plain"]["256"]
        for n in beyond:
            assert run["perplexity"][str(n)] == run["yarn"]["perplexity"][str(n)]
            assert run["passkey"][str(n)] == run["yarn"]["passkey"][str(n)]
        assert run["passkey"]["256"] == run["trained"]["passkey"]["256"]
        assert set(run["passkey"]["1024"]["keys"]) <= evaluation_keys
    # the training data: passkey windows first (each one window), then the novels; their keys not evaluated
    recipe = yaml.safe_load((work / "runs" / "cope" / "seed0" / "run" / "recipe.yaml").read_text())
    files = recipe["data"]["files"]
    assert files[0].endswith("passkey-train-256.jsonl") and recipe["data"]["packing"] == "concat"
    assert recipe["scheme"] == {"name": "cope", "rope_theta": 39062.5, "replace": True}
    docs = [json.loads(line)["text"] for line in open(files[0])]
    assert len(docs) == data["passkey_data"]["passkey_windows"] > 0
    train_keys = {int(KEY.search(d).group(1)) for d in docs}
    assert not train_keys & evaluation_keys and all(d.endswith(f"{QUESTION} {KEY.search(d).group(1)}") for d in docs)
    assert [c["status"] for c in data["claims"]] == [UNTESTABLE_SCALE, UNTESTABLE_SCALE]
    assert set(data["angles"]) >= {"HardClip at 4L", "CoPE at 8L", "CoPE at 16L"}
    markdown = (out / "results.md").read_text()
    assert "39,062.5" in markdown and "8L = 512 (YaRN)" in markdown and "**cannot be tested at this scale**" in markdown
    for name in ("heldout_loss.png", "passkey.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rerendered = run_cli("experiment", "cope_passkey", "--size", "toy", "--seeds", "2", "--out", str(out),
                         "--render-only")
    assert rerendered.returncode == 0, rerendered.stderr[-3000:]
    assert (out / "results.md").read_text() == markdown


def test_training_windows_hold_whole_passkeys_one_in_four(tmp_path):
    """Built as the trainer builds them (concat packing of the recipe's files): the first K windows are exactly the
    K passkey documents, whole (task description first, the key after the question, EOS last), and no later window
    holds a needle."""
    from hf_posenc.evaluation.passkey import TASK_DESCRIPTION
    from hf_posenc.training.config import DataSection
    from hf_posenc.training.data import build_dataset
    from hf_posenc_experiments.tokenizer import byte_tokenizer

    config = CopePasskeyConfig.preset("toy")
    length = config.extended_length
    novels = []
    for i, size in enumerate((9001, 12345, 7777)):
        path = tmp_path / f"novel{i}.txt"
        path.write_text(("Emma was handsome, clever and rich. " * 400)[:size])
        novels.append(str(path))
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    data = cope_passkey.write_passkey_data(config, {"train_files": novels}, work)
    k, n = data["passkey_windows"], data["novel_windows"]
    assert n == (9001 + 12345 + 7777 + 3) // length and k == round(n / 3)
    assert data["train_files"] == [data["file"], *novels]
    tokenizer = byte_tokenizer()
    windows = build_dataset(DataSection(files=data["train_files"], packing="concat"), tokenizer, length)
    assert len(windows) == k + n
    eos, keys = tokenizer.eos_token_id, []
    for i in range(len(windows)):
        ids = windows[i]["input_ids"].tolist()
        text = tokenizer.decode(ids[:-1])
        if i < k:
            found = KEY.search(text)
            assert found and ids[-1] == eos and eos not in ids[:-1] and text.startswith(TASK_DESCRIPTION)
            assert text.endswith(f"The pass key is {found.group(1)}")  # the question answered with the key
            keys.append(int(found.group(1)))
        else:
            assert "pass key" not in tokenizer.decode(ids)
    assert len(set(keys)) > k // 2 and not set(keys) & cope_passkey.evaluation_keys(config)
    assert 0.23 < k / (k + n) < 0.27


def test_the_angles_put_the_claims_out_of_reach_at_this_length_and_in_reach_at_a_longer_one():
    small = CopePasskeyConfig.preset("small")
    assert small.extended_theta == COPE_PAPER_THETA / COPE_PAPER_LENGTH * 256 == 39062.5
    assert small.schemes == {"RoPE": "rope:rope_theta=39062.5", "CoPE": "cope:rope_theta=39062.5",
                             "HardClip": "hardclip:rope_theta=39062.5"}
    reach = cope_passkey.reach_table(small)
    # the lowest 5 of 16 frequencies at θ' over 4L, and over 16L under YaRN x4 (interpolated by 4): 0.178 rad;
    # Llama-3-8B's lowest 20 of 64 at θ = 1e7 over 64k, and over 256k under YaRN x4: 1.009 rad
    for key in ("HardClip at 4L", "CoPE at 16L"):
        assert reach[key].here == pytest.approx(39062.5 ** (-11 / 16) * 256)
        assert reach[key].paper == pytest.approx(1e7 ** (-44 / 64) * 65536)
        assert not reach[key].testable
    assert reach["CoPE at 16L without YaRN"].here == pytest.approx(4 * reach["CoPE at 16L"].here)
    # at the same θ / length ratio the angle grows as length^(5/16): at 4L = 8,192 it is past half the paper's
    L = 2048
    theta = COPE_PAPER_THETA / COPE_PAPER_LENGTH * 4 * L
    schemes = {k: f"{v.split(':')[0]}:rope_theta={theta!r}" for k, v in small.schemes.items()}
    longer = dataclasses.replace(small, context_length=L, eval_tokens=16 * L, extended_theta=theta, schemes=schemes)
    assert all(r.testable for r in cope_passkey.reach_table(longer).values())
    with pytest.raises(ValueError, match="--size small"):
        CopePasskeyConfig.preset("gpu")


def planted(config, cope=0.0, hardclip=0.0, cope_digits=0.0):
    """A results.json payload with every field the analysis reads: RoPE's loss 2.0 at every length (seed noise
    ±0.003), CoPE ``cope`` higher beyond 4L, HardClip ``hardclip`` higher at 4L, CoPE's digit accuracy
    ``cope_digits`` higher beyond 4L."""
    trained = config.extended_length
    noise = {0: 0.003, 1: -0.002, 2: 0.0}
    runs = [{"label": cope_passkey.BASE_LABEL, "seed": 0, "seconds": 1.0, "final_train_loss": 2.5,
             "perplexity": {str(n): {"nll": 2.5} for n in config.eval_lengths}}]
    for label in config.schemes:
        for seed in range(3):
            def loss(n):
                shift = (cope if label == "CoPE" and n > trained else 0.0) + \
                    (hardclip if label == "HardClip" and n == trained else 0.0)
                return {"nll": 2.0 + shift + noise[seed] + 0.001 * (seed == 1) * (label == "CoPE")}

            def scores(n):
                digits = 0.5 + (cope_digits if label == "CoPE" and n > trained else 0.0) + noise[seed]
                return {"exact": 0.2, "digits": digits}

            yarn = {str(n): loss(n) for n in config.eval_lengths if n >= trained}
            runs.append({"label": label, "seed": seed, "seconds": 1.0, "final_train_loss": 2.1,
                         "perplexity": {str(n): loss(n) for n in config.eval_lengths},
                         "perplexity_plain": {str(n): loss(n) for n in config.eval_lengths},
                         "passkey": {str(n): scores(n) for n in config.passkey_lengths},
                         "trained": {"passkey": {str(trained): scores(trained)}},
                         "yarn": {"perplexity": yarn, "passkey": {str(n): scores(n) for n in config.passkey_lengths}}})
    return {"runs": runs, "base": runs[0]["perplexity"], "floors": {"unigram": 3.2, "bigram": 2.1},
            "passkey": cope_passkey.passkey_summary(runs, config.passkey_lengths),
            "passkey_data": {"passkey_windows": 1, "novel_windows": 3}, "command": "planted", "corpus": "planted",
            "wall_seconds": 60.0, "machine": {"threads": 2},
            "angles": {k: r.to_dict() for k, r in cope_passkey.reach_table(config).items()}}


@pytest.mark.parametrize("reachable", [True, False])
def test_claim_lines_on_planted_results(monkeypatch, reachable):
    config = CopePasskeyConfig.preset("toy")
    real = cope_passkey.reach_table(config)
    share = 1.0 if reachable else 0.1
    monkeypatch.setattr(cope_passkey, "reach_table", lambda c: {
        k: dataclasses.replace(r, here=share * r.paper) for k, r in real.items()})

    def statuses(**planted_effects):
        payload = planted(config, **planted_effects)
        analysed = cope_passkey.analyse(payload, config)
        payload.update(analysed)
        assert "## The papers' claims" in cope_passkey.render(payload, config)
        return [c["status"] for c in analysed["claims"]], analysed["claims"]

    out_of_reach = [UNTESTABLE_SCALE, UNTESTABLE_SCALE]
    # CoPE worse than RoPE beyond 4L (higher loss at 8L and 16L): a negative reading when the angles put it within
    # reach, which is not a fair test (every arm at one fixed rate, no grid): never "refuted"
    found, claims = statuses(cope=0.1)
    assert found == ([UNFAIR, UNTESTABLE_SCALE] if reachable else out_of_reach)
    if reachable:
        assert "missing a per-arm learning-rate grid at the final budget" in claims[0]["reason"]
        assert claims[0]["tuning"]["regime_reached"] and not claims[0]["tuning"]["fair"]
    assert "CoPE - RoPE loss at 16L +0.1" in claims[0]["reason"]
    if not reachable:
        assert "(10% of it; within reach from 50%)" in claims[0]["reason"]
    # CoPE better (lower loss beyond 4L): confirmed; also by retrieval alone (higher digit accuracy at 8L and 16L)
    assert statuses(cope=-0.1)[0] == ([CONFIRMED, UNTESTABLE_SCALE] if reachable else out_of_reach)
    assert statuses(cope_digits=0.2)[0] == ([CONFIRMED, UNTESTABLE_SCALE] if reachable else out_of_reach)
    # better loss but worse retrieval: negative (any detected difference against the claim), not a fair test
    assert statuses(cope=-0.1, cope_digits=-0.2)[0][0] == (UNFAIR if reachable else UNTESTABLE_SCALE)
    # HardClip worse than RoPE inside 4L: confirmed; better: negative, not a fair test; nothing detected: cannot tell
    assert statuses(hardclip=0.1)[0] == ([UNTESTABLE_SCALE, CONFIRMED] if reachable else out_of_reach)
    assert statuses(hardclip=-0.1)[0] == ([UNTESTABLE_SCALE, UNFAIR] if reachable else out_of_reach)
    found, claims = statuses()
    assert found == out_of_reach
    assert ("the test cannot tell" in claims[1]["reason"]) == reachable
