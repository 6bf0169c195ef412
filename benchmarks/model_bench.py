"""Setup shared by the whole-model benchmarks (`train_step.py`, `generate.py`): the model shape, the four rows
(unpatched, CoPE, TAPA and TAPE through their Triton backends), device and dtype, per-row error records, targets,
and where the JSON goes.

The rows are the same random-weight Llama patched four ways: ``unpatched`` (SDPA), ``cope`` (SDPA with CoPE's
frequencies), ``tapa`` (``backend="triton"``: hf-posenc's TAPA kernels) and ``tape`` (``backend="triton"``: the
fused TAPE kernel). On a GPU the Triton kernels are compiled for it. On CPU they run in Triton's interpreter when
the process started with TRITON_INTERPRET=1 (the scripts set it before anything imports Triton when the run is on
CPU: `interpret_if_cpu`), else TAPA takes its chunked PyTorch path and TAPE its SDPA path (``backend="auto"``);
each row names the implementation it used.

This module imports torch only; hf_posenc (and with it Triton) is imported inside the functions, after
`interpret_if_cpu` has run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

SCHEMES = ("unpatched", "cope", "tapa", "tape")
# Standard ~1B Llama shapes. llama-3.2-1b is Llama-3.2-1B's (without its llama3 rope scaling, which changes
# no cost); tinyllama-1.1b is TinyLlama-1.1B's. max_position_embeddings is raised so no length here is past it.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                         rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, head_dim=64, vocab_size=32000, tie_word_embeddings=False,
                           rope_theta=10000.0, max_position_embeddings=131072, rms_norm_eps=1e-5),
    # --smoke: a toy Llama for a CPU dry run of the same code path
    "toy": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=128, tie_word_embeddings=False, rope_theta=10000.0,
                max_position_embeddings=4096, rms_norm_eps=1e-5),
}
DEFAULT_SHAPE = "llama-3.2-1b"
NOT_TARGETS_CPU = "cpu: not a measurement of the targets"
NOT_TARGETS_SMOKE = "smoke: toy size, not a measurement of the targets"


# --------------------------------------------------------------------------------------------------
# Before hf_posenc is imported
# --------------------------------------------------------------------------------------------------


def _early_args(argv: list[str]) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", default=None)
    pre.add_argument("--smoke", action="store_true")
    known, _ = pre.parse_known_args(argv)
    return known


def run_device(device: str | None, smoke: bool) -> torch.device:
    """The device a run uses: ``--device`` when given, else CPU under ``--smoke`` and CUDA otherwise (a full-size
    run without a GPU is refused by `resolve_device_dtype`, not quietly run on CPU)."""
    if device is not None:
        return torch.device(device)
    return torch.device("cpu" if smoke else "cuda")


def interpret_if_cpu(argv: list[str]) -> None:
    """Set TRITON_INTERPRET=1 when this run will be on CPU, so the TAPA/TAPE rows run the same Triton kernels as on
    a GPU, interpreted. Must run before anything imports Triton (``import hf_posenc`` does)."""
    known = _early_args(argv)
    if run_device(known.device, known.smoke).type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


# --------------------------------------------------------------------------------------------------
# Command line shared by both scripts
# --------------------------------------------------------------------------------------------------


def add_common_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--smoke", action="store_true",
                    help="toy Llama on CPU in fp32 with tiny sizes: a dry run of the same code path")
    ap.add_argument("--device", default=None, help="default: cuda (cpu under --smoke)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--shape", choices=tuple(SHAPES), default=None,
                    help=f"model shape (default {DEFAULT_SHAPE}; toy under --smoke)")
    ap.add_argument("--layers", type=int, default=None, help="override the shape's number of layers")
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help=f"comma-separated rows out of {','.join(SCHEMES)} (unpatched is the ratios' baseline)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None,
                    help="output JSON (default benchmarks/results/<stem>-<device>.json; under --smoke on CPU a "
                         "file in the temporary directory, never the committed results)")


def parse_schemes(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCHEMES]
    if unknown or not names:
        raise SystemExit(f"--schemes: unknown {unknown}; pick from {','.join(SCHEMES)}")
    return list(dict.fromkeys(names))


def resolve_device_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of a run; a full-size run needs CUDA unless ``--device cpu`` asks for it."""
    device = run_device(args.device, args.smoke)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here; use --smoke for a CPU dry run (or --device cpu)")
    if device.type == "cuda":
        from hf_posenc.selftest.environment import interpreting

        if interpreting():
            raise SystemExit("TRITON_INTERPRET=1 is set: the Triton kernels would be interpreted, not compiled for "
                             "the GPU; unset it")
    if args.dtype is not None:
        dtype = getattr(torch, args.dtype)
    else:
        dtype = torch.bfloat16 if device.type == "cuda" and not args.smoke else torch.float32
    return device, dtype


