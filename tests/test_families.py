"""Every rotary causal-LM type of Transformers against hf-posenc's schemes (tiny random configs; tests/family_matrix.py
holds the checks). Each family's checks must give exactly its row of the committed support table
(hf_posenc/data/families.json, written by scripts/families_table.py from the same checks), so the table that
`hf-posenc families` prints and the README embeds cannot drift from what the tests find."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers

import hf_posenc
from family_matrix import RELOAD_ATOL, check_family, input_ids, logits, patched_for_round_trip, stock_model, universe
from fresh import jobs_for, load_in_fresh_process
from gguf_matrix import check_gguf
from hf_posenc.families import FamilyRefused, family_for
from hf_posenc.families.table import GGUF, SCHEMES, gguf_types, load_table, verified_types

TABLE = load_table()
SAME_VERSION = TABLE["transformers_version"] == transformers.__version__
FREQUENCY = ("cope", "hardclip", "prope", "rope")


@pytest.fixture(autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_table_covers_every_rotary_causal_lm_of_this_transformers():
    if not SAME_VERSION:
        pytest.skip(f"table written with Transformers {TABLE['transformers_version']}, running "
                    f"{transformers.__version__}: regenerate it with scripts/families_table.py")
    assert sorted(TABLE["families"]) == universe()
    assert TABLE["schemes"] == list(SCHEMES)


def test_table_verifies_at_least_80_families_per_frequency_scheme_and_refuses_every_other_cell_with_a_reason():
    for scheme in FREQUENCY:
        assert len(verified_types(scheme)) >= 80, (scheme, len(verified_types(scheme)))
    for model_type, row in TABLE["families"].items():
        assert set(row) == set(SCHEMES) | {GGUF}, model_type
        for scheme, entry in row.items():
            # none silently untested: a type the tiny-config builder cannot build needs an EXTRA entry or a refusal
            assert entry["status"] in ("verified", "refused"), (model_type, scheme, entry)
            assert (entry["status"] == "verified") == ("reason" not in entry), (model_type, scheme, entry)


# The six families of the mission: their rows must hold on any Transformers release the package allows (the
# upstream lane checks them on the newest); the rest of the table is the locked release's.
MISSION = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=pytest.mark.upstream) if t in MISSION else t
                                        for t in sorted(TABLE["families"])])
def test_family_checks_give_its_table_row(model_type):
    """Identity settings bitwise; frequencies by the papers' formulas on the rotated dimensions; cached greedy
    generation equal to the full forward; save/load and the stock export with the same logits; TAPA and TAPE where
    verified; refusals with patch_model's reason."""
    if not SAME_VERSION and model_type not in MISSION:
        pytest.skip(f"support table of Transformers {TABLE['transformers_version']}, this is "
                    f"{transformers.__version__} (the six families of the mission are checked on any release)")
    assert {**check_family(model_type), GGUF: check_gguf(model_type)} == TABLE["families"][model_type]


def test_the_gguf_column_exports_every_family_llama_cpp_converts_to_an_architecture_reading_rope_freqs():
    """The GGUF column against hf_posenc/data/llama_cpp.json (generated from llama.cpp's source): a family is
    verified exactly when its patched model (CoPE) is and its architecture converts to one that reads rope_freqs
    with one rotary setting for every layer (Mistral and Mixtral convert to `llama`)."""
    from hf_posenc.gguf_export import llama_cpp_table

    llama_cpp = llama_cpp_table()
    assert {"llama", "mistral", "mixtral"} <= set(gguf_types(TABLE))
    for model_type in gguf_types(TABLE):
        family = family_for(model_type)
        arch = llama_cpp["converter"][family.stock_model_class.__name__]
        assert TABLE["families"][model_type][GGUF]["arch"] == arch and arch in llama_cpp["rope_freqs_architectures"]
        assert TABLE["families"][model_type]["cope"]["status"] == "verified"


def _fresh_jobs() -> list[tuple[str, str]]:
    """(model type, scheme) of every verified cell whose checkpoint a fresh process loads: CoPE for the frequency
    schemes (saved and exported), TAPA and TAPE (saved)."""
    families = TABLE["families"]
    return [(t, s) for s in ("cope", "tapa", "tape") for t in sorted(families)
            if families[t][s]["status"] == "verified"]


