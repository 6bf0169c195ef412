"""Length generalisation from scratch (TAPA, p-RoPE and CoPE papers), in miniature.

A Llama-style byte-level model is trained from random weights at a short length L with each scheme (RoPE, NoPE,
CoPE, HardClip, p-RoPE 0.25 / 0.75, TAPA with quadratic and linear phase) and each seed, then scored on a held-out
novel at L, 2L, 4L and 8L (disjoint windows: every position 0…n−1 of each window is scored, so positions never
seen in training count). The held-out unigram and bigram entropies are reported as floors: a model below the
bigram floor uses more than one byte of context, which is where positional encoding can matter.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .config import ExperimentSettings, LengthGeneralisationConfig, ModelSettings, TrainSettings
from .corpus import Corpus, austen_corpus, ngram_entropies, write_text
from .report import closing_lines, markdown_table, plot_summary, write_results
from .runner import Cell, Summary, build_recipe, run_cells, slug
from .tokenizer import byte_tokenizer, save_byte_tokenizer
from .why import diagnose


def prepare(config: ExperimentSettings, corpus: Corpus, work: Path) -> dict[str, Any]:
    """Write the training files, the held-out evaluation file and the tokenizer under ``work``; measure the floors."""
    data = work / "data"
    train = Corpus(corpus.name, {k: v if config.train_chars is None else v[: config.train_chars]
                                 for k, v in corpus.train.items()}, corpus.heldout)
    files = train.write_train_files(data / "train")
    tokenizer = byte_tokenizer()
    eval_ids = tokenizer(corpus.heldout).input_ids[: config.eval_tokens]
    if len(eval_ids) < config.eval_tokens:
        raise ValueError(f"the held-out text has {len(eval_ids)} bytes, fewer than eval_tokens={config.eval_tokens}")
    eval_file = write_text(data / "heldout.txt", tokenizer.decode(eval_ids))
    return {"train_files": files, "eval_file": eval_file, "tokenizer_dir": save_byte_tokenizer(data / "tokenizer"),
            "eval_ids": eval_ids, "eos_id": tokenizer.eos_token_id, "floors": ngram_entropies(eval_ids),
            "train_bytes": sum(len(t.encode()) for t in train.train.values())}


def begin(config: ExperimentSettings, out: str | Path, work: str | Path, corpus: Corpus | None
          ) -> tuple[Path, Path, Corpus, dict[str, Any]]:
    """Create ``out`` and ``work`` and prepare the data (:func:`prepare`; the Austen novels by default)."""
    out, work = Path(out), Path(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    corpus = austen_corpus() if corpus is None else corpus
    return out, work, corpus, prepare(config, corpus, work)


def arm_cells(config: LengthGeneralisationConfig, arms: dict[str, tuple[str, ModelSettings, TrainSettings]],
              prepared: dict[str, Any], work: Path, experiment: str | None = None) -> list[Cell]:
    """Cells of ``arms`` (label -> scheme spec, model, optimisation) × ``config.seeds``, on ``config``'s data and
    evaluation; ``experiment`` names the experiment in each cell's fingerprint (default ``config.name``)."""
    out = []
    for label, (spec, model, train) in arms.items():
        for seed in config.seed_list:
            settings = {"experiment": experiment or config.name, "spec": spec, "seed": seed,
                        "context_length": config.context_length, "model": model, "train": train,
                        "eval_lengths": config.eval_lengths, "eval_tokens": config.eval_tokens,
                        "train_chars": config.train_chars, "train_bytes": prepared["train_bytes"]}

            def make(output_dir: str, spec: str = spec, seed: int = seed, model: ModelSettings = model,
                     train: TrainSettings = train) -> Any:
                return build_recipe(config, prepared, scheme=spec, seed=seed, context_length=config.context_length,
                                    model=model, train=train, output_dir=output_dir)

            out.append(Cell(label, spec, seed, work / "runs" / slug(label) / f"seed{seed}", settings, make))
    return out


