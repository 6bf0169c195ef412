"""``hf-posenc train RECIPE [dotted.key=value ...] [--resume] [--dry-run]``.

The lead CLI mounts :func:`add_train_arguments` / :func:`run_train`; ``python -m hf_posenc.training.cli`` runs the
same command stand-alone (what ``accelerate launch`` and ``torchrun`` start in each process).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` sub-command's arguments to ``parser``."""
    parser.add_argument("recipe", help="recipe YAML file (see recipes/)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides read as YAML, e.g. training.max_steps=10 scheme.clip_low_n=16 "
                             "(training.* takes any transformers.TrainingArguments field)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output.dir")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the recipe, print it with the context-length notes, load no weights")


def run_train(args: argparse.Namespace) -> int:
    """Validate and run a recipe; returns the exit status (2 for a bad recipe, with the reason on stderr)."""
    from .config import RecipeError, load_recipe

    recipe = None
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if args.dry_run:
            from .trainer import context_length_notes, load_model_config

            notes = context_length_notes(recipe, load_model_config(recipe))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-posenc train", description=__doc__)
    add_train_arguments(parser)
    return run_train(parser.parse_intermixed_args(argv))


if __name__ == "__main__":
    sys.exit(main())
