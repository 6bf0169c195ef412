"""Typed configurations of the miniature experiments, with a preset per size (``toy`` for the CI smoke test,
``small`` for the committed results).

Every knob that changes a number in a report lives here and is written into the report's JSON, so a result can be
traced to its settings; the presets are the only values the command line selects (``--size``), apart from the
number of seeds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hf_posenc_cli.arguments import EXPERIMENT_SIZES as SIZES

from ..schemes.spec import parse_scheme_spec


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
        initializer_range: standard deviation of the initial weights (Llama's ``initializer_range``); it sets the
            initial scale of q and k, hence TAPA's initial phase.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

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
            "eos_token_id": eos_id, "rope_theta": self.rope_theta, "initializer_range": self.initializer_range,
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


@dataclass(frozen=True, kw_only=True)
class ExperimentSettings:
    """What every miniature experiment has: the lengths, the held-out evaluation, the model and the seeds.

    Attributes:
        size: the preset's name.
        context_length: the (pre)training length L (bytes).
        eval_multiples: evaluation lengths as multiples of L.
        eval_tokens: held-out bytes scored at every length (disjoint windows, so every position 0…n−1 is scored).
        train_chars: characters kept from the start of each training novel (``None``: all of them).
        model: the decoder.
        seeds: how many seeds per row.
        first_seed: the first seed (``first_seed, first_seed + 1, …``); another value reruns the experiment with
            other seeds, to check that its means reproduce.
        diagnostic_tokens: held-out bytes the diagnostics (:mod:`.why`) read, from the start of the evaluation text.
    """

    size: str
    context_length: int
    eval_multiples: tuple[int, ...]
    eval_tokens: int
    train_chars: int | None
    model: ModelSettings
    seeds: int = 3
    first_seed: int = 0
    diagnostic_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if self.first_seed < 0:
            raise ValueError(f"first_seed must be >= 0, got {self.first_seed}")
        for spec in self.scheme_specs():
            parse_scheme_spec(spec)  # an unknown scheme or option fails here, before any training
        longest = self.context_length * max(self.eval_multiples)
        if self.eval_tokens < longest:
            raise ValueError(f"eval_tokens={self.eval_tokens} must be at least the longest evaluation length "
                             f"{longest} (= {max(self.eval_multiples)} x L)")

    @property
    def eval_lengths(self) -> list[int]:
        return [self.context_length * m for m in self.eval_multiples]

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    @property
    def length_names(self) -> list[str]:
        """Column names of the evaluation lengths: ``L = 64``, ``2L = 128``, …"""
        return [f"{m}L = {m * self.context_length}" if m > 1 else f"L = {self.context_length}"
                for m in self.eval_multiples]

    name = "experiment"

    def scheme_specs(self) -> list[str]:
        """The scheme specs this experiment trains (checked when the settings are built)."""
        return list(getattr(self, "schemes", {}).values())

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.name, **dataclasses.asdict(self)}


@dataclass(frozen=True, kw_only=True)
class LengthGeneralisationConfig(ExperimentSettings):
    """Length generalisation from scratch (TAPA, p-RoPE and CoPE papers): one model per scheme and seed trained
    at ``context_length`` tokens, evaluated by held-out perplexity at each of ``eval_multiples`` × L (the shared
    settings: :class:`ExperimentSettings`).

    Attributes:
        train: the optimisation.
        schemes: report label -> scheme spec.
    """

    train: TrainSettings
    schemes: dict[str, str] = field(default_factory=lambda: dict(LENGTH_GENERALISATION_SCHEMES))

    name = "length_generalisation"

    @classmethod
    def preset(cls, size: str, seeds: int = 3, first_seed: int = 0) -> LengthGeneralisationConfig:
        """``toy``: seconds per run, for the CI smoke test; ``small``: the committed experiment (about 11 min with
        3 seeds on 2 idle CPU cores)."""
        if size == "toy":
            return cls(size="toy", context_length=16, eval_multiples=(1, 2, 4, 8), eval_tokens=1024,
                       train_chars=4096, model=ModelSettings(32, 64, 1, 2, 16),
                       train=TrainSettings(steps=3, batch_size=4, learning_rate=3e-3, warmup_steps=1), seeds=seeds,
                       first_seed=first_seed)
        if size == "small":
            return cls(size="small", context_length=64, eval_multiples=(1, 2, 4, 8), eval_tokens=16384,
                       train_chars=None, model=ModelSettings(64, 192, 2, 2, 32),
                       train=TrainSettings(steps=1000, batch_size=16, learning_rate=3e-3, warmup_steps=50),
                       seeds=seeds, first_seed=first_seed)
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")


@dataclass(frozen=True)
class Variant:
    """One arm of a sweep: a scheme spec and the settings it changes from the experiment's defaults.

    Attributes:
        spec: scheme spec (``tapa:alpha=0.5``).
        learning_rate: peak learning rate (``None``: the experiment's).
        warmup_steps: linear warm-up steps (``None``: the experiment's).
        initializer_range: initial weight standard deviation (``None``: the experiment's).
    """

    spec: str
    learning_rate: float | None = None
    warmup_steps: int | None = None
    initializer_range: float | None = None

    def __post_init__(self) -> None:
        parse_scheme_spec(self.spec)  # an unknown scheme or option fails here, before any training
        for name in ("learning_rate", "initializer_range"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Variant {self.spec!r}: {name} must be > 0, got {value}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"Variant {self.spec!r}: warmup_steps must be >= 0, got {self.warmup_steps}")

    def apply(self, model: ModelSettings, train: TrainSettings) -> tuple[ModelSettings, TrainSettings]:
        """The model and optimisation settings of this arm."""
        if self.initializer_range is not None:
            model = dataclasses.replace(model, initializer_range=self.initializer_range)
        changes = {k: v for k, v in (("learning_rate", self.learning_rate), ("warmup_steps", self.warmup_steps))
                   if v is not None}
        return model, dataclasses.replace(train, **changes)


# The TAPA sweep: the paper's setting (α 0.1, θ 0.5, quadratic phase), then one knob at a time. RoPE and NoPE are
# the references, trained with the experiment's defaults. Initial weight std 0.02 / 0.05 / 0.1 puts TAPA's initial
# phase 2π|m−n|^α·q_P·k_P/√((1−θ)D) at about 0.15 / 1 / 4 rad (d = 64): the last is the regime of QK-norm models.
TAPA_VARIANTS: dict[str, Variant] = {
    "RoPE": Variant("rope"),
    "NoPE": Variant("prope:p=0"),
    "TAPA paper": Variant("tapa"),
    "TAPA alpha=0.5": Variant("tapa:alpha=0.5"),
    "TAPA alpha=1": Variant("tapa:alpha=1.0"),
    "TAPA theta=0.25": Variant("tapa:theta=0.25"),
    "TAPA theta=0.75": Variant("tapa:theta=0.75"),
    "TAPA linear phase": Variant("tapa:phase=linear"),
    "TAPA lr=1e-3": Variant("tapa", learning_rate=1e-3),
    "TAPA lr=1e-2": Variant("tapa", learning_rate=1e-2),
    "TAPA warm-up=200": Variant("tapa", warmup_steps=200),
    "TAPA init=0.05": Variant("tapa", initializer_range=0.05),
    "TAPA init=0.1": Variant("tapa", initializer_range=0.1),
    # second round, after the first: the lower learning rate was TAPA's best single change (the paper, too, trains
    # TAPA at 1/5 of RoPE's rate); is lower still better, does θ = 0.75 add to it, and what does RoPE do at 1e-3?
    "TAPA lr=3e-4": Variant("tapa", learning_rate=3e-4),
    "TAPA lr=1e-3 theta=0.75": Variant("tapa:theta=0.75", learning_rate=1e-3),
    "RoPE lr=1e-3": Variant("rope", learning_rate=1e-3),
}


@dataclass(frozen=True)
class TapaTrainabilityConfig:
    """Is TAPA trainable (issue: two small runs disagree)? The length-generalisation experiment's data, model and
    optimisation, with TAPA's α, θ, phase, learning rate, warm-up and initial weight scale swept one at a time
    against RoPE and NoPE.

    Attributes:
        base: the length-generalisation settings every arm starts from (same size preset).
        variants: report label -> arm.
    """

    base: LengthGeneralisationConfig
    variants: dict[str, Variant] = field(default_factory=lambda: dict(TAPA_VARIANTS))

    name = "tapa_trainability"

    @classmethod
    def preset(cls, size: str, seeds: int = 3, first_seed: int = 0) -> TapaTrainabilityConfig:
        """The sweep on the length-generalisation preset of the same size (``small``: about 25 min, 3 seeds)."""
        return cls(base=LengthGeneralisationConfig.preset(size, seeds=seeds, first_seed=first_seed))

    def arms(self) -> dict[str, tuple[str, ModelSettings, TrainSettings]]:
        """label -> (scheme spec, model settings, optimisation settings)."""
        return {label: (v.spec, *v.apply(self.base.model, self.base.train)) for label, v in self.variants.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.name, **dataclasses.asdict(self)}


# label -> scheme spec of the continued training at 4L (factor 4 where a scheme takes one; ABF raises θ 100x)
CONTEXT_EXTENSION_SCHEMES: dict[str, str] = {
    "RoPE": "rope",
    "RoPE + ABF": "rope:rope_theta=1000000",
    "PI": "rope:scaling=linear,factor=4",
    "YaRN": "rope:scaling=yarn,factor=4",
    "CoPE": "cope",
    "CoPE + ABF": "cope:rope_theta=1000000",
    "HardClip": "hardclip",
    "p-RoPE 0.75": "prope:p=0.75",
    "TAPE": "tape",
    "TAPA": "tapa",
}


@dataclass(frozen=True, kw_only=True)
class ContextExtensionConfig(ExperimentSettings):
    """Context extension of a pretrained base (CoPE, TAPE, PI, YaRN papers): a RoPE base is pretrained at L once
    (cached), then trained further at ``extension_factor`` × L with each scheme (full fine-tuning; TAPE's new
    modules start at zero, so its first step is the base), and evaluated by held-out loss from L to 16L and by
    passkey retrieval at ``passkey_multiples`` × L (the shared settings: :class:`ExperimentSettings`; the seeds
    are those of the continued training, the base is shared).

    Attributes:
        extension_factor: the continued-training length as a multiple of L.
        pretrain: optimisation of the base at L (seed 0, once).
        extend: optimisation of each continued-training run at ``extension_factor`` × L.
        schemes: report label -> scheme spec of the continued training.
        passkey_multiples: passkey lengths as multiples of L.
        passkey_depths: needle depths of the passkey prompts.
        passkey_trials: keys per (length, depth).
    """

    extension_factor: int
    pretrain: TrainSettings
    extend: TrainSettings
    schemes: dict[str, str] = field(default_factory=lambda: dict(CONTEXT_EXTENSION_SCHEMES))
    passkey_multiples: tuple[int, ...] = (4, 8)
    passkey_depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    passkey_trials: int = 5

    name = "context_extension"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.extension_factor < 2:
            raise ValueError(f"extension_factor must be >= 2, got {self.extension_factor}")

    @property
    def extended_length(self) -> int:
        return self.context_length * self.extension_factor

    @property
    def passkey_lengths(self) -> list[int]:
        return [self.context_length * m for m in self.passkey_multiples]

    @classmethod
    def preset(cls, size: str, seeds: int = 3, first_seed: int = 0) -> ContextExtensionConfig:
        """The length-generalisation preset's L, text, model and optimisation (here the base's pretraining),
        continued at 4L. ``toy``: seconds per run (CI smoke test; passkey at 16L = 256 bytes, the shortest prompt
        that fits); ``small``: the committed experiment (L = 64, continued at 256 bytes)."""
        base = LengthGeneralisationConfig.preset(size, seeds=seeds, first_seed=first_seed)  # refuses unknown sizes
        shared = dict(size=size, context_length=base.context_length, extension_factor=4, eval_tokens=base.eval_tokens,
                      train_chars=base.train_chars, model=base.model, pretrain=base.train, seeds=seeds,
                      first_seed=first_seed)
        if size == "toy":
            return cls(**shared, eval_multiples=(1, 4, 16),
                       extend=TrainSettings(steps=2, batch_size=1, learning_rate=1e-3, warmup_steps=1),
                       passkey_multiples=(16,), passkey_depths=(0.5,), passkey_trials=1)
        return cls(**shared, eval_multiples=(1, 2, 4, 8, 16),
                   extend=TrainSettings(steps=250, batch_size=4, learning_rate=1e-3, warmup_steps=25))


# p-RoPE at Gemma's ratio (issue #33): Gemma 2B in the p-RoPE paper trains at 8,192 tokens with RoPE base 10,000
GEMMA_THETA_PER_LENGTH = 10000 / 8192  # 1.22
PROPE_GEMMA_RATIO_SCHEMES: dict[str, str] = {
    "RoPE": "rope",
    "p-RoPE 0.75": "prope:p=0.75",
    "p-RoPE 0.25": "prope:p=0.25",
    "NoPE": "prope:p=0",
}
PROPE_GEMMA_RATIO_SEEDS = 10  # the preset's seeds when none are given (the command line gives --seeds)


@dataclass(frozen=True, kw_only=True)
class PropeGemmaRatioConfig(LengthGeneralisationConfig):
    """p-RoPE at Gemma's ratio of RoPE base to training length: the p-RoPE paper's claim (Table 2, Gemma 2B
    trained from scratch at 8k tokens with θ = 10,000: NoPE worst, 0.25-RoPE worse than 0.75-RoPE, 0.75-RoPE
    no worse than RoPE, 4.4414 vs 4.4627, -0.5 % in perplexity) is an order *at the training length*, so every
    row is scored at L only. At θ = 10⁴ and L = 64 the frequencies 0.75-RoPE stops turn 0.064 rad over L and
    the scheme equals RoPE by construction; here θ is set so that θ / L is Gemma's 10,000 / 8,192 = 1.22.

    Settings, fixed from the paper and the ratio before any run (none tuned on results):

    * θ = round(1.22 · L) = 78 at L = 64 bytes (20 in the toy, L = 16). What the ratio matches is RoPE's slowest
      frequency ≈ 1/θ: it turns 1.08 rad over L here and 0.88 rad over 8,192 tokens in Gemma 2B. The fastest
      of the frequencies 0.75-RoPE stops, θ^(-0.75), turns L^0.25 (L/θ)^0.75 radians over L: 2.44 rad here
      against 8.2 rad in Gemma (head dim 32 here, 256 there): the 4 of 16 stopped frequencies turn 1.08–2.44
      rad over L (Gemma: 32 of 128, 0.88–8.2 rad). 0.25-RoPE stops 12 of 16, which turn 1.08–21.5 rad.
    * Rows RoPE, p-RoPE 0.75, p-RoPE 0.25, NoPE (p = 0), as in the paper's Table 2.
    * Everything else is the length-generalisation preset of the same size (model d = 64, 2 layers, head dim
      32; 1,000 steps of 16 windows, lr 3e-3, 50 warm-up steps), so RoPE here differs from the committed
      length-generalisation RoPE by θ alone (and the toy's diagnostics read 256 bytes, to keep CI short).
    * :data:`PROPE_GEMMA_RATIO_SEEDS` (10) seeds by default (the committed run: ``--seeds 10``; 12 would not leave
      room in 30 min on 2 shared cores), and 65,536 held-out bytes at L (1,024 windows; more text than the other
      experiments because the effect in question is a few thousandths of a nat).
    """

    schemes: dict[str, str] = field(default_factory=lambda: dict(PROPE_GEMMA_RATIO_SCHEMES))

    name = "prope_gemma_ratio"

    @classmethod
    def preset(cls, size: str, seeds: int | None = None, first_seed: int = 0) -> PropeGemmaRatioConfig:
        """The length-generalisation preset of ``size`` with θ = round(1.22 · L), scored at L only; ``seeds``
        defaults to :data:`PROPE_GEMMA_RATIO_SEEDS`. ``small``: about 16 min with 10 seeds on 2 idle CPU cores."""
        seeds = PROPE_GEMMA_RATIO_SEEDS if seeds is None else seeds
        base = LengthGeneralisationConfig.preset(size, seeds=seeds, first_seed=first_seed)  # refuses unknown sizes
        theta = float(round(GEMMA_THETA_PER_LENGTH * base.context_length))
        return cls(size=size, context_length=base.context_length, eval_multiples=(1,),
                   eval_tokens=base.eval_tokens if size == "toy" else 65536, train_chars=base.train_chars,
                   model=dataclasses.replace(base.model, rope_theta=theta), train=base.train, seeds=seeds,
                   first_seed=first_seed, diagnostic_tokens=256 if size == "toy" else base.diagnostic_tokens)


# TAPA at depth (issue #33): the TAPA sweep's best setting against RoPE (at its own rate and at TAPA's) and NoPE
TAPA_DEPTH_VARIANTS: dict[str, Variant] = {
    "RoPE": Variant("rope"),
    "RoPE lr=1e-3": Variant("rope", learning_rate=1e-3),
    "TAPA lr=1e-3 theta=0.75": Variant("tapa:theta=0.75", learning_rate=1e-3),
    "NoPE": Variant("prope:p=0"),
}
TAPA_DEPTH_ARM = "TAPA lr=1e-3 theta=0.75"


@dataclass(frozen=True)
class TapaDepthConfig:
    """Is TAPA's gap to RoPE a property of two-layer models? The TAPA sweep's best setting (the lowest mean at L
    in ``examples/experiments/tapa-trainability``: θ = 0.75 at lr 1e-3, 2.231 ± 0.014 nats/byte, not detectably
    different from the paper's θ = 0.5 at the same rate, 2.236 ± 0.019), RoPE at its own learning rate (3e-3)
    and at TAPA's (1e-3), and NoPE, each trained at every depth of ``depths`` with the same seeds; scored at L
    (the gap) and 8L (growth).

    Settings, fixed before any run: the length-generalisation preset of the same size (d = 64, head dim 32,
    L = 64, batch 16, 50 warm-up steps) with ``depths`` = (2, 4) and 1,500 steps in the small preset, 3 seeds by
    default; the toy: depths (1, 2), 3 steps, diagnostics on 256 bytes. The issue asks for 3,000 steps (the sweep
    trained 1,000), which does not fit 30 min: measured on 2 idle cores, 200 steps of RoPE take 5.5 s at 2 layers
    and 9.8 s at 4 (14.2 s at 6), and TAPA costs 1.5x RoPE (the sweep), so 3 seeds of the 4 arms at 2 and 4 layers
    take about 45 min at 3,000 steps and 23 min at 1,500; 6 layers does not fit either.

    Attributes:
        base: the length-generalisation settings every arm starts from (its ``num_layers`` is replaced by each
            depth, its ``train.steps`` by ``steps``).
        depths: decoder layers of each arm.
        variants: report label -> arm (scheme and learning rate).
    """

    base: LengthGeneralisationConfig
    depths: tuple[int, ...]
    variants: dict[str, Variant] = field(default_factory=lambda: dict(TAPA_DEPTH_VARIANTS))

    name = "tapa_depth"

    def __post_init__(self) -> None:
        if not self.depths or any(d < 1 for d in self.depths) or list(self.depths) != sorted(set(self.depths)):
            raise ValueError(f"depths must be increasing positive layer counts, got {self.depths}")
        for needed in ("RoPE", TAPA_DEPTH_ARM):
            if needed not in self.variants:
                raise ValueError(f"the depth experiment needs a {needed!r} arm")

    @classmethod
    def preset(cls, size: str, seeds: int = 3, first_seed: int = 0) -> TapaDepthConfig:
        """``toy``: seconds (CI); ``small``: the committed experiment (depths 2 and 4, 1,500 steps, about 25 min
        with 3 seeds on 2 idle CPU cores)."""
        base = LengthGeneralisationConfig.preset(size, seeds=seeds, first_seed=first_seed)  # refuses unknown sizes
        steps, depths = (base.train.steps, (1, 2)) if size == "toy" else (1500, (2, 4))
        base = dataclasses.replace(base, eval_multiples=(1, 8), train=dataclasses.replace(base.train, steps=steps),
                                   diagnostic_tokens=256 if size == "toy" else base.diagnostic_tokens)
        return cls(base=base, depths=depths)

    @staticmethod
    def layers(depth: int) -> str:
        """``"1 layer"``, ``"4 layers"``."""
        return f"{depth} layer" + ("" if depth == 1 else "s")

    @classmethod
    def label(cls, variant: str, depth: int) -> str:
        """The report label of ``variant`` at ``depth`` layers: ``"RoPE, 4 layers"``."""
        return f"{variant}, {cls.layers(depth)}"

    def arms(self) -> dict[str, tuple[str, ModelSettings, TrainSettings]]:
        """label -> (scheme spec, model settings, optimisation settings), depth by depth."""
        out = {}
        for depth in self.depths:
            model = dataclasses.replace(self.base.model, num_layers=depth)
            for variant, v in self.variants.items():
                out[self.label(variant, depth)] = (v.spec, *v.apply(model, self.base.train))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.name, **dataclasses.asdict(self)}


# every experiment's configuration (its name is its module's and the command line's)
EXPERIMENT_CONFIGS: tuple[type, ...] = (LengthGeneralisationConfig, TapaTrainabilityConfig, ContextExtensionConfig,
                                        PropeGemmaRatioConfig, TapaDepthConfig)
