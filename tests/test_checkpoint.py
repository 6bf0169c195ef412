"""Checkpoint format: save/load in a fresh process, loading without hf-posenc, and export for stock Transformers."""

import json
import shutil
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
    ("llama", "tapa", {"backend": "chunked", "alpha": 0.5}),  # remote code carries the chunked CPU path too
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


@pytest.mark.upstream
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


@pytest.mark.upstream
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
        (lambda r: r.update(scheme="warp-rope"), r"'warp-rope', which is not registered here.*import or run that first"),
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


# -- the scheme is written twice in config.json: the two copies must agree on load ----------------------------------
def _edited_checkpoint(tmp_path, scheme, options, edit):
    hf_posenc.patch_model(tiny_model("llama"), scheme, **options).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.upstream
@pytest.mark.parametrize(
    "scheme, options, edit, match",
    [  # each edit ran silently before: a model computing one scheme while get_scheme / info report another
        ("cope", {"clip_low_n": 3}, lambda c: c["rope_parameters"].update(clip_low_n=5),
         r"implies rope_parameters clip_low_n = 3, but rope_parameters holds clip_low_n = 5"),
        ("cope", {"clip_low_n": 3}, lambda c: c["hf_posenc"]["options"].update(clip_low_n=7),
         r"implies rope_parameters clip_low_n = 7, but rope_parameters holds clip_low_n = 3"),
        ("prope", {"p": 0.5}, lambda c: c["rope_parameters"].update(partial_rotary_factor=0.75),
         r"partial_rotary_factor = 0.5, but rope_parameters holds partial_rotary_factor = 0.75"),
        ("rope", {"scaling": "yarn", "factor": 2.0}, lambda c: c["rope_parameters"].update(rope_type="linear"),
         r"rope_type = 'yarn', but rope_parameters holds rope_type = 'linear'"),
        ("cope", {"clip_low_n": 3}, lambda c: c.pop("hf_posenc"),
         r"rope type\(s\) \['cope'\] of hf-posenc, but no 'hf_posenc' entry"),
    ],
    ids=["rope_parameters edited", "record edited", "p-RoPE edited", "base type edited", "record deleted"],
)
def test_a_config_whose_record_and_rope_parameters_disagree_is_refused_naming_both(tmp_path, scheme, options, edit,
                                                                                   match):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = _edited_checkpoint(tmp_path, scheme, options, edit)
    with pytest.raises(ValueError, match=match):
        AutoModelForCausalLM.from_pretrained(path)
    with pytest.raises(ValueError, match=match):  # what get_scheme and `hf-posenc info` read
        AutoConfig.from_pretrained(path)


@pytest.mark.upstream
def test_patching_a_stock_export_is_refused_naming_its_source_unless_composed(tmp_path):
    """A stock export writes CoPE as longrope factors; patching it with CoPE again tapered the low frequencies twice
    (silently), so it is refused with the way out, and compose=True stacks them on purpose."""
    from transformers import AutoModelForCausalLM

    patched = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3)
    patched.save_pretrained(tmp_path / "patched")
    patched = AutoModelForCausalLM.from_pretrained(tmp_path / "patched")
    hf_posenc.export_stock(patched, tmp_path / "stock")
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "stock")
    ids = random_ids(1, 20)
    before = stock(ids).logits.detach()
    with pytest.raises(ValueError, match=r"stock export of hf-posenc, written from .*patched with scheme 'cope'.*"
                                         r"Load the hf-posenc checkpoint it was exported from.*compose=True"):
        hf_posenc.patch_model(stock, "cope", clip_low_n=3)
    assert hf_posenc.get_scheme(stock) is None and torch.equal(stock(ids).logits, before)  # left unchanged
    composed = hf_posenc.patch_model(stock, "cope", clip_low_n=3, compose=True)
    inv = composed.model.rotary_emb.inv_freq
    single = patched.model.rotary_emb.inv_freq
    # tapered twice, as asked: the taper over the lowest three frequencies is (1, 1/2, 0)
    assert torch.equal(inv[:-2], single[:-2]) and torch.allclose(inv[-2], single[-2] / 2) and inv[-1] == 0


