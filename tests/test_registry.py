"""The scheme registry: one `register_scheme` call per scheme, and what is derived from it (SCHEMES, make_scheme,
the Transformers registrations, the patched configs' rope validators, the checkpoint remote code)."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import hf_posenc
from hf_posenc import remote_code
from hf_posenc.schemes import REGISTRY, ROPE_TYPES, SCHEMES, RopeType, make_scheme, registry
from hf_posenc.schemes.base import FrequencySchemeConfig, head_dim
import outside_scheme
from tiny import random_ids, tiny_model


def test_every_scheme_is_registered_once_by_its_own_package():
    assert list(SCHEMES) == ["rope", "cope", "hardclip", "prope", "tapa", "tape"]
    for name, scheme in REGISTRY.items():
        assert scheme.config is SCHEMES[name] and scheme.config.name == name
        assert scheme.package == f"hf_posenc.schemes.{'cope' if name == 'hardclip' else name}"
    assert set(ROPE_TYPES) == {"cope", "cope_dynamic", "hardclip", "hardclip_dynamic"}
    assert {s.attention.name for s in REGISTRY.values() if s.attention} == {"hf_posenc_tapa", "hf_posenc_tape"}
    with pytest.raises(ValueError, match="already registered by hf_posenc.schemes.tapa"):
        registry.register_scheme(SCHEMES["tapa"])
    with pytest.raises(TypeError, match="SchemeConfig subclass"):
        registry.register_scheme(dict)
    with pytest.raises(TypeError, match="RopeType"):
        registry.register_scheme(_HalfConfig, rope_types={"test_half": _half_init})
    with pytest.raises(TypeError, match="AttentionFunctions"):
        registry.register_scheme(_HalfConfig, attention=_half_init)
    assert "test_half" not in SCHEMES and "test_half" not in ROPE_TYPES  # a refused call registers nothing


@dataclass(frozen=True)
class _HalfConfig(FrequencySchemeConfig):
    """A scheme from outside the package: halves every frequency through its own rope type."""

    name: ClassVar[str] = "test_half"
    paper: ClassVar[str] = "none (test)"
    rope_type: ClassVar[str] = "test_half"

    def rope_parameters(self, model_params, head_dim, max_position_embeddings):
        return {"rope_type": self.rope_type, "rope_theta": model_params["rope_theta"]}


def _half_init(config, device=None, seq_len=None, layer_type=None):
    dim = head_dim(config)
    return 0.5 / config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, device=device).float() / dim), 1.0


def _validate_half(config, rope_parameters, ignore_keys=None):
    if "rope_theta" not in rope_parameters:
        raise KeyError("test_half needs rope_theta")


@pytest.fixture
def half_scheme():
    """Registers the test scheme for one test and takes it out again (the registry is process-wide)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hf_posenc.families.base import PosencConfigMixin

    scheme = registry.register_scheme(_HalfConfig, rope_types={"test_half": RopeType(_half_init, _validate_half)})
    yield scheme
    del REGISTRY["test_half"], SCHEMES["test_half"], ROPE_TYPES["test_half"], ROPE_INIT_FUNCTIONS["test_half"]
    delattr(PosencConfigMixin, "_validate_test_half_rope_parameters")


def test_a_registered_scheme_is_usable_by_name_with_no_other_edit(half_scheme):
    """register_scheme is the only step (after `import hf_posenc`): patch_model finds it by name, Transformers gets
    its rope type and the patched config validates it."""
    from hf_posenc.families.base import PosencConfigMixin
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert ROPE_INIT_FUNCTIONS["test_half"] is _half_init
    assert PosencConfigMixin._validate_test_half_rope_parameters is _validate_half
    assert isinstance(make_scheme("test_half"), _HalfConfig) and "test_half" in SCHEMES
    ids = random_ids(1, 12)
    stock = tiny_model("llama")
    patched = hf_posenc.patch_model(tiny_model("llama"), "test_half")
    assert patched.config.rope_parameters["rope_type"] == "test_half"
    half, full = patched.model.rotary_emb.inv_freq, stock.model.rotary_emb.inv_freq
    assert torch.equal(half, full / 2)
    with torch.no_grad():
        assert not torch.allclose(patched(ids).logits, stock(ids).logits, atol=1e-3)