def test_every_verified_family_loads_in_a_fresh_process(tmp_path):
    """Saved (and, for CoPE, exported to plain Transformers) in this process, loaded in a new one: every verified
    family of the table, with the logits of the model that was saved."""
    if not SAME_VERSION:
        pytest.skip("support table of another Transformers version")
    ids = input_ids()
    patched, patched_schemes, stock, expected = [], [], [], {}
    for model_type, scheme in _fresh_jobs():
        model = patched_for_round_trip(stock_model(model_type), scheme)
        expected[(model_type, scheme)] = logits(model, ids)
        root = tmp_path / model_type / scheme
        model.save_pretrained(root / "patched")
        patched.append(root / "patched")
        patched_schemes.append(scheme)
        if scheme == "cope":
            hf_posenc.export_stock(model, root / "stock")
            stock.append(root / "stock")
    plugin = load_in_fresh_process(jobs_for(patched, "plugin", patched_schemes), ids, tmp_path, "plugin")
    plain = load_in_fresh_process(jobs_for(stock, "stock"), ids, tmp_path, "stock")
    checked = 0
    for results, directories, tag, suffix in ((plugin, patched, "plugin", "PosencForCausalLM"),
                                              (plain, stock, "stock", "ForCausalLM")):
        for directory in directories:
            model_type, scheme = directory.parent.parent.name, directory.parent.name
            out = str(directory / f"logits-{tag}.pt")
            assert "error" not in results[out], (model_type, scheme, tag, results[out])
            assert results[out]["class"].endswith(suffix), (model_type, results[out]["class"])
            assert tag == "plugin" or "Posenc" not in results[out]["class"], results[out]["class"]
            # a fresh process may sum MoE experts in another order than the saving one (see RELOAD_ATOL)
            torch.testing.assert_close(torch.load(out), expected[(model_type, scheme)], rtol=1e-5,
                                       atol=10 * RELOAD_ATOL, msg=lambda m: f"{model_type} {scheme} {tag}: {m}")
            checked += 1
    assert checked == len(patched) + len(stock) > 150


def test_refusals_name_the_reason_and_the_families_that_work():
    with pytest.raises(FamilyRefused, match=r"'gpt2'.*(no rotary|rope_parameters).*verified.*mistral"):
        family_for("gpt2")
    with pytest.raises(FamilyRefused, match=r"'nonexistent_type'.*not a model type"):
        family_for("nonexistent_type")
    model = stock_model("gemma2")
    assert model.config.attn_logit_softcapping is not None
    before = copy.deepcopy(model.config.to_dict())
    with pytest.raises(ValueError, match=r"soft-capping.*attn_logit_softcapping = None"):
        hf_posenc.patch_model(model, "tapa")
    assert model.config.to_dict() == before  # a refused patch leaves the model as it was
    with pytest.raises(FamilyRefused, match=r"moshi.*depth decoder.*hf-posenc families"):
        hf_posenc.patch_model(stock_model("moshi"), "cope")


def test_partial_rotary_counts_the_rotated_pairs():
    """Phi rotates half of each head: CoPE's clip_low_n counts the rotated frequency pairs, and a count above them
    is refused with the number."""
    model = stock_model("phi")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    pairs = int(head_dim * model.config.rope_parameters["partial_rotary_factor"]) // 2
    assert pairs < head_dim // 2
    with pytest.raises(ValueError, match=rf"exceeds the model's {pairs} RoPE frequencies"):
        hf_posenc.patch_model(copy.deepcopy(model), "cope", clip_low_n=pairs + 1)
    hf_posenc.patch_model(model, "cope", clip_low_n=pairs)


def test_docs_embed_the_generated_table():
    from pathlib import Path

    from hf_posenc.families.table import format_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text()
    assert format_table(TABLE, markdown=True) in page, \
        "docs/families.md's table is stale: paste `hf-posenc families --markdown`"


def test_the_export_page_lists_the_gguf_families_of_the_table():
    from pathlib import Path

    from hf_posenc.families.table import format_gguf_families

    page = (Path(__file__).resolve().parents[1] / "docs" / "export-and-serving.md").read_text()
    assert format_gguf_families(TABLE) in " ".join(page.split()), \
        "docs/export-and-serving.md's GGUF families are stale: paste hf_posenc.families.table.format_gguf_families()"
