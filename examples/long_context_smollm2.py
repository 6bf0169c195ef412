"""SmolLM2-135M zero-shot beyond its 8k training length: every frequency scheme at 12k and 16k tokens, on CPU.

No training: the shipped SmolLM2-135M-Instruct (RoPE, θ = 100,000, trained to 8,192 tokens) is patched with each
scheme in turn (one model in memory at a time) and scores one window of Jane Austen's *Persuasion* (Debian's
r-cran-janeaustenr, held out from every experiment's training) of exactly L tokens, at L = 12,288 and 16,384, with
the unpatched model also at 8,192 as the in-distribution reference. Perplexity over the whole window (every token
of it scored once), the output head chunked so the logits of 16k positions never exist at once. Interpolating
schemes get factor 2 (8k → 16k); CoPE/HardClip clip the 10 lowest of 32 frequencies, p-RoPE keeps 75%.

Writes ``results.json``, ``report.md`` (perplexity and seconds per cell) and ``perplexity.png`` into ``--out``,
plus ``run.json`` (machine, threads, total time). Run from the repository root::

    python examples/long_context_smollm2.py            # about 40 minutes on 2 idle CPU cores, < 4 GB of memory
    python examples/long_context_smollm2.py --lengths 1024 2048 --reference 512 --out /tmp/lc   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMES = {
    "rope (unpatched)": None,
    "PI x2": "rope:scaling=linear,factor=2",
    "NTK (dynamic) x2": "rope:scaling=dynamic,factor=2",
    "YaRN x2": "rope:scaling=yarn,factor=2",
    "CoPE (clip 10)": "cope:clip_low_n=10",
    "HardClip (clip 10)": "hardclip:clip_low_n=10",
    "p-RoPE (p=0.75)": "prope:p=0.75",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", nargs="+", type=int, default=[12288, 16384], help="window lengths beyond 8k")
    ap.add_argument("--reference", type=int, default=8192, help="in-distribution length (unpatched model only)")
    ap.add_argument("--out", default=str(ROOT / "examples" / "long-context-smollm2"))
    args = ap.parse_args(argv)

    import torch
    from tqdm.auto import tqdm

    from hf_posenc.evaluation import evaluate_schemes, write_report
    from hf_posenc.evaluation.cli import load_model, load_tokenizer
    from hf_posenc_experiments.corpus import austen_corpus
    from hf_posenc.models import smollm2_gguf

    directory, gguf = smollm2_gguf()
    tokenizer = load_tokenizer(directory, gguf)
    text = austen_corpus().heldout
    cells = [(args.reference, "rope (unpatched)")] + [(n, name) for n in args.lengths for name in SCHEMES]
    started, result = time.perf_counter(), None
    base = load_model(directory, gguf)  # each cell patches a copy of it
    # one cell = one scheme at one length: one window of exactly `length` tokens
    for length, name in tqdm(cells, desc="long-context cells", unit="cell"):
        part = evaluate_schemes(base, {name: SCHEMES[name]}, tokenizer,
                                tasks=["ppl"], lengths=[length], text=text, stride=length, max_tokens=length,
                                progress=False)
        result = part if result is None else result.merge(part)
    result.settings["schemes"] = {name: SCHEMES[name] for name in SCHEMES}
    result.settings["text"] = "Jane Austen, Persuasion (held out), first L tokens; SmolLM2 tokenizer"
    out = Path(args.out)
    write_report(result, out)
    run = {"total_seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "machine": platform.processor() or
           platform.machine(), "command": "python examples/long_context_smollm2.py " + " ".join(argv or sys.argv[1:])}
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    print(f"wrote {out} in {run['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
