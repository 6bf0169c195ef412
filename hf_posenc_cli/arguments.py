"""Every argument of the ``hf-posenc`` command and its subcommands, and the names they accept.

Standard library only, and no import of ``hf_posenc`` (an import-linter contract): importing ``hf_posenc`` registers
its schemes with Transformers, which imports torch, and help, ``--version`` and argument errors are answered from
this module alone. The names the arguments accept are :mod:`hf_posenc_cli.vocabulary`'s, which the modules that
run the commands import too.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .vocabulary import (  # the names the arguments accept (hf_posenc and hf_posenc_experiments import them there)
    PERTURBATION_SCORES, ANALYSES, RULER_LOCAL_TASKS, RULER_TASKS, EVAL_TASKS, NEEDLE_DEPTHS, RULER_SAMPLES,
    WEIGHT_DTYPES, EXPERIMENTS, EXPERIMENT_SIZES, SELFTEST_SIZES, SELFTEST_DTYPES,
)


def version() -> str:
    """The installed distribution's version (``hf_posenc.record.LIBRARY_VERSION``, which a test keeps equal)."""
    try:
        return metadata.version("hf-posenc")
    except metadata.PackageNotFoundError:  # a source tree on sys.path without `pip install -e .`
        return "unknown (not installed: pip install -e .)"


# -- argparse's private layout (kept here, where the parsers are; one test each in tests/test_cli.py) ---------------
def parser_option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string a parser takes (``-o``, ``--option``; argparse private ``_option_string_actions``)."""
    return list(parser._option_string_actions)


def parser_has_subcommands(parser: argparse.ArgumentParser) -> bool:
    """Whether ``add_subparsers`` was called on a parser (argparse private ``_subparsers``)."""
    return parser._subparsers is not None


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` (argparse private ``_SubParsersAction`` among ``_actions``)."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


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
        known = [s for s in parser_option_strings(self) if s.startswith("--")]
        notes = []
        for name in self._unknown_options():
            close = difflib.get_close_matches(name, known, n=1)
            notes.append(f"unknown option {name}" + (f" (did you mean {close[0]}?)" if close else ""))
        if notes:  # "unrecognized arguments: --lenghts 64" says no more than the notes; anything else follows them
            message = "; ".join(notes) + ("" if message.startswith("unrecognized arguments") else f"; {message}")
        super().error(message)


# -- argument types --------------------------------------------------------------------------------------------------
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


def _depth(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"a depth is a number in [0, 1], got {text!r}") from err
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a depth is the fraction of filler before the needle, in [0, 1]; got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _key_value(text: str) -> str:
    """A scheme option of ``-o``: ``KEY=VALUE`` with a key (the value is read by
    :func:`hf_posenc.schemes.spec.parse_key_values` when the command runs)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE: give each scheme option as -o KEY=VALUE "
                                         "(e.g. -o clip_low_n=10)")
    return text


# -- the subcommands -------------------------------------------------------------------------------------------------
def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="model directory, Hub id, or a .gguf file")
    parser.add_argument("--gguf-file", help="GGUF file name inside SOURCE (loaded dequantized)")


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="output directory (must not be SOURCE or lie inside it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUTPUT if it exists and is not empty (its current contents are deleted)")
    parser.add_argument("--no-tokenizer", action="store_true", help="do not copy the tokenizer")


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    _add_source(p)


def add_patch_arguments(p: argparse.ArgumentParser) -> None:
    _add_source(p)
    _add_output(p)
    p.add_argument("--scheme", required=True, help="cope, hardclip, prope, rope, tapa or tape")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                   help="scheme option, repeatable (e.g. -o clip_low_n=10 -o rope_theta=1e7)")
    p.add_argument("--replace", action="store_true", help="replace a scheme the checkpoint already carries")
    p.add_argument("--compose", action="store_true",
                   help="patch a stock export of hf-posenc on purpose (its frequencies already carry a scheme)")


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    _add_source(p)
    _add_output(p)
    p.add_argument("--gguf", metavar="QUANT", help="write OUTPUT as a GGUF file for llama.cpp instead: f32, f16, "
                   "bf16, q8_0 (llama.cpp's converter alone: scripts/serving/setup_llamacpp.sh --converter, seconds) "
                   "or q4_k_m (also its quantizer: the full setup, minutes); static frequency schemes, families whose "
                   "llama.cpp architecture reads rope_freqs (the GGUF column of `hf-posenc families`)")
    p.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp source directory holding convert_hf_to_gguf.py "
                   "(default: $HF_POSENC_LLAMA_CPP, else where the setup script unpacks it)")
    p.add_argument("--tokenizer", metavar="DIR_OR_HUB_ID",
                   help="the tokenizer to write with the model (default: SOURCE's; a GGUF file needs one)")


