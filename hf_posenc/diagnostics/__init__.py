"""Diagnostics: the papers' analyses of how a model uses its positional encoding, as tools.

Each analysis returns a result dataclass (``to_dict``/``to_json``/``save_json``) and has a ``plot_*`` function
(matplotlib, Agg backend) that accepts one result or a ``{name: result}`` mapping to compare models side by side.

* :func:`frequency_usage` — mean 2-norm of RoPE chunks of q/k (v as control), Barbero et al. §4 Fig. 3–4.
* :func:`positional_heads` — diagonal / previous-token heads and high-frequency use, Barbero et al. §5.
* :func:`disentanglement` — W′(d, j) ≈ a_d + b_j (eq. 3–4) and the 3-axis fit (eq. 2), position-generalization §3.
* :func:`distance_bias` — Attn(short) − Attn(long) histogram, TAPA Appendix I.
* :func:`semantic_decay` — 2σ²Σcos(Δt·θ_i) and its empirical gap, CoPE Theorem 3.2 eq. 6; with
  :func:`clipping_comparison`, RoPE vs HardClip vs CoPE on the same frequencies (the ringing of Thm 4.1, Fig. 4).
* :func:`perturbation_tolerance` — perplexity under token transposition / position offsets, position-generalization §4.1.
* :func:`phase_regime` — TAPA's phase at distance 1 (eq. 12) per layer and head: its cold or hot regime.
"""

from .capture import QKVCapture, capture_window, layer_frequencies
from .disentanglement import (
    DisentanglementResult, additive_correlation, additive_fit, disentanglement, plot_disentanglement,
    three_axis_correlation, three_axis_fit,
)
from .distance_bias import DistanceBiasResult, distance_bias, plot_distance_bias, scaled_ranges
from .frequency_usage import FrequencyUsageResult, frequency_usage, plot_frequency_usage
from .perturbation import PerturbationResult, perplexity, perturbation_tolerance, plot_perturbation
from .phase_regime import PhaseRegimeResult, phase_regime, plot_phase_regime
from .positional_heads import PositionalHead, PositionalHeadsResult, plot_positional_heads, positional_heads, score_attention_maps
from .semantic_decay import (
    ClippingComparison, SemanticDecayResult, clipped_frequency_sets, clipping_comparison, closed_form_gap,
    empirical_gap, model_frequency_sets, plot_semantic_decay, ringing_index, semantic_decay, smoothed_closed_form_gap,
)
from .summary import summary_lines, write_summary

__all__ = [
    "QKVCapture", "capture_window", "layer_frequencies",
    "FrequencyUsageResult", "frequency_usage", "plot_frequency_usage",
    "PositionalHead", "PositionalHeadsResult", "positional_heads", "score_attention_maps", "plot_positional_heads",
    "DisentanglementResult", "disentanglement", "additive_fit", "additive_correlation", "three_axis_fit",
    "three_axis_correlation", "plot_disentanglement",
    "DistanceBiasResult", "distance_bias", "scaled_ranges", "plot_distance_bias",
    "SemanticDecayResult", "semantic_decay", "closed_form_gap", "empirical_gap", "ringing_index",
    "model_frequency_sets", "plot_semantic_decay", "smoothed_closed_form_gap", "clipped_frequency_sets",
    "clipping_comparison", "ClippingComparison",
    "summary_lines", "write_summary",
    "PerturbationResult", "perturbation_tolerance", "perplexity", "plot_perturbation",
    "PhaseRegimeResult", "phase_regime", "plot_phase_regime",
]
