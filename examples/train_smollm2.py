"""A real (small) context-extension run on CPU: SmolLM2-135M with CoPE and with YaRN, before and after LoRA.

What it does, with the shipped recipes ``recipes/smollm2-cope-cpu.yaml`` and ``recipes/smollm2-yarn-cpu.yaml``:

1. splits ``examples/train-smollm2/corpus.txt`` (an original ~3,600-word essay) at section VII into a training
   part (sections I-VI) and a held-out part (sections VII-XI);
2. evaluates, before any training, the stock model (RoPE, unpatched) and the model patched with each scheme:
   sliding-window perplexity (Press et al. stride method) of the held-out text and passkey retrieval
   (Landmark-attention format) at each length;
3. runs ``hf-posenc train RECIPE key=value ...`` for each scheme (LoRA+ on the training part, a dozen steps at 512
   tokens), whose built-in evaluation scores the trained model on the same held-out text and prompts;
4. merges the before/after results into one report (``results.json``, ``report.md``, ``perplexity.png``,
   ``passkey.png``), plots the loss curves from each run's ``log.jsonl`` and writes ``summary.json``.

Run outputs (adapters, merged weights) stay under ``--work`` (default: a fresh temporary folder); only logs, JSON and
plots are copied into ``--out`` (default ``examples/train-smollm2``). Run from the repository root::

    python examples/train_smollm2.py                 # about 7 minutes on 2 idle CPU cores
    python examples/train_smollm2.py --steps 4 --lengths 256 512 --depths 0.5   # a quicker smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "train-smollm2" / "corpus.txt"
SPLIT_MARKER = "\nVII. "
SCHEMES = {"cope": "recipes/smollm2-cope-cpu.yaml", "yarn": "recipes/smollm2-yarn-cpu.yaml"}


def split_corpus(corpus: Path, work: Path) -> tuple[Path, Path]:
    """Write the training part (before ``SPLIT_MARKER``) and the held-out part (from it on) under ``work``."""
    text = corpus.read_text(encoding="utf-8")
    cut = text.find(SPLIT_MARKER)
    if cut < 0:
        raise ValueError(f"{corpus} has no section heading {SPLIT_MARKER.strip()!r} to split the held-out part at")
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    train, heldout = data / "train.txt", data / "heldout.txt"
    train.write_text(text[:cut].strip() + "\n", encoding="utf-8")
    heldout.write_text(text[cut:].strip() + "\n", encoding="utf-8")
    return train, heldout


def eval_options(args: argparse.Namespace) -> dict:
    """Keyword arguments of ``hf_posenc.evaluation.evaluate`` shared by the before and after evaluations."""
    return {"depths": list(args.depths), "trials": args.trials, "max_tokens": 4096, "progress": False}


def overrides(args: argparse.Namespace, scheme: str, train: Path, heldout: Path, work: Path) -> list[str]:
    """``dotted.key=value`` overrides that shorten the shipped recipe and point it at the local corpus."""
    return [
        f"data.files=[{train}]",
        f"context_length={args.context_length}",
        f"training.max_steps={args.steps}",
        f"training.save_steps={args.steps}",  # one checkpoint at the end, none in between
        f"output.dir={work / 'runs' / scheme}",
        "evaluation.enabled=true",
        f"evaluation.lengths={json.dumps(list(args.lengths))}",
        f"evaluation.tasks={json.dumps(list(args.tasks))}",
        f"evaluation.text_files=[{heldout}]",
        f"evaluation.options={json.dumps(eval_options(args))}",
    ]


def evaluate_before(args: argparse.Namespace, heldout: Path, train: Path, work: Path):
    """Evaluate the stock model and each scheme's patched, untrained model; returns the EvaluationResult."""
    from hf_posenc.evaluation import evaluate
    from hf_posenc.patching import patch_model
    from hf_posenc.training.config import load_recipe
    from hf_posenc.training.trainer import load_base_model, load_tokenizer

    text = heldout.read_text(encoding="utf-8")
    result = None
    names = ["rope-stock"] + list(args.schemes)
    for name in names:
        recipe = load_recipe(SCHEMES["cope" if name == "rope-stock" else name],
                             overrides(args, name, train, heldout, work))
        tokenizer = load_tokenizer(recipe)
        model = load_base_model(recipe).eval()
        if name != "rope-stock":
            patch_model(model, recipe.scheme_config())
        label = name if name == "rope-stock" else f"{name} before"
        part = evaluate({label: model}, tokenizer, tasks=list(args.tasks), lengths=list(args.lengths),
                        text=text, **eval_options(args))
        result = part if result is None else result.merge(part)
        del model
    return result


