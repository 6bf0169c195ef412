"""TAPA's options (``tapa-token-aware-phase-attention.md`` §3, eq. 12 and the §4.5 linear ablation, eq. 16)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ...upstream import supports_attention_backend
from ..base import SchemeConfig, check_type

ATTN_NAME = "hf_posenc_tapa"


@dataclass(frozen=True)
class TAPAConfig(SchemeConfig):
    """Options of TAPA.

    Attributes:
        alpha: distance exponent α > 0 in |m − n|^α (default 0.1, the paper's).
        theta: fraction θ of each head's dims used for the amplitude (default 0.5); θD and (1−θ)D must be
            positive integers.
        phase: ``"quadratic"`` (eq. 12) or ``"linear"`` (§4.5 ablation, eq. 16).
        backend: ``"auto"`` (Triton kernel on CUDA or under TRITON_INTERPRET=1, the chunked O(N)-memory path on
            CPU, else the reference), ``"triton"``, ``"chunked"`` or ``"reference"``.
        layers: TAPA replaces attention in every layer, so this must stay ``"all"``.
    """

    name: ClassVar[str] = "tapa"
    paper: ClassVar[str] = "Token-Aware Phase Attention (tapa-token-aware-phase-attention, eq. 12)"
    attn_implementation: ClassVar[str | None] = ATTN_NAME
    computes_attention: ClassVar[bool] = True
    whole_head: ClassVar[bool] = True  # θ splits each whole head into amplitude and phase dims (eq. 12)
    separates_packed_documents: ClassVar[bool] = True  # segments from the position ids (tapa_attend)
    selftest: ClassVar[str | None] = "hf_posenc.kernels.tapa.selftest"
    layers: Literal["global", "all"] = "all"
    alpha: float = 0.1
    theta: float = 0.5
    phase: str = "quadratic"
    backend: str = "auto"

    def __post_init__(self) -> None:
        from ...kernels.tapa.args import PHASES
        from ...kernels.tapa.dispatch import BACKENDS

        super().__post_init__()
        check_type(self.name, "alpha", self.alpha, (int, float))
        check_type(self.name, "theta", self.theta, (int, float))
        check_type(self.name, "phase", self.phase, (str,))
        check_type(self.name, "backend", self.backend, (str,))
        if self.layers != "all":
            raise ValueError("tapa: TAPA replaces attention in every layer; layers must be 'all'.")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"tapa: alpha must be a finite number > 0 (paper: 0.1), got {self.alpha}.")
        if not 0 < self.theta < 1:
            raise ValueError(f"tapa: theta must be in (0, 1) (paper: 0.5), got {self.theta}.")
        if self.phase not in PHASES:
            raise ValueError(f"tapa: phase must be one of {PHASES} (eq. 12 / eq. 16), got {self.phase!r}.")
        if self.backend not in BACKENDS:
            raise ValueError(f"tapa: backend must be one of {BACKENDS}, got {self.backend!r}.")

    def model_refusal(self, model: Any) -> str | None:
        """TAPA is an ``AttentionInterface`` function: the model must compute attention through Transformers'
        attention interface, and soft-capping (Gemma2) has no meaning for TAPA's scores."""
        if not supports_attention_backend(type(model)):
            return "its attention does not go through Transformers' attention interface, which TAPA replaces"
        if getattr(model.config, "attn_logit_softcapping", None) is not None:
            return ("attention-logit soft-capping does not apply to TAPA scores; set config.attn_logit_softcapping = "
                    "None before patching")
        return super().model_refusal(model)

    @classmethod
    def context_parallel_refusal(cls) -> str | None:
        """A ring pass over SDPA would have to carry K/V with their positions and apply eq. 12's phase per block."""
        return ("TAPA computes its own attention (amplitude × cos(2π|m−n|^α·phase), eq. 12), which PyTorch's "
                "context parallelism (ring attention over SDPA) cannot shard; it would need a ring pass of K/V "
                "with their positions")

    def check_model(self, head_dim: int) -> None:
        from ...kernels.tapa.args import tapa_split

        tapa_split(head_dim, self.theta)

    # a start in the paper's phase regime for a model trained from scratch (the recipe's ``scheme.init``)
    scratch_init_options: ClassVar[tuple[str, ...]] = ("phase_at_distance_1",)

    def check_scratch_init(self, options: dict[str, Any]) -> None:
        super().check_scratch_init(options)
        target = options.get("phase_at_distance_1")
        if "phase_at_distance_1" in options and not (
                isinstance(target, (int, float)) and not isinstance(target, bool) and math.isfinite(target)
                and target > 0):
            raise ValueError(f"tapa: scheme.init phase_at_distance_1 must be a number of radians > 0 (the median "
                             f"phase at distance 1 at init; a few radians is the paper's regime), got {target!r}.")

    def initialise_from_scratch(self, model: Any, **options: Any) -> dict[str, Any]:
        """``phase_at_distance_1=R``: fold a scale into the phase half of every layer's query and key projections
        so that the median phase at distance 1 at init (eq. 12 at |m − n| = 1, unit-variance inputs) is R radians
        (:func:`.phase.start_phase_regime`); returns ``{"phase_at_distance_1": {"target", "before", "after"}}``."""
        from ...kernels.tapa.args import tapa_split
        from .phase import start_phase_regime

        self.check_scratch_init(options)
        if "phase_at_distance_1" not in options:
            return {}
        text = model.config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        amp_dims, _ = tapa_split(head_dim, self.theta)
        return {"phase_at_distance_1": start_phase_regime(model, options["phase_at_distance_1"], amp_dims,
                                                          self.phase)}

    def rope_parameters(self, model_params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> dict:
        """No rotation. ``head_dim``: the rotated dimensions; a partial-rotary model keeps its rotated width (zero
        frequencies on its rotated pairs), since ``proportional`` would widen the rotation to the whole head."""
        if model_params.get("partial_rotary_factor", 1.0) != 1.0:
            from ..prope import rotated_pairs_kept

            return rotated_pairs_kept({**model_params, "rope_type": "default"}, head_dim, 0)
        return {"rope_type": "proportional", "rope_theta": model_params["rope_theta"], "partial_rotary_factor": 0.0}
