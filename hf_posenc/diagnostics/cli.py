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

ANALYSES = ("frequency_usage", "positional_heads", "disentanglement", "distance_bias", "semantic_decay", "perturbation")


def _number_list(cast: type, example: str, kind: str):
    """An argparse type for comma-separated numbers (``kind`` and ``example`` name them in the error)."""

    def parse(text: str) -> list:
        try:
            return [cast(x) for x in text.split(",") if x.strip()]
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind} like {example}, got {text!r}") from err

    return parse


_int_list = _number_list(int, "0,3,5", "integers")
_float_list = _number_list(float, "0.01,0.05", "numbers")


def _analyses(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if names == ["all"]:
        return list(ANALYSES)
    unknown = [n for n in names if n not in ANALYSES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown analyses {unknown}; choose from {', '.join(ANALYSES)} or 'all'")
    return names


def _range(text: str) -> tuple[int, int]:
    parts = _int_list(text)
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected LO,HI like 0,100, got {text!r}")
    return parts[0], parts[1]


def add_diagnose_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``diagnose`` arguments to ``parser`` (a sub-parser of the ``hf-posenc`` command)."""
    parser.add_argument("models", nargs="+", metavar="MODEL", help="model directory, Hub id, .gguf file, or NAME=PATH")
    parser.add_argument("--text", required=True, help="UTF-8 text file to analyse")
    parser.add_argument("--out", required=True, help="output directory for the JSON and PNG files")
    parser.add_argument("--analyses", type=_analyses, default=list(ANALYSES),
                        help=f"comma-separated subset of {', '.join(ANALYSES)} (default: all)")
    parser.add_argument("--gguf-file", help="GGUF file name inside every MODEL directory (loaded dequantized)")
    parser.add_argument("--layers", type=_int_list, help="layers to analyse, e.g. 0,5,-1 (default: all)")
    parser.add_argument("--heads", type=_int_list, help="query heads to analyse, e.g. 0,1 (default: all)")
    parser.add_argument("--max-tokens", type=int, default=None, help="use only the first N tokens of the text")
    parser.add_argument("--window", type=int, default=512, help="tokens per forward pass when streaming (512)")
    parser.add_argument("--length", type=int, default=256, help="tokens for the disentanglement fits (256)")
    parser.add_argument("--distances", type=int, default=None, help="fake distances for disentanglement (= length)")
    parser.add_argument("--no-three-axis", action="store_true", help="skip the 3-axis fit of the real logits")
    parser.add_argument("--short", type=_range, default=None, help="distance-bias short range LO,HI (paper 0,100)")
    parser.add_argument("--long", type=_range, default=None, help="distance-bias long range LO,HI (paper 10000,10100)")
    parser.add_argument("--samples", type=int, default=10000, help="distance-bias pairs / semantic-decay vectors")
    parser.add_argument("--max-distance", type=int, default=None,
                        help="semantic-decay range of Δt (default: the model's max_position_embeddings)")
    parser.add_argument("--diagonal-threshold", type=float, default=0.5)
    parser.add_argument("--previous-threshold", type=float, default=0.5)
    parser.add_argument("--high-freq-threshold", type=float, default=None, help="default 2 × --high-fraction")
    parser.add_argument("--high-fraction", type=float, default=0.125, help="share of chunks counted as high-frequency")
    parser.add_argument("--fractions", type=_float_list, default=[0.01, 0.05, 0.1], help="perturbed token fractions")
    parser.add_argument("--max-distances", type=_int_list, default=[5, 10], help="perturbation distances")
    parser.add_argument("--trials", type=int, default=2, help="random draws per perturbation setting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser


def _run_model(model: Any, ids: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    from . import (
        disentanglement, distance_bias, frequency_usage, model_frequency_sets, perturbation_tolerance,
        positional_heads, semantic_decay,
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
            window=args.window, seed=args.seed, name=name, progress=progress,
        ),
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

