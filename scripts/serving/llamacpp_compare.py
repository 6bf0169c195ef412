"""SmolLM2-135M exported with ``hf_posenc.export_gguf`` and run in llama.cpp, compared with Transformers + hf-posenc.

    .venv/bin/python scripts/serving/llamacpp_compare.py [--out DIR]

(``scripts/serving/setup_llamacpp.sh`` installs llama-cpp-python and unpacks llama.cpp's converter first.)

* Every scheme (plain RoPE, RoPE+YaRN, CoPE, HardClip, p-RoPE, CoPE over YaRN) as an f32 GGUF: prompt
  log-probabilities and greedy tokens in llama.cpp against the patched model in Transformers, float32 both; plus the
  same file with its ``rope_freqs`` removed (plain RoPE in llama.cpp) to show what the tensor carries.
* CoPE as f16, Q8_0 and Q4_K_M: greedy tokens and teacher-forced top-1 agreement against Transformers, and
  perplexity on a held-out text (a text of this repository never used for prompts) against the f16 export and
  against Transformers.

Writes ``benchmarks/results/serving-llamacpp-<device>.json``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from reference import (  # noqa: E402
    HELD_OUT_TEXT, PROMPT_TEXT, ROOT, compare, llamacpp_outputs, model_outputs, perplexity, prompt_scores,
    prompt_windows, scheme_variants,
)

# Per-token |Δ log p| allowed between llama.cpp and Transformers + hf-posenc for an f32 file (float32 both; llama.cpp
# computes sin/cos and sums in its own order; measured: at most 4e-5 on SmolLM2). A changed scheme moves log-probs by
# ~0.1-1 per token.
F32_TOLERANCE = 5e-4
MAX_TOKENS = 24
HELD_OUT_TOKENS = 1000
CONVERTER = ROOT / "build" / "llama-cpp-python" / "llama.cpp"


def without_rope_freqs(src: Path, dst: Path) -> None:
    """A copy of a GGUF file minus its ``rope_freqs`` tensor and scheme keys (llama.cpp then runs plain RoPE)."""
    import gguf

    from hf_posenc.gguf_export import ROPE_FREQS, SCHEME_KEY

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch=arch)
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, SCHEME_KEY) or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    tensors = [t for t in reader.tensors if t.name != ROPE_FREQS]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep the GGUF files here (default: a temporary directory)")
    parser.add_argument("--llama-cpp", type=Path, default=Path(os.environ.get("HF_POSENC_LLAMA_CPP", CONVERTER)))
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--length", type=int, default=400, help="tokens per prompt")
    args = parser.parse_args()

    import llama_cpp
    import transformers

    import hf_posenc
    from common import write_results
    from hf_posenc.models import load_smollm2

    start = time.perf_counter()
    base, tokenizer = load_smollm2(dtype=torch.float32)
    prompts = prompt_windows(tokenizer, args.prompts, args.length)
    held_out = tokenizer(HELD_OUT_TEXT.read_text(), add_special_tokens=False).input_ids[:HELD_OUT_TOKENS]
    results: dict = {"schemes_f32": {}, "quantized": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, scheme in scheme_variants().items():
            model = hf_posenc.patch_model(copy.deepcopy(base), scheme)
            reference = model_outputs(model, prompts, MAX_TOKENS)
            t0 = time.perf_counter()
            path = hf_posenc.export_gguf(model, work / f"{name}-f32.gguf", "f32", tokenizer=tokenizer,
                                         llama_cpp=args.llama_cpp, overwrite=True)
            export_s = time.perf_counter() - t0
            got = compare(reference, llamacpp_outputs(path, prompts, MAX_TOKENS))
            entry = {"llamacpp_vs_reference": got, "export_seconds": export_s,
                     "identical": got["greedy_identical"] and got["max_abs_dlogprob"] <= F32_TOLERANCE}
            if name != "rope":
                without_rope_freqs(path, work / f"{name}-no-rope-freqs.gguf")
                entry["without_rope_freqs_vs_reference"] = compare(
                    reference, llamacpp_outputs(work / f"{name}-no-rope-freqs.gguf", prompts, MAX_TOKENS))
            results["schemes_f32"][name] = entry
            print(f"{name:10s} f32: greedy identical {got['greedy_identical']!s:5s} max |Δ log p| "
                  f"{got['max_abs_dlogprob']:.2e} (export {export_s:.0f}s)", flush=True)
            if name == "cope":
                reference_ppl = perplexity(prompt_scores(model, held_out)["prompt_logprobs"])
                results["quantized"]["transformers_float32_perplexity"] = reference_ppl
                for quant in ("f32", "f16", "q8_0", "q4_k_m"):
                    qpath = work / f"{name}-{quant}.gguf"
                    if quant != "f32":
                        hf_posenc.export_gguf(model, qpath, quant, tokenizer=tokenizer, llama_cpp=args.llama_cpp,
                                              overwrite=True)
                    q = compare(reference, llamacpp_outputs(qpath, prompts, MAX_TOKENS))
                    ppl = perplexity(llamacpp_outputs(qpath, [held_out], 1, n_ctx=2048)[0]["prompt_logprobs"])
                    results["quantized"][quant] = {
                        "file_mib": qpath.stat().st_size / 2**20, "perplexity": ppl, "vs_reference": q,
                    }
                    print(f"cope {quant:7s}: {qpath.stat().st_size / 2**20:6.0f} MiB, held-out perplexity {ppl:.4f} "
                          f"(Transformers {reference_ppl:.4f}), greedy identical {q['greedy_identical']} (first "
                          f"differences {q['first_greedy_difference']}), top-1 agreement {q['top1_agreement']:.3f}, "
                          f"mean |Δ log p| {q['mean_abs_dlogprob']:.4f}", flush=True)
                f16 = results["quantized"]["f16"]["perplexity"]
                for quant in ("f32", "f16", "q8_0", "q4_k_m"):
                    results["quantized"][quant]["perplexity_vs_f16"] = results["quantized"][quant]["perplexity"] / f16
            del model
        text = PROMPT_TEXT.read_text()  # llama.cpp's tokenizer, read from the last file before the directory goes
        vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        tokenizer_ok = vocab.tokenize(text.encode(), add_bos=False, special=False) == tokenizer(
            text, add_special_tokens=False).input_ids
    out = write_results("serving-llamacpp", torch.device("cpu"), {
        "what": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32) patched with each scheme, written by "
                "export_gguf (llama.cpp's converter + rope_freqs), run in llama.cpp through llama-cpp-python "
                "(float32 KV cache, greedy), compared with Transformers + hf-posenc in float32",
        "versions": {"llama_cpp_python": llama_cpp.__version__, "gguf": importlib.metadata.version("gguf"),
                     "transformers": transformers.__version__, "hf_posenc": hf_posenc.__version__},
        "prompts": {"count": len(prompts), "tokens": args.length, "text": str(PROMPT_TEXT.relative_to(ROOT)),
                    "greedy_tokens": MAX_TOKENS},
        "held_out": {"text": str(HELD_OUT_TEXT.relative_to(ROOT)), "tokens": len(held_out)},
        "f32_logprob_tolerance": F32_TOLERANCE,
        "llamacpp_tokenizer_matches_transformers": tokenizer_ok,
        "seconds_total": time.perf_counter() - start,
        **results,
    })
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
