"""``hf-posenc diagnose MODEL [MODEL...] --text FILE --analyses ... --out DIR``.

Runs the chosen analyses on every model (``path`` or ``name=path``; GGUF through ``--gguf-file``, loaded
dequantized) and writes, per analysis, ``DIR/<analysis>.json`` (``{model name: result}``) and
``DIR/<analysis>.png`` (all models side by side or overlaid), then ``DIR/summary.md``: the number that matters from
each analysis, per model, with the files that hold the rest (also printed at the end).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..models import parse_model_specs
from ..results_io import dumps
from .summary import write_summary

def _run_model(model: Any, ids: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    from . import (
        disentanglement, distance_bias, frequency_usage, model_frequency_sets, perturbation_tolerance,
        phase_regime, positional_heads, semantic_decay,
    )

    progress = not args.no_progress
    common = dict(layers=args.layers, heads=args.heads, name=name)
    runs = {
        "frequency_usage": lambda: frequency_usage(model, ids, window=args.window, progress=progress, **common),
        "positional_heads": lambda: positional_heads(
            model, ids, window=args.window, diagonal_threshold=args.diagonal_threshold,
            previous_threshold=args.previous_threshold, high_freq_threshold=args.high_freq_threshold,
            high_fraction=args.high_fraction, progress=progress, **common,
        ),
        "disentanglement": lambda: disentanglement(
            model, ids, length=args.length, distances=args.distances, three_axis=not args.no_three_axis, **common
        ),
        "distance_bias": lambda: distance_bias(
            model, ids, short=args.short, long=args.long, samples=args.samples, seed=args.seed, **common
        ),
        "semantic_decay": lambda: semantic_decay(
            model_frequency_sets(model, args.layers), samples=min(args.samples, 4096), seed=args.seed, name=name,
            max_distance=args.max_distance or int(model.config.max_position_embeddings),
        ),
        "perturbation": lambda: perturbation_tolerance(
            model, ids, fractions=args.fractions, max_distances=args.max_distances, trials=args.trials,
            score=args.score, window=args.window, seed=args.seed, name=name, progress=progress,
        ),
        "phase_regime": lambda: phase_regime(model, ids, window=args.window, progress=progress, **common),
    }
    out: dict[str, Any] = {}
    for analysis in args.analyses:
        print(f"[{name}] {analysis}...", file=sys.stderr)
        out[analysis] = runs[analysis]()
    return out


def write_outputs(results: dict[str, dict[str, Any]], out_dir: str) -> list[str]:
    """``results[analysis][model] = result`` -> ``out_dir/<analysis>.json`` and ``.png``; returns the paths (the
    summary is :func:`hf_posenc.diagnostics.summary.write_summary`)."""
    from .. import diagnostics  # every analysis has its plot_<analysis>

    os.makedirs(out_dir, exist_ok=True)
    written = []
    for analysis, per_model in results.items():
        path = os.path.join(out_dir, f"{analysis}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(dumps({name: r.to_dict() for name, r in per_model.items()}))
        plot = getattr(diagnostics, f"plot_{analysis}")
        written += [path, plot(per_model, os.path.join(out_dir, f"{analysis}.png"))]
    return written


def run_diagnose(args: argparse.Namespace) -> int:
    """Run ``hf-posenc diagnose``; returns the exit status."""
    import hf_posenc  # noqa: F401  (registers the patched model types before loading)

    from ..models import load_model, load_tokenizer

    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise SystemExit(f"hf-posenc diagnose: {args.text} is empty.")
    specs = parse_model_specs(args.models)
    results: dict[str, dict[str, Any]] = {}
    for name, path in specs:
        print(f"loading {name} from {path}...", file=sys.stderr)
        model = load_model(path, args.gguf_file)
        tokenizer = load_tokenizer(path, args.gguf_file)
        ids = tokenizer(text, return_tensors="pt").input_ids
        if args.max_tokens is not None:
            ids = ids[:, : args.max_tokens]
        try:
            per_analysis = _run_model(model, ids, name, args)
        except (ValueError, TypeError) as err:
            raise SystemExit(f"hf-posenc diagnose: {name}: {err}") from err
        for analysis, result in per_analysis.items():
            results.setdefault(analysis, {})[name] = result
        del model
    written = write_outputs(results, args.out)
    summary, lines = write_summary(results, args.out, written)
    for path in [*written, summary]:
        print(path)
    print(f"\nsummary ({summary}):")
    print("\n".join(lines))
    return 0

