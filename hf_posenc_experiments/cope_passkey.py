"""CoPE's claim where it can show (issue #33 §2), in miniature: RoPE, CoPE and HardClip in the CoPE paper's
long-context recipe, with passkey windows in the continued training.

The base of :mod:`.context_extension` (RoPE at L = 64 bytes) is pretrained once; each arm continues it at 4L with
the base raised to θ' = (1e7 / 65,536) x 4L (the paper's ratio of base to extended length), one training window in
four a synthetic passkey window (:func:`passkey_documents`); every model is then scored on the held-out novel at
L…4L as trained and at 8L and 16L with YaRN x4 over θ' (original length 4L), and by passkey retrieval at 4L, 8L and
16L (greedy exact match and key-digit accuracy). The settings and why: :class:`.config.CopePasskeyConfig`.

Whether the claims can show here is decided before any run by :func:`reach_table`: the angles the frequencies
CoPE tapers (and HardClip zeroes) turn over the lengths in question, as the evaluated model computes them (YaRN
included), here and in the paper's setting. A claim whose angle here is below half the paper's
(:data:`MIN_SHARE_OF_PAPER`) reads "cannot be tested at this scale", with the angles, whatever difference shows.

The budget of ``small`` (3 arms x 3 seeds, 3,000 steps each), an estimate: while this was written the 2 cores were
shared with other jobs (load 3-5), which made wall times 5-20 x the idle ones (a partial run: the base's 1,000 steps
in 429 s, 300 continued steps in 271 s), so it rests on the committed idle timings and on ratios measured in one
process. Idle, the base (1,000 steps of 16 x 64 bytes) took 23 s in the context-extension report and a continued run
there (250 steps of 4 x 256, its evaluation included) 6.6-7.7 s, at most 26-31 ms a step. Measured here in one
process, alternating: a step of 4 x 256 costs 1.1-1.2 x a step of 16 x 64 (so about 24 ms), and an arm's
evaluation (100 passkey prompts greedy and teacher-forced, held-out loss at 3 lengths with YaRN) about 260 such
steps (about 7 s); writing the 4,633 passkey windows takes about 3 s. A run: 3,000 x 24 ms + 7 s + about 2 s of
set-up ≈ 80 s; 9 runs ≈ 12 min; with the base, the data and the start-up about 13 min on idle cores (about 16 min
at 31 ms a step).
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .claims import (
    CONFIRMED, REFUTED, UNTESTABLE_SCALE, Claim, angle, changed_frequencies, claims_section, fixed_rates,
)
from .config import CopePasskeyConfig
from .context_extension import BASE_LABEL, pretrain_base
from .corpus import Corpus, write_text
from .length_generalisation import begin
from .report import (
    TABLE_NOTE, Tests, analysis, fmt, make_payload, markdown_table, plot_settings, plot_summary, publish,
    tests_explained,
)
from .runner import Cell, Summary, build_recipe, fingerprint, mean_sd, run_cells, slug, train_and_evaluate
from .stats import Difference, compare

REFERENCE = "RoPE"
# the stream the training keys and depths are drawn from (never the evaluation's; its keys are excluded too)
TRAIN_STREAM = "cope_passkey/training-passkeys"
# a claim is within reach where the changed frequencies turn at least this share of the paper's angle
MIN_SHARE_OF_PAPER = 0.5
# the paper's setting: Llama-3-8B (head dim 128, pretrained at 8k with θ = 5e5), continued at 64k with θ = 1e7,
# YaRN x4 to 256k beyond it
PAPER_HEAD_DIM, PAPER_BASE_THETA, PAPER_BASE_LENGTH = 128, 5e5, 8192
PAPER_THETA, PAPER_LENGTH, PAPER_YARN = 1e7, 65536, 4


# -- the passkey training windows ---------------------------------------------------------------------------------
def evaluation_keys(config: CopePasskeyConfig, seed: int = 0) -> set[int]:
    """The keys :func:`hf_posenc.evaluation.evaluate` asks about on this experiment's grid (the evaluation's own
    :func:`~hf_posenc.evaluation.runner.passkey_key`); :func:`score_passkey` checks every evaluated key is among
    them."""
    from hf_posenc.evaluation.runner import passkey_key

    return {passkey_key(seed, n, d, t)
            for n in config.passkey_lengths for d in config.passkey_depths for t in range(config.passkey_trials)}


def passkey_documents(count: int, length: int, excluded: set[int], tokenizer: Any) -> list[str]:
    """``count`` passkey documents of exactly ``length − 1`` tokens (with the EOS that packing adds: one window of
    ``length``): the evaluation's prompt (:func:`~hf_posenc.evaluation.passkey.build_passkey_prompt`) for ``length
    − 1 − len(" KEY")`` tokens followed by ``" KEY"``; keys and depths from :data:`TRAIN_STREAM`, ``excluded`` keys
    skipped."""
    from hf_posenc.evaluation.passkey import KEY_RANGE, build_passkey_prompt

    rng = random.Random(TRAIN_STREAM)
    docs: list[str] = []
    while len(docs) < count:
        key = rng.randint(*KEY_RANGE)
        depth = rng.random()
        if key in excluded:
            continue
        answer = f" {key}"
        prompt = build_passkey_prompt(tokenizer, length - 1 - len(answer), depth, key)
        text = prompt.text + answer
        tokens = len(tokenizer(text, add_special_tokens=False).input_ids)
        if tokens != length - 1:
            raise ValueError(f"a passkey window of {length} tokens needs {length - 1} before EOS, got {tokens}: "
                             "the tokenizer is not byte-level")
        docs.append(text)
    return docs


def write_passkey_data(config: CopePasskeyConfig, prepared: dict[str, Any], work: Path) -> dict[str, Any]:
    """Write the passkey windows (JSON lines) for ``config.passkey_fraction`` of the training windows; returns
    the file, how many windows of each kind, and the training files in order (passkeys first, so that each fills
    exactly one window of the ``concat`` packing)."""
    from .tokenizer import byte_tokenizer

    length = config.extended_length
    novel_tokens = sum(len(Path(f).read_bytes()) + 1 for f in prepared["train_files"])  # + EOS per document
    novel_windows = novel_tokens // length
    count = round(novel_windows * config.passkey_fraction / (1 - config.passkey_fraction))
    docs = passkey_documents(count, length, evaluation_keys(config), byte_tokenizer())
    path = write_text(work / "data" / f"passkey-train-{length}.jsonl",
                      "".join(json.dumps({"text": d}) + "\n" for d in docs))
    return {"file": path, "passkey_windows": count, "novel_windows": novel_windows,
            "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16],
            "train_files": [path, *prepared["train_files"]]}


# -- evaluation ----------------------------------------------------------------------------------------------------
def score_passkey(model: Any, tokenizer: Any, config: CopePasskeyConfig, lengths: Sequence[int]) -> dict[str, Any]:
    """Passkey retrieval of ``model`` at ``lengths``: greedy exact match (:func:`hf_posenc.evaluation.evaluate`) and
    teacher-forced key-digit accuracy on the same prompts, the keys and outputs kept."""
    from hf_posenc.evaluation import evaluate
    from hf_posenc.evaluation.passkey import build_passkey_prompt, key_digit_accuracy

    greedy = evaluate({"model": model}, tokenizer, tasks=("passkey",), lengths=list(lengths),
                      depths=config.passkey_depths, trials=config.passkey_trials, progress=False)
    allowed = evaluation_keys(config)
    out: dict[str, Any] = {}
    for length in lengths:
        trials = [t for t in greedy.retrieval if t.length == length]
        keys = [int(t.answers[0]) for t in trials]
        if not set(keys) <= allowed:
            raise RuntimeError("the evaluation asked about keys the training stream did not exclude; "
                               "update evaluation_keys to hf_posenc.evaluation's prompt seeding")
        digits = [key_digit_accuracy(model, tokenizer, build_passkey_prompt(tokenizer, length, t.depth, key))
                  for t, key in zip(trials, keys)]
        out[str(length)] = {"exact": statistics.fmean(t.exact for t in trials), "digits": statistics.fmean(digits),
                            "prompts": len(trials), "keys": keys, "outputs": [t.output for t in trials]}
    return out


def heldout(model: Any, tokenizer: Any, text: str, config: CopePasskeyConfig, lengths: Sequence[int]) -> dict:
    """Held-out loss of ``model`` at ``lengths``, disjoint windows over ``config.eval_tokens`` bytes (as the
    recipe's own evaluation)."""
    from hf_posenc.evaluation import evaluate

    result = evaluate({"model": model}, tokenizer, tasks=("ppl",), lengths=list(lengths), text=text,
                      stride=max(config.eval_lengths), max_tokens=config.eval_tokens, progress=False).to_dict()
    return {str(p["context_length"]): {"nll": p["nll"], "ppl": p["perplexity"], "num_scored": p["num_scored"]}
            for p in result["perplexity"]}


def evaluate_arm(model_dir: str, spec: str, prepared: dict[str, Any], config: CopePasskeyConfig) -> dict[str, Any]:
    """Passkey retrieval of the trained model as trained at 4L; then the model re-patched with YaRN x4 over its
    own scheme (:meth:`.config.CopePasskeyConfig.eval_spec`, ``replace=True``): held-out loss and passkey at 4L, 8L
    and 16L; with the rope parameters and inverse frequencies each evaluation used."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    import hf_posenc
    from hf_posenc.demo import rotary_inv_freq
    from hf_posenc.schemes.spec import parse_scheme_spec

    trained = config.extended_length
    beyond = [n for n in config.eval_lengths if n >= trained]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # YaRN's factor against the base's max_position_embeddings, the loading bar
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(prepared["tokenizer_dir"])
        text = Path(prepared["eval_file"]).read_text(encoding="utf-8")
        plain = {"rope_parameters": dict(model.config.rope_parameters),
                 "inv_freq": rotary_inv_freq(model).tolist(),
                 "passkey": score_passkey(model, tokenizer, config, [trained])}
        hf_posenc.patch_model(model, parse_scheme_spec(config.eval_spec(spec)), replace=True)
        yarn = {"spec": config.eval_spec(spec), "rope_parameters": dict(model.config.rope_parameters),
                "attention_scaling": float(model.model.rotary_emb.attention_scaling),
                "inv_freq": rotary_inv_freq(model).tolist(),
                "perplexity": heldout(model, tokenizer, text, config, beyond),
                "passkey": score_passkey(model, tokenizer, config, [n for n in config.passkey_lengths
                                                                    if n >= trained])}
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return {"plain": plain, "yarn": yarn}


def combine(trained_length: int, plain: Mapping[str, Any], yarn: Mapping[str, Any]) -> dict[str, Any]:
    """The reported condition: as trained up to the trained length, with YaRN beyond it."""
    return {**{n: v for n, v in plain.items() if int(n) <= trained_length},
            **{n: v for n, v in yarn.items() if int(n) > trained_length}}


# -- the angles that decide what can show ------------------------------------------------------------------------
def seen_turn(spec: str, head_dim: int, base_theta: float, base_length: int, length: int) -> float:
    """The largest angle (radians) that RoPE with ``spec``'s base and scaling (its θ, YaRN) turns over ``length``
    positions at any frequency index ``spec`` changes (:func:`.claims.changed_frequencies`: what CoPE tapers,
    HardClip zeroes), as a model computes it: a one-layer Llama of ``head_dim`` (base θ ``base_theta``,
    ``base_length`` positions) patched with that RoPE, its rotary module's inverse frequencies read back, so ABF
    and YaRN's interpolation are as the library applies them."""
    import dataclasses

    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    import hf_posenc
    from hf_posenc.demo import rotary_inv_freq
    from hf_posenc.schemes.base import FrequencySchemeConfig
    from hf_posenc.schemes.spec import parse_scheme_spec

    scheme = parse_scheme_spec(spec)
    rope = type(parse_scheme_spec("rope"))(**{f.name: getattr(scheme, f.name)
                                              for f in dataclasses.fields(FrequencySchemeConfig)})
    config = LlamaConfig(vocab_size=8, hidden_size=head_dim, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=head_dim,
                         max_position_embeddings=base_length, rope_theta=base_theta)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = hf_posenc.patch_model(LlamaForCausalLM(config), rope)
    finally:
        hf_logging.set_verbosity(verbosity)
    freqs = rotary_inv_freq(model).double().tolist()
    return max((freqs[i] * length for i in changed_frequencies(spec, head_dim)), default=0.0)


@dataclass(frozen=True)
class Reach:
    """How far the frequencies ``scheme`` changes turn where a claim looks (``here``, over ``where``), against the
    paper's setting at the corresponding length (``paper``, over ``paper_where``)."""

    scheme: str
    where: str
    here: float
    paper_where: str
    paper: float

    @property
    def testable(self) -> bool:
        return self.here >= MIN_SHARE_OF_PAPER * self.paper

    def text(self) -> str:
        verb = {"CoPE": "tapers", "HardClip": "zeroes"}.get(self.scheme, "changes")
        return (f"the frequencies {self.scheme} {verb} turn at most {angle(self.here)} rad over {self.where}, "
                f"against {angle(self.paper)} rad over {self.paper_where} in the paper's setting "
                f"({self.here / self.paper:.0%} of it; within reach from {MIN_SHARE_OF_PAPER:.0%})")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "testable": self.testable}