def add_families_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_types", nargs="*", metavar="MODEL_TYPE",
                   help="only these model types' rows, e.g. llama qwen3 (default: every one)")
    p.add_argument("--markdown", action="store_true", help="as a Markdown table (what docs/families.md embeds)")


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=20)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """``hf-posenc train RECIPE [dotted.key=value ...] [--resume] [--dry-run]`` (flags may follow the overrides)."""
    parser.add_argument("recipe", help="recipe YAML file (see recipes/)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides read as YAML, e.g. training.max_steps=10 scheme.clip_low_n=16 "
                             "(training.* takes any transformers.TrainingArguments field)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output.dir")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the recipe, print it with the context-length notes, load no weights")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """``hf-posenc eval MODEL [MODEL...] --tasks ... --lengths ... --out DIR`` (see hf_posenc.evaluation.cli)."""
    parser.add_argument("models", nargs="+", metavar="MODEL", help="model directory, Hub id, .gguf file, or NAME=PATH")
    parser.add_argument("--schemes", nargs="+", default=None, metavar="SPEC",
                        help="evaluate the first MODEL patched with each scheme: NAME or NAME:key=value,... "
                             "(e.g. rope cope:clip_low_n=10 prope:p=0.75 tapa), optionally LABEL=SPEC")
    parser.add_argument("--tokenizer", help="tokenizer directory or Hub id for every model (default: each MODEL)")
    parser.add_argument("--gguf-file", help="GGUF file name inside every MODEL directory (loaded dequantized)")
    parser.add_argument("--text", help="UTF-8 text file for the perplexity task")
    parser.add_argument("--tasks", nargs="+", choices=EVAL_TASKS, default=["ppl", "passkey"], metavar="TASK",
                        help="ppl, passkey (default: both), and lm-eval's RULER tasks (pip install 'hf-posenc[eval]'; "
                             f"generated here, so they run offline: {', '.join(RULER_LOCAL_TASKS)}; downloading "
                             f"text: {', '.join(RULER_TASKS[len(RULER_LOCAL_TASKS):])})")
    parser.add_argument("--lengths", nargs="+", type=_positive, default=[512, 1024],
                        help="context lengths in tokens (default: 512 1024)")
    parser.add_argument("--stride", type=_positive, default=None,
                        help="perplexity window stride in tokens (default: half of each length)")
    parser.add_argument("--max-tokens", type=_positive, default=None, help="use only the first N tokens of --text")
    parser.add_argument("--depths", nargs="+", type=_depth, default=list(NEEDLE_DEPTHS),
                        help="passkey depths in [0, 1] (default: 0 0.25 0.5 0.75 1)")
    parser.add_argument("--trials", type=_positive, default=1, help="passkey prompts per length × depth (default 1)")
    parser.add_argument("--samples", type=_positive, default=RULER_SAMPLES,
                        help=f"RULER samples per length, the first of the 500 lm-eval builds (default {RULER_SAMPLES})")
    parser.add_argument("--batch-size", type=_positive, default=1, help="RULER prompts per generate call (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the passkeys and of RULER's samples")
    parser.add_argument("--max-new-tokens", type=_positive, default=None,
                        help="greedy tokens per answer (default: 10 for passkey, each RULER task's own)")
    parser.add_argument("--out", required=True, help="output directory for results.json, report.md and the plots")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", choices=WEIGHT_DTYPES, default="auto",
                        help="weights dtype (default: the checkpoint's)")
    parser.add_argument("--attn-implementation", default=None, help="e.g. sdpa, eager, flash_attention_2")
    parser.add_argument("--chunk-size", type=_positive, default=1024, help="positions per output-head chunk (1024)")
    parser.add_argument("--full-logits", action="store_true",
                        help="compute the perplexity from the model's full logits (reference path, more memory)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def add_diagnose_arguments(parser: argparse.ArgumentParser) -> None:
    """``hf-posenc diagnose MODEL [MODEL...] --text FILE --out DIR`` (see hf_posenc.diagnostics.cli)."""
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
    parser.add_argument("--score", choices=PERTURBATION_SCORES, default="all",
                        help="perturbation: score every target of the perturbed text (all), or only those it left "
                             "alone, paired with the clean text over the same targets (unperturbed; Han & Ji §4.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """``hf-posenc experiment NAME [--size toy|small] ...`` (see hf_posenc_experiments.cli)."""
    parser.add_argument("name", choices=EXPERIMENTS, help="which experiment")
    parser.add_argument("--size", choices=EXPERIMENT_SIZES, default="small",
                        help="toy: seconds (smoke test); small: the committed CPU results (default); gpu: the "
                             "experiments made for a GPU (minutes on one H100)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per scheme (default: the experiment's, 3; 10 for prope_gemma_ratio)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="first seed (default 0); other seeds rerun the experiment to check that it reproduces")
    parser.add_argument("--check-against", metavar="RESULTS_JSON",
                        help="compare the means with a committed results.json of the same experiment (95%% "
                             "prediction intervals) and write reproducibility.md/.json next to the results")
    parser.add_argument("--out", help="where results.json/.md/.png go (default out/experiments/NAME-SIZE)")
    parser.add_argument("--work", help="where runs are trained and cached (default out/experiments/NAME-SIZE/work); "
                                       "a rerun reuses finished runs with the same settings")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs trained at once, each in its own process with one torch thread (default 1; 2 on "
                             "2 cores does nearly twice the work: the miniatures are too small to share threads)")
    parser.add_argument("--render-only", action="store_true",
                        help="train nothing: rewrite results.md (and the verdict, tests and claims in results.json) "
                             "from the results.json in --out, e.g. a committed report after a change to the report")


def add_selftest_arguments(p: argparse.ArgumentParser) -> None:
    """``hf-posenc selftest`` (also ``python -m hf_posenc.selftest``)."""
    p.description = (
        "Check every TAPA/TAPE kernel against its float64 reference (bf16/fp16, forward and backward, GQA, "
        "key padding, packed segments, sliding window, linear phase, decode), then time TAPA and TAPE against "
        "RoPE through SDPA's flash backend. On CPU the kernels run in the Triton interpreter at small shapes. "
        "Exits 1 when a check fails, naming it.")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--size", choices=SELFTEST_SIZES, default=None,
                   help="shapes: realistic (default on cuda), small (default on cpu), tiny")
    p.add_argument("--dtypes", nargs="+", choices=SELFTEST_DTYPES, default=None,
                   help="dtypes to check; timing uses the first (default: bf16 fp16 on cuda, fp32 fp16 on cpu)")
    p.add_argument("--lengths", nargs="+", type=int, default=None,
                   help="timing lengths (default 1024 2048 4096 8192 16384 on cuda)")
    p.add_argument("--repeats", type=int, default=None, help="timing repeats per candidate (median is reported)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run only the checks whose name contains TEXT (repeatable), e.g. --only tapa/decode")
    p.add_argument("--no-checks", action="store_true", help="skip the kernel checks")
    p.add_argument("--no-timing", action="store_true", help="skip the timing")
    p.add_argument("--json", type=Path, default=None,
                   help="report path (default: hf-posenc-selftest-<device>.json in the current directory)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


# subcommand -> (help line, the function that adds its arguments); hf_posenc.cli.COMMANDS runs each
SUBCOMMANDS: dict[str, tuple[str, Any]] = {
    "info": ("what positional-encoding scheme a checkpoint carries", add_info_arguments),
    "patch": ("load a checkpoint, patch it with a scheme, save it", add_patch_arguments),
    "export": ("write a patched checkpoint for stock Transformers (no plugin needed)", add_export_arguments),
    "families": ("the support table: every rotary model type × scheme, as the tests found it", add_families_arguments),
    "demo": ("SmolLM2-135M patched with each scheme: frequencies, perplexity, greedy text", add_demo_arguments),
    "train": ("PEFT context-extension fine-tuning from a recipe (recipes/*.yaml)", add_train_arguments),
    "eval": ("sliding-window perplexity, passkey and lm-eval's RULER tasks at several lengths", add_eval_arguments),
    "diagnose": ("the papers' analyses (frequency usage, positional heads, disentanglement, ...)",
                 add_diagnose_arguments),
    "experiment": ("miniature reproductions of the papers' claims: every scheme side by side, several seeds",
                   add_experiment_arguments),
    "selftest": ("check every TAPA/TAPE kernel against its reference, then time them against RoPE",
                 add_selftest_arguments),
}

DESCRIPTION = ("hf-posenc: switch the positional encoding of Hugging Face RoPE checkpoints (CoPE, p-RoPE, TAPA, TAPE, "
               "PI, NTK, YaRN, ABF), fine-tune, evaluate, diagnose and export them.")


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-posenc`` parser with every subcommand."""
    parser = _Parser(prog="hf-posenc", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, add) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_text))
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """A subcommand's parser on its own (``prog="hf-posenc NAME"``): what ``python -m hf_posenc.training.cli`` and
    ``python -m hf_posenc.selftest`` parse."""
    help_text, add = SUBCOMMANDS[name]
    parser = _Parser(prog=f"hf-posenc {name}", description=help_text)
    add(parser)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; help, ``--version`` and errors exit here (0 and 2), before anything is imported.

    ``train RECIPE key=value ... --resume``: flags may follow the overrides (parsed intermixed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        args = command_parser("train").parse_intermixed_args(argv[1:])
        args.command = "train"
        return args
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser: its usage, and the option a misspelled one stands for
        subcommand_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    return args