def run_train(args: argparse.Namespace, scheme: str, train: Path, heldout: Path, work: Path) -> float:
    """Run ``hf-posenc train`` for one scheme as a subprocess; returns its wall time in seconds."""
    run_dir = work / "runs" / scheme
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = ["hf-posenc", "train", SCHEMES[scheme], *overrides(args, scheme, train, heldout, work)]
    print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def plot_losses(logs: dict[str, list[dict]], path: Path) -> None:
    """Training loss per step, one line per scheme."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for scheme, records in logs.items():
        rows = [(r["step"], r["loss"]) for r in records if "loss" in r]
        ax.plot([s for s, _ in rows], [v for _, v in rows], marker="o", label=scheme)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("SmolLM2-135M, LoRA+ at 512 tokens")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(os.fspath(path), dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", choices=sorted(SCHEMES), default=["cope", "yarn"])
    parser.add_argument("--steps", type=int, default=12, help="training steps per scheme (default 12)")
    parser.add_argument("--context-length", type=int, default=512, help="training window in tokens (default 512)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024], help="evaluation lengths")
    parser.add_argument("--tasks", nargs="+", default=["ppl", "passkey"], help="evaluation tasks")
    parser.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="passkey depths")
    parser.add_argument("--trials", type=int, default=1, help="passkey keys per length x depth (default 1)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "train-smollm2",
                        help="run outputs (weights; not kept in the repo)")
    parser.add_argument("--out", type=Path, default=HERE / "train-smollm2", help="logs, JSON and plots")
    args = parser.parse_args(argv)
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")

    from hf_posenc.evaluation import EvaluationResult, write_report
    from hf_posenc.training.trainer import read_log

    args.out.mkdir(parents=True, exist_ok=True)
    train, heldout = split_corpus(CORPUS, args.work)
    summary: dict = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                     "wall_s": {}}

    start = time.perf_counter()
    result = evaluate_before(args, heldout, train, args.work)
    summary["wall_s"]["evaluate_before"] = round(time.perf_counter() - start, 1)
    result.save_json(args.out / "before.json")

    logs: dict[str, list[dict]] = {}
    for scheme in args.schemes:
        summary["wall_s"][f"train_{scheme}"] = round(run_train(args, scheme, train, heldout, args.work), 1)
        run_dir = args.work / "runs" / scheme
        after = EvaluationResult.load_json(run_dir / "eval" / "results.json")
        for row in after.perplexity + after.retrieval:
            row.model = f"{scheme} after"
        result = result.merge(after)
        dest = args.out / scheme
        dest.mkdir(exist_ok=True)
        for name in ("log.jsonl", "recipe.yaml"):
            shutil.copy(run_dir / name, dest / name)
        logs[scheme] = read_log(run_dir / "log.jsonl")
        summary[scheme] = {"losses": [r["loss"] for r in logs[scheme] if "loss" in r],
                           "train_runtime_s": next((r["train_runtime"] for r in logs[scheme]
                                                    if "train_runtime" in r), None)}

    write_report(result, args.out)
    plot_losses(logs, args.out / "loss.png")
    summary["wall_s"]["total"] = round(time.perf_counter() - start, 1)
    summary["perplexity"] = {f"{r.model} @ {r.context_length}": round(r.perplexity, 3) for r in result.perplexity}
    if "passkey" in result.tasks():
        summary["passkey"] = {f"{m} @ {n}": result.mean_accuracy(m, "passkey", n)
                              for m in result.models() for n in args.lengths}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
