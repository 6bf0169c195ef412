"""TAPA's phase regime (eq. 12 at distance 1): the measure against the reference's scores, the cold regime of a
Llama-initialised model, the from-scratch start in the paper's regime (a scale folded into the phase half of q and
k, the amplitude half untouched), the recipe's ``scheme.init`` and ``hf-posenc diagnose``'s ``phase_regime``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.diagnostics import phase_regime
from hf_posenc.kernels.tapa.args import validate_tapa_args
from hf_posenc.kernels.tapa.naive import tapa_scores
from hf_posenc.schemes import make_scheme
from hf_posenc.schemes.tapa.phase import initial_phase_medians, phase_at_distance_1, start_phase_regime
from hf_posenc.training.config import RecipeError, load_recipe

sys.path.insert(0, str(Path(__file__).parent))
from tiny import tiny_config  # noqa: E402


def _tapa(arch: str = "llama", seed: int = 0, phase: str = "quadratic", **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides)).eval()
    with pytest.warns(UserWarning, match="needs training"):
        hf_posenc.patch_model(model, scheme="tapa", phase=phase)
    return model


@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_the_phase_at_distance_1_is_the_cosine_argument_of_eq_12(phase):
    """cos(phase_at_distance_1) equals the reference's score at |m − n| = 1 divided by its amplitude factor, on
    fresh random queries and keys (float64)."""
    torch.manual_seed(1)
    D, amp = 16, 8
    q, k = torch.randn(1, 1, 2, D, dtype=torch.float64) * 2, torch.randn(1, 1, 2, D, dtype=torch.float64) * 2
    args = validate_tapa_args(q, k, k, alpha=0.1, theta=0.5, phase=phase, causal=False)
    scores = tapa_scores(q, k, args, torch.float64)[0, 0]  # [2, 2]: (1, 0) is at distance 1
    amplitude = (q[0, 0, 1, :amp] @ k[0, 0, 0, :amp]) / math.sqrt(amp)
    measured = phase_at_distance_1(q[0, 0, 1], k[0, 0, 0], amp, phase)
    torch.testing.assert_close(scores[1, 0] / amplitude, torch.cos(measured), rtol=1e-12, atol=1e-12)


def test_a_llama_initialised_model_starts_cold_as_the_width_predicts():
    """Weights at normal(0, σ), width d: the phase at distance 1 has a standard deviation of about 2π·d·σ², so a
    median magnitude of about 0.674 × that (0.11 rad at d = 64, σ = 0.02)."""
    for d, sigma in ((64, 0.02), (128, 0.05)):
        model = _tapa(hidden_size=d, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      initializer_range=sigma)
        predicted = 0.6745 * 2 * math.pi * d * sigma**2
        for median in initial_phase_medians(model, 16, samples=4096):
            assert median == pytest.approx(predicted, rel=0.2)


@pytest.mark.parametrize("arch,phase", [("llama", "quadratic"), ("llama", "linear"), ("qwen3", "quadratic")])
def test_the_hot_start_reaches_its_target_and_leaves_the_amplitude_half(arch, phase):
    """Every layer's median reaches the target; the amplitude half of q and k (and the values) are unchanged, so
    only the phase of eq. 12 moves; Qwen3's per-head norms carry the scale (its projections would be normalised)."""
    model = _tapa(arch, phase=phase)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    start = make_scheme("tapa", phase=phase).initialise_from_scratch(model, phase_at_distance_1=7.0)
    record = start["phase_at_distance_1"]
    # Llama's init is cold; Qwen3's per-head norms give q and k unit components, a phase of a few radians already
    assert record["target"] == 7.0 and all(b < 1.0 if arch == "llama" else 1.0 < b < 7.0 for b in record["before"])
    assert record["after"] == pytest.approx([7.0] * len(record["after"]), rel=1e-4)
    assert initial_phase_medians(model, 8, phase) == pytest.approx(record["after"], rel=1e-6)
    changed = sorted(n for n, p in model.named_parameters() if not torch.equal(p, before[n]))
    where = ("q_norm", "k_norm") if arch == "qwen3" else ("q_proj", "k_proj")
    assert changed and all(any(w in n for w in where) for n in changed), changed
    for name in changed:
        new, old = dict(model.named_parameters())[name], before[name]
        rows = new.view(-1, 16, *new.shape[1:]) if new.dim() > 1 else new.view(-1, 16)
        old_rows = old.view_as(rows)
        assert torch.equal(rows[:, :8], old_rows[:, :8])  # the amplitude half (θ = 0.5 of head dim 16)
        assert not torch.equal(rows[:, 8:], old_rows[:, 8:])


