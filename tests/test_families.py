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
from family_matrix import check_family, input_ids, logits, stock_model, universe
from fresh import jobs_for, load_in_fresh_process
from hf_posenc.patches import FamilyRefused, adapter_for
from hf_posenc.patches.table import SCHEMES, load_table, verified_types

TABLE = load_table()
SAME_VERSION = TABLE["transformers_version"] == transformers.__version__
FREQUENCY = ("cope", "hardclip", "prope", "rope")
# Saved and exported in one process, loaded in another: GQA, sliding window, MoE, partial rotary, QK-norm,
# per-layer-type rotary.
FRESH_SAMPLE = ("mistral", "olmo2", "qwen3_moe", "phi3", "glm4", "gemma3_text", "granite")


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


def test_table_verifies_at_least_80_families_per_frequency_scheme_and_gives_every_other_cell_a_reason():
    for scheme in FREQUENCY:
        assert len(verified_types(scheme)) >= 80, (scheme, len(verified_types(scheme)))
    for model_type, row in TABLE["families"].items():
        assert set(row) == set(SCHEMES), model_type
        for scheme, entry in row.items():
            assert entry["status"] in ("verified", "refused", "untested"), (model_type, scheme)
            assert (entry["status"] == "verified") == ("reason" not in entry), (model_type, scheme, entry)


@pytest.mark.parametrize("model_type", sorted(TABLE["families"]))
def test_family_checks_give_its_table_row(model_type):
    """Identity settings bitwise; frequencies by the papers' formulas on the rotated dimensions; cached greedy
    generation equal to the full forward; save/load and the stock export with the same logits; TAPA and TAPE where
    verified; refusals with patch_model's reason."""
    if not SAME_VERSION:
        pytest.skip("support table of another Transformers version")
    assert check_family(model_type) == TABLE["families"][model_type]


def test_saved_and_exported_families_load_in_a_fresh_process(tmp_path):
    ids = input_ids()
    patched_dirs, stock_dirs, expected = [], [], {}
    for model_type in FRESH_SAMPLE:
        model = hf_posenc.patch_model(stock_model(model_type), "cope", layers="all", clip_low_n=4)
        out = logits(model, ids)
        patched, stock = tmp_path / model_type / "patched", tmp_path / model_type / "stock"
        model.save_pretrained(patched)
        hf_posenc.export_stock(model, stock)
        patched_dirs.append(patched)
        stock_dirs.append(stock)
        expected[model_type] = out
    plugin = load_in_fresh_process(jobs_for(patched_dirs, "plugin"), ids, tmp_path, "plugin")
    plain = load_in_fresh_process(jobs_for(stock_dirs, "stock"), ids, tmp_path, "stock")
    for model_type, patched, stock in zip(FRESH_SAMPLE, patched_dirs, stock_dirs):
        for results, directory, tag, cls in ((plugin, patched, "plugin", "PosencForCausalLM"),
                                             (plain, stock, "stock", "ForCausalLM")):
            out = str(directory / f"logits-{tag}.pt")
            assert "error" not in results[out], (model_type, results[out])
            assert results[out]["class"].endswith(cls), (model_type, results[out]["class"])
            if tag == "stock":
                assert "Posenc" not in results[out]["class"], results[out]["class"]
            torch.testing.assert_close(torch.load(out), expected[model_type], rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{model_type} {tag}: {m}")


def test_refusals_name_the_reason_and_the_families_that_work():
    with pytest.raises(FamilyRefused, match=r"'gpt2'.*(no rotary|rope_parameters).*verified.*mistral"):
        adapter_for("gpt2")
    with pytest.raises(FamilyRefused, match=r"'nonexistent_type'.*not a model type"):
        adapter_for("nonexistent_type")
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


def test_readme_embeds_the_generated_table():
    from pathlib import Path

    from hf_posenc.patches.table import format_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert format_table(TABLE, markdown=True) in readme, "README's table is stale: paste `hf-posenc families --markdown`"
