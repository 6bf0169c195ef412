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

from hf_posenc.schemes.spec import parse_scheme_spec
from .claims import (
    COPE_PAPER, UNTESTABLE_HERE, UNTESTABLE_SCALE, Claim, claims_section, han_ji_claim, paper_reach, reach,
)
from .config import ContextExtensionConfig, ExtensionSettings
from .corpus import Corpus
from .length_generalisation import begin
from .report import (
    TABLE_NOTE, Tests, analysis, closing_lines, fmt, make_payload, markdown_table, plot_summary, publish,
    tests_explained,
)
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

    from hf_posenc.evaluation import evaluate
    from hf_posenc.evaluation.passkey import build_passkey_prompt, key_digit_accuracy

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


def pretrain_base(config: ExtensionSettings, prepared: dict[str, Any], work: Path, common: dict[str, Any],
                  progress: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base every arm of a context-extension experiment continues: RoPE pretrained at L with
    ``config.pretrain`` (seed 0, once, cached in ``work/runs/base``). Returns its result and the settings it is
    fingerprinted by (``common`` and the base's own), which each arm's settings name."""
    settings = {**common, "role": "base", "spec": "rope", "seed": 0, "context_length": config.context_length,
                "model": config.model, "train": config.pretrain}
    cell = Cell(BASE_LABEL, "rope", 0, work / "runs" / "base", settings,
                lambda d: build_recipe(config, prepared, scheme="rope", seed=0, model=config.model,
                                       context_length=config.context_length, train=config.pretrain, output_dir=d))
    desc = f"{config.name} ({config.size}): pretraining the base"
    return run_cells([cell], desc=desc, progress=progress)[0], settings


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

    base, base_settings = pretrain_base(config, prepared, work, common, progress)
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
    payload = make_payload(config.name, command, config.to_dict(), corpus.name,
                           "held-out cross-entropy in nats per byte (perplexity = exp); passkey: accuracy in [0, 1]",
                           floors, everything, elapsed, summary=summary.to_dict(), passkey=passkey, why=why)
    publish(out, payload, config)
    plot_summary(summary, out / "heldout_loss.png",
                 f"Base at L = {config.context_length}, extended at {config.extended_length} bytes "
                 f"({config.size}, {config.seeds} seeds)", floors, config.extended_length)
    return payload


def render(payload: dict[str, Any], config: ContextExtensionConfig) -> str:
    """``results.md`` from ``results.json``."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    claims = [Claim.from_dict(c) for c in payload.get("claims") or []]
    md = [
        f"# Context extension of a pretrained base ({config.size})",
        "",
        f"Rerun: `{payload['command']}`",
        "",
        f"Byte-level Llama-style base (d = {config.model.hidden_size}, {config.model.num_layers} layers, "
        f"{config.model.num_heads} heads of {config.model.head_dim}) pretrained with RoPE at L = "
        f"{config.context_length} bytes for {config.pretrain.steps} steps of {config.pretrain.batch_size} windows "
        f"(lr {config.pretrain.learning_rate:g}; once, seed 0), then trained further at "
        f"{config.extended_length} bytes with each scheme for {config.extend.steps} steps of "
        f"{config.extend.batch_size} windows (lr {config.extend.learning_rate:g}, cosine, "
        f"{config.extend.warmup_steps} warm-up steps, full fine-tuning), {config.seeds} seeds per scheme (the "
        f"base is shared, so the sd is that of the continued training). Text: {payload['corpus']}. Evaluation: the "
        f"first {config.eval_tokens} bytes of the held-out novel, disjoint windows, nats per byte, mean ± sd "
        f"({TABLE_NOTE}).",
        "",
        markdown_table(summary, config.length_names, payload["floors"]),
        "",
        f"Passkey retrieval (Landmark format; {len(config.passkey_depths)} depths × {config.passkey_trials} keys "
        "per length): greedy exact match / teacher-forced fraction of the key's digits ranked first among the ten "
        "digits (chance 0.1; a model that copies the key scores near 1).",
        "",
        passkey_table(payload["passkey"], config.passkey_lengths),
        "",
        *closing_lines(payload["verdict"], payload["why"], config.extended_length,
                       f"Wall time {payload['wall_seconds'] / 60:.1f} min (torch threads "
                       f"{payload['machine']['threads']}).", claims_section(claims, CLAIM_NOTES)),
    ]
    return "\n".join(md)


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


REFERENCE = "RoPE"
CLAIM_NOTES = (
    "No claim line for p-RoPE (its paper has no context-extension experiment), nor for PI and YaRN (their papers "
    "are not among those this project reproduces): their rows are compared above with their tests.",
)


def same_theta_rope(config: ContextExtensionConfig) -> dict[str, str]:
    """Scheme -> the plain RoPE arm with the same base θ, where that is neither RoPE itself nor the scheme
    (``CoPE + ABF`` -> ``RoPE + ABF``): the reference that isolates what the scheme adds to its base change."""
    def theta(spec: str) -> Any:
        return getattr(parse_scheme_spec(spec), "rope_theta", None)

    plain = {theta(spec): label for label, spec in config.schemes.items()
             if parse_scheme_spec(spec).name == "rope" and parse_scheme_spec(spec).scaling is None}
    return {label: plain[theta(spec)] for label, spec in config.schemes.items()
            if theta(spec) in plain and plain[theta(spec)] not in (label, REFERENCE)}


def verdict(summary: Summary, passkey: dict[str, Any], config: ContextExtensionConfig,
            tests: Tests | None = None) -> list[str]:
    """Per scheme, each comparison with its test: the growth beyond the trained length 4L, the difference from
    continued RoPE (and from the RoPE arm with the same base θ) at 4L and 16L, the gain over the unextended base
    at 4L and 16L (one-sample against its single run); then whether any model retrieves the passkey."""
    tests = Tests() if tests is None else tests
    trained, longest, L = config.extended_length, config.eval_lengths[-1], config.context_length
    f, k = config.extension_factor, longest // L
    base = summary.rows[BASE_LABEL]
    refs = same_theta_rope(config)
    lines = [tests_explained(summary),
             "Every continued run starts from the same base (seed 0): the intervals hold for this base and contain "
             "the spread of the continued training only; how much bases differ is not measured, so a detected "
             "difference is one on this base, not a ranking of the schemes in general.",
             f"{BASE_LABEL}: {base[L][0]:.3f} at L, {base[trained][0]:.3f} at {f}L, {base[longest][0]:.3f} at "
             f"{k}L (one run)."]
    for label, row in summary.rows.items():
        if label == BASE_LABEL:
            continue
        items = [(f"growth {f}L -> {k}L", summary.diff(label, label, longest, other_length=trained), "grows",
                  "shrinks")]
        if label != REFERENCE and REFERENCE in summary.rows:
            items += [(f"{label} - RoPE at {f}L", summary.diff(label, REFERENCE, trained), "higher loss than RoPE",
                       "lower loss than RoPE"),
                      (f"at {k}L", summary.diff(label, REFERENCE, longest), "higher loss than RoPE",
                       "lower loss than RoPE")]
        if label in refs:
            ref = refs[label]
            items += [(f"{label} - {ref} at {f}L", summary.diff(label, ref, trained), f"higher loss than {ref}",
                       f"lower loss than {ref}"),
                      (f"at {k}L", summary.diff(label, ref, longest), f"higher loss than {ref}",
                       f"lower loss than {ref}")]
        items += [(f"{label} - base at {f}L", summary.diff(label, BASE_LABEL, trained), "higher loss than the base",
                   "lower loss than the base"),
                  (f"at {k}L", summary.diff(label, BASE_LABEL, longest), "higher loss than the base",
                   "lower loss than the base")]
        lines.append(f"{label}: {row[trained][0]:.3f} at {f}L (trained length), {row[longest][0]:.3f} at {k}L; "
                     + tests.line(items) + "; passkey digits "
                     + ", ".join(f"{passkey[label][str(n)]['digits']:.2f} at {n}" for n in config.passkey_lengths)
                     + ".")
    exact = max(p[str(n)]["exact"] for p in passkey.values() for n in config.passkey_lengths)
    digits = [p[str(n)]["digits"] for p in passkey.values() for n in config.passkey_lengths]
    span = f"key digits ranked first {min(digits):.2f}-{max(digits):.2f} of the time"
    lines.append(f"Passkey: no model retrieves the key (greedy exact match 0 for every model at every length; {span}): "
                 "retrieval cannot be tested at this scale." if exact == 0 else
                 f"Passkey: greedy exact match up to {exact:.2f} ({span}); see the table.")
    return lines


def paper_claims(summary: Summary, passkey: dict[str, Any], config: ContextExtensionConfig, why: dict[str, Any],
                 tests: Tests) -> list[Claim]:
    """The CoPE, TAPE and TAPA papers' claims this experiment speaks to, and the position-generalization paper's
    diagnostics."""
    trained, longest, L = config.extended_length, config.eval_lengths[-1], config.context_length
    f, k = config.extension_factor, longest // L
    model, schemes, rows = config.model, config.schemes, summary.rows
    refs = same_theta_rope(config)
    out: list[Claim] = []

    def line(name: str, a: str, b: str, length: int) -> str:
        return tests.line([(name, summary.diff(a, b, length), f"higher loss than {b}", f"lower loss than {b}")])

    if "CoPE" in rows and REFERENCE in rows:
        abf = [label for label in refs if parse_scheme_spec(schemes[label]).name == "cope"]
        reason = ""
        if abf:
            label = abf[0]
            turned = reach(schemes[label], model.head_dim, model.rope_theta, {f"{k}L = {longest}": longest})
            reason = (f"with ABF as in the paper, {turned}, so {label} equals {refs[label]} by construction (a null "
                      "by design): "
                      + line(f"{label} - {refs[label]} at {k}L", label, refs[label], longest) + "; without ABF, ")
        reason += (f"{reach(schemes['CoPE'], model.head_dim, model.rope_theta, {f'{f}L': trained, f'{k}L': longest})}"
                   f", against {paper_reach(schemes['CoPE'], COPE_PAPER)}: "
                   + line(f"CoPE - RoPE at {k}L", "CoPE", REFERENCE, longest)
                   + "; and the paper's measures are long-context task scores of an 8B model, not byte perplexity.")
        out.append(Claim(
            "CoPE", "CoPE in long-context continued training with ABF beats RoPE inside the new length (HELMET 58.68 "
            "vs 52.94 at 64k) and beyond it with YaRN (28.48 vs 14.37 at 256k)", UNTESTABLE_SCALE, reason))
        exact = max(p[str(n)]["exact"] for p in passkey.values() for n in config.passkey_lengths)
        if exact == 0:
            out.append(Claim(
                "CoPE", "CoPE retrieves better far beyond the training length (RULER needle-in-a-haystack at 256k: "
                "78.5 vs 60.5)", UNTESTABLE_SCALE,
                "no model here retrieves a passkey at all (greedy exact match 0 for every model, "
                + ", ".join(f"{n}" for n in config.passkey_lengths) + " bytes): two layers trained on novels do not "
                "learn retrieval, so there is nothing for a scheme to improve."))
        if "HardClip" in rows:
            out.append(Claim(
                "CoPE", "HardClip (the same frequencies zeroed) is worse than CoPE inside the training length "
                "(HELMET 50.71 vs 58.68 at 64k)", UNTESTABLE_SCALE,
                f"{reach(schemes['HardClip'], model.head_dim, model.rope_theta, {f'{f}L': trained})}: both barely "
                "differ from RoPE here; " + line(f"HardClip - CoPE at {f}L", "HardClip", "CoPE", trained) + "."))
    if "TAPE" in rows and REFERENCE in rows:
        out.append(Claim(
            "TAPE", "parameter-efficient TAPE (its W1, W2 and o_proj trained) extends Llama2-7B from 4k to 8k better "
            "than LoRA (PG19 perplexity at 8k 7.063 vs 8.199)", UNTESTABLE_HERE,
            "not run: this experiment fine-tunes every parameter and has no LoRA arm; what it measures instead is "
            f"full fine-tuning from TAPE's zero-initialised modules for {config.extend.steps} steps: "
            + line(f"TAPE - RoPE at {k}L", "TAPE", REFERENCE, longest) + "."))
    if "TAPA" in rows and REFERENCE in rows:
        out.append(Claim(
            "TAPA", "models pretrained with TAPA extrapolate beyond their training length (with 500 fine-tuning steps "
            "at 4x: 11.67 at 49k vs RoPE 938)", UNTESTABLE_HERE,
            "this experiment converts a RoPE-pretrained base to TAPA, which the paper never does (it pretrains "
            "TAPA from scratch), so the converted model tests none of its claims: "
            + line(f"TAPA - RoPE at {f}L", "TAPA", REFERENCE, trained) + "."))
    if why:
        out.append(han_ji_claim(why))
    return out


def analyse(payload: dict[str, Any], config: ContextExtensionConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload["passkey"], config, tests),
                    paper_claims(summary, payload["passkey"], config, payload.get("why") or {}, tests))
