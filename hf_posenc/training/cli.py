"""``hf-posenc train RECIPE [dotted.key=value ...] [--resume] [--dry-run]``.

``hf-posenc train`` runs :func:`run_train` (its arguments: ``hf_posenc_cli.arguments.add_train_arguments``);
``python -m hf_posenc.training.cli`` runs the same command stand-alone (what ``accelerate launch`` and ``torchrun``
start in each process).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings


def run_train(args: argparse.Namespace) -> int:
    """Validate and run a recipe; returns the exit status (2 for a bad recipe, with the reason on stderr)."""
    from .config import RecipeError, load_recipe

    recipe = None
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.dry_run:
            from .trainer import check_family, context_length_notes, load_model_config

            config = load_model_config(recipe)
            check_family(recipe, config)
            notes = context_length_notes(recipe, config)
            print(json.dumps({"recipe": recipe.to_dict(), "notes": notes}, indent=2, default=str))
            return 0
        from .trainer import run_training

        with warnings.catch_warnings():
            warnings.simplefilter("default")
            result = run_training(recipe, resume=args.resume)
    except RecipeError as exc:
        print(f"hf-posenc train: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from .trainer import last_complete_checkpoint

        last = None if recipe is None else last_complete_checkpoint(recipe.output.dir)
        saved = (f"the newest complete checkpoint is {last}; continue from it with `hf-posenc train {args.recipe} "
                 f"{' '.join(args.overrides)}{' ' if args.overrides else ''}--resume`" if last else
                 "no checkpoint was saved yet (training.save_steps sets how often), so a new run starts over")
        print(f"hf-posenc train: interrupted; {saved}.", file=sys.stderr)
        return 130
    print(json.dumps({"output_dir": result.output_dir, "model_dir": result.model_dir,
                      "merged_dir": result.merged_dir, "log": result.log_path,
                      "final_loss": result.losses[-1] if result.losses else None, "notes": result.notes}, indent=2))
    return 0


def end_launched_rank(code: int) -> None:
    """End this process now, with ``code``, where it is one rank of a distributed launch (``WORLD_SIZE`` > 1) whose
    command succeeded: its output flushed and its log handlers closed, then ``os._exit``, skipping the interpreter's
    shutdown. There a rank of a DeepSpeed launch on the CPU can abort after its training and save succeeded
    (``terminate called without an active exception``, SIGABRT from C++ threads of the distributed stack still
    joinable in their destructors; seen in ZeRO-3 launches with and without its process group destroyed first),
    which fails the whole launch. Every file the run writes is closed before its command returns. A failure, or a
    process outside a launch, returns and exits the usual way."""
    import logging
    import os

    if code != 0 or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    from hf_posenc_cli.arguments import command_parser

    return run_train(command_parser("train").parse_intermixed_args(argv))


if __name__ == "__main__":
    status = main()
    end_launched_rank(status)
    sys.exit(status)