# -- adapters cannot load onto the wrong base ------------------------------------------------------------------------
def _tape_over_cope(**overrides):
    return hf_posenc.patch_model(tiny_model("llama", **overrides), "tape", frequencies={"scheme": "cope", "clip_low_n": 3})


# The base each adapter is trained on, and bases it must refuse with (part of) the message that says why.
ADAPTER_BASES = {
    "tape over cope": (_tape_over_cope, {
        "unpatched": (lambda: tiny_model("llama"), r"modules \['tape'\] are missing from the base.*Fix: patch the base "
                      r"first: `hf_posenc.patch_model\(base, 'tape', frequencies=\{'scheme': 'cope', 'layers': "
                      r"'global', 'clip_low_n': 3\}\)`"),
        "another scheme": (lambda: hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3),
                           r"scheme: adapter 'tape', base 'cope'.*replace=True\)`"),
        "plain tape": (lambda: hf_posenc.patch_model(tiny_model("llama"), "tape"),
                       r"differ in options.frequencies: adapter \{'scheme': 'cope'.*\}, base None"),
        "other frequencies": (lambda: hf_posenc.patch_model(tiny_model("llama"), "tape",
                                                            frequencies={"scheme": "cope", "clip_low_n": 2}),
                              r"options.frequencies.clip_low_n: adapter 3, base 2"),
        "another base model": (lambda: _tape_over_cope(rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                               r"original_rope_parameters.rope_theta: adapter 10000.0, base 500000.0.*another base "
                               r"model: load the one the adapter was trained on"),
    }),
    "cope": (lambda: hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3), {
        "unpatched": (lambda: tiny_model("llama"),
                      r"scheme: adapter 'cope', base none \(unpatched\).*`hf_posenc.patch_model\(base, 'cope', "
                      r"clip_low_n=3\)`"),
        "other options": (lambda: hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2),
                          r"options.clip_low_n: adapter 3, base 2"),
    }),
}


def _peft_load_adapter(base, path):
    """``PeftModel.load_adapter``: a second adapter on a PeftModel already wrapping the base."""
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]), adapter_name="first")
    wrapped.load_adapter(path, adapter_name="trained")
    wrapped.set_adapter("trained")
    return wrapped


def _transformers_load_adapter(base, path):
    base.load_adapter(str(path))
    return base


def _adapter_loaders():
    from peft import PeftModel

    from hf_posenc.adapters import load_adapter

    return {"PeftModel.from_pretrained": PeftModel.from_pretrained, "model.load_adapter": _transformers_load_adapter,
            "hf_posenc.adapters.load_adapter": load_adapter, "PeftModel.load_adapter": _peft_load_adapter}


def _hand_written_lora():
    """A LoRA config as TRL's and PEFT's docs write one: no scheme modules named."""
    from peft import LoraConfig

    return LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")


def _wrap(base, writer):
    """``base`` with a LoRA adapter, as ``writer`` builds it."""
    import peft

    from hf_posenc.adapters import lora_config

    if writer in ("save_adapter", "hf-posenc train"):
        return peft.get_peft_model(base, lora_config(base, r=2))
    trains_own_modules = bool(hf_posenc.get_scheme(base).trainable_modules)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if writer == "PeftModel.save_pretrained":
            wrapped = peft.get_peft_model(base, _hand_written_lora())
        else:  # Transformers' own adapter API
            base.add_adapter(_hand_written_lora())
            wrapped = base
    said = [str(w.message) for w in caught if "hf-posenc:" in str(w.message)]
    assert len(said) == int(trains_own_modules), said  # once, and only where a module was left frozen
    assert all("modules_to_save" in m and "exclude_modules=['tape']" in m for m in said)
    return wrapped


