"""``export_gguf`` files run in a real llama.cpp (llama-cpp-python, built from source) give the patched model's outputs.

Skipped only when llama.cpp is absent; ``scripts/serving/setup_llamacpp.sh`` installs it (about 5 minutes to build on
2 cores). The SmolLM2 measurements over every scheme and quantisation are ``scripts/serving/llamacpp_compare.py``
(``benchmarks/results/serving-llamacpp-*.json``).
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import hf_posenc
from hf_posenc.gguf_export import export_gguf

ROOT = Path(__file__).resolve().parents[1]
CONVERTER = ROOT / "build" / "llama-cpp-python" / "llama.cpp"
sys.path.insert(0, str(ROOT / "scripts" / "serving"))

from reference import compare, llamacpp_outputs, model_outputs, prompt_windows  # noqa: E402
import outside_scheme  # noqa: E402
from test_gguf_export import smollm2_tokenizer  # noqa: E402,F401  (fixture)
from tiny import tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or not (CONVERTER / "convert_hf_to_gguf.py").is_file(),
    reason="llama.cpp is not installed: run scripts/serving/setup_llamacpp.sh (builds llama-cpp-python from source "
           "and unpacks llama.cpp's converter)",
)

# float32 file, float32 KV cache: llama.cpp and Transformers differ only in summation order and sin/cos rounding
# (measured up to 6e-6 on these tiny models).
F32_TOLERANCE = 1e-4
SCHEMES = [
    ("cope", dict(clip_low_n=3)),
    ("hardclip", dict(clip_low_n=2)),
    ("prope", dict(p=0.5)),
    ("rope", dict(scaling="yarn", factor=4.0)),
    ("rope", dict(scaling="llama3", factor=8.0, original_max_position_embeddings=64)),
    ("cope", dict(clip_low_n=3, rope_theta=1e5, scaling="yarn", factor=4.0)),
]


def _prompts(count=2, length=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 20000, (length,), generator=g).tolist() for _ in range(count)]


@pytest.mark.parametrize("scheme, options", SCHEMES, ids=[f"{s}-{'-'.join(map(str, o.values()))}" for s, o in SCHEMES])
def test_f32_export_runs_the_scheme_in_llama_cpp(tmp_path, smollm2_tokenizer, scheme, options):
    # larger weights than the default init, so that the scheme moves the outputs far beyond the tolerance
    kw = dict(vocab_size=len(smollm2_tokenizer), initializer_range=0.15)
    model = hf_posenc.patch_model(tiny_model("llama", **kw), scheme, **options)
    plain = tiny_model("llama", **kw)  # the same weights with plain RoPE
    prompts = _prompts()
    path = export_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=smollm2_tokenizer, llama_cpp=CONVERTER)
    got = llamacpp_outputs(path, prompts, max_tokens=1, n_ctx=256)
    same = compare(model_outputs(model, prompts, 1), got)
    other = compare(model_outputs(plain, prompts, 1), got)
    assert same["max_abs_dlogprob"] <= F32_TOLERANCE, same
    assert other["max_abs_dlogprob"] > 100 * F32_TOLERANCE, other  # the scheme is what llama.cpp ran


# Quantised CoPE files against Transformers in float32 (measured on 3 prompts of 400 tokens: f16 0.998 top-1 agreement,
# Q8_0 0.964, Q4_K_M 0.866; held-out perplexity vs f16 1.006 and 1.036). Greedy continuations of quantised files
# leave the float32 ones at near ties (one prompt's first token has a log-prob gap of 0.01), so the check is the
# teacher-forced top-1 agreement and the mean |Δ log p|.
QUANTIZED = {"f16": (0.99, 0.01), "q8_0": (0.93, 0.12), "q4_k_m": (0.80, 0.40)}


@pytest.mark.slow
def test_smollm2_quantized_exports_keep_the_scheme_and_the_predictions(tmp_path, monkeypatch, capfd):
    """Also: f16 needs only the converter ``setup_llamacpp.sh --converter`` unpacks (found with no flag or variable,
    llama.cpp's bindings out of reach), and Q4_K_M prints one summary line instead of the quantizer's log."""
    import gguf
    import numpy as np

    from hf_posenc import gguf_export
    from hf_posenc.gguf_export import ROPE_FREQS, gguf_rope_parameters
    from hf_posenc.models import load_smollm2

    assert gguf_export.DEFAULT_LLAMA_CPP == CONVERTER  # where the setup script unpacks it
    monkeypatch.delenv("HF_POSENC_LLAMA_CPP", raising=False)
    model, tokenizer = load_smollm2(dtype=torch.float32)
    hf_posenc.patch_model(model, "cope")
    prompts = prompt_windows(tokenizer, count=2, length=300)
    reference = model_outputs(model, prompts, 1)
    for quant, (min_agreement, max_mean_delta) in QUANTIZED.items():
        capfd.readouterr()
        if quant == "f16":
            with monkeypatch.context() as without_bindings:
                without_bindings.setitem(sys.modules, "llama_cpp", None)
                path = export_gguf(model, tmp_path / f"{quant}.gguf", quant, tokenizer=tokenizer)
        else:
            path = export_gguf(model, tmp_path / f"{quant}.gguf", quant, tokenizer=tokenizer, llama_cpp=CONVERTER)
        out, err = capfd.readouterr()  # file descriptors 1 and 2: what llama.cpp's C code prints included
        if quant == "q4_k_m":
            summary = [line for line in err.splitlines() if line.startswith("llama.cpp's quantizer: ")]
            others = [line for line in err.splitlines() if line.strip() and line not in summary
                      and not line.lstrip("\r").startswith("Writing model shards")]
            assert out == "" and len(summary) == 1 and others == [], err[-3000:]
            assert "MiB (f16) -> " in summary[0] and "MiB (Q4_K_M)" in summary[0]
        freqs = next(t for t in gguf.GGUFReader(path).tensors if t.name == ROPE_FREQS)
        assert np.array_equal(np.asarray(freqs.data), gguf_rope_parameters(model)[0].numpy()), quant  # kept, F32
        got = compare(reference, llamacpp_outputs(path, prompts, 1))
        assert got["top1_agreement"] >= min_agreement and got["mean_abs_dlogprob"] <= max_mean_delta, (quant, got)


@pytest.mark.parametrize("mode", outside_scheme.MODES)
def test_a_scheme_registered_outside_the_package_runs_in_llama_cpp(tmp_path_factory, mode):
    """docs/architecture.md's HalfConfig (every frequency halved), registered in a script run as `__main__` or in a
    module of its own, exported to GGUF in that user's process: llama.cpp's greedy tokens are the patched model's."""
    out, printed = outside_scheme.user_run(mode, tmp_path_factory)
    got = llamacpp_outputs(out / "half.gguf", printed["prompts"], max_tokens=8, n_ctx=256)
    same, other = compare(printed["outputs"], got), compare(printed["plain"], got)
    assert same["greedy_identical"] and same["max_abs_dlogprob"] <= F32_TOLERANCE, same
    assert other["max_abs_dlogprob"] > 100 * F32_TOLERANCE, other  # the scheme is what llama.cpp ran


def test_a_mistral_model_with_cope_exports_to_f16_and_llama_cpp_gives_its_greedy_tokens(tmp_path, smollm2_tokenizer):
    """llama.cpp converts Mistral checkpoints to its `llama` architecture, which reads `rope_freqs`: a Mistral-shaped
    model (random weights, SmolLM2's vocabulary) with CoPE, written as f16, generates the patched model's greedy
    tokens in llama.cpp (Transformers runs the same f16-rounded weights in float32)."""
    from transformers import AutoModelForCausalLM, MistralConfig

    from tiny import COMMON

    def mistral():
        torch.manual_seed(0)
        config = MistralConfig(**{**COMMON, "vocab_size": len(smollm2_tokenizer), "initializer_range": 0.15,
                                  "sliding_window": None})
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        return model.half().float()  # the weights the f16 file holds

    model = hf_posenc.patch_model(mistral(), "cope", clip_low_n=6)  # 6 of 8 pairs: far beyond f16's rounding
    assert model.config.model_type == "hf_posenc_mistral"
    prompts = _prompts()
    path = export_gguf(model, tmp_path / "mistral.gguf", "f16", tokenizer=smollm2_tokenizer, llama_cpp=CONVERTER)
    got = llamacpp_outputs(path, prompts, max_tokens=8, n_ctx=256)
    same, other = compare(model_outputs(model, prompts, 8), got), compare(model_outputs(mistral(), prompts, 8), got)
    # measured: f16 rounding moves the prompt log-probs by up to 0.0044, plain RoPE by 0.84 (and its greedy tokens)
    assert same["greedy_identical"] and same["max_abs_dlogprob"] < 0.02, same
    assert not other["greedy_identical"] and other["max_abs_dlogprob"] > 0.2, other  # CoPE is what llama.cpp ran
