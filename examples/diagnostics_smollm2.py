"""Run every positional-encoding diagnostic on the real SmolLM2-135M-Instruct, unpatched and patched, side by side.

Three variants of the same checkpoint (no fine-tuning, so the patched ones show what the swap does *before*
any adaptation):

* ``rope``      — the checkpoint as trained (RoPE, θ_base = 100 000, 8k context);
* ``cope``      — ``patch_model(..., "cope")`` (clipped, softly tapered low frequencies);
* ``prope-0.75``— ``patch_model(..., "prope", p=0.75)`` (the lowest 25 % of the frequencies set to 0).

Analyses (``hf_posenc.diagnostics``): frequency usage and positional heads (Barbero et al. §4–5), the
disentanglement law (position-generalization eq. 2–4), the distance bias (TAPA App. I), the semantic-decay curve
(CoPE Thm 3.2 eq. 6) and tolerance to position perturbations (position-generalization §4.1).

The sizes below keep the whole run to a few minutes on 2 shared CPU cores; raise them on a bigger machine.
Outputs (``<analysis>.json`` + ``<analysis>.png``, ``summary.json``) go to ``examples/diagnostics-smollm2/``.

    python examples/diagnostics_smollm2.py [--out DIR] [--no-progress]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from typing import Any

import torch

import hf_posenc
import hf_posenc.models
from hf_posenc import diagnostics as dg

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "diagnostics-smollm2")

# --- sizes (tokens of the built-in ~2,500-token essay) -------------------------------------------------------
SCAN_TOKENS = 384  # frequency usage + positional heads: one 384-token window, every layer and head
DISENT_TOKENS = 192  # disentanglement: W' is 192 × 192 per head, the 3-axis fit a 576-unknown solve per head
DISENT_LAYERS = [0, 4, 8, 12, 16, 20, 24, 29]  # the 3-axis solves (9 heads per layer) dominate the cost
BIAS_TOKENS = 1024  # distance bias: one forward of 1024 tokens ...
BIAS_CONTEXT = 512  # ... with the paper's ranges scaled to a 512-token "context" so queries i ∈ [511, 1024)
BIAS_SAMPLES = 4000
PPL_TOKENS = 192  # perturbation: one 192-token window per perplexity
PPL_FRACTIONS = (0.05, 0.2)
PPL_DISTANCES = (8,)
PPL_TRIALS = 1
DECAY_MAX = 8192  # semantic decay over SmolLM2's whole 8k context
DECAY_SMOOTH = 16  # ringing index after a 16-point (≈ 64-token) moving average: the slow ringing only
JSON_DIGITS = 5  # significant digits kept in the JSON files (keeps them small enough for the repository)


def variants(model: Any) -> dict[str, Any]:
    """The unpatched checkpoint and two patched deep copies."""
    return {
        "rope": model,
        "cope": hf_posenc.patch_model(copy.deepcopy(model), "cope"),
        "prope-0.75": hf_posenc.patch_model(copy.deepcopy(model), "prope", p=0.75),
    }


class ExplicitMask(torch.nn.Module):
    """Calls the wrapped causal LM with an explicit all-ones ``attention_mask``.

    Workaround for ``perturbation_tolerance(mode="position_offset")``: it passes non-monotonic ``position_ids``
    without an attention mask, and Transformers 5 then reads every jump in the position ids as the start of a new
    *packed* sequence (``masking_utils.find_packed_sequence_indices``) and makes the causal mask block-diagonal,
    so the perplexity measured would be that of a text cut into pieces, not of shifted positions. An explicit 2-D
    mask turns that detection off; with consecutive positions the output is unchanged.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        kwargs.setdefault("attention_mask", torch.ones_like(input_ids))
        return self.model(input_ids=input_ids, **kwargs)


