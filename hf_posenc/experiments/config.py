"""Typed configurations of the miniature experiments, with a preset per size (``toy`` for the CI smoke test,
``small`` for the committed results).

Every knob that changes a number in a report lives here and is written into the report's JSON, so a result can be
traced to its settings; the presets are the only values the command line selects (``--size``), apart from the
number of seeds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Size = Literal["toy", "small"]
SIZES: tuple[str, ...] = ("toy", "small")

# label -> scheme spec (see hf_posenc.schemes.spec); NoPE is p-RoPE with p = 0 (no rotated frequency at all)
LENGTH_GENERALISATION_SCHEMES: dict[str, str] = {
    "RoPE": "rope",
    "NoPE": "prope:p=0",
    "CoPE": "cope",
    "HardClip": "hardclip",
    "p-RoPE 0.25": "prope:p=0.25",
    "p-RoPE 0.75": "prope:p=0.75",
    "TAPA quadratic": "tapa:phase=quadratic",
    "TAPA linear": "tapa:phase=linear",
}


@dataclass(frozen=True)
class ModelSettings:
    """A Llama-style decoder trained from scratch (byte vocabulary, tied embeddings, no GQA).

    Attributes:
        hidden_size: model width d.
        intermediate_size: SwiGLU MLP width.
        num_layers: decoder layers.
        num_heads: attention heads; ``hidden_size = num_heads * head_dim``.
        head_dim: per-head width (TAPA splits it into amplitude and phase halves at θ = 0.5).
        rope_theta: RoPE base θ of the frequency schemes.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ValueError(f"num_heads * head_dim must equal hidden_size, got {self.num_heads} * {self.head_dim} "
                             f"!= {self.hidden_size}")

    def llama_config(self, vocab_size: int, eos_id: int, max_positions: int) -> dict[str, Any]:
        """The inline ``model.config`` of a training recipe."""
        return {
            "model_type": "llama", "vocab_size": vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_heads, "head_dim": self.head_dim,
            "max_position_embeddings": max_positions, "tie_word_embeddings": True, "bos_token_id": eos_id,
            "eos_token_id": eos_id, "rope_theta": self.rope_theta,
        }


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation of every run (AdamW, cosine schedule after a linear warm-up, batch of packed windows).

    Attributes:
        steps: optimizer steps.
        batch_size: windows per step.
        learning_rate: peak learning rate.
        warmup_steps: linear warm-up steps.
        weight_decay: AdamW weight decay.
    """

    steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float = 0.01


@dataclass(frozen=True)
class LengthGeneralisationConfig:
    """Length generalisation from scratch (TAPA, p-RoPE and CoPE papers): one model per scheme and seed trained
    at ``context_length`` tokens, evaluated by held-out perplexity at each of ``eval_multiples`` × L.

    Attributes:
        size: the preset's name.
        context_length: training length L (bytes).
        eval_multiples: evaluation lengths as multiples of L.
        eval_tokens: held-out bytes scored at every length (disjoint windows, so every position 0…n−1 is scored).
        train_chars: characters kept from the start of each training novel (``None``: all of them).
        model: the decoder.
        train: the optimisation.
        schemes: report label -> scheme spec.
        seeds: how many seeds (0, 1, …) per scheme.
    """

    size: str
    context_length: int
    eval_multiples: tuple[int, ...]
    eval_tokens: int
    train_chars: int | None
    model: ModelSettings
    train: TrainSettings
    schemes: dict[str, str] = field(default_factory=lambda: dict(LENGTH_GENERALISATION_SCHEMES))
    seeds: int = 3

    name = "length_generalisation"

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        longest = self.context_length * max(self.eval_multiples)
        if self.eval_tokens < longest:
            raise ValueError(f"eval_tokens={self.eval_tokens} must be at least the longest evaluation length "
                             f"{longest} (= {max(self.eval_multiples)} x L)")

    @property
    def eval_lengths(self) -> list[int]:
        return [self.context_length * m for m in self.eval_multiples]

    @classmethod
    def preset(cls, size: str, seeds: int = 3) -> LengthGeneralisationConfig:
        """``toy``: seconds per run, for the CI smoke test; ``small``: the committed experiment (about 11 min with
        3 seeds on 2 idle CPU cores)."""
        if size == "toy":
            return cls(size="toy", context_length=16, eval_multiples=(1, 2, 4, 8), eval_tokens=1024,
                       train_chars=4096, model=ModelSettings(32, 64, 1, 2, 16),
                       train=TrainSettings(steps=3, batch_size=4, learning_rate=3e-3, warmup_steps=1), seeds=seeds)
        if size == "small":
            return cls(size="small", context_length=64, eval_multiples=(1, 2, 4, 8), eval_tokens=16384,
                       train_chars=None, model=ModelSettings(64, 192, 2, 2, 32),
                       train=TrainSettings(steps=1000, batch_size=16, learning_rate=3e-3, warmup_steps=50),
                       seeds=seeds)
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.name, **dataclasses.asdict(self)}