def model_shape(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    name = args.shape or ("toy" if args.smoke else DEFAULT_SHAPE)
    shape = dict(SHAPES[name])
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
    return name, shape


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


def build_base(shape: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """A random-weight LlamaForCausalLM of ``shape`` through SDPA, initialised directly on ``device``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    # no end-of-sequence token: generation makes every requested token
    config = LlamaConfig(**shape, pad_token_id=0, bos_token_id=1, eos_token_id=None, attention_dropout=0.0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def kernel_backend(device: torch.device) -> str:
    """``"triton"`` where the Triton kernels can run (CUDA, or CPU under the interpreter), else ``"auto"`` (TAPA's
    chunked PyTorch path, TAPE's SDPA path)."""
    from hf_posenc.selftest.environment import interpreting

    return "triton" if device.type == "cuda" or interpreting() else "auto"


def scheme_options(scheme: str, device: torch.device) -> dict[str, Any] | None:
    """patch_model's scheme and options for a row (None: unpatched)."""
    if scheme == "unpatched":
        return None
    if scheme == "cope":
        return {"scheme": "cope"}
    if scheme in ("tapa", "tape"):
        return {"scheme": scheme, "backend": kernel_backend(device)}
    raise ValueError(f"unknown row {scheme!r}; pick from {SCHEMES}")


def implementation(scheme: str, device: torch.device) -> str:
    """What computes a row's attention, in words."""
    from hf_posenc.selftest.environment import interpreting

    if scheme in ("unpatched", "cope"):
        what = "RoPE" if scheme == "unpatched" else "CoPE frequencies"
        return f"{what} + torch SDPA"
    backend = kernel_backend(device)
    if backend == "triton":
        where = "compiled for the GPU" if device.type == "cuda" else "Triton interpreter (TRITON_INTERPRET=1)"
        kernel = "hf_posenc.kernels.tapa" if scheme == "tapa" else "hf_posenc.kernels.tape fused kernel"
        return f"backend=triton: {kernel}, {where}"
    if scheme == "tapa":
        return "backend=auto on CPU without the interpreter: chunked PyTorch path (hf_posenc.kernels.tapa.chunked)"
    return "backend=auto on CPU without the interpreter: TAPE through the model's SDPA"


def patched_copy(base: torch.nn.Module, scheme: str, device: torch.device) -> torch.nn.Module:
    """A copy of ``base`` patched for the row (the unpatched row is a plain copy)."""
    import hf_posenc

    model = copy.deepcopy(base)
    options = scheme_options(scheme, device)
    if options is not None:
        options = dict(options)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*needs training.*")  # TAPA/TAPE from random weights
            hf_posenc.patch_model(model, options.pop("scheme"), **options)
    return model


# --------------------------------------------------------------------------------------------------
# Rows, errors, targets, output
# --------------------------------------------------------------------------------------------------


def error_record(exc: BaseException) -> dict[str, str]:
    """An exception as the JSON records it (printed to stderr as well: nothing is swallowed)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    print(tb, file=sys.stderr, flush=True)
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "traceback": tb[-4000:]}


def free_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def target_verdicts(ratios: dict[str, float | None], targets: dict[str, float], higher_is_better: bool,
                    device: torch.device, smoke: bool) -> dict[str, dict[str, Any]]:
    """{scheme: {target, ratio, met, note}}; ``met`` only for a full-size CUDA run (None elsewhere)."""
    note = NOT_TARGETS_SMOKE if smoke else (NOT_TARGETS_CPU if device.type != "cuda" else None)
    out = {}
    for scheme, bound in targets.items():
        ratio = ratios.get(scheme)
        met = None
        if note is None and ratio is not None:
            met = ratio >= bound if higher_is_better else ratio <= bound
        out[scheme] = {("min_ratio" if higher_is_better else "max_ratio"): bound, "ratio": ratio, "met": met,
                       **({"note": note} if note else {})}
    return out


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def output_path(stem: str, device: torch.device, args: argparse.Namespace) -> Path:
    """--json; else a smoke run on CPU goes to the temporary directory (never over committed results), else
    benchmarks/results/<stem>-<device slug>.json as `common.write_results` names it."""
    from common import RESULTS, device_name, slug

    if args.json is not None:
        return args.json
    if args.smoke and device.type == "cpu":
        return Path(tempfile.gettempdir()) / "hf_posenc-benchmarks" / f"{stem}-smoke-{slug(device_name(device))}.json"
    return RESULTS / f"{stem}-{slug(device_name(device))}.json"


def header(device: torch.device, dtype: torch.dtype, args: argparse.Namespace, shape_name: str,
           shape: dict[str, Any]) -> dict[str, Any]:
    """The JSON's fields that say where and how the run was made."""
    from common import device_name

    from hf_posenc.selftest.environment import interpreting, versions

    return {"device": device_name(device), "torch": torch.__version__, "versions": versions(),
            "smoke": bool(args.smoke), "dtype": str(dtype).removeprefix("torch."),
            "triton_interpret": interpreting(), "argv": sys.argv[1:] if args.argv is None else args.argv,
            "model": {"name": shape_name, "config": shape, "random_weights": True, "attn_implementation": "sdpa"}}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write (atomically: a temporary file renamed over the target), so a run cut short leaves the last whole
    file; the scripts write after every phase."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
