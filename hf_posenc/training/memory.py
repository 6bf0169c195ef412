"""Per-device memory of a training step with Ulysses sequence parallelism and ZeRO-3, from the model's shapes.

:func:`training_memory` adds up, in bytes per device (docs/training.md shows the terms for the CoPE recipe past one
device, and tests/test_sequence_parallel.py checks the sum against the peak measured on two CPU processes):

* **weights**: the frozen parameters partitioned over all W processes (ZeRO-3), b bytes each;
* **trainable states**: per trainable parameter (LoRA, the scheme's modules, trained embeddings and norms), partitioned
  over W: the weight (b), an fp32 master copy when b < 4, the fp32 gradient and Adam's two fp32 moments;
* **gathered weights**: ZeRO-3 gathers a module's full weights while it runs: the largest module (the embedding or
  the output head), or one decoder layer and the next one prefetched;
* **checkpoints**: with activation checkpointing, each layer's input for the local s = S/N tokens (and TAPE's states
  E, which cross the layers beside it);
* **layer recompute**: one layer's saved activations during its backward, for s tokens: the two norms' inputs and
  outputs (4 × hidden), the attention output o_proj reads (heads × head dim), the MLP's gate, its activation, up and
  their product (4 × intermediate), TAPE's state and its update; and the gradients alive at once while the MLP's
  backward runs (2 × intermediate + hidden). Q, K and V are kept only after the exchange (next term);
* **attention exchange**: after DeepSpeed's all-to-all each process holds Q, K, V and the output for the whole
  sequence S and H/N heads (key/value heads replicated up to N), forward and gradient (TAPE: E and Ẽ beside them);
* **logits**: the model's own loss under sequence parallelism (the Trainer's): s × vocab logits, their fp32 copy
  and both gradients.

The peak is the partitions, the checkpoints and the gathered weights (the output head's while the logits live), plus
the larger of the logits and a layer's backward (its recompute and its exchange). Measured against two CPU processes
(fp32, tests/test_sequence_parallel.py): within 10% where a layer's backward or the logits set the peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FP32 = 4


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per device, by term (see the module docstring)."""

    weights: int
    trainable_states: int
    gathered_weights: int
    checkpoints: int
    layer_recompute: int
    attention_exchange: int
    logits: int

    @property
    def peak(self) -> int:
        static = self.weights + self.trainable_states + self.checkpoints + self.gathered_weights
        return static + max(self.logits, self.layer_recompute + self.attention_exchange)

    def rows(self) -> list[tuple[str, float]]:
        """(term, GiB) for each term and the peak."""
        return [(k.replace("_", " "), v / 2**30) for k, v in asdict(self).items()] + [("peak", self.peak / 2**30)]


def training_memory(model: Any, sequence_length: int, sequence_parallel_size: int, world_size: int,
                    bytes_per_value: int = 2, carries_states: bool = False) -> TrainingMemory:
    """The per-device memory of one training step of ``model`` (the PEFT-wrapped, patched model, on any device,
    the meta device included: only shapes and ``requires_grad`` are read) on sequences of ``sequence_length``
    tokens split over ``sequence_parallel_size`` processes, ZeRO-3 over ``world_size``, weights and activations in
    ``bytes_per_value`` (2: bf16, 4: fp32). ``carries_states``: the scheme passes states between layers beside the
    hidden features and through attention beside V (TAPE, eq. 6-8)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    b, n, w = bytes_per_value, sequence_parallel_size, world_size
    s, seq = sequence_length // n, sequence_length
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads = config.num_attention_heads
    kv_heads = max(getattr(config, "num_key_value_heads", None) or heads, n)  # DeepSpeed replicates up to N
    d = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    per_trainable = b + (FP32 if b < FP32 else 0) + FP32 + 2 * FP32
    decoder = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    layer_params = max((sum(p.numel() for p in m.parameters()) for m in decoder), default=0)
    embedding = max((m.weight.numel() for m in model.modules() if type(m).__name__ == "Embedding"), default=0)
    states = kv_heads * d if carries_states else 0
    layer_values = (4 * hidden + heads * d + 4 * inter + 2 * states) + (2 * inter + hidden)  # saved + gradients
    exchange_values = ((heads + 2 * kv_heads) * d + heads * d + (kv_heads + heads) * d * carries_states) / n
    return TrainingMemory(
        weights=frozen * b // w,
        trainable_states=trainable * per_trainable // w,
        gathered_weights=max(embedding, 2 * layer_params) * b,
        checkpoints=layers * s * (hidden + states) * b,
        layer_recompute=s * layer_values * b,
        attention_exchange=int(2 * seq * exchange_values * b),
        logits=s * vocab * (2 * b + 2 * FP32),
    )


__all__ = ["TrainingMemory", "training_memory"]
