"""Typed scheme configurations shared by every positional-encoding scheme.

A scheme config is a frozen dataclass: it validates its own options when built (types and ranges that do not
depend on the model) and again against a model's head dimension in :meth:`SchemeConfig.check_model`. Configs
serialise to plain dicts (``to_dict``/``from_dict``), which is what travels in ``config.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

LayerSelection = Literal["global", "all"]
SCALING_TYPES = ("linear", "dynamic", "yarn", "llama3")
_SCALING_OPTION_KEYS = {
    "linear": set(),
    "dynamic": set(),
    "yarn": {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"},
    "llama3": {"low_freq_factor", "high_freq_factor"},
}
_LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
# A finite stand-in for an infinite per-dimension factor (a frequency set to 0, w = 0) in LongRoPE's factor lists and
# llama.cpp's rope_freqs: JSON cannot hold inf, and f·b^(2j/d) overflows fp32 to inf for every j > 0 of any practical
# base, giving exactly 0.
STOCK_INF_FACTOR = 3.0e38


def head_dim(config: Any) -> int:
    """The attention head width of a model config: ``head_dim``, or ``hidden_size // num_attention_heads`` where
    the config has none (as Transformers' attention modules compute it)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_dim(config: Any, params: dict[str, Any]) -> int:
    """The rotated head dimensions, as Transformers' rope init functions compute them:
    ``int(head_dim · partial_rotary_factor)``."""
    return int(head_dim(config) * params.get("partial_rotary_factor", 1.0))


def layer_rope_parameters(config: Any) -> list[dict[str, Any]]:
    """The rope parameters of each layer type of a config (one dict, or one per nested layer type)."""
    rope = config.rope_parameters
    nested = config.nested_rope_parameter_keys(rope)
    return [rope[k] for k in nested if rope[k] is not None] if nested else [rope]


def check_type(scheme: str, name: str, value: Any, kinds: tuple[type, ...], optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is one of ``kinds`` (``bool`` never counts as a number).

    Kept instead of ``huggingface_hub.dataclasses.strict`` (which the patched model configs use): ``strict``
    validates on attribute assignment, so it checks nothing in a frozen dataclass (scheme configs are frozen and
    hashable), and it refuses an ``int`` for a ``float`` option (``p=1``, ``alpha=1``), which users write."""
    if value is None and optional:
        return
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        expected = " or ".join(k.__name__ for k in kinds) + (" or None" if optional else "")
        raise TypeError(f"{scheme}: option {name!r} must be {expected}, got {type(value).__name__} ({value!r}).")


@dataclass(frozen=True)
class SchemeConfig:
    """Base of all scheme configs.

    Attributes:
        layers: which attention layers the scheme applies to in families with separate rotary settings per layer
            type (Gemma3): ``"global"`` (the full-attention layers, default) or ``"all"``. Families with a single
            rotary setting always apply it to every layer.
    """

    name: ClassVar[str]
    paper: ClassVar[str]
    # The attention implementation the scheme registers, or None when any backend works (see attention_name).
    attn_implementation: ClassVar[str | None] = None
    layers: LayerSelection = "global"

    def __post_init__(self) -> None:
        if self.layers not in ("global", "all"):
            raise ValueError(f"{self.name}: layers must be 'global' or 'all', got {self.layers!r}.")

    # -- model-dependent checks -------------------------------------------------------------------------------
    def check_model(self, head_dim: int) -> None:
        """Validate the options against a model's head dimension (raises ``ValueError``)."""

    def resolved(self, head_dim: int) -> SchemeConfig:
        """Return a copy whose model-dependent defaults are filled in."""
        return self

    def attention_name(self) -> str | None:
        """The attention implementation this configured scheme requires, or ``None`` if any backend works."""
        return self.attn_implementation

    def frequency_scheme(self) -> SchemeConfig:
        """The scheme whose ``rope_parameters`` set the rotary frequencies (itself, or a nested one for TAPE)."""
        return self

    # -- capabilities: what the rest of hf-posenc asks a scheme (it reads these, never a scheme's name) ----------
    # The scheme computes attention itself (TAPA's score, eq. 12; TAPE's token mixing, eq. 6-7): a model whose
    # attention has parts of its own (sinks, gates, latent attention) would lose them.
    computes_attention: ClassVar[bool] = False
    # The scheme's options count over the whole head width (TAPA splits each head), not the rotated pairs.
    whole_head: ClassVar[bool] = False
    # The module that checks and times the scheme's kernels in `hf-posenc selftest` (selftest.checks.families), in
    # its kernel package (kernels/tapa/selftest.py), or None.
    selftest: ClassVar[str | None] = None

    def model_refusal(self, model: Any) -> str | None:
        """Why this scheme cannot patch ``model`` (a loaded causal LM whose family may take it), or ``None``.

        Frequency schemes change only ``rope_parameters`` and take any model whose family takes them; a scheme
        that computes attention refuses attention parts it would drop. Subclasses add their own layout rules."""
        if not self.computes_attention:
            return None
        config = model.config
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        attn = getattr(layers[0], "self_attn", None) if len(layers) else None
        own = [name for name, _ in attn.named_parameters(recurse=False)] if attn is not None else []
        if own:
            return (f"its attention has parameters of its own ({', '.join(own)}: attention sinks or gates) that "
                    f"{self.name.upper()}'s attention would ignore")
        v_dim = getattr(config, "v_head_dim", None)
        qk_dim = getattr(config, "qk_head_dim", None) or (
            (getattr(config, "qk_nope_head_dim", None) or 0) + (getattr(config, "qk_rope_head_dim", None) or 0)
        ) or head_dim(config)
        if v_dim is not None and v_dim != qk_dim:
            return (f"its values are {v_dim} wide and its queries/keys {qk_dim} (multi-head latent attention); "
                    f"{self.name.upper()} splits one head width across queries, keys and values")
        return None

    @classmethod
    def context_parallel_refusal(cls) -> str | None:
        """Why the scheme cannot run under context parallelism (the sequence sharded over devices with ring
        attention over SDPA), or ``None``: frequency schemes change only each position's rotary frequencies."""
        return None

    # The scheme's attention finds packed documents in the position ids itself (TAPA's segments), so they stay
    # apart under Ulysses sequence parallelism whatever kernel runs underneath; otherwise only a kernel that reads
    # the gathered position ids (flash attention's varlen path) keeps them apart there.
    separates_packed_documents: ClassVar[bool] = False

    def sequence_parallel_refusal(self, config: Any) -> str | None:
        """Why the scheme cannot train under Ulysses sequence parallelism (DeepSpeed's all-to-all around the
        attention function: each process gets the whole sequence for a slice of the heads), or ``None``.

        Frequency schemes rotate each shard with its own position ids before the exchange, and a scheme whose
        attention is a function registered with Transformers is called through DeepSpeed's wrapper with the gathered
        position ids, so both run unchanged. ``config``: the model's config."""
        return None

    # -- modules a scheme adds to the model (TAPE); frequency and attention schemes add none ------------------
    trainable_modules: ClassVar[tuple[str, ...]] = ()

    def install(self, model: Any) -> None:
        """Add the scheme's modules to ``model`` (called by ``patch_model`` and when a checkpoint is loaded)."""

    def uninstall(self, model: Any) -> None:
        """Remove what :meth:`install` added (called when ``replace=True`` switches to another scheme)."""

    # -- initialisation of a model trained from scratch (TAPA's phase regime); none by default ----------------
    scratch_init_options: ClassVar[tuple[str, ...]] = ()

    def check_scratch_init(self, options: dict[str, Any]) -> None:
        """Refuse ``options`` of :meth:`initialise_from_scratch` this scheme does not take (a ``ValueError`` naming
        the valid ones), before any model is built."""
        unknown = sorted(set(options) - set(self.scratch_init_options))
        if unknown:
            valid = (f"valid: {list(self.scratch_init_options)}" if self.scratch_init_options else
                     "it has no from-scratch initialisation; remove scheme.init")
            raise ValueError(f"{self.name}: unknown from-scratch init option(s) {unknown} ({valid}).")

    def initialise_from_scratch(self, model: Any, **options: Any) -> dict[str, Any]:
        """Change the random initial weights of a patched model that will be trained from scratch as the scheme
        needs (``options``: :attr:`scratch_init_options`); returns a JSON-ready record of what changed. Never called
        on a pretrained model (its weights are what it learned)."""
        self.check_scratch_init(options)
        return {}

    # -- serialisation --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> SchemeConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ValueError(f"{cls.name}: unknown option(s) {unknown}; valid options are {sorted(names)}.")
        return cls(**options)


@dataclass(frozen=True)
class FrequencySchemeConfig(SchemeConfig):
    """Options that change the base RoPE frequencies before a scheme acts on them.

    Attributes:
        rope_theta: a new base θ (ABF, Xiong et al. 2024); ``None`` keeps the model's.
        scaling: a standard context-extension scaling applied first: ``"linear"`` (PI), ``"dynamic"`` (NTK),
            ``"yarn"`` or ``"llama3"``; ``None`` keeps the model's own rope type (which may already be one of these,
            or ``longrope``).
        factor: the scaling factor (required with ``scaling``).
        original_max_position_embeddings: pre-training length for yarn/llama3 (defaults to the model's
            ``max_position_embeddings``).
        scaling_options: extra keys of the scaling type (yarn: ``beta_fast``, ``beta_slow``, ``mscale``,
            ``mscale_all_dim``, ``attention_factor``, ``truncate``; llama3: ``low_freq_factor``,
            ``high_freq_factor``).
    """

    rope_theta: float | None = None
    scaling: str | None = None
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    scaling_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_type(self.name, "rope_theta", self.rope_theta, (int, float), optional=True)
        check_type(self.name, "scaling", self.scaling, (str,), optional=True)
        check_type(self.name, "factor", self.factor, (int, float), optional=True)
        check_type(self.name, "original_max_position_embeddings", self.original_max_position_embeddings, (int,), True)
        check_type(self.name, "scaling_options", self.scaling_options, (dict,))
        if self.rope_theta is not None and not (math.isfinite(self.rope_theta) and self.rope_theta > 1):
            raise ValueError(f"{self.name}: rope_theta must be a finite number > 1, got {self.rope_theta}.")
        if self.scaling is None:
            if self.factor is not None or self.scaling_options or self.original_max_position_embeddings:
                raise ValueError(
                    f"{self.name}: factor/scaling_options/original_max_position_embeddings need a scaling type; "
                    f"pass scaling= one of {list(SCALING_TYPES)}."
                )
            return
        if self.scaling not in SCALING_TYPES:
            raise ValueError(f"{self.name}: scaling must be one of {list(SCALING_TYPES)} or None, got {self.scaling!r}.")
        if self.factor is None or not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"{self.name}: scaling={self.scaling!r} needs factor >= 1, got {self.factor!r}.")
        if self.original_max_position_embeddings is not None and self.original_max_position_embeddings < 1:
            raise ValueError(f"{self.name}: original_max_position_embeddings must be >= 1.")
        unknown = set(self.scaling_options) - _SCALING_OPTION_KEYS[self.scaling]
        if unknown:
            raise ValueError(
                f"{self.name}: scaling_options {sorted(unknown)} are not used by {self.scaling!r}; valid keys: "
                f"{sorted(_SCALING_OPTION_KEYS[self.scaling])}."
            )

    def base_rope_parameters(self, model_params: dict[str, Any], max_position_embeddings: int) -> dict[str, Any]:
        """The stock rope parameters the scheme starts from: the model's own, with ABF and scaling applied."""
        params = dict(model_params)
        if self.rope_theta is not None:
            params["rope_theta"] = float(self.rope_theta)
        if self.scaling is None:
            return params
        params = {"rope_type": self.scaling, "rope_theta": params["rope_theta"], "factor": float(self.factor),
                  **{k: params[k] for k in ("partial_rotary_factor",) if k in params}}  # the rotated fraction stays
        if self.scaling in ("yarn", "llama3"):
            trained = self.original_max_position_embeddings or max_position_embeddings
            if trained is None:
                raise ValueError(
                    f"{self.name}: scaling={self.scaling!r} needs the trained context length, and this model's config "
                    "has no max_position_embeddings; pass original_max_position_embeddings=<trained length>."
                )
            params["original_max_position_embeddings"] = trained
        if self.scaling == "llama3":
            params.update(_LLAMA3_DEFAULTS)
        params.update(self.scaling_options)
        return params

    def rope_parameters(self, model_params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> dict:
        """The rope parameters the patched layers use (Transformers' ``rope_parameters`` format)."""
        return self.base_rope_parameters(model_params, max_position_embeddings)
