"""``export_gguf`` without a llama.cpp runtime: the ``rope_freqs`` factors, the GGUF rewrite read back with the ``gguf``
package's reader, the refusals, and (when llama.cpp's converter is unpacked) a full export read back.
Running the files in llama.cpp is ``test_serving_llamacpp.py``."""

import importlib.util
import json
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import hf_posenc
from hf_posenc import gguf_export
from hf_posenc.gguf_export import ROPE_FREQS, SCHEME_KEY, add_rope_freqs, export_gguf, gguf_rope_parameters
from hf_posenc.schemes.cope import STOCK_INF_FACTOR, taper_factors
from tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]
CONVERTER = ROOT / "build" / "llama-cpp-python" / "llama.cpp"
SETUP = "run bash scripts/serving/setup_llamacpp.sh --converter (unpacks llama.cpp's converter, installs sentencepiece)"
CONVERTER_SETUP = "bash scripts/serving/setup_llamacpp.sh --converter"

SCHEMES = [
    ("rope", {}),
    ("rope", {"rope_theta": 1e6}),
    ("rope", {"scaling": "linear", "factor": 2.0}),
    ("rope", {"scaling": "yarn", "factor": 4.0}),
    ("rope", {"scaling": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}),
    ("cope", {"clip_low_n": 3}),
    ("hardclip", {"clip_low_n": 2}),
    ("prope", {"p": 0.5}),
    ("prope", {"p": 0.75, "scaling": "linear", "factor": 2.0}),
    ("cope", {"clip_low_n": 3, "rope_theta": 1e6, "scaling": "yarn", "factor": 4.0}),
    ("hardclip", {"clip_low_n": 2, "scaling": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}),
]


def _ids(scheme, options):
    return f"{scheme}-" + "-".join(f"{v}" for v in options.values())


