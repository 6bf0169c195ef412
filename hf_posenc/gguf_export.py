"""``export_gguf``: a patched frequency-scheme model as a GGUF file that stock llama.cpp runs with the scheme intact.

llama.cpp rotates chunk i of a query/key by ``pos · θ_i / f_i`` where θ_i = b^(−2i/d) and f_i comes from a
``rope_freqs`` tensor (how Llama 3.1's scaling is exported; read by the ``llama`` architecture). Every static
frequency scheme is therefore one vector of factors

    f_i = θ_i / θ'_i      (θ' = the patched inverse frequencies Transformers computes for the model)

which is 1/w_i for CoPE/HardClip over the default base (``cope-clipped-rope`` eq. 10), 1 for p-RoPE's kept frequencies,
and the combined ratio over linear/YaRN/Llama-3 bases. Which rope types are static is read from the scheme registry
(:class:`hf_posenc.schemes.RopeType` ``dynamic``), for a scheme registered from outside the package too, and the
factors are :func:`hf_posenc.export.rope_factors`, as in the stock export. Where θ'_i = 0 (HardClip, CoPE's last frequency, p-RoPE's dropped
ones) f_i is a large finite number (3e38, as in the stock export), which makes the angle exactly 0 in fp32. The rope
type's attention scaling (YaRN's mscale, also under CoPE) multiplies cos and sin in both engines and is written as
``<arch>.rope.scaling.attn_factor``; no other rope scaling is declared, so llama.cpp applies nothing on top.

Steps (nothing is written to ``path`` unless all succeed):

1. refuse what llama.cpp cannot express (schemes that change attention, dynamic NTK, LongRoPE's short/long switch,
   families whose llama.cpp architecture does not read ``rope_freqs``), before anything is written; which
   Transformers architectures llama.cpp's converter turns into an architecture that reads ``rope_freqs`` is
   ``hf_posenc/data/llama_cpp.json``, generated from the llama.cpp source the project builds
   (``scripts/llama_cpp_archs.py``);
2. stage the model as a plain Transformers checkpoint with the default rope type and the model's base;
3. convert it with llama.cpp's own converter (``convert_hf_to_gguf.py``: tensor names, q/k layout, tokenizer and its
   pre-tokenizer) to f32, f16, bf16 or Q8_0;
4. copy that file through the ``gguf`` package's writer, adding ``rope_freqs.weight``, the attention factor and the
   scheme record (``hf_posenc.scheme``);
5. for Q4_K_M, run llama.cpp's quantizer (``llama_model_quantize`` from ``llama-cpp-python``) on the f16 file, its
   per-tensor log captured (one summary line instead; the log's tail in the error if it fails).

The converter is a script in llama.cpp's source tree (also vendored in ``llama-cpp-python``'s source distribution),
not part of any installed package. ``bash scripts/serving/setup_llamacpp.sh --converter`` unpacks it (seconds, nothing
compiled) to ``build/llama-cpp-python/llama.cpp`` in the checkout, where export finds it; elsewhere pass its directory
as ``llama_cpp=`` (``--llama-cpp DIR``) or set ``HF_POSENC_LLAMA_CPP``. f32/f16/bf16/Q8_0 need nothing else; Q4_K_M
also needs the bindings, which the script's default mode builds (several minutes).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .export import dynamic_refusal, rope_factors, save_stock, stock_config
from .families import family_for
from .patching import check_patchable, scheme_record
from .schemes import ROPE_TYPES
from .schemes.base import FrequencySchemeConfig
from .schemes.base import head_dim as config_head_dim



class EngineError(RuntimeError):
    """llama.cpp's converter or quantizer failed on input hf-posenc accepted: the message ends with the end of its
    log (the command line prints it without a traceback, exit status 1)."""


# Which Transformers architectures llama.cpp carries: generated from its source by scripts/llama_cpp_archs.py.
LLAMA_CPP_TABLE = Path(__file__).resolve().parent / "data" / "llama_cpp.json"
# Transformers' own rope types whose frequencies are not one fixed vector (its `dynamic_rope_update` recomputes
# every type whose name contains "dynamic", and LongRoPE switches factor lists at the original length).
SEQUENCE_DEPENDENT = {
    "dynamic": "its frequencies change with the sequence length (dynamic NTK recomputes them as it grows)",
    "longrope": "LongRoPE switches between two factor sets by sequence length, and llama.cpp reads a single "
                "`rope_freqs`",
}
# quantization -> the converter's --outtype (Q4_K_M: the f16 file, then llama.cpp's quantizer)
QUANTIZATIONS = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q4_k_m": "f16"}
# the types llama.cpp's quantizer (llama-cpp-python's bindings) makes -> its llama_ftype constant
QUANTIZER_FTYPES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
LLAMA_CPP_ENV = "HF_POSENC_LLAMA_CPP"
# where scripts/serving/setup_llamacpp.sh unpacks the converter, in the checkout hf_posenc is installed from
DEFAULT_LLAMA_CPP = Path(__file__).resolve().parents[1] / "build" / "llama-cpp-python" / "llama.cpp"
SETUP_SCRIPT = "scripts/serving/setup_llamacpp.sh"
CONVERTER_SETUP = f"bash {SETUP_SCRIPT} --converter"
FULL_SETUP = f"bash {SETUP_SCRIPT}"
QUANTIZER_LOG_TAIL = 25  # lines of the quantizer's log an error shows
SCHEME_KEY = "hf_posenc.scheme"
ROPE_FREQS = "rope_freqs.weight"


def _refuse(message: str) -> ValueError:
    return ValueError(f"export_gguf: {message}")


@functools.cache
def llama_cpp_table() -> dict[str, Any]:
    """``hf_posenc/data/llama_cpp.json``: ``converter`` (Transformers architecture -> the llama.cpp architecture its
    converter writes) and ``rope_freqs_architectures`` (those whose loader reads a ``rope_freqs`` tensor)."""
    return json.loads(LLAMA_CPP_TABLE.read_text())


def llama_cpp_arch(config: Any) -> str:
    """The llama.cpp architecture a model exports to, or a ``ValueError`` naming the family, the architecture llama.cpp
    converts it to and the alternatives when that architecture cannot carry the scheme."""
    family = family_for(config.model_type)
    hf_arch = family.stock_model_class.__name__
    table = llama_cpp_table()
    arch = table["converter"].get(hf_arch)
    alternatives = ("export it with export_stock (`hf-posenc export DIR OUT`: stock Transformers and vLLM run the "
                    "scheme) instead")
    if arch is None:
        raise _refuse(f"llama.cpp's converter (llama-cpp-python {table['llama_cpp_python']}) has no class for "
                      f"{hf_arch}, so the {family.stock_model_type!r} family cannot be written as GGUF; "
                      f"{alternatives}.")
    if arch not in table["rope_freqs_architectures"]:
        raise _refuse(
            f"llama.cpp converts {family.stock_model_type!r} models ({hf_arch}) to its {arch!r} architecture, which "
            "does not read a per-dimension `rope_freqs` tensor, so the scheme's frequencies cannot be expressed "
            f"(llama.cpp would silently run plain RoPE); {alternatives}. `hf-posenc families` lists the families "
            "that export to GGUF."
        )
    return arch


def gguf_rope_parameters(model_or_config: Any) -> tuple[torch.Tensor, float, float]:
    """``(factors, attention_factor, rope_theta)``: the ``rope_freqs`` values (float32, head_dim/2 of them) and
    attention factor that make llama.cpp's rotation equal to the patched model's (see the module docstring).

    Raises ``ValueError`` (naming the reason) for what llama.cpp cannot express."""
    config = getattr(model_or_config, "config", model_or_config)
    record = scheme_record(config)
    if record is None:
        raise _refuse("this model carries no hf-posenc scheme; convert it with llama.cpp's convert_hf_to_gguf.py.")
    if not isinstance(record.scheme, FrequencySchemeConfig):
        raise _refuse(
            f"scheme {record.scheme.name!r} changes attention itself (not just the rotary frequencies); llama.cpp has "
            "no such operation. Publish it with save_pretrained (runs with hf-posenc in Transformers)."
        )
    llama_cpp_arch(config)
    params = config.rope_parameters
    if config.nested_rope_parameter_keys(params):
        raise _refuse("this model has rotary settings per layer type, and llama.cpp's `rope_freqs` is one vector for "
                      "every layer; export it with export_stock instead.")
    rope_type = params["rope_type"]
    why = dynamic_refusal(record.scheme.name, rope_type)
    if why is None and rope_type not in ROPE_TYPES:  # one of Transformers' own rope types
        why = SEQUENCE_DEPENDENT.get("dynamic" if "dynamic" in rope_type else rope_type)
        why = None if why is None else f"rope type {rope_type!r}: {why}, while a GGUF `rope_freqs` tensor is fixed"
    if why is not None:
        raise _refuse(f"{why}. Patch with a static base (e.g. scaling='yarn' or 'linear') to export it.")
    head_dim = config_head_dim(config)
    theta = float(params["rope_theta"])
    if rope_type == "default":  # plain RoPE (with ABF): llama.cpp's own θ_i
        return torch.ones(head_dim // 2), 1.0, theta
    if params.get("partial_rotary_factor", 1.0) != 1.0 and rope_type != "proportional":
        raise _refuse("partial rotary models are not supported (llama.cpp's `rope_freqs` covers n_rot/2 pairs).")
    try:
        factors, attention_factor = rope_factors(config, params, None, head_dim)
    except ValueError as exc:
        raise _refuse(f"{exc} (partial rotary models are not supported).") from None
    return factors.float(), attention_factor, theta


def find_converter(llama_cpp: str | os.PathLike | None = None) -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` in ``llama_cpp``, else ``$HF_POSENC_LLAMA_CPP``, else where
    ``setup_llamacpp.sh --converter`` unpacks it (``DEFAULT_LLAMA_CPP``), checked for use."""
    where = llama_cpp if llama_cpp is not None else os.environ.get(LLAMA_CPP_ENV)
    if where is None:
        if (DEFAULT_LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
            where = DEFAULT_LLAMA_CPP
        else:
            raise FileNotFoundError(
                "export_gguf needs llama.cpp's converter (convert_hf_to_gguf.py with its conversion/ and gguf-py/ "
                f"folders), which is not in {DEFAULT_LLAMA_CPP}. Get it in seconds (nothing is compiled; f32, f16, "
                f"bf16 and q8_0 need nothing else): {CONVERTER_SETUP} (in the hf-posenc checkout). Or use a llama.cpp "
                f"source directory: --llama-cpp DIR (Python: llama_cpp=DIR) or {LLAMA_CPP_ENV}=DIR."
            )
    script = Path(where).expanduser() / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} does not exist; --llama-cpp DIR (llama_cpp=) / {LLAMA_CPP_ENV} must name "
                                "a llama.cpp source directory (the one holding convert_hf_to_gguf.py); "
                                f"{CONVERTER_SETUP} unpacks one to {DEFAULT_LLAMA_CPP}.")
    if importlib.util.find_spec("sentencepiece") is None:
        raise ModuleNotFoundError(
            "llama.cpp's converter imports sentencepiece for every Llama model (even BPE ones); install it: "
            f"pip install sentencepiece (or run {CONVERTER_SETUP})"
        )
    return script


