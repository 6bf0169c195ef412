"""TAPA at a size where it might train (issue #33 §3), on one GPU.

The CPU experiments (:mod:`.tapa_trainability`, :mod:`.tapa_depth`) found TAPA about 0.4 nats/byte above RoPE at
the training length in byte models of 0.1M parameters, at 2 and at 4 layers. Here a model of about 15M parameters
(8 layers, d = 384, head dim 64) is trained from scratch at L = 256 bytes on CUDA (TAPA through its Triton kernel,
bf16 autocast) with RoPE at its learning rate and TAPA at a third of it, with the paper's setting and with the
sweep's best θ, the same seeds for every arm (:class:`.config.TapaScaleConfig`: the settings, their sources and
the time budget), and scored on the held-out novel at L, 2L, 4L, 8L and 16L. TAPA − RoPE is compared paired by
seed at every length; the answer says whether the gap is still there, and whether it is smaller than the small
models'. ``results.json`` records the device and which attention ran (:func:`device_record`).

Run with ``hf-posenc experiment tapa_scale --size gpu`` on a CUDA machine; ``--size toy`` is the CPU smoke test.
While the RoPE runs train, :func:`warm_up` compiles the TAPA kernels in background processes, so that the TAPA runs
find them in Triton's on-disk cache. A GPU machine without a network needs the text brought along (1.8 MB: the
folder ``r-cran-janeaustenr`` that ``scripts/data/install_austen.sh`` unpacks, under a folder that
``HF_POSENC_DATA`` names there) and the training stack's packages (``datasets``, ``trl`` and theirs).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hf_posenc.schemes.spec import parse_scheme_spec
from .claims import (
    CONFIRMED, REFUTED, UNTESTABLE_SCALE, Claim, han_ji_claim, tapa_arms_tuning, unless_context_is_used,
)
from .config import ModelSettings, TapaScaleConfig
from .corpus import Corpus, austen_corpus
from .length_generalisation import arm_cells, prepare, render_from_scratch, run_from_scratch, undecided
from .prope_gemma_ratio import POWER, sensitivity
from .report import Tests, analysis, plot_settings, plot_summary, publish, tests_explained
from .runner import Summary, build_recipe, slug
from .stats import Difference, compare
from .tokenizer import VOCAB_SIZE

REFERENCE = "RoPE"
# TAPA (θ = 0.75 at lr 1e-3) − RoPE (lr 3e-3) at L = 64 in the 0.1M-parameter byte models, paired by seed, n = 3
# (examples/experiments/tapa-depth/results.json; a test keeps these equal to it)
SMALL_MODEL_GAPS = {2: 0.409, 4: 0.465}
WARM_UP_STEPS = 2


def parameter_count(model: ModelSettings, vocab_size: int = VOCAB_SIZE) -> int:
    """Parameters of the Llama-style model (tied embeddings, no biases, no GQA): embeddings, per layer q/k/v/o,
    the SwiGLU MLP and two RMSNorms, and the final norm."""
    d, inner = model.hidden_size, model.num_heads * model.head_dim
    layer = 4 * d * inner + 3 * d * model.intermediate_size + 2 * d
    return vocab_size * d + model.num_layers * layer + d


def millions(count: int) -> str:
    """``"15.4M"``, ``"29k"``, ``"192"``: a count of parameters or bytes in short."""
    return f"{count / 1e6:.1f}M" if count >= 1e6 else f"{count / 1e3:.0f}k" if count >= 1e4 else f"{count:,}"


def trained_bytes(config: TapaScaleConfig) -> int:
    """Bytes one run trains on: steps × batch × L."""
    return config.base.train.steps * config.base.train.batch_size * config.base.context_length


# -- the device ----------------------------------------------------------------------------------------------------
def check_device(config: TapaScaleConfig) -> None:
    """Refuse a CUDA preset on a machine without CUDA, or without Triton (the issue asks for the Triton kernel)."""
    if config.base.train.device != "cuda":
        return
    import torch

    from hf_posenc.kernels.tapa import TRITON_IMPORT_ERROR

    if not torch.cuda.is_available():
        raise ValueError(f"tapa_scale --size {config.base.size} trains on CUDA (15M parameters, the Triton TAPA "
                         "kernel) and this machine has no CUDA device; run it on a GPU machine, or --size toy here")
    if TRITON_IMPORT_ERROR is not None:
        raise ImportError(f"tapa_scale --size {config.base.size} runs TAPA through its Triton kernel: "
                          f"{TRITON_IMPORT_ERROR}")


def triton_binaries() -> dict[str, int] | None:
    """Per TAPA Triton kernel, how many binaries this process has compiled or loaded for a launch (Triton's
    per-device kernel caches): evidence that the kernel ran here. ``None`` where Triton, or that cache, is not
    there (the interpreter, another Triton version)."""
    try:
        from hf_posenc.kernels.tapa import triton_tapa

        out = {}
        for name in sorted(vars(triton_tapa)):
            fn = getattr(triton_tapa, name)
            while not hasattr(fn, "device_caches") and hasattr(fn, "fn"):  # autotuner / heuristics wrappers
                fn = fn.fn
            if name.startswith("_tapa") and hasattr(fn, "device_caches"):
                out[name] = sum(len(entry[0]) for entry in fn.device_caches.values())
        return out or None
    except Exception:  # noqa: BLE001 -- a record, never a failure of the experiment
        return None


def attention_paths(config: TapaScaleConfig) -> dict[str, str]:
    """Per arm, the attention that runs on the preset's device: RoPE through Transformers' SDPA (the recipes'
    ``attn_implementation``), TAPA through hf-posenc's attention function and the op its dispatcher picks there
    (:func:`hf_posenc.kernels.tapa.uses_triton`: the Triton kernel on CUDA, the chunked path on the CPU)."""
    import torch

    from hf_posenc.kernels.tapa import uses_triton

    probe = torch.empty(0, device=config.base.train.device)
    out = {}
    for label, variant in config.variants.items():
        if parse_scheme_spec(variant.spec).name == "tapa":
            op = ("Triton kernel (hf_posenc.kernels.tapa.triton_tapa)" if uses_triton(probe) else
                  "chunked PyTorch path (hf_posenc.kernels.tapa.chunked)" if probe.device.type == "cpu" else
                  "eager reference")
            out[label] = f"hf_posenc_tapa -> {op}"
        else:
            out[label] = "sdpa (torch.nn.functional.scaled_dot_product_attention)"
    return out


def device_record(config: TapaScaleConfig, tapa_runs_here: int) -> dict[str, Any]:
    """What ``results.json`` → ``device`` holds: the device and its name, the precision, the attention of every
    arm, and the Triton binaries this process launched (with how many TAPA runs it trained; cached runs launch
    nothing)."""
    import platform

    import torch

    train = config.base.train
    cuda = train.device == "cuda" and torch.cuda.is_available()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": "cuda" if cuda else "cpu",
            "name": torch.cuda.get_device_name(0) if cuda else (platform.processor() or platform.machine()),
            "training_precision": "bf16 autocast, fp32 weights" if train.bf16 else "fp32",
            "evaluation_precision": "fp32", "torch": torch.__version__, "triton": triton_version,
            "attention": attention_paths(config), "tapa_runs_trained_in_this_process": tapa_runs_here,
            "triton_tapa_binaries_in_this_process": triton_binaries()}


# -- compiling the TAPA kernels in the background ------------------------------------------------------------------
def warm_up(config: TapaScaleConfig, prepared: dict[str, Any], corpus: Corpus, work: Path, force: bool = False
            ) -> list[subprocess.Popen]:
    """Start, per TAPA arm with a run still to train, a background process that trains a 1-layer copy of the arm
    for :data:`WARM_UP_STEPS` steps and evaluates it at every length, through the same recipe code (batch, heads,
    head dim, θ, dtypes), so the Triton kernels it compiles have the keys the real runs ask for and land in
    Triton's on-disk cache while the RoPE runs train. Only on CUDA (``force``: on the CPU too, for tests); a failed
    warm-up costs nothing but its log (``work/warm-up/<arm>.log``)."""
    if not force and config.base.train.device != "cuda":
        return []
    arms = {k: v for k, v in config.arms().items() if k in config.tapa_arms}
    cells = arm_cells(config.base, arms, prepared, work, experiment=config.name)
    todo = [label for label in arms if any(c.cached() is None for c in cells if c.label == label)]
    if not todo:
        return []
    folder = work / "warm-up"
    folder.mkdir(parents=True, exist_ok=True)
    enough = (WARM_UP_STEPS + 1) * config.base.train.batch_size * config.base.context_length
    text = next(iter(corpus.train.values())).encode()[:enough].decode("utf-8", "ignore")  # its own small file
    (folder / "train.txt").write_text(text, encoding="utf-8")
    started = []
    for label in todo:
        job = {"size": config.base.size, "seeds": config.base.seeds, "first_seed": config.base.first_seed,
               "label": label, "output_dir": str(folder / slug(label)),
               "prepared": {"tokenizer_dir": prepared["tokenizer_dir"], "eos_id": prepared["eos_id"],
                            "eval_file": prepared["eval_file"], "train_files": [str(folder / "train.txt")]}}
        spec = folder / f"{slug(label)}.json"
        spec.write_text(json.dumps(job))
        log = open(folder / f"{slug(label)}.log", "w")  # noqa: SIM115 -- the child writes it after we return
        started.append(subprocess.Popen([sys.executable, "-m", __name__, "--warm-up", str(spec)], stdout=log,
                                        stderr=subprocess.STDOUT, env={**os.environ, "TQDM_DISABLE": "1"}))
        log.close()
    return started


def warm_up_recipe(job: dict[str, Any]) -> Any:
    """The recipe of one warm-up (:func:`warm_up`'s job): the arm's settings with 1 layer and a few steps."""
    config = TapaScaleConfig.preset(job["size"], seeds=job["seeds"], first_seed=job["first_seed"])
    spec, model, train = config.arms()[job["label"]]
    return build_recipe(config.base, job["prepared"], scheme=spec, seed=config.base.first_seed,
                        context_length=config.base.context_length, model=dataclasses.replace(model, num_layers=1),
                        train=dataclasses.replace(train, steps=WARM_UP_STEPS, warmup_steps=1),
                        output_dir=job["output_dir"])


def stop(processes: list[subprocess.Popen]) -> list[int | None]:
    """End the warm-ups still running (each by its own process); returns their exit statuses."""
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return [proc.returncode for proc in processes]


# -- analysis ------------------------------------------------------------------------------------------------------
def gap_values(summary: Summary, a: str, b: str, length: int) -> dict[int, float]:
    """Per seed, ``a − b`` at ``length`` (the seeds both rows trained)."""
    left, right = summary.values[a][length], summary.values[b][length]
    return {s: v - right[s] for s, v in left.items() if s in right}


def setting_line(config: TapaScaleConfig) -> str:
    """The model, the tokens and the rates, in one line."""
    m, t = config.base.model, config.base.train
    rates = ", ".join(f"{label} {(v.learning_rate or t.learning_rate):.3g}" for label, v in config.variants.items())
    return (f"Setting: {millions(parameter_count(m))} parameters ({m.num_layers} layers, d = {m.hidden_size}, "
            f"{m.num_heads} heads of {m.head_dim}), {t.steps:,} steps of {t.batch_size} windows of "
            f"{config.base.context_length} bytes ({millions(trained_bytes(config))} bytes a run); learning rates "
            f"{rates}.")


def verdict(summary: Summary, floors: dict[str, float], config: TapaScaleConfig, tests: Tests) -> list[str]:
    """The answer, each comparison with its test: RoPE against the bigram floor; per TAPA arm its difference from
    RoPE at L and at the longest length, its growth and RoPE's, its distance to the bigram floor; the TAPA arms
    against each other; what the design detects; the reading."""
    L, longest = config.base.context_length, summary.lengths[-1]
    k = longest // L
    bigram = floors["bigram"]
    lines = [tests_explained(summary), setting_line(config)]
    lines.append(f"RoPE at L = {L}: {summary.rows[REFERENCE][L][0]:.3f} nats/byte; " + tests.line([
        (f"RoPE - bigram floor ({bigram:.3f})", summary.diff(REFERENCE, bigram, L),
         "above the floor: this run does not show context use", "below the floor: the models use context"),
        (f"RoPE growth L -> {k}L", summary.diff(REFERENCE, REFERENCE, longest, other_length=L), "grows", "shrinks")])
        + ".")
    for arm in config.tapa_arms:
        row = summary.rows[arm]
        items = [(f"{arm} - RoPE at L", summary.diff(arm, REFERENCE, L), "higher loss than RoPE",
                  "lower loss than RoPE"),
                 (f"at {k}L", summary.diff(arm, REFERENCE, longest), "higher loss than RoPE", "lower loss than RoPE"),
                 (f"growth L -> {k}L", summary.diff(arm, arm, longest, other_length=L), "grows", "shrinks"),
                 ("- RoPE's growth", summary.growth_diff(arm, REFERENCE, L, longest), "grows more than RoPE",
                  "grows less than RoPE"),
                 ("- bigram floor at L", summary.diff(arm, bigram, L), "above the bigram floor",
                  "below the bigram floor")]
        lines.append(f"{arm}: {row[L][0]:.3f} at L -> {row[longest][0]:.3f} at {k}L; " + tests.line(items) + ".")
    arms = config.tapa_arms
    if len(arms) > 1:
        lines.append("TAPA against TAPA: " + tests.line([
            (f"{other} - {arms[0]} at L", summary.diff(other, arms[0], L), f"higher loss than {arms[0]}",
             f"lower loss than {arms[0]}") for other in arms[1:]]) + ".")
    lines.append(sensitivity_line(summary, config))
    lines.append(answer(summary, config))
    return lines


def sensitivity_line(summary: Summary, config: TapaScaleConfig) -> str:
    """What TAPA − RoPE at L can detect with these seeds, against the small models' gap."""
    L, arm = config.base.context_length, config.tapa_arms[0]
    d = summary.diff(arm, REFERENCE, L)
    if not d.finite:
        return "Sensitivity: one run per row, so no interval and nothing detectable; rerun with --seeds 3 or more."
    rope = summary.rows[REFERENCE][L][0]
    s = sensitivity(d, rope, min(SMALL_MODEL_GAPS.values()) / rope)
    reach = "within" if s["effect_detectable"] else "beyond"
    return (f"Sensitivity (n = {d.n} seeds): {arm} - RoPE at L has half-width {s['half_width']:.3f} nats/byte; the "
            f"smallest difference detected with {POWER:.0%} power is {s['detectable']:.3f}, so a gap of the 0.1M-"
            f"parameter models' size ({min(SMALL_MODEL_GAPS.values()):+.3f}) is {reach} this design's reach.")


def small_model_reading(d: Difference) -> str:
    """Where an interval of TAPA − RoPE lies against the small models' gaps (+0.409 at 2 layers, +0.465 at 4)."""
    low, high = min(SMALL_MODEL_GAPS.values()), max(SMALL_MODEL_GAPS.values())
    if d.high < low:
        return f"smaller than the 0.1M-parameter models' estimates, +{low:.3f} / +{high:.3f}"
    if d.low > high:
        return f"larger than the 0.1M-parameter models' estimates, +{low:.3f} / +{high:.3f}"
    return f"not distinguishable from the 0.1M-parameter models' estimates, +{low:.3f} / +{high:.3f}"


def answer(summary: Summary, config: TapaScaleConfig) -> str:
    """The reading of TAPA − RoPE at L for every TAPA arm: still above RoPE, not detectably different, or below;
    and against the small models' gap."""
    L = config.base.context_length
    found = {arm: summary.diff(arm, REFERENCE, L) for arm in config.tapa_arms}
    if not all(d.finite for d in found.values()):
        return "Answer: one run per row, so TAPA - RoPE has no test; rerun with --seeds 3 or more."
    parts = []
    for arm, d in found.items():
        state = ("detectably above RoPE" if d.detected and d.estimate > 0 else
                 "detectably below RoPE" if d.detected else "not detectably different from RoPE")
        parts.append(f"{arm} - RoPE is {d.interval()} ({state}; {small_model_reading(d)})")
    size = f"{millions(parameter_count(config.base.model))} parameters"
    if all(d.detected and d.estimate > 0 for d in found.values()):
        lead = f"at {size} TAPA still trains to a higher loss than RoPE inside L at both settings"
    elif any(d.detected and d.estimate < 0 for d in found.values()):
        lead = f"at {size} TAPA trains to a lower loss than RoPE inside L at some setting"
    else:
        lead = f"at {size} TAPA is not detectably worse than RoPE inside L at some setting"
    return (f"Answer: {lead}, after {config.base.train.steps:,} steps at a third of RoPE's rate: " + "; ".join(parts)
            + ".")


def paper_claims(summary: Summary, floors: dict[str, float], config: TapaScaleConfig, why: dict[str, Any],
                 tests: Tests) -> list[Claim]:
    """The TAPA paper's claims this experiment speaks to (and the position-generalization paper's diagnostics);
    where RoPE is not detectably below the bigram floor the models hardly use context and none can be tested."""
    L, longest = config.base.context_length, summary.lengths[-1]
    two = 2 * L if 2 * L in summary.lengths else longest
    size = (f"byte models of {millions(parameter_count(config.base.model))} parameters trained on "
            f"{millions(trained_bytes(config))} bytes, not the paper's 7B model trained on 420B tokens")
    out: list[Claim] = []
    found = {arm: summary.diff(arm, REFERENCE, L) for arm in config.tapa_arms}
    items = [(f"{arm} - RoPE at L", d, "higher loss than RoPE", "lower loss than RoPE") for arm, d in found.items()]
    text = tests.line(items)
    if all(d.detected and d.estimate > 0 for d in found.values()):
        status, reason = REFUTED, f"for this regime ({size}): every TAPA arm has a higher loss than RoPE: {text}"
    elif any(d.detected and d.estimate < 0 for d in found.values()):
        status, reason = CONFIRMED, f"for this regime ({size}): a TAPA arm has a lower loss than RoPE: {text}"
    else:
        status, reason = UNTESTABLE_SCALE, (f"{text}; no difference detected is not a match: "
                                            f"{undecided(list(found.values()))}")
    tuning = tapa_arms_tuning(config.arms(), L)
    out.append(Claim.judged("TAPA", "TAPA trains to RoPE's perplexity inside the training length (within a few "
                            "hundredths at 1k-8k; TAPA at 1/5 of RoPE's learning rate)", status, reason + ".", tuning))
    rope = summary.diff(REFERENCE, REFERENCE, two, other_length=L)
    k = two // L
    growth = [(f"RoPE growth L -> {k}L", rope, "grows", "shrinks")]
    if not (rope.finite and rope.detected and rope.estimate >= math.log(10)):
        status, reason = UNTESTABLE_SCALE, (
            f"RoPE does not collapse here (its perplexity grows x{math.exp(rope.estimate):.2f} from L to {k}L; the "
            "paper's goes from about 12 to 5.9e3 at 2x), so there is no failure to avoid: " + tests.line(growth))
    else:
        evidence = [(f"{arm} growth - RoPE's growth, L -> {k}L", summary.growth_diff(arm, REFERENCE, L, two),
                     "grows more than RoPE", "grows less than RoPE") for arm in config.tapa_arms]
        less = [d.detected and d.estimate < 0 for _, d, _, _ in evidence]
        more = [d.detected and d.estimate > 0 for _, d, _, _ in evidence]
        status = CONFIRMED if all(less) else REFUTED if any(more) else UNTESTABLE_SCALE
        reason = (f"RoPE's perplexity grows x{math.exp(rope.estimate):.1f} from L to {k}L here: "
                  + tests.line(growth + evidence))
    out.append(Claim.judged("TAPA", "without long-context fine-tuning TAPA degrades beyond the training length, but "
                            "far less than RoPE (perplexity 17.96 vs about 5.9e3 at 2x the training length)", status,
                            reason + ".", tuning))
    out = unless_context_is_used(out, summary.diff(REFERENCE, floors["bigram"], L), "no positional encoding")
    if why:
        out.append(han_ji_claim(why, f"byte models of {millions(parameter_count(config.base.model))} parameters"))
    return out


def analyse(payload: dict[str, Any], config: TapaScaleConfig) -> dict[str, Any]:
    """The analysis fields of ``results.json`` from its runs (``verdict``, ``comparisons``, ``claims``)."""
    summary = Summary.from_results(payload["runs"], config.base.eval_lengths)
    tests = Tests()
    return analysis(tests, verdict(summary, payload["floors"], config, tests),
                    paper_claims(summary, payload["floors"], config, payload.get("why") or {}, tests))


# -- report --------------------------------------------------------------------------------------------------------
def gap_table(summary: Summary, config: TapaScaleConfig) -> list[str]:
    """Each TAPA arm minus RoPE (and the TAPA arms against each other) at every length, paired by seed."""
    names, lengths = config.base.length_names, summary.lengths
    lines = ["| difference (paired by seed) | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    arms = config.tapa_arms
    pairs = [(arm, REFERENCE) for arm in arms] + [(other, arms[0]) for other in arms[1:]]
    for a, b in pairs:
        cells = [compare(gap_values(summary, a, b, n), 0.0).interval() for n in lengths]
        lines.append(f"| {a} - {b} | " + " | ".join(cells) + " |")
    return lines


def device_lines(payload: dict[str, Any]) -> list[str]:
    """The device section: what ran where (``results.json`` → ``device``)."""
    found = payload.get("device")
    if not found:
        return ["Device: not recorded.", ""]
    binaries = found.get("triton_tapa_binaries_in_this_process")
    shown = "not readable" if binaries is None else ", ".join(f"{k} {v}" for k, v in binaries.items()) or "none"
    return [f"Device: {found['device']} ({found['name']}); training {found['training_precision']}, evaluation "
            f"{found['evaluation_precision']}; torch {found['torch']}, Triton {found['triton']}. Attention per arm:",
            "", *[f"- {label}: {path}" for label, path in found["attention"].items()], "",
            f"TAPA runs trained in this process: {found['tapa_runs_trained_in_this_process']}; Triton TAPA binaries it "
            f"launched: {shown}.", ""]


def render(payload: dict[str, Any], config: TapaScaleConfig) -> str:
    """``results.md`` from ``results.json``."""
    summary = Summary.from_results(payload["runs"], config.base.eval_lengths)
    t = config.base.train
    arms = [f"- {name}: `{v.spec}`, learning rate {(v.learning_rate or t.learning_rate):.3g}"
            for name, v in config.variants.items()]
    optimiser = (f"AdamW (β2 = {t.adam_beta2:g}, weight decay {t.weight_decay:g}), linear warm-up over "
                 f"{t.warmup_steps} steps then cosine decay to {t.min_lr_ratio:g} × the peak, as in the TAPA paper"
                 if hasattr(t, "adam_beta2") else "AdamW")
    notes = [f"{setting_line(config)} Optimisation: {optimiser}.", "",
             "Arms (scheme spec and learning rate):", "", *arms, "",
             *device_lines(payload),
             "TAPA minus RoPE at every length, each a paired-by-seed 95 % interval. The 0.1M-parameter models of "
             f"tapa-depth had +{SMALL_MODEL_GAPS[2]:.3f} at 2 layers and +{SMALL_MODEL_GAPS[4]:.3f} at 4 (TAPA θ = "
             "0.75 at lr 1e-3, RoPE at 3e-3, L = 64, 1,500 steps of 16 windows): set against those estimates, the "
             "reading above is a description across two designs, not a test.", "",
             *gap_table(summary, config), "",
             "![TAPA minus RoPE by length](gap_by_length.png)", "",
             "The s / run column is the measured wall time of a run (training and evaluation) on a GPU shared with "
             "other work.", ""]
    title = f"TAPA at {millions(parameter_count(config.base.model))} parameters ({config.base.size})"
    return render_from_scratch(payload, config.base, title=title,
                               notes=notes)


def plot(config: TapaScaleConfig) -> Any:
    """The plots: held-out loss against evaluation length per arm, and TAPA − RoPE per seed at every length."""
    L = config.base.context_length

    def draw(summary: Summary, floors: dict[str, float], out: Path) -> None:
        title = (f"Trained at L = {L} bytes, {config.base.train.steps:,} steps ({config.base.size}, "
                 f"{config.base.seeds} seeds)")
        plot_summary(summary, out / "heldout_loss.png", title, floors, L)
        names = dict(zip(summary.lengths, config.base.length_names))
        plot_settings({f"{arm} - RoPE": {names[n]: gap_values(summary, arm, REFERENCE, n) for n in summary.lengths}
                       for arm in config.tapa_arms}, out / "gap_by_length.png", title, "evaluation length",
                      ylabel="held-out loss minus RoPE's, same seed (nats / byte)", zero_line=True)

    return draw


def run(config: TapaScaleConfig, out: str | Path, work: str | Path, command: str, corpus: Corpus | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the experiment; writes ``results.json`` (with ``device``), ``results.md``,
    ``heldout_loss.png`` and ``gap_by_length.png`` to ``out`` and returns the JSON payload."""
    check_device(config)
    out, work = Path(out), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = austen_corpus() if corpus is None else corpus
    prepared = prepare(config.base, corpus, work)
    tapa = [c for c in arm_cells(config.base, config.arms(), prepared, work, experiment=config.name)
            if c.label in config.tapa_arms and c.cached() is None]
    workers = warm_up(config, prepared, corpus, work)
    try:
        payload = run_from_scratch(config.base, config.arms(), out, work, command, corpus=corpus, progress=progress,
                                   experiment=config.name, experiment_config=config.to_dict(), config_object=config,
                                   plot=plot(config))
    finally:
        stop(workers)
    payload["device"] = device_record(config, len(tapa))
    return publish(out, payload, config)


def _warm_up_main(spec: str) -> int:
    """One warm-up (:func:`warm_up`), in its own process."""
    from hf_posenc.training.trainer import run_training

    run_training(warm_up_recipe(json.loads(Path(spec).read_text())))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--warm-up":
        sys.exit(_warm_up_main(sys.argv[2]))
    sys.exit(f"usage: python -m {__name__} --warm-up JOB.json (started by tapa_scale.warm_up)")