def reach_table(config: CopePasskeyConfig) -> dict[str, Reach]:
    """The angles behind the two claims: HardClip's zeroed frequencies (CoPE's tapered ones) over the trained length
    4L, no YaRN, against 64k in Llama-3-8B at θ = 1e7; CoPE's over each length beyond 4L with YaRN x4 against the
    same multiple of 64k with YaRN x4 there; and, for comparison, over the longest length without YaRN."""
    model, L, f = config.model, config.context_length, config.extension_factor
    paper_yarn = f",scaling=yarn,factor={PAPER_YARN},original_max_position_embeddings={PAPER_LENGTH}"
    longest = max(config.eval_multiples)
    rows = [("HardClip", "hardclip", f, False), ("CoPE", "cope", f, False),
            *[("CoPE", "cope", m, True) for m in config.eval_multiples if m > f], ("CoPE", "cope", longest, False)]
    out = {}
    for label, name, m, yarn in rows:
        if label not in config.schemes:
            continue
        spec = config.schemes[label]
        here = seen_turn(config.eval_spec(spec) if yarn else spec, model.head_dim, model.rope_theta, L, m * L)
        paper_spec = f"{name}:rope_theta={PAPER_THETA!r}" + (paper_yarn if yarn else "")
        paper = seen_turn(paper_spec, PAPER_HEAD_DIM, PAPER_BASE_THETA, PAPER_BASE_LENGTH, PAPER_LENGTH * m // f)
        how = " with YaRN x4" if yarn else (" (trained length)" if m == f else " without YaRN")
        key = f"{label} at {m}L" + ("" if yarn or m == f else " without YaRN")
        out[key] = Reach(label, f"{m}L = {m * L}{how}", here, f"{PAPER_LENGTH * m // f // 1024}k{how}", paper)
    return out


# -- the experiment -----------------------------------------------------------------------------------------------
def run(config: CopePasskeyConfig, out: str | Path, work: str | Path, command: str, corpus: Corpus | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md``, ``heldout_loss.png`` and
    ``passkey.png`` to ``out`` and returns the JSON payload. ``corpus`` defaults to the Austen novels."""
    start = time.perf_counter()
    out, work, corpus, prepared = begin(config, out, work, corpus)
    L, trained = config.context_length, config.extended_length
    common = {"experiment": config.name, "eval_lengths": config.eval_lengths, "eval_tokens": config.eval_tokens,
              "train_chars": config.train_chars, "train_bytes": prepared["train_bytes"]}
    base, base_settings = pretrain_base(config, prepared, work, common, progress)
    data = write_passkey_data(config, prepared, work)
    mixed = {**prepared, "train_files": data["train_files"]}
    evaluation = {"yarn_factor": config.yarn_factor, "passkey": [config.passkey_lengths, config.passkey_depths,
                                                                 config.passkey_trials]}

    cells = []
    for label, spec in config.schemes.items():
        for seed in config.seed_list:
            settings = {**common, "role": "extension", "base": fingerprint(base_settings), "spec": spec,
                        "eval_spec": config.eval_spec(spec), "seed": seed, "context_length": trained,
                        "train": config.extend, "passkey_data": {k: data[k] for k in ("passkey_windows",
                                                                                     "novel_windows", "sha256")},
                        "train_stream": TRAIN_STREAM, "evaluation": evaluation}

            def execute(directory: Path, spec: str = spec, seed: int = seed) -> dict[str, Any]:
                began = time.perf_counter()
                recipe = build_recipe(config, mixed, scheme=spec, seed=seed, context_length=trained,
                                      model=config.model, train=config.extend, output_dir=str(directory / "run"),
                                      base_model=base["model_dir"])
                result = train_and_evaluate(recipe, directory / "train.log")
                evaluated = evaluate_arm(result["model_dir"], spec, prepared, config)
                plain, yarn = evaluated["plain"], evaluated["yarn"]
                return {**result, "perplexity_plain": result["perplexity"],
                        "perplexity": combine(trained, result["perplexity"], yarn["perplexity"]),
                        "passkey": combine(trained, plain["passkey"], yarn["passkey"]),
                        "yarn": yarn, "trained": plain, "train_seconds": result["seconds"],
                        "seconds": time.perf_counter() - began}

            cells.append(Cell(label, spec, seed, work / "runs" / slug(label) / f"seed{seed}", settings, None,
                              execute=execute))
    results = run_cells(cells, desc=f"{config.name} ({config.size}): continued training at {trained} with "
                                    "passkey windows, then YaRN x4 beyond", progress=progress)
    summary = Summary.from_results([base, *results], config.eval_lengths)  # the base a row of its own
    elapsed = time.perf_counter() - start
    payload = make_payload(
        config.name, command, config.to_dict(), corpus.name,
        "held-out cross-entropy in nats per byte (perplexity = exp); passkey: accuracy in [0, 1]", prepared["floors"],
        [base, *results], elapsed, summary=summary.to_dict(), base=base["perplexity"],
        passkey_data={k: data[k] for k in ("passkey_windows", "novel_windows")},
        passkey=passkey_summary(results, config.passkey_lengths),
        angles={k: r.to_dict() for k, r in reach_table(config).items()})
    publish(out, payload, config)
    plot_summary(summary, out / "heldout_loss.png",
                 f"Base at L = {L}, continued at {trained} bytes with θ' = {config.extended_theta:,.1f} and passkey "
                 f"windows; YaRN x{config.yarn_factor:g} beyond ({config.size}, {config.seeds} seeds)",
                 prepared["floors"], trained)
    series = {f"{label} {measure}": {f"{n} bytes": passkey_values(results, label, n, measure)
                                     for n in config.passkey_lengths}
              for measure in ("digits", "exact") for label in config.schemes}
    plot_settings(series, out / "passkey.png", f"Passkey retrieval (YaRN x{config.yarn_factor:g} beyond {trained}; "
                  f"{config.size}, {config.seeds} seeds)", "prompt length", ylabel="accuracy")
    return payload


def arm_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The continued-training runs (the base left out)."""
    return [r for r in runs if r["label"] != BASE_LABEL]


def passkey_values(runs: Sequence[dict[str, Any]], label: str, length: int, measure: str,
                   field: str = "passkey") -> dict[int, float]:
    """Per seed, ``measure`` (``exact`` or ``digits``) of ``label`` at ``length`` (``field``: ``passkey``, the
    reported condition, or ``trained`` / ``yarn``, either condition alone)."""
    def scores(r: dict[str, Any]) -> dict[str, Any]:
        return r["passkey"] if field == "passkey" else r[field]["passkey"]

    return {r["seed"]: scores(r)[str(length)][measure] for r in runs
            if r["label"] == label and str(length) in scores(r)}


def passkey_summary(runs: Sequence[dict[str, Any]], lengths: Sequence[int]) -> dict[str, dict[str, dict[str, float]]]:
    """label -> length -> mean ± sd over seeds of exact match and key-digit accuracy (reported condition)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label in dict.fromkeys(r["label"] for r in arm_runs(runs)):
        out[label] = {}
        for n in lengths:
            exact = mean_sd(list(passkey_values(runs, label, n, "exact").values()))
            digits = mean_sd(list(passkey_values(runs, label, n, "digits").values()))
            out[label][str(n)] = {"exact": exact[0], "exact_sd": exact[1], "digits": digits[0], "digits_sd": digits[1]}
    return out


def loss_values(runs: Sequence[dict[str, Any]], label: str, length: int, field: str) -> dict[int, float]:
    """Per seed, the held-out loss of ``label`` at ``length`` in ``field`` (``perplexity_plain``: as trained;
    ``yarn``: with YaRN)."""
    def table(r: dict[str, Any]) -> dict[str, Any]:
        return r["yarn"]["perplexity"] if field == "yarn" else r[field]

    return {r["seed"]: float(table(r)[str(length)]["nll"]) for r in runs if r["label"] == label}


# -- analysis -----------------------------------------------------------------------------------------------------
def judge(groups: Mapping[str, Sequence[tuple[Difference, int]]]) -> str | None:
    """The status the evidence gives a claim: refuted when any difference is detected with the sign opposite to
    the claim's (``sign`` +1: the claim says the estimate is positive), confirmed when none is and every difference
    of one group (held-out loss, or passkey at every length) is detected with the claimed sign, ``None`` (the test
    cannot tell) otherwise."""
    every = [e for group in groups.values() for e in group]
    if any(d.detected and (d.estimate > 0) != (sign > 0) for d, sign in every):
        return REFUTED
    if any(group and all(d.detected and (d.estimate > 0) == (sign > 0) for d, sign in group)
           for group in groups.values()):
        return CONFIRMED
    return None


def status(groups: Mapping[str, Sequence[tuple[Difference, int]]], reach: Reach) -> str:
    """:func:`judge` where the angles put the claim within reach; "cannot be tested at this scale" otherwise (and
    where the test cannot tell)."""
    return (judge(groups) if reach.testable else None) or UNTESTABLE_SCALE


def retrieves(passkey: Mapping[str, Any], label: str, length: int) -> bool:
    """Whether ``label`` retrieves the key at ``length`` at all (greedy exact match above 0 on average)."""
    return passkey.get(label, {}).get(str(length), {}).get("exact", 0.0) > 0


def paper_claims(summary: Summary, runs: Sequence[dict[str, Any]], passkey: Mapping[str, Any],
                 config: CopePasskeyConfig, tests: Tests, reaches: Mapping[str, Reach] | None = None) -> list[Claim]:
    """The two claims of the CoPE paper this experiment is made for, each with its paired intervals (recorded in
    ``tests``) and the angles (``reaches``, default :func:`reach_table`) that say whether it can show here."""
    reaches = reach_table(config) if reaches is None else reaches
    f, L, trained = config.extension_factor, config.context_length, config.extended_length
    beyond = [n for n in config.eval_lengths if n > trained]
    runs = arm_runs(runs)
    out: list[Claim] = []
    rates = {label: (config.extend.learning_rate, config.extend.steps) for label in summary.rows}

    def passkey_diff(a: str, length: int, measure: str) -> Difference:
        return compare(passkey_values(runs, a, length, measure), passkey_values(runs, REFERENCE, length, measure))

    def evidence(a: str, lengths: Sequence[int], better: int) -> dict[str, list[tuple[str, Difference, int]]]:
        """Per group, (name, difference a − RoPE, claimed sign): ``better`` +1 where the claim is that ``a`` is
        better (lower loss, higher accuracy), −1 where it is worse."""
        name = lambda n: f"{n // L}L" if n % L == 0 else str(n)  # noqa: E731
        groups = {"loss": [(f"{a} - RoPE loss at {name(n)}", summary.diff(a, REFERENCE, n), -better)
                           for n in lengths],
                  "digits": [(f"{a} - RoPE passkey digits at {name(n)}", passkey_diff(a, n, "digits"), better)
                             for n in lengths if n in config.passkey_lengths],
                  "exact": [(f"{a} - RoPE passkey exact at {name(n)}", passkey_diff(a, n, "exact"), better)
                            for n in lengths if n in config.passkey_lengths]}
        return groups

    def written(groups: dict[str, list[tuple[str, Difference, int]]]) -> str:
        items = []
        for kind, group in groups.items():
            for name, d, _ in group:
                higher, lower = (("higher loss than RoPE", "lower loss than RoPE") if kind == "loss" else
                                 ("higher accuracy than RoPE", "lower accuracy than RoPE"))
                items.append((name, d, higher, lower))
        return tests.line(items)

    def decided(groups: dict[str, list[tuple[str, Difference, int]]], reach: Reach) -> tuple[str, str]:
        plain = {k: [(d, s) for _, d, s in g] for k, g in groups.items()}
        found = status(plain, reach)
        if not reach.testable:
            lead = (f"{reach.text()}: the scheme changes rotations by at most that angle, so it is close to RoPE by "
                    "construction here, and a difference that shows is not the paper's mechanism; ")
        elif found == UNTESTABLE_SCALE:
            n = max((d.n for g in plain.values() for d, _ in g), default=0)
            lead = f"{reach.text()}, so within reach, but with {n} seeds the test cannot tell: "
        else:
            lead = f"{reach.text()}, so within reach: "
        return found, lead

    if "CoPE" in summary.rows and REFERENCE in summary.rows and beyond:
        reach = reaches[f"CoPE at {beyond[-1] // L}L"]  # the longest length: where the frequencies turn furthest
        groups = evidence("CoPE", beyond, +1)
        found, lead = decided(groups, reach)
        learned = retrieves(passkey, REFERENCE, trained) or retrieves(passkey, "CoPE", trained)
        note = ("" if learned else f"; neither RoPE nor CoPE retrieves the key at the trained length {trained} "
                "(greedy exact match 0), so retrieval beyond it cannot show")
        out.append(Claim.judged(
            "CoPE", f"CoPE retrieves and models better than RoPE beyond the trained length with YaRN x4 "
            f"({', '.join(f'{n // L}L' for n in beyond)} here; HELMET average 52.72 vs 44.29 at 128k and 28.48 vs "
            "14.37 at 256k, RULER NIAH 94.0 vs 91.0 and 78.5 vs 60.5, trained at 64k)", found,
            lead + written(groups) + note + ".", fixed_rates(rates, reach.text(), reach.testable)))
    if "HardClip" in summary.rows and REFERENCE in summary.rows:
        reach = reaches[f"HardClip at {f}L"]
        groups = evidence("HardClip", [trained], -1)
        found, lead = decided(groups, reach)
        out.append(Claim.judged(
            "CoPE", f"HardClip (the same lowest frequencies zeroed) is worse than RoPE inside the trained length "
            f"({f}L here; HELMET average 50.71 vs 52.94 at 64k, RULER NIAH 99.33 vs 99.67)", found,
            lead + written(groups) + ".", fixed_rates(rates, reach.text(), reach.testable)))
    return out


def verdict(summary: Summary, runs: Sequence[dict[str, Any]], passkey: Mapping[str, Any], config: CopePasskeyConfig,
            base: Mapping[str, Any], tests: Tests) -> list[str]:
    """The comparisons, each with its test: per arm its loss and passkey scores against RoPE at 4L, 8L and 16L;
    YaRN's effect on each arm (4L with and without it; beyond 4L without and with it); whether retrieval was
    learned."""
    runs = arm_runs(runs)
    L, trained, f = config.context_length, config.extended_length, config.extension_factor
    beyond = [n for n in config.eval_lengths if n > trained]
    shown = [trained, *beyond]
    name = {n: f"{n // L}L" if n > L else "L" for n in config.eval_lengths}
    lines = [tests_explained(summary) + " Passkey accuracies are compared the same way (per seed, over the same "
             "prompts for every model)."]
    lines.append(f"{BASE_LABEL}: " + ", ".join(f"{float(base[str(n)]['nll']):.3f} at {name[n]}"
                                               for n in config.eval_lengths if str(n) in base)
                 + " (one run, no YaRN).")
    for label in config.schemes:
        row = summary.rows[label]
        scores = "; passkey exact / digits " + ", ".join(
            f"{passkey[label][str(n)]['exact']:.2f} / {passkey[label][str(n)]['digits']:.2f} at {name[n]}"
            for n in config.passkey_lengths)
        head = f"{label}: " + ", ".join(f"{row[n][0]:.3f} at {name[n]}" for n in shown) + scores
        if label == REFERENCE:
            lines.append(head + ".")
            continue
        items = []
        for n in shown:
            items.append((f"{label} - RoPE loss at {name[n]}", summary.diff(label, REFERENCE, n),
                          "higher loss than RoPE", "lower loss than RoPE"))
        for measure in ("digits", "exact"):
            for n in config.passkey_lengths:
                d = compare(passkey_values(runs, label, n, measure), passkey_values(runs, REFERENCE, n, measure))
                items.append((f"passkey {measure} at {name[n]}", d, "higher accuracy than RoPE",
                              "lower accuracy than RoPE"))
        lines.append(head + "; " + tests.line(items) + ".")
    for label in config.schemes:
        items = [(f"{label}: YaRN - as trained, loss at {name[trained]}",
                  compare(loss_values(runs, label, trained, "yarn"), loss_values(runs, label, trained,
                                                                                 "perplexity_plain")),
                  "YaRN raises the loss", "YaRN lowers the loss")]
        items += [(f"as trained - YaRN at {name[n]}",
                   compare(loss_values(runs, label, n, "perplexity_plain"), loss_values(runs, label, n, "yarn")),
                   "YaRN lowers the loss", "YaRN raises the loss") for n in beyond]
        items.append((f"passkey digits at {name[trained]}, YaRN - as trained",
                      compare(passkey_values(runs, label, trained, "digits", "yarn"),
                              passkey_values(runs, label, trained, "digits", "trained")),
                      "YaRN retrieves better", "YaRN retrieves worse"))
        lines.append(tests.line(items) + ".")
    best = {n: max(p[str(n)]["exact"] for p in passkey.values()) for n in config.passkey_lengths}
    if best[trained] == 0:
        lines.append(f"Passkey: no model retrieves the key even at the trained length {trained} (greedy exact match 0 "
                     "for every model): the passkey windows did not teach retrieval in this budget, so retrieval "
                     "beyond it cannot show.")
    else:
        lines.append("Passkey: the best greedy exact match is " + ", ".join(f"{best[n]:.2f} at {name[n]}"
                                                                             for n in config.passkey_lengths)
                     + " (mean over seeds).")
    return lines


def analyse(payload: dict[str, Any], config: CopePasskeyConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    runs = arm_runs(payload["runs"])
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, runs, payload["passkey"], config, payload["base"], tests),
                    paper_claims(summary, runs, payload["passkey"], config, tests))


# -- rendering ----------------------------------------------------------------------------------------------------
def passkey_table(runs: Sequence[dict[str, Any]], config: CopePasskeyConfig) -> str:
    """Exact match and key-digit accuracy (mean ± sd over seeds) per arm: at 4L as trained and with YaRN, beyond
    with YaRN."""
    trained = config.extended_length
    columns = [(f"{trained} as trained", trained, "trained"), (f"{trained} YaRN", trained, "yarn")]
    columns += [(f"{n} YaRN", n, "yarn") for n in config.passkey_lengths if n > trained]
    head = ["scheme", *[f"{c[0]}: exact" for c in columns], *[f"{c[0]}: digits" for c in columns]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in config.schemes:
        cells = [fmt(*mean_sd(list(passkey_values(runs, label, n, measure, field).values())), 2)
                 for measure in ("exact", "digits") for _, n, field in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def yarn_table(runs: Sequence[dict[str, Any]], config: CopePasskeyConfig) -> str:
    """Held-out loss (mean ± sd) from the trained length on, as trained and with YaRN."""
    lengths = [n for n in config.eval_lengths if n >= config.extended_length]
    head = ["scheme", *[f"{n} as trained" for n in lengths], *[f"{n} YaRN" for n in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in config.schemes:
        cells = [fmt(*mean_sd(list(loss_values(runs, label, n, field).values())))
                 for field in ("perplexity_plain", "yarn") for n in lengths]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(payload: dict[str, Any], config: CopePasskeyConfig) -> str:
    """``results.md`` from ``results.json``."""
    runs = arm_runs(payload["runs"])
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    claims = [Claim.from_dict(c) for c in payload.get("claims") or []]
    L, trained = config.context_length, config.extended_length
    names = [(f"{m}L" if m > 1 else "L") + f" = {m * L}" + (" (YaRN)" if m > config.extension_factor else "")
             for m in config.eval_multiples]
    data = payload["passkey_data"]
    share = data["passkey_windows"] / (data["passkey_windows"] + data["novel_windows"])
    model, pre, ext = config.model, config.pretrain, config.extend
    angles = [f"- {key}: {Reach(**{k: v for k, v in r.items() if k != 'testable'}).text()}"
              + ("" if r["testable"] else ": out of reach") for key, r in payload["angles"].items()]
    md = [
        f"# CoPE's claim where it can show: RoPE, CoPE and HardClip with ABF, passkey windows and YaRN x4 "
        f"({config.size})",
        "",
        f"Rerun: `{payload['command']}`",
        "",
        f"Byte-level Llama-style base (d = {model.hidden_size}, {model.num_layers} layers, {model.num_heads} heads of "
        f"{model.head_dim}, θ = {model.rope_theta:,.0f}) pretrained with RoPE at L = {L} bytes for {pre.steps} steps "
        f"of {pre.batch_size} windows (lr {pre.learning_rate:g}; once, seed 0), the context-extension experiment's "
        f"base. Each arm continues it at 4L = {trained} bytes with the base raised to θ' = (1e7 / 65,536) x {trained} "
        f"= {config.extended_theta:,.1f} (the CoPE paper's ratio of base to extended length) for {ext.steps} steps "
        f"of {ext.batch_size} windows (lr {ext.learning_rate:g}, {ext.warmup_steps} warm-up steps, cosine to "
        f"{getattr(ext, 'min_lr_ratio', 0):g} x, AdamW β2 {getattr(ext, 'adam_beta2', 0.999):g}, weight decay "
        f"{ext.weight_decay:g}; full fine-tuning), {config.seeds} seeds per arm, paired by seed. Arms: "
        + ", ".join(f"{label} `{spec}`" for label, spec in config.schemes.items())
        + f". Training data: the novels ({payload['corpus']}) and {data['passkey_windows']:,} passkey windows for "
        f"{data['novel_windows']:,} novel windows ({share:.1%} of the windows; the Trainer samples them at random), "
        f"each exactly one window of {trained} bytes (Landmark prompt, the answer and EOS; keys from a training-only "
        "stream, every evaluation key excluded), loss on the whole window.",
        "",
        f"Evaluation: the held-out novel's first {config.eval_tokens} bytes in disjoint windows, nats per byte, mean ± "
        f"sd ({TABLE_NOTE}); up to {trained} as trained, beyond it with YaRN x{config.yarn_factor:g} over θ' "
        f"(original length {trained}) for every arm, CoPE's and HardClip's clip range over YaRN's frequencies; the base "
        "row as pretrained at every length (no YaRN).",
        "",
        markdown_table(summary, names, payload["floors"]),
        "",
        f"YaRN's effect on held-out loss from the trained length on (the table above uses the first columns up to "
        f"{trained} and YaRN beyond):",
        "",
        yarn_table(runs, config),
        "",
        f"Passkey retrieval ({len(config.passkey_depths)} depths x {config.passkey_trials} keys per length, the same "
        "prompts for every model): greedy exact match / teacher-forced fraction of the key's digits ranked first among "
        "the ten digits (chance 0.1).",
        "",
        passkey_table(runs, config),
        "",
        "![passkey](passkey.png)",
        "",
        "The angles that decide whether the claims can show (the frequencies as the evaluated model computes them, "
        "YaRN included; the paper's setting: Llama-3-8B, head dim 128, θ = 1e7, trained at 64k, YaRN x4 beyond):",
        "",
        *angles,
        "",
        *[f"- {line}" for line in payload["verdict"]],
        "",
        f"Wall time {payload['wall_seconds'] / 60:.1f} min (torch threads {payload['machine']['threads']}).",
        "",
        "![held-out loss](heldout_loss.png)",
        "",
        *claims_section(claims),
    ]
    return "\n".join(md)