def check_quantizer(quantization: str) -> None:
    """For a type llama.cpp's quantizer makes (Q4_K_M), a ``ModuleNotFoundError`` naming the setup when its bindings
    (``llama-cpp-python``) are not installed; the converter's own types need nothing."""
    if quantization in QUANTIZER_FTYPES and importlib.util.find_spec("llama_cpp") is None:
        raise ModuleNotFoundError(
            f"quantization={quantization!r} runs llama.cpp's quantizer, which comes with llama-cpp-python (not "
            f"installed). {FULL_SETUP} builds it from source: several minutes (6 to 14 on 2 cores), and it also "
            "unpacks the converter. Or export f16, bf16 or q8_0, which need only llama.cpp's converter "
            f"({CONVERTER_SETUP}, seconds)."
        )


def _stage_checkpoint(model: Any, tokenizer: Any, theta: float, directory: str) -> None:
    """The model as a stock checkpoint whose rope type is plain RoPE with base ``theta`` (the converter's input)."""
    stock = stock_config(model)
    stock.rope_parameters = {"rope_type": "default", "rope_theta": theta}  # the scheme goes into rope_freqs
    save_stock(model, stock, directory, tokenizer)


def _run_converter(script: Path, checkpoint: str, out: str, outtype: str, name: str) -> None:
    cmd = [sys.executable, str(script), checkpoint, "--outfile", out, "--outtype", outtype, "--model-name", name]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(out):
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise EngineError(f"llama.cpp's converter failed (exit {done.returncode}):\n{tail}")


