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
        _leave_process_group()
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


def _leave_process_group() -> None:
    """Destroy the process group a distributed launch set up (the Trainer's, through accelerate), once this rank's
    part of the run is done: every collective is behind it (the last is the barrier after the save), and what is
    left runs on the main process alone. A process that exits with its gloo group alive can abort in the
    interpreter's shutdown (``terminate called without an active exception``, SIGABRT: gloo's worker threads are
    still joinable), which fails a launch whose training succeeded; PyTorch's documentation asks every process to
    call ``destroy_process_group`` at the end. Destroying a group is local to the process, so a rank that finishes
    before the main process does not wait for it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from hf_posenc_cli.arguments import command_parser

    return run_train(command_parser("train").parse_intermixed_args(argv))


if __name__ == "__main__":
    sys.exit(main())