def verdict(summary: Summary, floors: dict[str, float], context_length: int) -> list[str]:
    """Plain statements the numbers support: whether RoPE is below the floors at L, and each scheme's growth
    from L to the longest length."""
    lines = []
    if "RoPE" in summary.rows:
        rope = summary.rows["RoPE"][context_length][0]
        lines.append(f"RoPE at L = {context_length}: {rope:.3f} nats/byte, "
                     + (f"{floors['bigram'] - rope:.3f} below the bigram floor ({floors['bigram']:.3f}): the models "
                        "use context." if rope < floors["bigram"] else
                        f"NOT below the bigram floor ({floors['bigram']:.3f}): this run does not show context use."))
    longest = summary.lengths[-1]
    for label, row in summary.rows.items():
        m0, m1 = row[context_length][0], row[longest][0]
        lines.append(f"{label}: {m0:.3f} at L -> {m1:.3f} at {longest // context_length}L "
                     f"({'+' if m1 >= m0 else ''}{m1 - m0:.3f} nats/byte)")
    return lines


def run(config: LengthGeneralisationConfig, out: str | Path, work: str | Path, command: str,
        corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md`` and ``heldout_loss.png`` to
    ``out`` and returns the JSON payload. ``corpus`` defaults to the Austen novels."""
    arms = {label: (spec, config.model, config.train) for label, spec in config.schemes.items()}
    return run_from_scratch(config, arms, out, work, command, corpus=corpus, progress=progress,
                            title=f"Length generalisation from scratch ({config.size})",
                            experiment=config.name, experiment_config=config.to_dict(), verdict=verdict)


Verdict = Callable[[Summary, dict[str, float], int], list[str]]


def run_from_scratch(config: LengthGeneralisationConfig, arms: dict[str, tuple[str, ModelSettings, TrainSettings]],
                     out: str | Path, work: str | Path, command: str, *, title: str, experiment: str,
                     experiment_config: dict[str, Any], verdict: Verdict, notes: Sequence[str] = (),
                     corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Train every arm × seed from scratch on ``config``'s data, evaluate at ``config``'s lengths and write the
    report (``results.json``, ``results.md`` with ``notes`` under the table, ``heldout_loss.png``)."""
    start = time.perf_counter()
    out, work, corpus, prepared = begin(config, out, work, corpus)
    grid = arm_cells(config, arms, prepared, work, experiment=experiment)
    results = run_cells(grid, desc=f"{experiment} ({config.size})", progress=progress)
    summary = Summary.from_results(results, config.eval_lengths)
    first = {r["label"]: r["model_dir"] for r in results if r["seed"] == config.first_seed}
    why = diagnose(first, prepared["eval_ids"][: config.diagnostic_tokens], config.context_length,
                   out / "diagnostics", progress=progress)
    floors = prepared["floors"]
    elapsed = time.perf_counter() - start
    payload = write_results(out, experiment, command, experiment_config, corpus.name,
                            "held-out cross-entropy in nats per byte (perplexity = exp)", floors, results, elapsed,
                            summary=summary.to_dict(), verdict=verdict(summary, floors, config.context_length), why=why)
    md = [
        f"# {title}",
        "",
        f"Rerun: `{command}`",
        "",
        f"Byte-level Llama-style model (d = {config.model.hidden_size}, {config.model.num_layers} layers, "
        f"{config.model.num_heads} heads of {config.model.head_dim}) trained from scratch at L = "
        f"{config.context_length} bytes for {config.train.steps} steps of {config.train.batch_size} windows "
        f"(lr {config.train.learning_rate:g}, cosine, {config.train.warmup_steps} warm-up steps, initial weight "
        f"std {config.model.initializer_range:g}, unless a row says otherwise), {config.seeds} seeds per row "
        f"({', '.join(map(str, config.seed_list))}). "
        f"Training text: {corpus.name}. Evaluation: the first {config.eval_tokens} bytes of the held-out novel, "
        "disjoint windows; held-out loss in nats per byte, mean ± sample sd over seeds (bold: best mean per "
        "column). Floors: plug-in unigram and bigram entropies of the evaluation text.",
        "",
        markdown_table(summary, config.length_names, floors),
        "",
        *notes,
        *closing_lines(payload["verdict"], why, config.context_length,
                       f"Wall time {elapsed / 60:.1f} min ({payload['seconds_in_runs'] / 60:.1f} min in training and "
                       f"evaluation runs, torch threads {torch.get_num_threads()})."),
    ]
    (out / "results.md").write_text("\n".join(md))
    plot_summary(summary, out / "heldout_loss.png",
                 f"Trained at L = {config.context_length} bytes ({config.size}, {config.seeds} seeds)", floors,
                 config.context_length)
    return payload