def test_layer_zero_phases_on_a_text_scale_exactly_with_the_start():
    """phase_regime on a text: in the first layer (whose inputs the start does not change) every phase scales by
    target / median exactly; a model that is not TAPA has no phase term and says so."""
    ids = torch.randint(0, 128, (1, 96), generator=torch.Generator().manual_seed(3))
    cold = phase_regime(_tapa(), ids, layers=[0], name="cold")
    hot_model = _tapa()
    record = start_phase_regime(hot_model, 5.0, 8)
    hot = phase_regime(hot_model, ids, layers=[0], window=40, name="hot")  # windows of 40: 39 pairs each, 3 windows
    ratio = 5.0 / record["before"][0]
    assert cold.applies and cold.pairs == 95 and hot.pairs == 39 + 39 + 15  # pairs never cross a window
    full = phase_regime(hot_model, ids, layers=[0], window=1024)
    assert full.median_phase_at_distance_1 == pytest.approx(cold.median_phase_at_distance_1 * ratio, rel=1e-4)
    assert full.step_1_to_2 == pytest.approx((2**0.1 - 1) * full.median_phase_at_distance_1)
    torch.manual_seed(0)
    rope = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    other = phase_regime(rope, ids)
    assert not other.applies and other.median_phase_at_distance_1 is None and other.to_dict()["scheme"] is None


def test_the_text_measure_pairs_each_query_with_the_previous_key():
    """The median phase of head 0 in layer 1 equals |2π·c_P·q_P(m)·k_P(m − 1)| over the text's adjacent pairs,
    computed here from the projections' outputs (GQA: head 0 reads key head 0)."""
    model = _tapa()
    start_phase_regime(model, 4.0, 8)
    ids = torch.randint(0, 128, (1, 50), generator=torch.Generator().manual_seed(5))
    seen = {}
    attn = model.model.layers[1].self_attn
    hooks = [getattr(attn, f"{kind}_proj").register_forward_hook(
        lambda _m, _i, out, kind=kind: seen.__setitem__(kind, out.detach().double())) for kind in ("q", "k")]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    q, k = seen["q"][0, :, 8:16], seen["k"][0, :, 8:16]  # head 0's phase half (head dim 16, θ = 0.5)
    expected = (2 * math.pi / math.sqrt(8) * (q[1:] * k[:-1]).sum(-1)).abs().median()
    measured = phase_regime(model, ids, layers=[1], heads=[0])
    assert measured.per_head[0][0] == pytest.approx(float(expected), rel=1e-5)
    assert measured.pairs == 49


def _scratch_recipe(tmp_path: Path, scheme: dict, **model) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(60)]
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                            bos_token="<s>").save_pretrained(tmp_path / "tok")
    (tmp_path / "corpus.txt").write_text(" ".join(words[(i * 7) % 60] for i in range(600)))
    section = model or {"config": {"model_type": "llama", "vocab_size": len(vocab), "hidden_size": 32,
                                   "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                   "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64},
                        "tokenizer": str(tmp_path / "tok")}
    return {"model": section, "scheme": scheme, "context_length": 32, "data": {"files": [str(tmp_path / "corpus.txt")]},
            "peft": {"enabled": False},
            "training": {"max_steps": 2, "learning_rate": 1e-3, "per_device_train_batch_size": 2, "use_cpu": True,
                         "disable_tqdm": True, "save_steps": 10},
            "output": {"dir": str(tmp_path / "out")}}


def test_a_recipe_starts_tapa_in_the_phase_regime_and_records_it(tmp_path):
    from hf_posenc.training.trainer import SCHEME_INIT_FILE, run_training

    recipe = load_recipe(data=_scratch_recipe(tmp_path, {"name": "tapa", "init": {"phase_at_distance_1": 6.0}}))
    assert recipe.scheme.init == {"phase_at_distance_1": 6.0} and recipe.scheme.options == {}
    assert recipe.to_dict()["scheme"]["init"] == {"phase_at_distance_1": 6.0}
    with pytest.warns(UserWarning):
        result = run_training(recipe)
    record = json.loads((Path(result.output_dir) / SCHEME_INIT_FILE).read_text())["phase_at_distance_1"]
    assert record["target"] == 6.0 and record["after"] == pytest.approx([6.0, 6.0], rel=1e-4)
    assert all(b < 0.5 for b in record["before"])
    trained = AutoModelForCausalLM.from_pretrained(result.model_dir)
    assert min(initial_phase_medians(trained, 8)) > 3.0  # two small steps keep the hot start


@pytest.mark.parametrize("scheme,model,message", [
    ({"name": "tapa", "init": {"phase_at_distance_1": 6.0}}, {"path": "some/pretrained"},
     "initialises a model trained from scratch .*remove scheme.init"),
    ({"name": "tapa", "init": {"phase": 6.0}}, {}, r"unknown from-scratch init option\(s\) \['phase'\] .*"
                                                   r"phase_at_distance_1"),
    ({"name": "tapa", "init": {"phase_at_distance_1": -1}}, {}, "must be a number of radians > 0"),
    ({"name": "cope", "init": {"phase_at_distance_1": 6.0}}, {}, "it has no from-scratch initialisation"),
    ({"name": "tapa", "init": 6.0}, {}, "recipe key 'scheme.init': invalid dict value"),
])
def test_bad_scheme_init_is_refused_naming_the_fix(tmp_path, scheme, model, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(data=_scratch_recipe(tmp_path, scheme, **model))
