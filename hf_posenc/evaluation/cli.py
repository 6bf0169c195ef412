"""``hf-posenc eval MODEL [MODEL...] --tasks ppl passkey niah_single_1 --lengths 512 1024 --out DIR``.

Each MODEL is a directory, Hub id or ``.gguf`` file, optionally named ``NAME=PATH``. With ``--schemes SPEC...``
the first MODEL is a base that each scheme patches in turn (``hf-posenc eval BASE --schemes rope
cope:clip_low_n=10 prope:p=0.75 tapa``: a fresh copy per scheme, one model in memory at a time, no checkpoint
saved); further MODELs are evaluated as saved, beside them. Models load one at a time with
``AutoModelForCausalLM.from_pretrained`` (a GGUF file dequantized through ``GgufConfig(dequantize=True)``), after
``import hf_posenc`` so that checkpoints patched by hf-posenc load as such. lm-eval's RULER tasks (the
``hf-posenc[eval]`` extra) score the loaded or patched model object itself; a missing lm-eval, or a RULER task that
downloads text while offline, is an error before any model loads. DIR receives ``results.json``, ``report.md``,
``perplexity.png``, ``passkey.png`` and ``ruler.png``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..models import load_model as load_pretrained
from ..models import load_tokenizer, parse_model_specs

def load_model(path: str, gguf_file: str | None = None, *, dtype: str = "auto", device: str | None = None,
               attn_implementation: str | None = None) -> Any:
    """:func:`hf_posenc.models.load_model` (a GGUF file loaded dequantized) on ``device``, in eval mode."""
    import torch

    kwargs: dict[str, Any] = {"dtype": dtype if dtype == "auto" else getattr(torch, dtype)}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = load_pretrained(path, gguf_file, **kwargs)
    return model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()


def parse_scheme_args(specs: list[str]) -> dict[str, Any]:
    """``--schemes`` values → {label: SchemeConfig}: ``SPEC`` is labelled by itself, ``LABEL=SPEC`` by LABEL (a
    ``=`` before any ``:`` names the label; ``cope:clip_low_n=10`` is a bare spec). Labels must be unique."""
    from ..schemes.spec import parse_scheme_spec

    parsed: dict[str, Any] = {}
    for spec in specs:
        eq, colon = spec.find("="), spec.find(":")
        label, text = (spec[:eq], spec[eq + 1:]) if eq > 0 and (colon < 0 or eq < colon) else (spec, spec)
        if label in parsed:
            raise ValueError(f"--schemes: {label!r} is given twice; label repeats with LABEL=SPEC.")
        parsed[label] = parse_scheme_spec(text)
    return parsed


def run_eval(args: argparse.Namespace) -> int:
    """Run ``hf-posenc eval``; returns the exit status (errors raise ``ValueError``/``OSError`` with the fix)."""
    from .report import write_report
    from .harness import check_ruler_tasks
    from .runner import RULER_TASKS, check_tasks, evaluate, evaluate_schemes

    tasks = check_tasks(args.tasks)
    if any(t in RULER_TASKS for t in tasks):  # before any model loads
        check_ruler_tasks([t for t in tasks if t in RULER_TASKS], args.lengths)
    text = None
    if "ppl" in tasks:
        if not args.text:
            raise ValueError("the ppl task needs --text FILE (a UTF-8 text longer than the largest --lengths)")
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        if not text.strip():
            raise ValueError(f"{args.text} is empty; --text needs a long UTF-8 text")
    specs = parse_model_specs(args.models)
    schemes = parse_scheme_args(args.schemes) if args.schemes else {}
    clash = sorted(set(schemes) & {name for name, _ in specs[1:]})
    if clash:
        raise ValueError(f"result names {clash} are both a scheme and a model; rename one with LABEL=SPEC or "
                         "NAME=PATH.")
    shared_tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    common = dict(text=text, stride=args.stride, max_tokens=args.max_tokens, trials=args.trials, seed=args.seed,
                  samples=args.samples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                  fast=not args.full_logits, chunk_size=args.chunk_size, progress=not args.no_progress)

    def load(name: str, path: str) -> Any:
        print(f"loading {name} from {path}...", file=sys.stderr)
        return load_model(path, args.gguf_file, dtype=args.dtype, device=args.device,
                          attn_implementation=args.attn_implementation)

    result = None
    if schemes:
        (base_name, base_path), specs = specs[0], specs[1:]
        tokenizer = shared_tokenizer or load_tokenizer(base_path, args.gguf_file)
        base = load(base_name, base_path)  # loaded (a GGUF dequantized) once; each scheme patches a copy of it
        result = evaluate_schemes(base, schemes, tokenizer, tasks, args.lengths, args.depths, **common)
        result.settings["base"] = base_path
        del base
    for name, path in specs:  # one model in memory at a time
        model = load(name, path)
        tokenizer = shared_tokenizer or load_tokenizer(path, args.gguf_file)
        part = evaluate({name: model}, tokenizer, tasks, args.lengths, args.depths, **common)
        result = part if result is None else result.merge(part)
        del model
    result.settings["text"] = args.text
    for path in write_report(result, args.out):
        print(path)
    return 0