def _write_adapter(kind, writer, path):
    """Train-by-perturbation an adapter on the ``kind`` base and save it as ``writer`` does; returns its logits."""
    pytest.importorskip("peft")
    from hf_posenc.adapters import save_adapter
    from hf_posenc.training.trainer import save_output

    base = ADAPTER_BASES[kind][0]()
    wrapped = _wrap(base, writer)
    own = hf_posenc.get_scheme(base).trainable_modules
    trained = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert all(any(f".{m}." in n for n in trained) for m in own), trained  # every scheme module trains
    for p in wrapped.parameters():
        if p.requires_grad:
            p.data.add_(torch.randn_like(p) * 0.2)
    if writer == "save_adapter":  # what hf_posenc.push_to_hub publishes
        save_adapter(wrapped, path)
    elif writer == "hf-posenc train":
        save_output(wrapped, path)
    else:  # PEFT's or Transformers' own save (the Trainer's and TRL's save_model)
        wrapped.save_pretrained(path)
    with torch.no_grad():
        return wrapped(random_ids(2, 20)).logits


ADAPTER_WRITERS = ["save_adapter", "hf-posenc train", "PeftModel.save_pretrained", "model.add_adapter"]


@pytest.mark.parametrize("r", [2, 0])
def test_lora_config_trains_the_scheme_modules_itself(r):
    """hf-posenc's own configs name the scheme's modules (with r=0 as with LoRA): wrapping needs no rescue."""
    import peft

    from hf_posenc.adapters import lora_config

    base = _tape_over_cope()
    config = lora_config(base, r=r)
    assert config.modules_to_save == ["tape"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft.get_peft_model(base, config)
    assert not [w for w in caught if "hf-posenc:" in str(w.message)]

@pytest.mark.parametrize("how", ["lora_config(scheme_modules=False)", "exclude_modules", "loaded for inference"])
def test_a_scheme_module_kept_frozen_on_purpose_stays_frozen_without_a_word(tmp_path, how):
    """The scheme-module rule adds only what a config leaves frozen by omission: an ablation that excludes TAPE's
    blocks, and an adapter loaded for inference, are left as they are."""
    import peft

    from hf_posenc.adapters import lora_config, save_adapter

    base = _tape_over_cope()
    if how == "lora_config(scheme_modules=False)":
        config = lora_config(base, r=2, scheme_modules=False)
    elif how == "exclude_modules":
        config = _hand_written_lora()
        config.exclude_modules = ["tape"]
    else:
        save_adapter(peft.get_peft_model(_tape_over_cope(), lora_config(_tape_over_cope(), r=2,
                                                                        scheme_modules=False)), tmp_path / "a")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "loaded for inference":
            wrapped = peft.PeftModel.from_pretrained(base, tmp_path / "a")
        else:
            wrapped = peft.get_peft_model(base, config)
    assert not [w for w in caught if "hf-posenc:" in str(w.message)]
    assert not wrapped.peft_config["default"].modules_to_save
    assert not [n for n, p in wrapped.named_parameters() if p.requires_grad and ".tape." in n]


@pytest.mark.parametrize("writer", ADAPTER_WRITERS)
@pytest.mark.parametrize("kind", list(ADAPTER_BASES))
def test_every_adapter_loader_refuses_a_wrong_base_naming_the_fix_and_accepts_the_right_one(tmp_path, kind, writer):
    expected = _write_adapter(kind, writer, tmp_path / "adapter")
    record = json.loads((tmp_path / "adapter" / "hf_posenc_adapter.json").read_text())["hf_posenc"]
    assert record == hf_posenc.patching.scheme_record(ADAPTER_BASES[kind][0]()).to_dict()
    assert not (tmp_path / "adapter" / "hf_posenc_scheme.json").exists()  # one adapter record, not two
    right, wrong = ADAPTER_BASES[kind]
    for name, load in _adapter_loaders().items():
        for case, (make, match) in wrong.items():
            base = make()
            state = {k: v.clone() for k, v in base.state_dict().items()}
            with pytest.raises(ValueError, match=match) as info:
                load(base, tmp_path / "adapter")
            assert "hf_posenc_adapter.json" not in str(info.value) and "unguard_peft" in str(info.value)
            assert not hasattr(base, "peft_config") or list(base.peft_config) == ["first"], (name, case)
            after = base.state_dict() if name != "PeftModel.load_adapter" else state  # first adapter's own layers
            assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state), (name, case)
        loaded = load(right(), tmp_path / "adapter").eval()
        with torch.no_grad():
            got = loaded(random_ids(2, 20)).logits
        # The trained model's weights require grad and the loaded ones do not: CPU matmul may take another path.
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_loading_from_an_adapter_folder_and_the_opt_out(tmp_path, monkeypatch):
    """``AutoModelForCausalLM.from_pretrained(adapter_dir)`` loads the base it names, then the adapter, checked;
    ``unguard_peft`` (or HF_POSENC_GUARD_PEFT=0 at import) restores PEFT's unchecked loading."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from hf_posenc import adapters

    expected = _write_adapter("tape over cope", "save_adapter", tmp_path / "adapter")
    _tape_over_cope().save_pretrained(tmp_path / "right-base")
    hf_posenc.patch_model(tiny_model("llama"), "tape").save_pretrained(tmp_path / "wrong-base")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "wrong-base")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="options.frequencies: adapter"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")
    config["base_model_name_or_path"] = str(tmp_path / "right-base")
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()(random_ids(2, 20)).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    adapters.unguard_peft()
    try:
        assert not getattr(peft.PeftModel.from_pretrained.__func__, "_hf_posenc_guard", False)
        loaded = peft.PeftModel.from_pretrained(tiny_model("llama"), tmp_path / "adapter")  # wrong base, no word
        with torch.no_grad():
            assert (loaded(random_ids(2, 20)).logits - expected).abs().max() > 1e-2  # what the check prevents
        with pytest.raises(ValueError, match="base none"):  # the explicit loader checks regardless
            adapters.load_adapter(tiny_model("llama"), tmp_path / "adapter")
        monkeypatch.setenv("HF_POSENC_GUARD_PEFT", "0")
        hf_posenc._guard_peft()  # what `import hf_posenc` runs
        assert not getattr(peft.PeftModel.from_pretrained.__func__, "_hf_posenc_guard", False)
        monkeypatch.setenv("HF_POSENC_GUARD_PEFT", "1")
        hf_posenc._guard_peft()
        assert peft.PeftModel.from_pretrained.__func__._hf_posenc_guard
    finally:
        adapters.guard_peft()
    with pytest.raises(ValueError, match="base none"):
        peft.PeftModel.from_pretrained(tiny_model("llama"), tmp_path / "adapter")


def test_an_adapter_record_is_read_from_a_hub_repository(tmp_path, monkeypatch):
    """A Hub id goes through the Hub cache (here filled by hand, offline): the record is fetched like the weights."""
    peft = pytest.importorskip("peft")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    _write_adapter("cope", "save_adapter", tmp_path / "adapter")
    commit = "0" * 40
    repo = tmp_path / "cache" / "models--me--cope-adapter"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(tmp_path / "adapter", repo / "snapshots" / commit)
    hub = {"cache_dir": str(tmp_path / "cache"), "local_files_only": True}
    with pytest.raises(ValueError, match=r"scheme: adapter 'cope', base none"):
        peft.PeftModel.from_pretrained(tiny_model("llama"), "me/cope-adapter", **hub)
    base = hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=3)
    assert isinstance(peft.PeftModel.from_pretrained(base, "me/cope-adapter", **hub), peft.PeftModel)
