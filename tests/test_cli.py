"""The hf-posenc command line on a tiny checkpoint."""

import json

import torch

import hf_posenc
from hf_posenc.cli import main as cli
from hf_posenc.models import load_model
from tiny import random_ids, tiny_model


def test_patch_info_export(tmp_path, capsys):
    tiny_model("qwen3").save_pretrained(tmp_path / "base")
    assert cli(["patch", str(tmp_path / "base"), str(tmp_path / "cope"), "--scheme", "cope", "-o", "clip_low_n=3",
                "-o", "rope_theta=1e5", "--no-tokenizer"]) == 0
    capsys.readouterr()
    assert cli(["info", str(tmp_path / "cope")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["scheme"] == "cope" and info["options"]["clip_low_n"] == 3 and info["options"]["rope_theta"] == 1e5
    assert cli(["export", str(tmp_path / "cope"), str(tmp_path / "stock"), "--no-tokenizer"]) == 0
    stock = json.loads((tmp_path / "stock" / "config.json").read_text())
    assert stock["model_type"] == "qwen3" and stock["rope_parameters"]["rope_type"] == "longrope"
    ids = random_ids()
    with torch.no_grad():
        a = load_model(tmp_path / "cope", attn_implementation="eager")(ids).logits
        b = load_model(tmp_path / "stock", attn_implementation="eager")(ids).logits
    assert torch.equal(a, b)


def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, capsys):
    tiny_model("llama").save_pretrained(tmp_path / "base")
    assert cli(["patch", str(tmp_path / "base"), str(tmp_path / "out"), "--scheme", "prope", "-o", "p=3",
                "--no-tokenizer"]) == 2
    assert "p must be in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert cli(["export", str(tmp_path / "base"), str(tmp_path / "out"), "--no-tokenizer"]) == 2
    assert "carries no hf-posenc scheme" in capsys.readouterr().err
    assert hf_posenc.get_scheme(load_model(tmp_path / "base")) is None


def test_repeated_model_names_are_refused(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("some text " * 50)
    code = cli(["diagnose", "a=x", "a=y", "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "o")])
    assert code == 2 and "repeat; name them with NAME=PATH" in capsys.readouterr().err