@pytest.mark.parametrize("scheme, options", SCHEMES, ids=[_ids(*c) for c in SCHEMES])
def test_rope_freqs_turn_llama_cpps_frequencies_into_the_patched_ones(scheme, options):
    model = hf_posenc.patch_model(tiny_model("llama"), scheme, **options)
    factors, attention_factor, theta = gguf_rope_parameters(model)
    rotary = model.model.rotary_emb
    head_dim = model.config.head_dim
    # llama.cpp: θ_i = b^(−2i/d) / f_i (rope_freqs), scaled cos/sin by the attention factor
    llama_cpp_theta = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim) / factors.double()
    assert factors.dtype == torch.float32 and factors.shape == (head_dim // 2,)
    zero = rotary.inv_freq == 0
    assert torch.all(factors[zero] == STOCK_INF_FACTOR) and torch.all(llama_cpp_theta[zero] < 1e-38)
    torch.testing.assert_close(llama_cpp_theta[~zero], rotary.inv_freq[~zero].double(), rtol=1e-6, atol=0)
    assert attention_factor == pytest.approx(rotary.attention_scaling, rel=1e-12)
    if scheme == "rope" and "scaling" not in options:
        assert torch.equal(factors, torch.ones(head_dim // 2))  # llama.cpp's own frequencies, untouched
    if scheme == "cope" and "scaling" not in options:  # the paper's taper, f = 1/w (cope-clipped-rope eq. 10)
        torch.testing.assert_close(factors, taper_factors(head_dim // 2, 3).clamp(max=STOCK_INF_FACTOR).float(),
                                   rtol=1e-6, atol=0)
    if options.get("scaling") == "yarn":
        assert attention_factor == pytest.approx(0.1 * math.log(4.0) + 1.0)


def _tiny_gguf(path):
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_block_count(2)
    writer.add_string("general.name", "tiny")
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_array("tokenizer.ggml.token_type", [1, 3, 1])
    g = np.random.default_rng(0)
    tensors = {"token_embd.weight": g.standard_normal((3, 8)).astype(np.float32),
               "blk.0.attn_q.weight": g.standard_normal((8, 8)).astype(np.float16)}
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def _fields(reader):
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


@pytest.mark.parametrize("attention_factor", [1.0, 1.1386])
def test_add_rope_freqs_copies_the_file_and_adds_the_tensor(tmp_path, attention_factor):
    tensors = _tiny_gguf(tmp_path / "a.gguf")
    factors = torch.tensor([1.0, 1.5, 40.0, STOCK_INF_FACTOR])
    add_rope_freqs(tmp_path / "a.gguf", tmp_path / "b.gguf", factors, attention_factor, {"scheme": "cope"})
    before, after = gguf.GGUFReader(tmp_path / "a.gguf"), gguf.GGUFReader(tmp_path / "b.gguf")
    added = _fields(after)
    assert json.loads(added.pop(SCHEME_KEY)) == {"scheme": "cope"}
    if attention_factor != 1.0:
        assert added.pop("llama.rope.scaling.attn_factor") == pytest.approx(attention_factor, rel=1e-6)
    assert added == _fields(before)
    got = {t.name: t for t in after.tensors}
    for name, data in tensors.items():
        assert got[name].tensor_type == before.tensors[[t.name for t in before.tensors].index(name)].tensor_type
        assert np.array_equal(np.asarray(got[name].data).reshape(data.shape), data)
    freqs = got[ROPE_FREQS]
    assert freqs.tensor_type == gguf.GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(freqs.data), factors.numpy().astype(np.float32))
    with pytest.raises(ValueError, match="already has a rope_freqs"):
        add_rope_freqs(tmp_path / "b.gguf", tmp_path / "c.gguf", factors, 1.0, {})


def _refusals():
    return [
        (lambda: tiny_model("llama"), {}, ValueError, "carries no hf-posenc scheme"),
        (lambda: hf_posenc.patch_model(tiny_model("llama"), "tapa", backend="reference"), {}, ValueError,
         "changes attention itself"),
        (lambda: hf_posenc.patch_model(tiny_model("llama"), "tape"), {}, ValueError, "changes attention itself"),
        (lambda: hf_posenc.patch_model(tiny_model("llama"), "cope", clip_low_n=2, scaling="dynamic", factor=2.0), {},
         ValueError, "change with the sequence length"),
        (lambda: hf_posenc.patch_model(tiny_model("llama"), "rope", scaling="dynamic", factor=2.0), {},
         ValueError, "change with the sequence length"),
        (lambda: hf_posenc.patch_model(tiny_model("qwen2"), "cope", clip_low_n=2), {}, ValueError,
         "'qwen2' architecture, which does not read"),
        (lambda: hf_posenc.patch_model(tiny_model("gemma3_text"), "prope"), {}, ValueError,
         "'gemma3' architecture, which does not read"),
        (lambda: hf_posenc.patch_model(tiny_model("llama"), "cope"), {"quantization": "q3_k"}, ValueError,
         "quantization must be one of"),
        (lambda: hf_posenc.patch_model(tiny_model("llama"), "cope"), {"tokenizer": None}, ValueError,
         "pass tokenizer="),
    ]


REFUSAL_IDS = ["unpatched", "tapa", "tape", "cope-dynamic", "rope-dynamic", "qwen2", "gemma3", "quantization",
               "no-tokenizer"]


@pytest.mark.filterwarnings("ignore:tapa replaces how attention scores are computed")
@pytest.mark.parametrize("build, kwargs, error, match", _refusals(), ids=REFUSAL_IDS)
def test_what_llama_cpp_cannot_express_is_refused_before_anything_is_written(tmp_path, build, kwargs, error, match):
    kwargs = {"tokenizer": object(), "llama_cpp": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        export_gguf(build(), tmp_path / "out.gguf", **kwargs)
    assert os.listdir(tmp_path) == []


def _tiny(model_type):
    """A tiny stock model of a family the suite's `tiny` module does not build (Mistral, Mixtral, Phi-3...)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tiny import COMMON

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **COMMON)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("model_type", ["mistral", "mixtral"])
def test_families_llama_cpp_converts_to_its_llama_architecture_export(model_type):
    """llama.cpp's converter writes Mistral and Mixtral checkpoints as its `llama` architecture, which reads
    `rope_freqs` (hf_posenc/data/llama_cpp.json, generated from its source): they export like Llama."""
    model = hf_posenc.patch_model(_tiny(model_type), "cope", clip_low_n=3)
    assert gguf_export.llama_cpp_arch(model.config) == "llama"
    factors, attention_factor, _ = gguf_rope_parameters(model)
    torch.testing.assert_close(factors, taper_factors(8, 3).clamp(max=STOCK_INF_FACTOR).float(), rtol=0, atol=0)
    assert attention_factor == 1.0


def test_a_family_whose_llama_cpp_architecture_cannot_carry_the_scheme_is_refused_naming_all_three(tmp_path):
    """The family, the llama.cpp architecture its converter writes, and the alternatives (export_stock, vLLM); a
    ValueError (the command line prints it as one line), never a KeyError, for any family."""
    model = hf_posenc.patch_model(_tiny("phi3"), "cope", clip_low_n=2)
    with pytest.raises(ValueError) as refused:
        export_gguf(model, tmp_path / "out.gguf", tokenizer=object(), llama_cpp=tmp_path)
    message = str(refused.value)
    assert "'phi3' models (Phi3ForCausalLM) to its 'phi3' architecture" in message, message
    assert "export_stock" in message and "vLLM" in message and "\n" not in message
    assert os.listdir(tmp_path) == []
    table = gguf_export.llama_cpp_table()
    assert table["converter"]["MistralForCausalLM"] == "llama" and "llama" in table["rope_freqs_architectures"]
    assert table["converter"]["Qwen2ForCausalLM"] == "qwen2" and "qwen2" not in table["rope_freqs_architectures"]


def test_a_family_llama_cpps_converter_has_no_class_for_is_refused(monkeypatch, tmp_path):
    table = {**gguf_export.llama_cpp_table()}
    table["converter"] = {k: v for k, v in table["converter"].items() if k != "MistralForCausalLM"}
    monkeypatch.setattr(gguf_export, "llama_cpp_table", lambda: table)
    model = hf_posenc.patch_model(_tiny("mistral"), "cope", clip_low_n=3)
    with pytest.raises(ValueError, match=r"converter \(llama-cpp-python [\d.]+\) has no class for MistralForCausalLM"
                                         r", so the 'mistral' family.*export_stock"):
        gguf_rope_parameters(model)


@pytest.mark.skipif(not any((ROOT / "build" / "llama-cpp-python").glob("llama_cpp_python-*.tar.gz")),
                    reason="llama-cpp-python's source is not cached: run bash scripts/serving/setup_llamacpp.sh "
                           "--converter")
def test_the_committed_llama_cpp_table_is_what_its_source_says(tmp_path):
    """hf_posenc/data/llama_cpp.json, regenerated from the cached llama.cpp source (scripts/llama_cpp_archs.py)."""
    out = tmp_path / "llama_cpp.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "llama_cpp_archs.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text()) == gguf_export.llama_cpp_table(), \
        "hf_posenc/data/llama_cpp.json is stale: run .venv/bin/python scripts/llama_cpp_archs.py"


def test_a_missing_converter_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_POSENC_LLAMA_CPP", raising=False)
    monkeypatch.setattr(gguf_export, "DEFAULT_LLAMA_CPP", tmp_path / "not-unpacked")  # as before the setup ran
    model = hf_posenc.patch_model(tiny_model("llama"), "cope")
    with pytest.raises(FileNotFoundError) as missing:
        export_gguf(model, tmp_path / "out.gguf", tokenizer=object())
    message = str(missing.value)
    # the command that gets it in seconds, the command line's flag and the environment variable
    assert CONVERTER_SETUP in message and "--llama-cpp DIR" in message and "HF_POSENC_LLAMA_CPP=DIR" in message
    with pytest.raises(FileNotFoundError, match="convert_hf_to_gguf.py does not exist.*--converter"):
        export_gguf(model, tmp_path / "out.gguf", tokenizer=object(), llama_cpp=tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_quantised_type_without_llama_cpps_bindings_names_the_full_setup(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # llama-cpp-python not installed
    monkeypatch.setattr(gguf_export, "DEFAULT_LLAMA_CPP", tmp_path / "not-unpacked")
    model = hf_posenc.patch_model(tiny_model("llama"), "cope")
    with pytest.raises(ModuleNotFoundError) as missing:  # before the converter is looked for or anything is written
        export_gguf(model, tmp_path / "out.gguf", "q4_k_m", tokenizer=object())
    message = str(missing.value)
    assert "bash scripts/serving/setup_llamacpp.sh builds it" in message and "several minutes" in message
    assert CONVERTER_SETUP in message  # and what the other types need
    assert os.listdir(tmp_path) == []


# -- a full export through llama.cpp's converter (pure Python; no llama.cpp runtime) --------------------------------
needs_converter = pytest.mark.skipif(
    not (CONVERTER / "convert_hf_to_gguf.py").is_file() or importlib.util.find_spec("sentencepiece") is None,
    reason=f"llama.cpp's converter is not unpacked: {SETUP}",
)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from hf_posenc.models import load_tokenizer, smollm2_gguf

    return load_tokenizer(*smollm2_gguf())


def tiny_llama_with_vocab(tokenizer, scheme, **options):
    """A two-layer Llama with SmolLM2's vocabulary (llama.cpp's converter needs a tokenizer it recognises)."""
    model = tiny_model("llama", vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return hf_posenc.patch_model(model, scheme, **options)


@needs_converter
def test_exported_file_carries_the_scheme_in_llama_cpps_layout(tmp_path, smollm2_tokenizer):
    options = dict(clip_low_n=3, rope_theta=1e6, scaling="yarn", factor=4.0)
    model = tiny_llama_with_vocab(smollm2_tokenizer, "cope", **options)
    path = export_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=smollm2_tokenizer, llama_cpp=CONVERTER)
    assert os.listdir(tmp_path) == ["m.gguf"]  # no staging left behind
    reader = gguf.GGUFReader(path)
    fields = _fields(reader)
    factors, attention_factor, theta = gguf_rope_parameters(model)
    assert fields["general.architecture"] == "llama"
    assert fields["llama.rope.freq_base"] == pytest.approx(theta)
    assert fields["llama.rope.scaling.attn_factor"] == pytest.approx(attention_factor, rel=1e-6)
    assert "llama.rope.scaling.type" not in fields  # nothing applied on top of rope_freqs
    assert fields["tokenizer.ggml.pre"] == "smollm" and fields["tokenizer.ggml.model"] == "gpt2"
    assert json.loads(fields[SCHEME_KEY])["scheme"] == "cope"
    tensors = {t.name: t for t in reader.tensors}
    assert np.array_equal(np.asarray(tensors[ROPE_FREQS].data), factors.numpy())
    # llama.cpp's converter permutes q/k rows from Transformers' half-split rotation to llama.cpp's interleaved pairs
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    heads = model.config.num_attention_heads
    permuted = q.reshape(heads, 2, q.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(q.shape)
    assert np.array_equal(np.asarray(tensors["blk.0.attn_q.weight"].data), permuted)
    with pytest.raises(ValueError, match="exists; pass overwrite=True"):
        export_gguf(model, path, "f32", tokenizer=smollm2_tokenizer, llama_cpp=CONVERTER)


@needs_converter
def test_q8_0_export_quantizes_the_matrices_and_keeps_rope_freqs_f32(tmp_path, smollm2_tokenizer):
    model = tiny_llama_with_vocab(smollm2_tokenizer, "hardclip", clip_low_n=2)
    path = export_gguf(model, tmp_path / "m.gguf", "q8_0", tokenizer=smollm2_tokenizer, llama_cpp=CONVERTER)
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors[ROPE_FREQS].tensor_type == gguf.GGMLQuantizationType.F32
    assert np.asarray(tensors[ROPE_FREQS].data)[-2:].tolist() == [np.float32(STOCK_INF_FACTOR)] * 2


def _sdist():
    return next(iter(sorted((CONVERTER.parent).glob("llama_cpp_python-*.tar.gz"))), None)


@pytest.mark.skipif(_sdist() is None or importlib.util.find_spec("sentencepiece") is None,
                    reason="llama-cpp-python's source is not cached or sentencepiece is not installed: run bash "
                           "scripts/serving/setup_llamacpp.sh --converter")
def test_the_converter_setup_unpacks_it_without_building_the_bindings(tmp_path):
    """``setup_llamacpp.sh --converter`` in a fresh checkout (the source already downloaded): seconds, no build."""
    sdist = _sdist()
    script = tmp_path / "scripts" / "serving" / "setup_llamacpp.sh"
    script.parent.mkdir(parents=True)
    script.write_bytes((ROOT / "scripts" / "serving" / "setup_llamacpp.sh").read_bytes())
    cache = tmp_path / "build" / "llama-cpp-python"
    cache.mkdir(parents=True)
    (cache / sdist.name).symlink_to(sdist)
    version = sdist.name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")
    env = dict(os.environ, HF_POSENC_VENV=sys.prefix, LLAMA_CPP_PYTHON_VERSION=version)
    run = subprocess.Popen(["bash", str(script), "--converter"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # compiling the bindings (what --converter must not do)
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        pytest.fail("setup_llamacpp.sh --converter did not finish in 2 minutes (building llama-cpp-python?)")
    assert run.returncode == 0, output
    unpacked = cache / "llama.cpp"
    assert (unpacked / "convert_hf_to_gguf.py").is_file() and (unpacked / "conversion").is_dir()
    assert (unpacked / "gguf-py" / "gguf").is_dir()
    assert not list(cache.glob("*.whl")) and "--llama-cpp" in output


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama.cpp's quantizer is not installed: run bash scripts/serving/setup_llamacpp.sh")
@pytest.mark.parametrize("logger_level", [logging.NOTSET, logging.ERROR], ids=["fresh process", "after a quiet Llama"])
def test_a_failing_quantizer_raises_with_its_logs_tail_and_restores_the_output(tmp_path, capfd, logger_level):
    """llama.cpp's reason reaches the error also after a ``Llama(verbose=False)`` in the same process, which sets
    llama-cpp-python's logger to ERROR (its level map sends llama.cpp's error lines to DEBUG): a serving test run
    earlier in the same worker did, and the log came back empty."""
    from hf_posenc.gguf_export import quantize

    logger = logging.getLogger("llama-cpp-python")
    saved = logger.level
    logger.setLevel(logger_level)
    try:
        (tmp_path / "bad.gguf").write_bytes(b"not a GGUF file" * 100)
        capfd.readouterr()
        with pytest.raises(RuntimeError, match=r"(?s)quantizer failed on .*bad\.gguf.*the end of its log:\n.*\S") as e:
            quantize(str(tmp_path / "bad.gguf"), str(tmp_path / "q.gguf"))
        assert logger.level == logger_level  # the caller's verbosity is back
    finally:
        logger.setLevel(saved)
    assert "failed to quantize" in str(e.value)  # llama.cpp's own reason, from the captured log
    print("python after")
    os.write(1, b"fd 1 after\n")
    os.write(2, b"fd 2 after\n")
    out, err = capfd.readouterr()  # nothing leaked while captured, and both descriptors are back
    assert out == "python after\nfd 1 after\n" and err == "fd 2 after\n"
    assert os.listdir(tmp_path) == ["bad.gguf"]  # the log is not left behind


@needs_converter
def test_cli_export_gguf(tmp_path, smollm2_tokenizer, capsys):
    from hf_posenc.cli import main

    model = tiny_llama_with_vocab(smollm2_tokenizer, "prope", p=0.5)
    model.save_pretrained(tmp_path / "patched")
    smollm2_tokenizer.save_pretrained(tmp_path / "patched")
    out = tmp_path / "m.gguf"
    argv = ["export", str(tmp_path / "patched"), str(out), "--gguf", "f16", "--llama-cpp", str(CONVERTER)]
    assert main(argv) == 0
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert np.array_equal(np.asarray(tensors[ROPE_FREQS].data), gguf_rope_parameters(model)[0].numpy())
    assert main(argv) == 2 and "exists; pass overwrite=True (--overwrite)" in capsys.readouterr().err


def test_cli_prints_a_family_refusal_as_one_line(tmp_path, smollm2_tokenizer, capsys):
    from hf_posenc.cli import main

    model = hf_posenc.patch_model(tiny_model("qwen2", vocab_size=len(smollm2_tokenizer)), "cope", clip_low_n=2)
    model.save_pretrained(tmp_path / "patched")
    smollm2_tokenizer.save_pretrained(tmp_path / "patched")
    capsys.readouterr()
    assert main(["export", str(tmp_path / "patched"), str(tmp_path / "m.gguf"), "--gguf", "f16",
                 "--llama-cpp", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]  # (besides the weight loading's progress bar)
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("hf-posenc export: error: export_gguf: llama.cpp converts 'qwen2' models"), err
    assert errors[0].endswith("lists the families that export to GGUF."), err
    assert not (tmp_path / "m.gguf").exists()


def test_cli_prints_an_engine_failure_with_its_log_and_no_traceback(capsys):
    """llama.cpp's converter or quantizer failing (an EngineError, its log's end in the message) ends the command
    with status 1 and that message, not a Python traceback."""
    import argparse

    from hf_posenc.cli import run_command
    from hf_posenc.gguf_export import EngineError

    def export(args):
        raise EngineError("llama.cpp's converter failed (exit 1):\nValueError: an unknown tensor")

    rc = run_command(argparse.Namespace(command="export"), commands={"export": export})
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.startswith("hf-posenc export: error: llama.cpp's converter failed (exit 1):\nValueError: an unknown")
