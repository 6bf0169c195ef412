"""TAPE's claim (issue #33 §2), in miniature: parameter-efficient TAPE against LoRA at a matched number of trainable
parameters, and against o_proj alone.

The TAPE paper (§3.3, §4.3) extends Llama2-7B from 4k to 8k tokens training only TAPE's modules (W1 and W2,
W2 at zero so the model starts as the base) and "the post-attention linear layer", and reports a lower PG19 perplexity
at 8k than LoRA (7.063 against 8.199). Here the context-extension base (a byte-level RoPE model pretrained at L,
:mod:`.context_extension`'s settings) is continued at 4L with each arm of :class:`.config.TapePeftConfig`, every
other weight frozen: TAPE's blocks plus every o_proj; LoRA on q, k, v, o at the rank whose trainable-parameter
count is closest to TAPE's; o_proj alone, the control: if it matches TAPE, the gain is not TAPE's. All through
the project's recipe trainer and real PEFT (LoRA; ``peft.r = 0`` trains modules whole, PEFT's LN-tuning wrapper),
scored by held-out loss at L, 4L (the trained length, the paper's 8k), 8L and 16L, compared paired by seed.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from .claims import CONFIRMED, REFUTED, UNTESTABLE_SCALE, Claim, claims_section
from .config import (
    LLAMA2_PRETRAIN_LEARNING_RATE, TAPE_PAPER_LEARNING_RATE, TAPE_PEFT_LORA, TAPE_PEFT_OPROJ, TAPE_PEFT_TAPE, PeftArm,
    TapePeftConfig,
)
from .context_extension import BASE_LABEL, pretrain_base
from .corpus import Corpus
from .length_generalisation import begin
from .report import (
    NEGLIGIBLE, TABLE_NOTE, Tests, analysis, make_payload, markdown_table, plot_summary, publish, tests_explained,
)
from .runner import Cell, Summary, build_recipe, fingerprint, run_cells, slug
from .stats import Difference
from .tokenizer import VOCAB_SIZE

# the comparisons of the report, each "a - b" (positive: a has the higher loss)
PAIRS = ((TAPE_PEFT_TAPE, TAPE_PEFT_LORA), (TAPE_PEFT_TAPE, TAPE_PEFT_OPROJ), (TAPE_PEFT_LORA, TAPE_PEFT_OPROJ))


# -- what trains ------------------------------------------------------------------------------------------------
def peft_section(config: TapePeftConfig, arm: PeftArm, rank: int) -> dict[str, Any]:
    """The recipe's ``peft`` section of ``arm``: LoRA at ``rank`` (alpha = ``lora_alpha_per_rank`` × rank, dropout
    0) on its modules, or (``r = 0``) its modules trained whole; the scheme's modules (TAPE's blocks) whole where
    the arm says so, nothing else trainable."""
    if arm.lora and rank < 1:
        raise ValueError(f"a LoRA arm needs a rank >= 1, got {rank}")
    r = rank if arm.lora else 0
    return {"enabled": True, "r": r, "alpha": config.lora_alpha_per_rank * r if arm.lora else 16.0, "dropout": 0.0,
            "target_modules": list(arm.modules), "modules_to_save": [], "trainable_embeddings": False,
            "trainable_norms": False, "scheme_modules": arm.scheme_modules}


def _base_model(config: TapePeftConfig) -> Any:
    """A fresh Llama of ``config.model`` at the extended length (the base's shape, random weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = config.model.llama_config(VOCAB_SIZE, VOCAB_SIZE - 1, config.extended_length)
    return LlamaForCausalLM(LlamaConfig(**{k: v for k, v in settings.items() if k != "model_type"}))


def trainable_parameters(config: TapePeftConfig, arm: PeftArm, rank: int = 0) -> dict[str, int]:
    """Name -> size of every parameter that trains in ``arm`` (LoRA at ``rank``), counted on the model the
    trainer builds: the Llama of ``config.model``, patched with the arm's scheme, wrapped by PEFT with the config
    :func:`hf_posenc.adapters.lora_config` makes from :func:`peft_section` (as ``hf_posenc.training`` does)."""
    import hf_posenc  # noqa: F401  (registers the patched model types)
    from peft import get_peft_model

    from hf_posenc.adapters import lora_config
    from hf_posenc.patching import patch_model
    from hf_posenc.schemes.spec import parse_scheme_spec

    model = _base_model(config)
    patch_model(model, parse_scheme_spec(arm.spec))
    p = peft_section(config, arm, rank)
    peft_config = lora_config(model, r=p["r"], lora_alpha=p["alpha"], lora_dropout=p["dropout"],
                              target_modules=p["target_modules"], modules_to_save=p["modules_to_save"],
                              scheme_modules=p["scheme_modules"])
    wrapped = get_peft_model(model, peft_config)
    return {name: param.numel() for name, param in wrapped.named_parameters() if param.requires_grad}


def closest_rank(target: int, per_rank: int) -> int:
    """The LoRA rank r >= 1 whose count r × ``per_rank`` is closest to ``target`` (the lower on a tie)."""
    if per_rank < 1:
        raise ValueError(f"per_rank must be >= 1, got {per_rank}")
    low = max(1, target // per_rank)
    return min((low, low + 1), key=lambda r: (abs(r * per_rank - target), r))


def arm_budget(config: TapePeftConfig) -> dict[str, dict[str, Any]]:
    """Label -> ``{"rank", "parameters", "by_module"}``: the rank of each arm (the matched one for LoRA arms, 0
    otherwise) and its trainable parameters, counted on the built model (:func:`trainable_parameters`);
    ``by_module``: the count per trained module name (``o_proj``, ``tape``, ``lora_A`` ...)."""
    target = sum(trainable_parameters(config, config.arms[config.match]).values())
    out = {}
    for label, arm in config.arms.items():
        rank = closest_rank(target, sum(trainable_parameters(config, arm, 1).values())) if arm.lora else 0
        counts = trainable_parameters(config, arm, rank)
        by_module: dict[str, int] = {}
        for name, size in counts.items():
            key = next((part for part in name.split(".") if part in ("tape", "lora_A", "lora_B", *arm.modules)),
                       "other")
            by_module[key] = by_module.get(key, 0) + size
        out[label] = {"rank": rank, "parameters": sum(counts.values()), "by_module": by_module}
    return out


def base_parameters(config: TapePeftConfig) -> int:
    """Parameters of the base model (tied embeddings)."""
    return sum(p.numel() for p in _base_model(config).parameters())


def extension_recipe(config: TapePeftConfig, prepared: dict[str, Any], arm: PeftArm, rank: int, seed: int,
                     output_dir: str, base_dir: str) -> Any:
    """The validated recipe of one continued run: the base in ``base_dir`` at 4L with ``arm``'s scheme and
    :func:`peft_section` (LoRA at ``rank``), ``config.extend``'s optimisation, evaluation at ``config``'s lengths."""
    from hf_posenc.training.config import PeftSection, validate_recipe

    recipe = build_recipe(config, prepared, scheme=arm.spec, seed=seed, context_length=config.extended_length,
                          model=config.model, train=config.extend, output_dir=output_dir, base_model=base_dir)
    recipe = dataclasses.replace(recipe, peft=PeftSection(**peft_section(config, arm, rank)))
    validate_recipe(recipe)
    return recipe


# -- the run ----------------------------------------------------------------------------------------------------
def run(config: TapePeftConfig, out: str | Path, work: str | Path, command: str, corpus: Corpus | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json``, ``results.md`` and ``heldout_loss.png`` to
    ``out`` and returns the JSON payload. ``corpus`` defaults to the Austen novels."""
    start = time.perf_counter()
    out, work, corpus, prepared = begin(config, out, work, corpus)
    lengths = config.eval_lengths
    budget = arm_budget(config)
    common = {"experiment": config.name, "eval_lengths": lengths, "eval_tokens": config.eval_tokens,
              "train_chars": config.train_chars, "train_bytes": prepared["train_bytes"]}
    # the context-extension base: RoPE pretrained at L with its settings (seed 0, once)
    base, base_settings = pretrain_base(config, prepared, work, common, progress)
    cells = []
    for label, arm in config.arms.items():
        peft = peft_section(config, arm, budget[label]["rank"])
        for seed in config.seed_list:
            settings = {**common, "role": "extension", "base": fingerprint(base_settings), "spec": arm.spec,
                        "seed": seed, "context_length": config.extended_length, "model": config.model,
                        "train": config.extend, "peft": peft}

            def make(d: str, arm: PeftArm = arm, seed: int = seed, rank: int = budget[label]["rank"]) -> Any:
                return extension_recipe(config, prepared, arm, rank, seed, d, base["model_dir"])

            cells.append(Cell(label, arm.spec, seed, work / "runs" / slug(label) / f"seed{seed}", settings, make))
    results = run_cells(cells, desc=f"{config.name} ({config.size}): continued training at {config.extended_length}",
                        progress=progress)
    everything = [base, *results]
    summary = Summary.from_results(everything, lengths)
    floors = prepared["floors"]
    payload = make_payload(config.name, command, config.to_dict(), corpus.name,
                           "held-out cross-entropy in nats per byte (perplexity = exp)", floors, everything,
                           time.perf_counter() - start, summary=summary.to_dict(), trainable=budget,
                           base_parameters=base_parameters(config))
    publish(out, payload, config)
    plot_summary(summary, out / "heldout_loss.png",
                 f"Base at L = {config.context_length}, extended at {config.extended_length} bytes with a frozen "
                 f"base ({config.size}, {config.seeds} seeds)", floors, config.extended_length)
    return payload


# -- the analysis -----------------------------------------------------------------------------------------------
def decisive(diff: Difference) -> bool:
    """Detected (the interval excludes 0) and at least :data:`.report.NEGLIGIBLE` (0.001 nats/byte, the tables'
    precision): a difference that can decide a claim."""
    return diff.detected and abs(diff.estimate) >= NEGLIGIBLE


def tape_claim_status(vs_lora: Difference, vs_oproj: Difference) -> str:
    """The status of TAPE's claim from TAPE − LoRA and TAPE − o_proj alone at the extended length (negative: TAPE
    has the lower loss): **refuted** when TAPE is decisively worse than LoRA (at matched trainable parameters) or
    than o_proj alone (TAPE's modules then cost, so the gain is not TAPE's); **confirmed** when it is decisively
    better than both; otherwise it cannot be told at this scale (an interval containing 0 is not a match)."""
    if any(decisive(d) and d.estimate > 0 for d in (vs_lora, vs_oproj)):
        return REFUTED
    if all(decisive(d) and d.estimate < 0 for d in (vs_lora, vs_oproj)):
        return CONFIRMED
    return UNTESTABLE_SCALE


def describe_budget(trainable: dict[str, dict[str, Any]]) -> str:
    """``"TAPE + o_proj 8,740 (o_proj 8,192, tape 548); LoRA (matched) rank 9: 9,216; o_proj only 8,192"``."""
    parts = []
    for label, b in trainable.items():
        modules = ", ".join(f"{k} {v:,}" for k, v in b["by_module"].items())
        rank = f" rank {b['rank']}:" if b["rank"] else ""
        parts.append(f"{label}{rank} {b['parameters']:,}" + (f" ({modules})" if len(b["by_module"]) > 1 else ""))
    return "; ".join(parts)


def verdict(summary: Summary, payload: dict[str, Any], config: TapePeftConfig, tests: Tests) -> list[str]:
    """Each comparison with its test: every arm against the unextended base at 4L and its growth to the longest
    length; then TAPE − LoRA, TAPE − o_proj alone and LoRA − o_proj alone at 4L, at L and at the longest length."""
    trained, longest, L = config.extended_length, config.eval_lengths[-1], config.context_length
    f, k = config.extension_factor, longest // L
    base = summary.rows[BASE_LABEL]
    lines = [tests_explained(summary),
             "Every continued run starts from the same base (seed 0): the intervals hold for this base and contain "
             "the spread of the continued training only.",
             f"{BASE_LABEL}: {base[L][0]:.3f} at L, {base[trained][0]:.3f} at {f}L, {base[longest][0]:.3f} at "
             f"{k}L (one run).",
             f"Trainable parameters (counted on the model PEFT builds; the base has {payload['base_parameters']:,}): "
             + describe_budget(payload["trainable"]) + "."]
    for label in config.arms:
        row = summary.rows[label]
        lines.append(f"{label}: {row[trained][0]:.3f} at {f}L (trained length), {row[longest][0]:.3f} at {k}L; "
                     + tests.line([(f"{label} - base at {f}L", summary.diff(label, BASE_LABEL, trained),
                                    "higher loss than the base", "lower loss than the base"),
                                   (f"growth {f}L -> {k}L", summary.diff(label, label, longest, other_length=trained),
                                    "grows", "shrinks")]) + ".")
    for length, name in ((trained, f"{f}L"), (L, "L"), (longest, f"{k}L")):
        items = [(f"{a} - {b} at {name}", summary.diff(a, b, length), f"higher loss than {b}", f"lower loss than {b}")
                 for a, b in PAIRS if a in summary.rows and b in summary.rows]
        lines.append(f"At {name}" + (" (the trained length)" if length == trained else "") + ": "
                     + tests.line(items) + ".")
    return lines


CLAIM = ("parameter-efficient TAPE (its W1, W2 and o_proj trained) extends a RoPE model's context better than LoRA "
         "(Llama2-7B from 4k to 8k: PG19 perplexity at 8k 7.063 vs 8.199)")


def paper_claims(summary: Summary, payload: dict[str, Any], config: TapePeftConfig, tests: Tests) -> list[Claim]:
    """TAPE's claim, from TAPE − LoRA and TAPE − o_proj alone at the trained length (:func:`tape_claim_status`)."""
    trained, f = config.extended_length, config.extension_factor
    if not all(label in summary.rows for label in (TAPE_PEFT_TAPE, TAPE_PEFT_LORA, TAPE_PEFT_OPROJ)):
        return []
    vs_lora = summary.diff(TAPE_PEFT_TAPE, TAPE_PEFT_LORA, trained)
    vs_oproj = summary.diff(TAPE_PEFT_TAPE, TAPE_PEFT_OPROJ, trained)
    status = tape_claim_status(vs_lora, vs_oproj)
    budget = payload["trainable"]
    evidence = tests.line([
        (f"TAPE - LoRA at {f}L", vs_lora, "higher loss than LoRA", "lower loss than LoRA"),
        (f"TAPE - o_proj only at {f}L", vs_oproj, "higher loss than o_proj alone", "lower loss than o_proj alone")])
    matched = (f"{budget[TAPE_PEFT_TAPE]['parameters']:,} trainable parameters against LoRA's "
               f"{budget[TAPE_PEFT_LORA]['parameters']:,} (rank {budget[TAPE_PEFT_LORA]['rank']}) and o_proj's "
               f"{budget[TAPE_PEFT_OPROJ]['parameters']:,}")
    regime = (f"for this regime (a {config.model.num_layers}-layer byte model extended from {config.context_length} "
              f"to {trained} bytes, {config.extend.steps:,} steps), not the paper's 7B model: ")
    if status == REFUTED:
        worse = [name for name, d in (("LoRA", vs_lora), ("o_proj alone", vs_oproj)) if decisive(d) and d.estimate > 0]
        reading = (f"TAPE has a higher loss than {' and than '.join(worse)} at {matched}"
                   + ("; o_proj alone does better, so TAPE's modules cost rather than gain" if "o_proj alone" in worse
                      else "") + ": ")
        reason = regime + reading + evidence + "."
    elif status == CONFIRMED:
        reason = (regime + f"TAPE has a lower loss than LoRA at {matched}, and than o_proj alone, so the gain is "
                  "TAPE's modules': " + evidence + ".")
    else:
        if decisive(vs_lora) and vs_lora.estimate < 0:
            lead = ("TAPE has a lower loss than LoRA, but is not detectably different from o_proj alone, so the gain "
                    f"cannot be attributed to TAPE's modules (the interval excludes a TAPE advantage over o_proj "
                    f"alone of more than {max(0.0, -vs_oproj.low):.2g} nats/byte); ")
        else:
            seeds = f"{vs_lora.n} seed" + ("s" if vs_lora.n != 1 else "")
            lead = f"with {seeds} the test cannot tell TAPE from LoRA at {matched}; "
        reason = lead + evidence + "."
    return [Claim("TAPE", CLAIM, status, reason)]


def analyse(payload: dict[str, Any], config: TapePeftConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload, config, tests), paper_claims(summary, payload, config, tests))


# -- the report -------------------------------------------------------------------------------------------------
CLAIM_NOTES = (
    "What the paper's setup trained, in its authors' code (`VITA-Group/TAPE`, `train_llama.py` and "
    "`script/train_llama.sh`, read for this experiment): \"the post-attention linear layer\" of §3.3 is "
    "`post_attention_linear`, a heads × heads map on TAPE's positional states after attention (here the `attn_mix` "
    "of each `tape` block, W_att, which the TAPE arm trains), not the attention output projection o_proj, "
    "which the code freezes; its freezing filter names `post_attention_linears`, which matches no parameter, so "
    "that map stays at its zero initialisation; and both TAPE and LoRA (r = 8, alpha = 16, q, k, v, o) also train "
    "the embeddings and every norm (`trainable_params` \"embed,norm\"), with linear RoPE scaling (PI) ×2 for every "
    "method. The arms here follow the issue: TAPE with o_proj, LoRA at a matched parameter count, o_proj alone, "
    "nothing else trained, the base's RoPE unscaled.",
)


def pair_table(summary: Summary, config: TapePeftConfig) -> list[str]:
    """Each pair's difference at every length, a paired-by-seed 95 % interval."""
    head = ["difference (paired by seed)", *config.length_names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, b in PAIRS:
        if a in summary.rows and b in summary.rows:
            lines.append(f"| {a} - {b} | " + " | ".join(summary.diff(a, b, n).interval() for n in summary.lengths)
                         + " |")
    return lines


def shared_base(config: TapePeftConfig) -> str:
    """``": the context-extension experiment's base"`` where this size's base has its settings (model, text, L,
    pretraining), else nothing."""
    from .config import ContextExtensionConfig

    try:
        other = ContextExtensionConfig.preset(config.size)
    except ValueError:
        return ""
    same = (other.model, other.pretrain, other.context_length, other.train_chars) == \
        (config.model, config.pretrain, config.context_length, config.train_chars)
    return ": the context-extension experiment's base" if same else ""


def render(payload: dict[str, Any], config: TapePeftConfig) -> str:
    """``results.md`` from ``results.json``."""
    summary = Summary.from_results(payload["runs"], config.eval_lengths)
    claims = [Claim(**c) for c in payload.get("claims") or []]
    model, ext, budget = config.model, config.extend, payload["trainable"]
    arms = []
    for label, arm in config.arms.items():
        what = (f"LoRA on {', '.join(arm.modules)} at rank {budget[label]['rank']} (alpha "
                f"{config.lora_alpha_per_rank * budget[label]['rank']:g})" if arm.lora else
                " and ".join([f"every {', '.join(arm.modules)}"] + (["TAPE's blocks"] if arm.scheme_modules else []))
                + " trained whole")
        arms.append(f"- {label}: scheme `{arm.spec}`, {what}: {budget[label]['parameters']:,} trainable parameters")
    rate = TAPE_PAPER_LEARNING_RATE / LLAMA2_PRETRAIN_LEARNING_RATE
    md = [
        f"# TAPE's parameter-efficient context extension against LoRA ({config.size})",
        "",
        f"Rerun: `{payload['command']}`",
        "",
        f"Byte-level Llama-style base (d = {model.hidden_size}, {model.num_layers} layers, {model.num_heads} heads "
        f"of {model.head_dim}; {payload['base_parameters']:,} parameters) pretrained with RoPE at L = "
        f"{config.context_length} bytes for {config.pretrain.steps} steps of {config.pretrain.batch_size} windows "
        f"(lr {config.pretrain.learning_rate:g}; once, seed 0{shared_base(config)}), then "
        f"trained further at {config.extended_length} bytes for {ext.steps} steps of {ext.batch_size} windows with "
        "each arm, every other weight frozen (PEFT through the project's recipe trainer; TAPE's W2 and W_att start "
        "at zero, so its first step is the base):",
        "",
        *arms,
        "",
        f"Every arm: learning rate {ext.learning_rate:g}, {ext.warmup_steps} warm-up steps then constant, weight "
        f"decay {ext.weight_decay:g}, AdamW, the same data order per seed. The paper trains at "
        f"{TAPE_PAPER_LEARNING_RATE:g} (its Table 5; the authors' script: the same rate, 50 warm-up steps then "
        f"constant, no weight decay, for every method), 1/{1 / rate:.0f} of Llama 2's pretraining peak "
        f"({LLAMA2_PRETRAIN_LEARNING_RATE:g}); the same fraction of this base's pretraining rate "
        f"({config.pretrain.learning_rate:g}) is {ext.learning_rate:g}. Chosen before any run, not tuned. "
        f"{config.seeds} seeds per arm ({', '.join(map(str, config.seed_list))}). Text: {payload['corpus']}. "
        f"Evaluation: the first {config.eval_tokens} bytes of the held-out novel, disjoint windows, nats per byte, "
        f"mean ± sd ({TABLE_NOTE}).",
        "",
        markdown_table(summary, config.length_names, payload["floors"]),
        "",
        "Differences between the arms, each a paired-by-seed 95 % interval (positive: the first named has the "
        "higher loss):",
        "",
        *pair_table(summary, config),
        "",
        *[f"- {line}" for line in payload["verdict"]],
        "",
        f"Wall time {payload['wall_seconds'] / 60:.1f} min ({payload['seconds_in_runs'] / 60:.1f} min in training "
        f"and evaluation runs, torch threads {payload['machine']['threads']}).",
        "",
        "![held-out loss](heldout_loss.png)",
        "",
        *claims_section(claims, CLAIM_NOTES),
    ]
    return "\n".join(md)
