"""A byte-level tokenizer (256 byte tokens + ``<|endoftext|>``) as a standard ``PreTrainedTokenizerFast``.

The miniature experiments train models of a few hundred thousand parameters. With SmolLM2's 49,152-token
vocabulary the embedding and output head alone would be ~6M parameters at d = 128 and the head's
softmax would dominate every step on 2 CPU cores, and 5 novels are too little text to learn a 49k-token
vocabulary's statistics; with bytes the model's cost is its attention and MLP, which is what the schemes change,
and there are enough training tokens (3.5M) per parameter for context to matter within a few hundred steps.

Token id ``b`` is byte ``b``; id 256 is the end-of-text token that packing puts between documents. The encoding
is exactly the UTF-8 bytes of the text (no normalisation, no added special tokens), so perplexity per token is
perplexity per byte.
"""

from __future__ import annotations

import os
from typing import Any

EOS = "<|endoftext|>"
VOCAB_SIZE = 257


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast``: id ``b`` for byte ``b``, ``<|endoftext|>`` = 256, no special tokens added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte <-> printable character map

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)  # VOCAB_SIZE tokens, EOS the last


def save_byte_tokenizer(directory: str | os.PathLike) -> str:
    """Write the byte tokenizer to ``directory`` (loadable with ``AutoTokenizer.from_pretrained``); returns it."""
    byte_tokenizer().save_pretrained(directory)
    return str(directory)
