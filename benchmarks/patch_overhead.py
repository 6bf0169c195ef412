"""Forward time of patched vs unpatched models, side by side in one run.

CoPE, HardClip and p-RoPE only change the rotary frequencies, so the target ratio is 1.00 ± noise.
Usage: python benchmarks/patch_overhead.py [--device cuda] [--length 512] [--repeats 15] [--no-smollm2]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import hf_posenc  # noqa: E402
from common import time_interleaved, write_results  # noqa: E402
from tiny import tiny_model  # noqa: E402

SCHEMES = {
    "cope": dict(scheme="cope"),
    "hardclip": dict(scheme="hardclip"),
    "prope": dict(scheme="prope", p=0.75),
    "rope-yarn": dict(scheme="rope", scaling="yarn", factor=4.0),
}


def bench(label: str, model, length: int, repeats: int, device: torch.device, vocab: int) -> dict:
    model = model.to(device).eval()
    ids = torch.randint(3, vocab, (1, length), device=device)
    models = {"unpatched": model}
    for name, kw in SCHEMES.items():
        kw = dict(kw)
        models[name] = hf_posenc.patch_model(copy.deepcopy(model), kw.pop("scheme"), **kw)

    def forward(m):
        def run():
            with torch.inference_mode():
                m(ids)
        return run

    medians, _ = time_interleaved({k: forward(m) for k, m in models.items()}, device, repeats)
    base = medians["unpatched"]
    rows = {k: {"median_s": v, "ratio_vs_unpatched": v / base} for k, v in medians.items()}
    print(f"\n{label} (length {length}, median of {repeats})")
    for k, r in rows.items():
        print(f"  {k:<10} {r['median_s'] * 1e3:9.2f} ms   ratio {r['ratio_vs_unpatched']:.3f}")
    return {"model": label, "length": length, "repeats": repeats, "results": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    runs = [bench("tiny llama (2 layers, hidden 64)", tiny_model("llama", "sdpa"), args.length, args.repeats * 4,
                  device, 128)]
    if not args.no_smollm2:
        from hf_posenc.models import load_smollm2

        model, _ = load_smollm2(attn_implementation="sdpa")
        runs.append(bench("SmolLM2-135M", model, args.length, args.repeats, device, model.config.vocab_size))
    path = write_results("patch_overhead", device, {"runs": runs})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