def run_model(name: str, model: Any, ids: torch.Tensor, progress: bool) -> dict[str, Any]:
    """All six analyses of one variant. The q/k capture analyses get the decoder (``model.model``): they never
    need logits, and skipping the 49k-vocabulary LM head saves about a third of this small model's FLOPs."""
    decoder = model.model
    short, long = dg.scaled_ranges(BIAS_CONTEXT)
    steps = {
        "frequency_usage": lambda: dg.frequency_usage(
            decoder, ids[:, :SCAN_TOKENS], window=SCAN_TOKENS, name=name, progress=progress),
        "positional_heads": lambda: dg.positional_heads(
            decoder, ids[:, :SCAN_TOKENS], window=SCAN_TOKENS, name=name, progress=progress),
        "disentanglement": lambda: dg.disentanglement(
            decoder, ids, layers=DISENT_LAYERS, length=DISENT_TOKENS, name=name),
        "distance_bias": lambda: dg.distance_bias(
            decoder, ids[:, :BIAS_TOKENS], short=short, long=long, samples=BIAS_SAMPLES, name=name),
        "semantic_decay": lambda: dg.semantic_decay(
            dg.model_frequency_sets(decoder), max_distance=DECAY_MAX, samples=2048, ringing_smooth=DECAY_SMOOTH,
            name=name),
        "perturbation": lambda: dg.perturbation_tolerance(
            ExplicitMask(model), ids[:, :PPL_TOKENS], fractions=PPL_FRACTIONS, max_distances=PPL_DISTANCES,
            trials=PPL_TRIALS, window=PPL_TOKENS, name=name, progress=progress),
    }
    out = {}
    for analysis, step in steps.items():
        t0 = time.perf_counter()
        out[analysis] = step()
        print(f"[{name}] {analysis}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def summary(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The headline numbers per variant (what README.md quotes)."""
    out: dict[str, Any] = {}
    for name in results["disentanglement"]:
        dis = results["disentanglement"][name]
        fake = torch.tensor(dis.fake_distance_correlation, dtype=torch.float64)
        axis = torch.tensor(dis.three_axis_correlation, dtype=torch.float64)
        bias = results["distance_bias"][name]
        heads = results["positional_heads"][name]
        usage = results["frequency_usage"][name]
        decay = results["semantic_decay"][name]
        pert = results["perturbation"][name]
        q = usage.layer_means("q").mean(0)  # [chunk], high → low frequency
        n = q.numel()
        out[name] = {
            "fake_distance_correlation_mean": dis.mean_fake_distance_correlation,
            "fake_distance_correlation_per_layer": dict(zip(dis.layers, fake.nanmean(1).tolist())),
            "three_axis_correlation_mean": dis.mean_three_axis_correlation,
            "three_axis_correlation_per_layer": dict(zip(dis.layers, axis.nanmean(1).tolist())),
            "distance_bias": {"short": bias.short, "long": bias.long, "mean": bias.pooled_mean, "std": bias.pooled_std},
            "positional_heads": {
                kind: [[h.layer, h.head] for h in heads.found if kind in h.kinds]
                for kind in ("diagonal", "previous_token", "high_frequency")
            },
            "query_chunk_norm_by_frequency_quarter": [float(q[i * n // 4 : (i + 1) * n // 4].mean()) for i in range(4)],
            "zero_frequencies": int(sum(f == 0 for f in decay.frequencies["model"])),
            "semantic_decay_ringing": decay.ringing["model"],
            "semantic_gap_at": {  # nearest grid point to each Δt
                d: _finite(decay.curves["model"][min(range(len(decay.distances)), key=lambda i: abs(decay.distances[i] - d))])
                for d in (0, 64, 1024, 4096, 8192)
            },
            "perplexity": {"baseline": pert.baseline_perplexity, **{
                f"{p.mode}@{p.fraction:g},l={p.max_distance}": p.perplexity for p in pert.points}},
        }
    return out


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{JSON_DIGITS}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def write_outputs(results: dict[str, dict[str, Any]], out_dir: str) -> list[str]:
    """``<analysis>.json`` (``{variant: result}``, rounded) and ``<analysis>.png`` (variants side by side)."""
    import matplotlib

    matplotlib.rcParams["figure.constrained_layout.use"] = True  # the grid plots' titles otherwise overlap
    plots = {
        "frequency_usage": dg.plot_frequency_usage, "positional_heads": dg.plot_positional_heads,
        "disentanglement": dg.plot_disentanglement, "distance_bias": dg.plot_distance_bias,
        "semantic_decay": dg.plot_semantic_decay, "perturbation": dg.plot_perturbation,
    }
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for analysis, per_model in results.items():
        path = os.path.join(out_dir, f"{analysis}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({name: _rounded(r.to_dict()) for name, r in per_model.items()}, f, indent=1, allow_nan=False)
        written += [path, plots[analysis](per_model, os.path.join(out_dir, f"{analysis}.png"))]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: examples/diagnostics-smollm2)")
    parser.add_argument("--text", default=os.path.join(DEFAULT_OUT, "text.txt"), help="English text to analyse")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    torch.manual_seed(0)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    model, tok = hf_posenc.models.load_smollm2()
    model.eval()
    ids = tok(text, return_tensors="pt").input_ids
    need = max(SCAN_TOKENS, DISENT_TOKENS, BIAS_TOKENS, PPL_TOKENS)
    if ids.shape[1] < need:
        raise SystemExit(f"{args.text} has {ids.shape[1]} tokens; these settings need {need}.")
    print(f"loaded in {time.perf_counter() - start:.1f} s; text: {ids.shape[1]} tokens", file=sys.stderr)

    results: dict[str, dict[str, Any]] = {}
    for name, variant in variants(model).items():
        for analysis, result in run_model(name, variant, ids, not args.no_progress).items():
            results.setdefault(analysis, {})[name] = result
    written = write_outputs(results, args.out)
    info = {
        "model": "SmolLM2-135M-Instruct (GGUF, dequantized)", "text_tokens": int(ids.shape[1]),
        "settings": {
            "scan_tokens": SCAN_TOKENS, "disentanglement_tokens": DISENT_TOKENS, "disentanglement_layers": DISENT_LAYERS,
            "bias_tokens": BIAS_TOKENS, "bias_ranges": dg.scaled_ranges(BIAS_CONTEXT), "bias_samples": BIAS_SAMPLES,
            "perplexity_tokens": PPL_TOKENS, "fractions": PPL_FRACTIONS, "max_distances": PPL_DISTANCES,
            "trials": PPL_TRIALS, "semantic_decay_max_distance": DECAY_MAX, "ringing_smooth": DECAY_SMOOTH,
            "perturbation_workaround": "explicit all-ones attention_mask (see ExplicitMask)",
        },
        "seconds": round(time.perf_counter() - start, 1),
        "variants": summary(results),
    }
    path = os.path.join(args.out, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, allow_nan=False)
    for p in [*written, path]:
        print(p)
    print(f"total {info['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
