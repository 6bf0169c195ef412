"""Context extension of a pretrained base (CoPE, TAPE, PI and YaRN papers), in miniature.

A byte-level RoPE model is pretrained at L once (cached, seed 0) — the base. Each scheme then continues training
the base at 4L (full fine-tuning, several seeds): RoPE as it is, RoPE with a raised base θ (ABF), PI, YaRN, CoPE
with and without ABF, HardClip, p-RoPE, TAPE (new modules at zero, so it starts as the base) and a conversion to
TAPA attention. Every model is scored on a held-out novel from L to 16L (disjoint windows) and on passkey
retrieval at 4L and 8L: greedy exact match (:mod:`hf_posenc.evaluation`) and the teacher-forced fraction of key
digits ranked first (:func:`~hf_posenc.evaluation.passkey.key_digit_accuracy`), which small models need.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from .config import ContextExtensionConfig
from .corpus import Corpus
from .length_generalisation import begin
from .report import closing_lines, fmt, markdown_table, plot_summary, write_results
from .runner import Cell, Summary, build_recipe, fingerprint, mean_sd, run_cells, slug
from .why import diagnose

BASE_LABEL = "base (RoPE at L, not extended)"


def passkey_scores(model_dir: str, tokenizer_dir: str, config: ContextExtensionConfig) -> dict[str, Any]:
    """Passkey retrieval of the saved model at each of ``config.passkey_lengths``: greedy exact-match accuracy
    and teacher-forced key-digit accuracy, over ``passkey_depths`` × ``passkey_trials`` prompts (the same prompts
    for every model)."""
    import hf_posenc  # noqa: F401  (registers the patched model types before loading)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..evaluation import evaluate
    from ..evaluation.passkey import build_passkey_prompt, key_digit_accuracy

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the loading bar, and generation past the base's max_position_embeddings
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        greedy = evaluate({"model": model}, tokenizer, tasks=("passkey",), lengths=config.passkey_lengths,
                          depths=config.passkey_depths, trials=config.passkey_trials, progress=False)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    out: dict[str, Any] = {}
    for length in config.passkey_lengths:
        trials = [t for t in greedy.retrieval if t.length == length]
        # the same prompts, rebuilt from each trial's key, answered with the key in the context
        digits = [key_digit_accuracy(model, tokenizer, build_passkey_prompt(tokenizer, length, t.depth,
                                                                            int(t.answers[0])))
                  for t in trials]
        out[str(length)] = {"exact": sum(t.exact for t in trials) / len(trials),
                            "digits": statistics.fmean(digits), "prompts": len(trials),
                            "outputs": [t.output for t in trials]}
    return out


def run(config: ContextExtensionConfig, out: str | Path, work: str | Path, command: str,
        corpus: Corpus | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md`` and ``heldout_loss.png`` to
    ``out`` and returns the JSON payload. ``corpus`` defaults to the Austen novels."""
    start = time.perf_counter()
    out, work, corpus, prepared = begin(config, out, work, corpus)
    lengths = config.eval_lengths
    common = {"experiment": config.name, "eval_lengths": lengths, "eval_tokens": config.eval_tokens,
              "train_chars": config.train_chars, "train_bytes": prepared["train_bytes"],
              "passkey": [config.passkey_lengths, config.passkey_depths, config.passkey_trials]}

    base_settings = {**common, "role": "base", "spec": "rope", "seed": 0, "context_length": config.context_length,
                     "model": config.model, "train": config.pretrain}
    base_cell = Cell(BASE_LABEL, "rope", 0, work / "runs" / "base", base_settings,
                     lambda d: build_recipe(config, prepared, scheme="rope", seed=0, model=config.model,
                                            context_length=config.context_length, train=config.pretrain, output_dir=d))
    base = run_cells([base_cell], desc=f"{config.name} ({config.size}): pretraining the base", progress=progress)[0]
    base_dir = base["model_dir"]

    cells = []
    for label, spec in config.schemes.items():
        for seed in config.seed_list:
            settings = {**common, "role": "extension", "base": fingerprint(base_settings), "spec": spec, "seed": seed,
                        "context_length": config.extended_length, "train": config.extend}

            def make(d: str, spec: str = spec, seed: int = seed) -> Any:
                return build_recipe(config, prepared, scheme=spec, seed=seed, context_length=config.extended_length,
                                    model=config.model, train=config.extend, output_dir=d, base_model=base_dir)

            cells.append(Cell(label, spec, seed, work / "runs" / slug(label) / f"seed{seed}", settings, make))
    results = run_cells(cells, desc=f"{config.name} ({config.size}): continued training at "
                                    f"{config.extended_length}", progress=progress)
    everything = [base, *results]
    # passkey scores are measured on every saved model at each run (seconds), not cached with the training
    from tqdm.auto import tqdm

    for r in tqdm(everything, desc="passkey", disable=not progress):
        r["passkey"] = passkey_scores(r["model_dir"], prepared["tokenizer_dir"], config)
    summary = Summary.from_results(everything, lengths)
    passkey = passkey_summary(everything, config.passkey_lengths)
    why = diagnose({r["label"]: r["model_dir"] for r in everything
                    if r["label"] == BASE_LABEL or r["seed"] == config.first_seed},
                   prepared["eval_ids"][: config.diagnostic_tokens], config.extended_length, out / "diagnostics",
                   progress=progress)
    floors = prepared["floors"]
    elapsed = time.perf_counter() - start
    payload = write_results(out, config.name, command, config.to_dict(), corpus.name,
                            "held-out cross-entropy in nats per byte (perplexity = exp); passkey: accuracy in [0, 1]",
                            floors, everything, elapsed, summary=summary.to_dict(), passkey=passkey,
                            verdict=verdict(summary, passkey, config), why=why)
    md = [
        f"# Context extension of a pretrained base ({config.size})",
        "",
        f"Rerun: `{command}`",
        "",
        f"Byte-level Llama-style base (d = {config.model.hidden_size}, {config.model.num_layers} layers, "
        f"{config.model.num_heads} heads of {config.model.head_dim}) pretrained with RoPE at L = "
        f"{config.context_length} bytes for {config.pretrain.steps} steps of {config.pretrain.batch_size} windows "
        f"(lr {config.pretrain.learning_rate:g}; once, seed 0), then trained further at "
        f"{config.extended_length} bytes with each scheme for {config.extend.steps} steps of "
        f"{config.extend.batch_size} windows (lr {config.extend.learning_rate:g}, cosine, "
        f"{config.extend.warmup_steps} warm-up steps, full fine-tuning), {config.seeds} seeds per scheme (the "
        f"base is shared, so the sd is that of the continued training). Text: {corpus.name}. Evaluation: the "
        f"first {config.eval_tokens} bytes of the held-out novel, disjoint windows, nats per byte, mean ± sd "
        "(bold: best mean per column).",
        "",
        markdown_table(summary, config.length_names, floors),
        "",
        f"Passkey retrieval (Landmark format; {len(config.passkey_depths)} depths × {config.passkey_trials} keys "
        "per length): greedy exact match / teacher-forced fraction of the key's digits ranked first among the ten "
        "digits (chance 0.1; a model that copies the key scores near 1).",
        "",
        passkey_table(passkey, config.passkey_lengths),
        "",
        *closing_lines(payload["verdict"], why, config.extended_length,
                       f"Wall time {elapsed / 60:.1f} min (torch threads {torch.get_num_threads()})."),
    ]
    (out / "results.md").write_text("\n".join(md))
    plot_summary(summary, out / "heldout_loss.png",
                 f"Base at L = {config.context_length}, extended at {config.extended_length} bytes "
                 f"({config.size}, {config.seeds} seeds)", floors, config.extended_length)
    return payload


