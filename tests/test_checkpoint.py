"""Checkpoint format: save/load in a fresh process, loading without hf-posenc, and export for stock Transformers."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_posenc
from hf_posenc.record import FORMAT_VERSION
from tiny import ARCHS, random_ids, tiny_model

# A fresh interpreter; with BLOCK, importing hf_posenc is impossible (as on a machine without it installed).
BLOCK = textwrap.dedent(
    """
    import importlib.abc, sys
    class _NoHfPosenc(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_posenc" or name.startswith("hf_posenc."):
                raise ModuleNotFoundError(f"No module named {name!r}")
    sys.meta_path.insert(0, _NoHfPosenc())
    """
)
LOAD = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    dirs, ids, plugin = json.loads(sys.argv[1]), torch.load(sys.argv[2]), sys.argv[3] == "1"
    if plugin:
        import hf_posenc
    results = {}
    for d in dirs:
        try:
            model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
        except Exception as exc:  # reported back to the test, which checks the message
            results[d] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        with torch.no_grad():
            torch.save(model(ids).logits, d + "/logits.pt")
        results[d] = {"class": type(model).__name__, "rope": model.config.rope_parameters}
    print("RESULTS" + json.dumps(results))
    """
)


def load_in_fresh_process(dirs, ids, tmp_path, plugin):
    torch.save(ids, tmp_path / "ids.pt")
    code = (BLOCK if not plugin else "") + LOAD
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([str(d) for d in dirs]), str(tmp_path / "ids.pt"), "1" if plugin else "0"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS"))
    return json.loads(line.removeprefix("RESULTS"))


CASES = [(arch, "cope", {"clip_low_n": 3}) for arch in ARCHS] + [
    ("llama", "hardclip", {"clip_low_n": 2}),
    ("qwen2", "prope", {"p": 0.25}),
    ("gemma3_text", "cope", {"clip_low_n": 3, "layers": "all"}),
    ("qwen3", "rope", {"rope_theta": 5e5, "scaling": "yarn", "factor": 4.0}),
    ("llama", "cope", {"clip_low_n": 3, "rope_theta": 1e6, "scaling": "yarn", "factor": 4.0}),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    ids = random_ids(2, 30)
    out = []
    for i, (arch, scheme, options) in enumerate(CASES):
        model = hf_posenc.patch_model(tiny_model(arch), scheme, **options)
        model.save_pretrained(root / f"patched{i}")
        with torch.no_grad():
            out.append((root / f"patched{i}", model, model(ids).logits))
    return root, ids, out


def test_round_trip_in_a_fresh_process_gives_identical_logits(saved, tmp_path):
    _, ids, cases = saved
    results = load_in_fresh_process([d for d, _, _ in cases], ids, tmp_path, plugin=True)
    for (d, model, expected), (arch, scheme, _) in zip(cases, CASES):
        r = results[str(d)]
        assert "error" not in r, r
        assert r["class"] == type(model).__name__ and r["class"].endswith("PosencForCausalLM")
        assert torch.equal(torch.load(d / "logits.pt"), expected), (arch, scheme)
        config = json.loads((d / "config.json").read_text())
        assert config["model_type"] == "hf_posenc_" + arch
        assert config["hf_posenc"]["scheme"] == scheme and config["hf_posenc"]["format_version"] == FORMAT_VERSION


def test_without_hf_posenc_loading_fails_and_never_falls_back_to_rope(saved, tmp_path):
    _, ids, cases = saved
    results = load_in_fresh_process([d for d, _, _ in cases], ids, tmp_path, plugin=False)
    for (d, _, _), (arch, _, _) in zip(cases, CASES):
        error = results[str(d)].get("error", "")
        assert f"model type `hf_posenc_{arch}`" in error, results[str(d)]


EXACT = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}  # default base (and stock types): bitwise; CoPE over YaRN: float rounding


def test_export_stock_loads_without_hf_posenc_with_identical_logits(saved, tmp_path):
    root, ids, cases = saved
    dirs = [hf_posenc.export_stock(model, root / f"stock{i}") for i, (_, model, _) in enumerate(cases)]
    results = load_in_fresh_process(dirs, ids, tmp_path, plugin=False)
    for i, (d, (_, model, expected)) in enumerate(zip(dirs, cases)):
        r = results[str(d)]
        assert "error" not in r, r
        assert not r["class"].endswith("PosencForCausalLM")
        got = torch.load(d / "logits.pt")
        if i in EXACT:
            assert torch.equal(got, expected), CASES[i]
        else:
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        scheme = CASES[i][1]
        rope = r["rope"].get("full_attention", r["rope"])
        expected_type = {"cope": "longrope", "hardclip": "longrope", "prope": "proportional", "rope": "yarn"}[scheme]
        assert rope["rope_type"] == expected_type


def test_export_refuses_what_stock_transformers_cannot_express(tmp_path):
    with pytest.raises(ValueError, match="carries no hf-posenc scheme"):
        hf_posenc.export_stock(tiny_model("llama"), tmp_path / "a")
    dynamic = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2, scaling="dynamic", factor=2.0)
    with pytest.raises(ValueError, match="no stock Transformers equivalent"):
        hf_posenc.export_stock(dynamic, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda r: r.update(format_version=FORMAT_VERSION + 1), "newer than the format"),
        (lambda r: r.update(scheme="warp-rope"), "does not know"),
        (lambda r: r["options"].update(clip_low_n=-4), "clip_low_n must be >= 0"),
    ],
)
def test_checkpoints_this_version_cannot_honour_are_clear_errors(tmp_path, edit, match):
    from transformers import AutoModelForCausalLM

    hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config["hf_posenc"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        AutoModelForCausalLM.from_pretrained(tmp_path)