def test_a_registered_scheme_is_refused_where_every_scheme_is(half_scheme):
    """OVERRIDES refusing every scheme of a family cover a scheme registered from outside the package too: it was
    patched silently on phimoe (its rotary module reads LongRoPE's mscales, which the scheme's rope type lacks) and
    moshi (its cached generation differs from its full forward even unpatched), where CoPE is refused."""
    from family_matrix import stock_model
    from hf_posenc.families import EVERY_SCHEME, OVERRIDES, FamilyRefused, family_for, family_refusal

    assert {"phimoe", "moshi"} <= {t for t, o in OVERRIDES.items() if EVERY_SCHEME in o.get("refusals", {})}
    for model_type in ("phimoe", "moshi"):
        family = family_for(model_type)
        assert family_refusal(family, "test_half") == family_refusal(family, "cope") is not None
        model = stock_model(model_type)
        for scheme in ("cope", "test_half"):
            with pytest.raises(FamilyRefused, match=f"{scheme} cannot be applied to model type '{model_type}': "):
                hf_posenc.patch_model(model, scheme)
        assert hf_posenc.get_scheme(model) is None


@pytest.mark.parametrize("source, match", [
    ("from ..kernels.tapa import x\n", "outside `try`, but it is declared optional"),
    ("try:\n    from ..kernels.other import x\nexcept ImportError:\n    x = None\n",
     "inside `try`: declare it in remote_code.OPTIONAL"),
])
def test_the_optional_modules_of_the_remote_code_are_declared_and_imported_inside_try(tmp_path, monkeypatch,
                                                                                      source, match):
    """Which modules stay out of a checkpoint's remote code is the declared list remote_code.OPTIONAL, and each is
    imported only inside `try` (where the remote code may lack it); either slip is refused when bundling."""
    (tmp_path / "schemes").mkdir()
    (tmp_path / "schemes" / "probe.py").write_text(source)
    monkeypatch.setattr(remote_code, "_ROOT", tmp_path)
    with pytest.raises(RuntimeError, match=match):
        remote_code.bundle(["schemes.probe"])
    (tmp_path / "schemes" / "probe.py").write_text("try:\n    from ..kernels.tapa import x\nexcept ImportError:\n    pass\n")
    assert remote_code.bundle(["schemes.probe"]) == ("schemes.probe",)


def test_an_edited_module_is_bundled_as_it_reads_now(tmp_path, monkeypatch):
    """What a module imports is parsed once per version of its source (every save bundles the same modules): an
    edit between two saves changes the bundle at once."""
    (tmp_path / "schemes").mkdir()
    (tmp_path / "schemes" / "probe.py").write_text("from .other import x\n")
    (tmp_path / "schemes" / "other.py").write_text("x = 1\n")
    monkeypatch.setattr(remote_code, "_ROOT", tmp_path)
    assert remote_code.bundle(["schemes.probe"]) == ("schemes.other", "schemes.probe")
    (tmp_path / "schemes" / "probe.py").write_text("x = 2\n")
    assert remote_code.bundle(["schemes.probe"]) == ("schemes.probe",)


def test_the_remote_bundle_is_derived_from_the_registry():
    modules = remote_code.bundle()
    for scheme in REGISTRY.values():
        assert scheme.package.removeprefix("hf_posenc.") in modules
    assert "families.base" in modules and "schemes.registry" in modules
    assert "kernels.tapa.chunked" in modules  # imported outside `try`: the CPU path travels
    assert not [m for m in modules if m in ("kernels.tapa", "kernels.tape", "kernels._triton")
                or "triton" in m]  # imported inside `try` only: the Triton kernels stay out
    # a package that is not registered (nor imported by one that is) does not travel
    assert "hub" not in modules and "training" not in modules
    assert remote_code.bundle(["schemes.rope"]) == ("schemes.base", "schemes.registry", "schemes.rope")