def add_rope_freqs(src: str | os.PathLike, dst: str | os.PathLike, factors: torch.Tensor, attention_factor: float,
                   scheme: dict[str, Any]) -> None:
    """Copy the GGUF ``src`` to ``dst`` through the ``gguf`` writer, adding ``rope_freqs.weight`` (F32), the rope
    attention factor (when ≠ 1) and the scheme record; every other key and tensor is copied unchanged."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    if any(t.name == ROPE_FREQS for t in reader.tensors):
        raise ValueError(f"{src} already has a {ROPE_FREQS} tensor (written by llama.cpp's converter for a Llama-3 "
                         "rope type); the staged checkpoint should have declared plain RoPE.")
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    if attention_factor != 1.0:
        writer.add_float32(gguf.Keys.Rope.SCALING_ATTN_FACTOR.format(arch=arch), attention_factor)
    writer.add_string(SCHEME_KEY, json.dumps(scheme, sort_keys=True))
    freqs = factors.detach().cpu().numpy().astype(np.float32)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.add_tensor_info(ROPE_FREQS, freqs.shape, freqs.dtype, freqs.nbytes, gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.write_tensor_data(freqs)
    writer.close()


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers (what C code printf'd but has not written to the file descriptors yet)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output(log: str | os.PathLike):
    """Everything written to stdout/stderr in the block, C code's included, appended to the file ``log``.

    llama.cpp prints from C to file descriptors 1 and 2 (and llama-cpp-python's log callback to Python's
    ``sys.stderr``), which ``contextlib.redirect_stdout`` alone does not catch: both descriptors are pointed at
    ``log`` for the block, Python's streams too, and everything is restored afterwards, also when the block raises."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _flush_c_stdio()
    text = open(log, "a", buffering=1, encoding="utf-8", errors="replace")  # O_APPEND: shares the file with fds 1/2
    saved: dict[int, int] = {}
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # a closed descriptor is left alone
                saved[fd] = os.dup(fd)
                os.dup2(text.fileno(), fd)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            yield
    finally:
        _flush_c_stdio()
        text.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        text.close()


