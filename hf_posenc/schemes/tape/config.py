"""TAPE's options (``tape-contextualized-equivariant-pe.md`` eq. 6–8): the update's width, the frequencies the
states start from, and the attention backend."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import nn

from ..base import FrequencySchemeConfig, SchemeConfig, check_type
from ..registry import make_scheme
from ..rope import RoPEConfig
from .attention import ATTN_NAME
from .layout import layout_refusal
from .modeling import install_tape, uninstall_tape


@dataclass(frozen=True)
class TAPEConfig(SchemeConfig):
    """Options of TAPE.

    Attributes:
        hidden: intermediate width I of the MLP-side update (eq. 8); default 4 × the key/value heads, as in the
            authors' code.
        frequencies: a frequency scheme applied first, as a dict ``{"scheme": "cope", "clip_low_n": 10}``
            (any of cope, hardclip, prope, rope with their options); ``None`` keeps the model's frequencies.
        backend: ``"auto"`` runs through the model's attention implementation (eager, sdpa, flex, flash);
            ``"triton"`` uses the fused kernel (O = P·V and Ẽ = P·E in one pass; no sliding windows, soft-capping or
            packed sequences).
        layers: TAPE runs in every layer; must stay ``"all"``.
    """

    name: ClassVar[str] = "tape"
    paper: ClassVar[str] = "Rethinking Addressing in Language Models via Contextualized Equivariant PE (TAPE, eq. 6-8)"
    trainable_modules: ClassVar[tuple[str, ...]] = ("tape",)
    computes_attention: ClassVar[bool] = True
    selftest: ClassVar[str | None] = "hf_posenc.kernels.tape.selftest"
    layers: Literal["global", "all"] = "all"
    hidden: int | None = None
    frequencies: dict[str, Any] | None = None
    backend: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_type(self.name, "hidden", self.hidden, (int,), optional=True)
        check_type(self.name, "backend", self.backend, (str,))
        if self.backend not in ("auto", "triton"):
            raise ValueError(f"tape: backend must be 'auto' (the model's attention implementation) or 'triton' "
                             f"(the fused kernel), got {self.backend!r}.")
        check_type(self.name, "frequencies", self.frequencies, (dict,), optional=True)
        if self.layers != "all":
            raise ValueError("tape: TAPE updates positions in every layer; layers must be 'all'.")
        if self.hidden is not None and self.hidden < 1:
            raise ValueError(f"tape: hidden must be >= 1, got {self.hidden}.")
        self.frequency_scheme()  # validates the nested scheme now

    def attention_name(self) -> str | None:
        return ATTN_NAME if self.backend == "triton" else None

    def frequency_scheme(self) -> FrequencySchemeConfig:
        if self.frequencies is None:
            return RoPEConfig()
        options = dict(self.frequencies)
        name = options.pop("scheme", None)
        scheme = make_scheme(name, **options) if isinstance(name, str) else None
        if not isinstance(scheme, FrequencySchemeConfig):
            raise ValueError(
                "tape: frequencies must name a frequency scheme, e.g. {'scheme': 'cope', 'clip_low_n': 10}; "
                f"got {self.frequencies!r}."
            )
        return scheme

    def check_model(self, head_dim: int) -> None:
        self.frequency_scheme().check_model(head_dim)

    def model_refusal(self, model: nn.Module) -> str | None:
        """The attention parts TAPE would drop (base class), then the decoder layouts its layer forward
        reproduces (:func:`~.layout.layout_refusal`)."""
        return super().model_refusal(model) or layout_refusal(model)

    @classmethod
    def context_parallel_refusal(cls) -> str | None:
        """Eq. 7 mixes the states with the attention weights: they would have to ride with V around the ring."""
        return ("TAPE mixes its positional states through the attention weights (eq. 7), so each sequence "
                "shard would need the states riding with V around the ring, which context parallelism does not "
                "pass")

    def sequence_parallel_refusal(self, config: Any) -> str | None:
        """Eq. 7's states pass DeepSpeed's wrapper as a second value beside V (key-wide, as it requires); the fused
        kernel's single [V | E] call, and the zero-padded single call that attention dropout needs, are wider."""
        if self.backend == "triton":
            return ("the fused kernel attends over [V | E] in one call, twice as wide as the keys DeepSpeed's "
                    "Ulysses wrapper exchanges; patch with backend='auto' (the states then pass through the "
                    "wrapper as a second value)")
        if getattr(config, "attention_dropout", 0.0):
            return ("with attention dropout TAPE attends over [V | E] in one call (one dropout mask for eq. 6 and "
                    "7), wider than the heads DeepSpeed's Ulysses wrapper exchanges; set attention_dropout to 0")
        return None

    def resolved(self, head_dim: int) -> TAPEConfig:
        inner = self.frequency_scheme().resolved(head_dim)
        frequencies = None if self.frequencies is None else {"scheme": inner.name, **inner.to_dict()}
        return dataclasses.replace(self, frequencies=frequencies)

    def install(self, model: nn.Module) -> None:
        install_tape(model, self)

    def uninstall(self, model: nn.Module) -> None:
        uninstall_tape(model)