def test_written_remote_code_imports_only_its_own_files_or_optional_installed_ones(tmp_path):
    model = hf_posenc.patch_model(tiny_model("llama"), "tapa", backend="reference")
    model.save_pretrained(tmp_path)
    files = {p.stem for p in tmp_path.glob("*.py")}
    assert files == {remote_code.ENTRY} | {remote_code.flat_name(m) for m in remote_code.bundle()}
    optional = 0
    for path in tmp_path.glob("*.py"):
        source = path.read_text()
        for target in re.findall(r"^\s*from\s+\.(\S+)\s+import", source, flags=re.MULTILINE):  # Transformers' rule
            assert target in files, (path.name, target)
        tree = ast.parse(source)
        tries = [n for n in ast.walk(tree) if isinstance(n, ast.Try)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hf_posenc"):
                optional += 1
                assert any(node in ast.walk(t) for t in tries), (path.name, node.lineno)  # only inside `try`
    assert optional == 2  # TAPA's and TAPE's Triton entry points


def test_a_module_the_flattener_cannot_rewrite_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "schemes" / "bad"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\n")
    (pkg / "sub.py").write_text("X = 1\n")
    (pkg / "absolute.py").write_text("import hf_posenc.record\n")
    monkeypatch.setattr(remote_code, "_ROOT", tmp_path)
    with pytest.raises(RuntimeError, match=r"write `from \.<submodule> import <names>`"):
        remote_code.bundle(["schemes.bad"])
    with pytest.raises(RuntimeError, match="imports hf_posenc absolutely"):
        remote_code.bundle(["schemes.bad.absolute"])


def test_scheme_configs_stay_plain_frozen_dataclasses():
    for cls in SCHEMES.values():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_the_docs_scheme_from_outside_gets_its_refusals_and_its_table_column(tmp_path):
    """docs/architecture.md's "Adding a scheme" block, saved as a module of its own: the family table regenerated
    with it (scripts/families_table.py --import) has its column, verified on llama (patched, finite, cached
    generation equal to the full forward) and refused on phimoe with CoPE's reason (every scheme is refused there)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    page = (repo / "docs" / "architecture.md").read_text()
    block = re.search(r"```python\n(# half_scheme\.py.*?)```", page, re.S).group(1)
    (tmp_path / "half_scheme.py").write_text(block)
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{repo}"}
    done = subprocess.run([sys.executable, str(repo / "scripts" / "families_table.py"), "--only", "llama", "phimoe",
                           "--import", "half_scheme", "--out", str(tmp_path / "families.json")],
                          env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stdout.decode()[-2000:] + done.stderr.decode()[-2000:]
    table = json.loads((tmp_path / "families.json").read_text())
    assert "half" in table["schemes"] and set(table["schemes"]) >= set(SCHEMES)
    assert table["families"]["llama"]["half"] == {"status": "verified"}
    assert table["families"]["phimoe"]["half"]["status"] == "refused"
    assert table["families"]["phimoe"]["half"]["reason"] == table["families"]["phimoe"]["cope"]["reason"]
    from hf_posenc.families.table import format_table

    assert "| half |" in format_table(table, markdown=True).splitlines()[0] + "|"


def test_the_docs_scheme_from_outside_saves_and_exports_for_stock_transformers(tmp_path, tmp_path_factory):
    """Registered in a script (module `__main__`, no package) or in a module of its own: every save works (the
    remote code carries hf-posenc's schemes), and export_stock writes per-dimension factors (longrope, all 2: the
    frequencies halved) that plain Transformers, in a fresh process without hf-posenc, runs with identical logits."""
    import json

    from fresh import jobs_for, load_in_fresh_process

    runs = {mode: outside_scheme.user_run(mode, tmp_path_factory) for mode in outside_scheme.MODES}
    for out, printed in runs.values():
        assert printed["package"] == ""  # neither __main__ nor a top-level module has a package
        for saved in ("patched", "cope"):
            assert (out / saved / f"{remote_code.ENTRY}.py").is_file()
        rope = json.loads((out / "stock" / "config.json").read_text())["rope_parameters"]
        assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"] == [2.0] * 8
    ids = torch.load(runs["__main__"][0] / "ids.pt")
    dirs = [out / "stock" for out, _ in runs.values()]
    results = load_in_fresh_process(jobs_for(dirs, "stock"), ids, tmp_path, "stock")
    for out, _ in runs.values():
        got = results[str(out / "stock" / "logits-stock.pt")]
        assert "error" not in got and got["class"] == "LlamaForCausalLM", got
        want = torch.load(out / "logits.pt")
        assert torch.equal(torch.load(out / "stock" / "logits-stock.pt"), want)
        assert not torch.equal(torch.load(out / "plain.pt"), want)  # the scheme is what was exported


def test_a_rope_type_named_dynamic_must_declare_it():
    """Transformers recomputes a rope type whose name contains "dynamic" with the sequence length; export reads
    `RopeType.dynamic`, so the two cannot disagree."""
    with pytest.raises(ValueError, match=r"test_half_dynamic.*declare RopeType\(\.\.\., dynamic=True\)"):
        registry.register_scheme(_HalfConfig, rope_types={"test_half_dynamic": RopeType(_half_init, _validate_half)})
    assert "test_half" not in SCHEMES and "test_half_dynamic" not in ROPE_TYPES
    assert ROPE_TYPES["cope_dynamic"].dynamic and not ROPE_TYPES["cope"].dynamic


def test_export_reads_the_registry_for_a_scheme_from_outside(half_scheme, tmp_path):
    """A static rope type registered from outside: per-dimension factors for stock Transformers (longrope) and for
    llama.cpp (rope_freqs), exactly 2 (each frequency halved: Transformers' float32 default frequencies over the
    patched ones), with no scheme name in the export modules."""
    from hf_posenc.export import stock_config
    from hf_posenc.gguf_export import gguf_rope_parameters

    model = hf_posenc.patch_model(tiny_model("llama"), "test_half")
    rope = stock_config(model).rope_parameters
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"] == [2.0] * 8
    factors, attention_factor, _ = gguf_rope_parameters(model)
    assert torch.equal(factors, torch.full((8,), 2.0)) and attention_factor == 1.0


@dataclass(frozen=True)
class _GrowingConfig(_HalfConfig):
    """A scheme from outside whose frequencies depend on the sequence length (declared dynamic)."""

    name: ClassVar[str] = "test_growing"
    rope_type: ClassVar[str] = "test_growing_dynamic"


def test_a_dynamic_rope_type_from_outside_is_refused_by_both_exports_naming_the_scheme(tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hf_posenc.families.base import PosencConfigMixin

    registry.register_scheme(_GrowingConfig, rope_types={
        "test_growing_dynamic": RopeType(_half_init, _validate_half, dynamic=True)})
    try:
        model = hf_posenc.patch_model(tiny_model("llama"), "test_growing")
        why = ("scheme 'test_growing' uses rope type 'test_growing_dynamic', whose frequencies change with the "
               "sequence length")
        with pytest.raises(ValueError, match=why + ".*no stock Transformers equivalent"):
            hf_posenc.export_stock(model, tmp_path / "stock")
        with pytest.raises(ValueError, match="export_gguf: " + why):
            hf_posenc.export_gguf(model, tmp_path / "m.gguf", tokenizer=object(), llama_cpp=tmp_path)
        assert os.listdir(tmp_path) == []
    finally:
        del REGISTRY["test_growing"], SCHEMES["test_growing"], ROPE_TYPES["test_growing_dynamic"]
        del ROPE_INIT_FUNCTIONS["test_growing_dynamic"]
        delattr(PosencConfigMixin, "_validate_test_growing_dynamic_rope_parameters")


def test_a_scheme_defined_in_a_script_has_no_package_and_leaves_the_remote_code_alone(monkeypatch):
    """A config class whose module has no package (`__main__` of a script or a notebook): registered with package
    "", and the remote code (hf-posenc's own schemes) is bundled as before instead of failing on None."""
    import sys
    import types

    script = types.ModuleType("a_users_script")  # as `__main__` of `python script.py`: __package__ is None
    assert script.__package__ is None
    monkeypatch.setitem(sys.modules, "a_users_script", script)
    config = dataclass(frozen=True)(type("ScriptConfig", (FrequencySchemeConfig,), {
        "__module__": "a_users_script", "__annotations__": {"name": ClassVar[str], "paper": ClassVar[str]},
        "name": "test_script", "paper": "-"}))
    before = remote_code.bundle()
    scheme = registry.register_scheme(config)
    try:
        assert scheme.package == ""
        assert remote_code.bundle() == before
    finally:
        del REGISTRY["test_script"], SCHEMES["test_script"]