@contextlib.contextmanager
def every_llama_cpp_log_line():
    """llama.cpp's log lines, every level, reach Python's ``sys.stderr`` in the block; the level is restored afterwards.

    llama-cpp-python forwards llama.cpp's log through its logger ``"llama-cpp-python"`` and drops a line whose
    level maps below the logger's; its map predates llama.cpp's renumbered levels (an error line maps to DEBUG), and
    any ``Llama(verbose=False)`` in the process sets that logger to ERROR, so from then on the quantizer's own reason
    for a failure ("failed to quantize: ...") would be dropped. Everything the block prints goes to a captured log
    anyway, of which only a failure's tail is shown."""
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(level)


def _log_tail(log: str, lines: int = QUANTIZER_LOG_TAIL) -> str:
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read().rstrip()
    except OSError:
        text = ""
    return "\n".join(text.splitlines()[-lines:]) or "(nothing)"


def _mib(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.1f} MiB"


def quantize(src: str, dst: str, quantization: str = "q4_k_m") -> str:
    """Run llama.cpp's quantizer on the GGUF file ``src``, writing ``dst``; returns a one-line summary (sizes, type).

    Its log (several lines per tensor) is captured in a file beside ``dst`` and deleted afterwards; a failure raises
    an :class:`EngineError` ending with the log's last lines."""
    check_quantizer(quantization)
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTIZER_FTYPES[quantization])
    params.nthread = os.cpu_count() or 1
    log = f"{dst}.log"
    start = time.perf_counter()
    try:
        error: Exception | None = None
        status = None
        try:
            with captured_output(log), every_llama_cpp_log_line():
                status = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
        except Exception as e:  # noqa: BLE001  (re-raised below with the log)
            error = e
        if error is not None or status != 0 or not os.path.exists(dst):
            why = f"{type(error).__name__}: {error}" if error is not None else f"status {status}"
            raise EngineError(f"llama.cpp's quantizer failed on {src} ({why}); the end of its log:\n"
                               + _log_tail(log)) from error
    finally:
        with contextlib.suppress(OSError):
            os.remove(log)
    return (f"llama.cpp's quantizer: {_mib(src)} ({QUANTIZATIONS[quantization]}) -> {_mib(dst)} "
            f"({quantization.upper()}) in {time.perf_counter() - start:.1f} s")


