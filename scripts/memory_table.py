"""The per-GPU memory of recipes/cope-llama3-8b-128k-sp.yaml (Llama-3-8B, 131,072-token sequences split over 8 GPUs
by Ulysses, ZeRO-3 over the same 8, bf16, LoRA r=8 with trained embeddings and norms), per scheme, as
:func:`hf_posenc.training.memory.training_memory` computes it; docs/training.md embeds the table (a test checks it
is current).

    .venv/bin/python scripts/memory_table.py
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Meta-Llama-3-8B's published config (the model itself is not needed: the estimate reads shapes only)
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
             "tie_word_embeddings": False}
LENGTH, SP, WORLD = 131072, 8, 8
SCHEMES = {"cope": {"clip_low_n": 20, "rope_theta": 1.0e7}, "tapa": {}, "tape": {}}


def memory_table() -> str:
    """The Markdown table: one column per scheme, one row per term, GiB per GPU."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    sys.path.insert(0, str(ROOT))
    import hf_posenc
    from hf_posenc.adapters import lora_config
    from hf_posenc.training.memory import training_memory

    warnings.simplefilter("ignore")  # TAPA's "needs training" notice: this is the training plan
    columns = {}
    for scheme, options in SCHEMES.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA3_8B), dtype=torch.bfloat16)
            hf_posenc.patch_model(model, scheme, **options)
            model = get_peft_model(model, lora_config(model, r=8, train_embeddings=True, train_norms=True))
        memory = training_memory(model, LENGTH, SP, WORLD, bytes_per_value=2, carries_states=scheme == "tape")
        columns[scheme] = memory.rows()
    terms = [term for term, _ in next(iter(columns.values()))]
    lines = ["| per GPU (GiB) | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for i, term in enumerate(terms):
        cells = [f"{columns[s][i][1]:.1f}" for s in columns]
        lines.append(f"| {'**peak**' if term == 'peak' else term} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(memory_table())
