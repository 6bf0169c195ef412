"""Checkpoint format: save/load in a fresh process, loading without hf-posenc, and export for stock Transformers."""

import json
import warnings

import pytest
import torch

import hf_posenc
from hf_posenc.record import FORMAT_VERSION
from fresh import jobs_for, load_in_fresh_process
from tiny import ARCHS, random_ids, tiny_model

CASES = [(arch, "cope", {"clip_low_n": 3}) for arch in ARCHS] + [
    ("llama", "hardclip", {"clip_low_n": 2}),
    ("qwen2", "prope", {"p": 0.25}),
    ("gemma3_text", "cope", {"clip_low_n": 3, "layers": "all"}),
    ("qwen3", "rope", {"rope_theta": 5e5, "scaling": "yarn", "factor": 4.0}),
    ("llama", "cope", {"clip_low_n": 3, "rope_theta": 1e6, "scaling": "yarn", "factor": 4.0}),
    ("qwen3", "tapa", {"backend": "reference"}),
    ("gemma3_text", "tape", {"hidden": 8}),
    ("llama", "tape", {"frequencies": {"scheme": "cope", "clip_low_n": 3}}),
]
STOCK = {"cope": "longrope", "hardclip": "longrope", "prope": "proportional", "rope": "yarn"}
EXACT_STOCK = set(range(10))  # default base (and stock types): bitwise; index 10, CoPE over YaRN: float rounding


def _perturb_tape(model):
    from hf_posenc.schemes.tape import TapeBlock

    g = torch.Generator().manual_seed(0)
    for block in (m for m in model.modules() if isinstance(m, TapeBlock)):
        for p in block.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    ids = random_ids(2, 30)
    out = []
    for i, (arch, scheme, options) in enumerate(CASES):
        layer_types = {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2}
        model = tiny_model(arch, **(layer_types if (arch, scheme) == ("gemma3_text", "tape") else {}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TAPA's "needs training" warning
            model = _perturb_tape(hf_posenc.patch_model(model, scheme, **options))
        model.save_pretrained(root / f"patched{i}")
        with torch.no_grad():
            out.append((root / f"patched{i}", model, model(ids).logits))
    return root, ids, out


@pytest.mark.parametrize("mode", ["plugin", "remote"])
def test_round_trip_in_a_fresh_process_gives_identical_logits(saved, tmp_path, mode):
    """plugin: `import hf_posenc` then from_pretrained; remote: no hf-posenc, trust_remote_code=True."""
    _, ids, cases = saved
    jobs = jobs_for([d for d, _, _ in cases], mode, [c[1] for c in CASES])
    results = load_in_fresh_process(jobs, ids, tmp_path, mode)
    for (d, model, expected), (arch, scheme, _) in zip(cases, CASES):
        r = results[str(d / f"logits-{mode}.pt")]
        assert "error" not in r, r
        assert r["class"] == type(model).__name__ and r["class"].endswith("PosencForCausalLM")
        assert ("transformers_modules" in r["module"]) == (mode == "remote")
        assert torch.equal(torch.load(d / f"logits-{mode}.pt"), expected), (arch, scheme, mode)
        config = json.loads((d / "config.json").read_text())
        assert config["model_type"] == "hf_posenc_" + arch
        assert config["hf_posenc"]["scheme"] == scheme and config["hf_posenc"]["format_version"] == FORMAT_VERSION
        assert config["auto_map"]["AutoModelForCausalLM"].startswith("hf_posenc_remote.")


def test_without_hf_posenc_loading_fails_and_never_falls_back_to_rope(saved, tmp_path):
    _, ids, cases = saved
    jobs = jobs_for([d for d, _, _ in cases], "stock", [c[1] for c in CASES])
    results = load_in_fresh_process(jobs, ids, tmp_path, "stock")
    for d, _, _ in cases:
        error = results[str(d / "logits-stock.pt")].get("error", "")
        assert "contains custom code" in error and "trust_remote_code=True" in error, error


def test_export_stock_loads_without_hf_posenc_with_identical_logits(saved, tmp_path):
    root, ids, cases = saved
    exportable = [i for i, case in enumerate(CASES) if case[1] in STOCK]
    dirs = [hf_posenc.export_stock(cases[i][1], root / f"stock{i}") for i in exportable]
    results = load_in_fresh_process(jobs_for(dirs, "stock"), ids, tmp_path, "stock")
    for i, d in zip(exportable, dirs):
        r = results[str(d / "logits-stock.pt")]
        assert "error" not in r, r
        assert not r["class"].endswith("PosencForCausalLM")
        got, expected = torch.load(d / "logits-stock.pt"), cases[i][2]
        if i in EXACT_STOCK:
            assert torch.equal(got, expected), CASES[i]
        else:
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        rope = r["rope"].get("full_attention", r["rope"])
        assert rope["rope_type"] == STOCK[CASES[i][1]]
        assert "auto_map" not in json.loads((d / "config.json").read_text())


def test_tape_adapter_restores_exactly_on_a_base_loaded_any_way(tmp_path):
    peft = pytest.importorskip("peft")
    from hf_posenc.adapters import lora_config, save_adapter

    ids = random_ids(2, 30)
    base = hf_posenc.patch_model(tiny_model("qwen3"), "tape")
    base.save_pretrained(tmp_path / "base")
    wrapped = peft.get_peft_model(base, lora_config(base, r=2))
    for p in wrapped.parameters():
        if p.requires_grad:
            p.data.add_(torch.randn_like(p) * 0.2)
    save_adapter(wrapped, tmp_path / "adapter")
    with torch.no_grad():
        expected = wrapped(ids).logits
    for mode in ("plugin", "remote"):
        job = jobs_for([tmp_path / "base"], f"adapter-{mode}", adapter=str(tmp_path / "adapter"))
        result = load_in_fresh_process(job, ids, tmp_path, mode)[job[0]["out"]]
        assert "error" not in result, result
        assert torch.equal(torch.load(job[0]["out"]), expected), mode


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