def export_gguf(
    model: Any,
    path: str | os.PathLike,
    quantization: str = "f16",
    *,
    tokenizer: Any = None,
    llama_cpp: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (patched with a frequency scheme) to the GGUF file ``path`` for stock llama.cpp.

    Args:
        model: a model patched with a frequency scheme whose rope type is static (CoPE, HardClip, p-RoPE, a RoPE
            baseline, or a scheme registered from outside the package), of a family llama.cpp converts to an
            architecture that reads ``rope_freqs`` (Llama, Mistral, Mixtral, Granite...: ``hf-posenc families``).
        path: the ``.gguf`` file to write (replaced only when the whole export succeeds).
        quantization: ``"f32"``, ``"f16"``, ``"bf16"``, ``"q8_0"`` (llama.cpp's converter alone) or ``"q4_k_m"``
            (then llama.cpp's quantizer, through ``llama-cpp-python``; prints a one-line summary to stderr).
        tokenizer: the model's tokenizer (required: the GGUF file carries the vocabulary).
        llama_cpp: a llama.cpp source directory holding ``convert_hf_to_gguf.py`` (default ``$HF_POSENC_LLAMA_CPP``,
            else ``build/llama-cpp-python/llama.cpp`` where ``setup_llamacpp.sh --converter`` unpacks it).
        overwrite: replace an existing file at ``path`` (refused otherwise).
    """
    check_patchable(model)
    quantization = quantization.lower()
    if quantization not in QUANTIZATIONS:
        raise _refuse(f"quantization must be one of {sorted(QUANTIZATIONS)}, got {quantization!r}.")
    factors, attention_factor, theta = gguf_rope_parameters(model)
    if tokenizer is None:
        raise _refuse("a GGUF file carries the vocabulary: pass tokenizer= (e.g. AutoTokenizer.from_pretrained(...); "
                      "command line: --tokenizer DIR_OR_HUB_ID).")
    check_quantizer(quantization)
    script = find_converter(llama_cpp)
    path = Path(path)
    if path.is_dir():
        raise _refuse(f"{path} is a directory; pass the path of the .gguf file to write.")
    if path.exists() and not overwrite:
        raise _refuse(f"{path} exists; pass overwrite=True (--overwrite) to replace it, or choose another path.")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = scheme_record(model)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.export-") as tmp:
        checkpoint = os.path.join(tmp, "checkpoint")
        _stage_checkpoint(model, tokenizer, theta, checkpoint)
        converted = os.path.join(tmp, "converted.gguf")
        _run_converter(script, checkpoint, converted, QUANTIZATIONS[quantization], path.stem)
        with_freqs = os.path.join(tmp, "rope_freqs.gguf")
        add_rope_freqs(converted, with_freqs, factors, attention_factor, record.to_dict())
        final, summary = with_freqs, None
        if quantization in QUANTIZER_FTYPES:
            final = os.path.join(tmp, f"{quantization}.gguf")
            summary = quantize(with_freqs, final, quantization)
        os.replace(final, path)
    if summary:
        print(summary, file=sys.stderr)
    return path