def passkey_summary(results: list[dict[str, Any]], lengths: list[int]) -> dict[str, dict[str, dict[str, float]]]:
    """label -> length -> mean ± sd over seeds of exact-match and digit accuracy."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label in dict.fromkeys(r["label"] for r in results):
        mine = [r["passkey"] for r in results if r["label"] == label]
        out[label] = {}
        for n in lengths:
            exact = mean_sd([p[str(n)]["exact"] for p in mine])
            digits = mean_sd([p[str(n)]["digits"] for p in mine])
            out[label][str(n)] = {"exact": exact[0], "exact_sd": exact[1], "digits": digits[0],
                                  "digits_sd": digits[1]}
    return out


def passkey_table(passkey: dict[str, dict[str, dict[str, float]]], lengths: list[int]) -> str:
    head = ["scheme", *[f"{n} bytes: exact" for n in lengths], *[f"{n} bytes: digits" for n in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, row in passkey.items():
        exact = [fmt(row[str(n)]["exact"], row[str(n)]["exact_sd"], 2) for n in lengths]
        digits = [fmt(row[str(n)]["digits"], row[str(n)]["digits_sd"], 2) for n in lengths]
        lines.append(f"| {label} | " + " | ".join(exact + digits) + " |")
    return "\n".join(lines)


def verdict(summary: Summary, passkey: dict[str, Any], config: ContextExtensionConfig) -> list[str]:
    """Per scheme: the loss at the trained length 4L and at 16L, and how much it grows beyond 4L."""
    trained, longest = config.extended_length, config.eval_lengths[-1]
    base = summary.rows[BASE_LABEL]
    lines = [f"{BASE_LABEL}: {base[config.context_length][0]:.3f} at L, {base[trained][0]:.3f} at "
             f"{config.extension_factor}L, {base[longest][0]:.3f} at {longest // config.context_length}L."]
    ranked = sorted((k for k in summary.rows if k != BASE_LABEL), key=lambda k: summary.rows[k][longest][0])
    for label in ranked:
        row = summary.rows[label]
        lines.append(f"{label}: {row[trained][0]:.3f} at {config.extension_factor}L (trained length), "
                     f"{row[longest][0]:.3f} at {longest // config.context_length}L "
                     f"({row[longest][0] - row[trained][0]:+.3f} beyond the trained length); passkey digits "
                     + ", ".join(f"{passkey[label][str(n)]['digits']:.2f} at {n}" for n in config.passkey_lengths)
                     + ".")
    return lines
