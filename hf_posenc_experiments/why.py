"""The "why" beside the "what": the position-generalization paper's diagnostics on an experiment's trained models.

For the first seed of every arm: tolerance to position perturbations (§4.1: a fraction of tokens transposed
with a later one, or their position ids moved, within a maximum distance) at the length the model was trained
at, and the disentanglement law of its attention logits (§3, eq. 2–4) for the schemes that rotate q and k
(RoPE, CoPE, HardClip, p-RoPE, including NoPE as p = 0); TAPA and TAPE compute attention another way, so that
fit does not apply to them and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

ROTARY_SCHEMES = ("rope", "cope", "hardclip", "prope")
FRACTIONS = (0.05, 0.2)
TRIALS = 2


def diagnose(models: Mapping[str, str], input_ids: Sequence[int], window: int, out: str | Path,
             progress: bool = True) -> dict[str, Any]:
    """Run the diagnostics on ``models`` (label -> saved model directory) with ``input_ids`` (held-out text) in
    windows of ``window`` tokens; writes ``perturbation.png`` and ``disentanglement.png`` to ``out`` and returns
    ``{label: {"scheme", "perturbation", "disentanglement" (or None), "note"}}``."""
    import hf_posenc  # noqa: F401  (registers the patched model types)
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from hf_posenc.diagnostics import disentanglement, perturbation_tolerance, plot_disentanglement, plot_perturbation
    from hf_posenc.patching import scheme_record

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.tensor([list(input_ids)])
    distances = (max(2, window // 16), max(3, window // 4))
    perturbations, fits, summary = {}, {}, {}
    hf_logging.disable_progress_bar()
    try:
        for label, path in tqdm(models.items(), desc="diagnostics", disable=not progress):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            record = scheme_record(model.config)
            scheme = "rope" if record is None else record.scheme.name
            perturbations[label] = perturbation_tolerance(model, ids, fractions=FRACTIONS, max_distances=distances,
                                                          trials=TRIALS, window=window, name=label, progress=False)
            entry: dict[str, Any] = {"scheme": scheme, "perturbation": perturbations[label].to_dict()}
            if scheme == "tapa":
                entry["tapa_phase"] = tapa_phase_scale(model, ids[:, :window], record.scheme)
            if scheme in ROTARY_SCHEMES:
                fits[label] = disentanglement(model, ids, length=min(window, 128), name=label)
                entry["disentanglement"] = fits[label].to_dict()
            else:
                entry["disentanglement"] = None
                entry["note"] = f"{scheme}: attention is not a rotation of q and k, so the disentanglement fit does " \
                                "not apply"
            summary[label] = entry
    finally:
        hf_logging.enable_progress_bar()
    plot_perturbation(perturbations, out / "perturbation.png")
    if fits:
        plot_disentanglement(fits, out / "disentanglement.png")
    return summary


def tapa_phase_scale(model: Any, input_ids: torch.Tensor, scheme: Any) -> dict[str, float]:
    """How far TAPA's learned phases can tell nearby positions apart (eq. 12 / eq. 16).

    For every layer, head and adjacent pair (query i, key i−1) of one window: the phase φ (q_P·k_P/√((1−θ)D), or
    the linear phase's (Σq_P + Σk_P)/√((1−θ)D)), its size at distance 1, 2π|φ| (radians), and how much the cosine's
    argument changes between distances 1 and 2 for the same φ, 2π(2^α − 1)|φ|: well below π/2 the score barely
    changes from one token back to two, so the head cannot single out the previous token (what RoPE's highest
    frequencies do). Returns the medians over all pairs and the largest per-head median.
    """
    from hf_posenc.diagnostics import capture_window
    from hf_posenc.kernels.tapa.args import tapa_split
    from hf_posenc.schemes.tapa.phase import phase_pairs

    captured = capture_window(model, input_ids, None, None, kinds=("q", "k"))
    amp, _ = tapa_split(captured[0]["q"].shape[-1], scheme.theta)
    per_head = [phases[0] for _, phases in phase_pairs(captured, amp, scheme.phase)]  # [H, S-1] per layer
    phases = torch.cat(per_head)  # [layers * H, S-1]
    step = 2.0 ** scheme.alpha - 1.0
    return {"median_phase_rad": float(phases.median()), "median_change_d1_to_d2_rad": float(phases.median() * step),
            "largest_head_median_change_rad": float(phases.median(dim=-1).values.max() * step),
            "alpha": float(scheme.alpha)}


def why_table(summary: Mapping[str, dict[str, Any]]) -> str:
    """Markdown: per model, the baseline perplexity, the perplexity with the largest perturbation of each mode,
    and the disentanglement correlations."""
    first = next(iter(summary.values()))["perturbation"]
    frac = max(p["fraction"] for p in first["points"])
    dist = max(p["max_distance"] for p in first["points"])
    head = ["model", f"ppl (window {first['window']})", f"transposed ({frac:g} of tokens, ≤ {dist} apart)",
            f"position ids moved ({frac:g}, ≤ {dist})", "fake-distance fit corr.", "3-axis fit corr.",
            "TAPA phase at d = 1 / its change d = 1→2 (rad, median; largest head)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, entry in summary.items():
        p = entry["perturbation"]
        at = {pt["mode"]: pt["perplexity"] for pt in p["points"] if pt["fraction"] == frac and pt["max_distance"] == dist}
        d = entry["disentanglement"]
        fits = ["n/a", "n/a"] if d is None else [f"{d['mean_fake_distance_correlation']:.3f}",
                                                 f"{d['mean_three_axis_correlation']:.3f}"]
        t = entry.get("tapa_phase")
        phase = "" if t is None else (f"{t['median_phase_rad']:.2f} / {t['median_change_d1_to_d2_rad']:.3f}; "
                                      f"{t['largest_head_median_change_rad']:.3f}")
        lines.append(f"| {label} | {p['baseline_perplexity']:.3f} | {at['transpose']:.3f} | "
                     f"{at['position_offset']:.3f} | " + " | ".join(fits) + f" | {phase} |")
    return "\n".join(lines)


def why_section(summary: Mapping[str, dict[str, Any]], window: int) -> list[str]:
    """The Markdown lines of the diagnostics section of an experiment report (files under ``diagnostics/``)."""
    return [
        "## Why: position perturbation and disentanglement (first seed of each row)",
        "",
        f"Position-generalization paper §4.1 and §3, on the held-out text in windows of {window} bytes: perplexity "
        "when a fraction of the bytes is transposed with a later one or has its position id moved (largest setting "
        "shown; every setting in `results.json` → `why` and `diagnostics/perturbation.png`), and the mean "
        "correlation of the disentanglement fits of the attention logits (`diagnostics/disentanglement.png`).",
        "",
        why_table(summary),
        "",
    ]
