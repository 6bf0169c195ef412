"""Sliding-window perplexity by the stride method of Press et al. ("Train Short, Test Long", ALiBi), as in the
Hugging Face guide to the perplexity of fixed-length models.

Windows of ``context_length`` tokens start every ``stride`` tokens. In each window only the targets the previous
window did not reach are scored (the earlier ones are masked with -100). With ``stride < context_length`` every
token after the first is scored exactly once, with at least ``context_length - stride`` tokens of context (except
in the first window); with ``stride == context_length`` the windows are disjoint and the first token of each window,
which has nothing before it, is not scored:

    NLL = (1/N) Σ_t −log p(x_t | x_{max(0, e−L)} … x_{t−1})      PPL = exp(NLL)

where ``e`` is the end of the window that scores ``x_t``. Context lengths beyond the model's trained context are
allowed on purpose: that is what length-generalisation evaluation measures.

The fast path (:func:`window_nll`) runs the decoder once per window and applies the output head only to the
hidden states of the scored targets, ``chunk_size`` positions at a time, so the ``L × vocab`` logits of a long
window are never materialised. :func:`window_nll_reference` is the plain full-logits version it is tested against.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..decoder_layers import decoder_layers, output_logit_transform, transform_logits
from .results import PerplexityResult

IGNORE_INDEX = -100


class TextTooShortError(ValueError):
    """The evaluation text has fewer tokens than a requested context length."""


def tokenize_text(tokenizer: Any, text: str, max_tokens: int | None = None) -> torch.Tensor:
    """``[1, n]`` token ids of ``text`` (with the special tokens the tokenizer adds), cut to ``max_tokens``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (read the file first), got {type(text).__name__}")
    ids = torch.as_tensor(tokenizer(text).input_ids, dtype=torch.long).reshape(1, -1)
    return ids if max_tokens is None else ids[:, :max_tokens]


def window_spans(num_tokens: int, context_length: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """``(begin, end, num_new)`` of each window: tokens ``[begin, end)`` are fed, the last ``num_new`` are new.

    The loop of the Press et al. / Hugging Face recipe: ``begin`` advances by ``stride`` until a window reaches the
    end of the text; the last window may be shorter than ``context_length``."""
    if stride < 1 or stride > context_length:
        raise ValueError(f"stride must be in [1, context_length={context_length}], got {stride}")
    prev_end = 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + context_length, num_tokens)
        yield begin, end, end - prev_end
        prev_end = end
        if end == num_tokens:
            break


def _check_text_length(num_tokens: int, context_length: int) -> None:
    if num_tokens < context_length:
        raise TextTooShortError(
            f"the text has {num_tokens} tokens but context length {context_length} needs at least {context_length}; "
            "use a longer text or smaller --lengths"
        )


def window_nll_reference(model: Any, window: torch.Tensor, num_new: int) -> tuple[float, int]:
    """``(sum of NLL, number of scored targets)`` of one window from the model's full logits (reference path)."""
    labels = window.clone()
    labels[:, : window.shape[1] - num_new] = IGNORE_INDEX  # targets an earlier window scored
    logits = model(input_ids=window).logits.float()
    nll = F.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=IGNORE_INDEX, reduction="sum")
    return float(nll), int((labels[0, 1:] != IGNORE_INDEX).sum())


def window_nll(model: Any, window: torch.Tensor, num_new: int, chunk_size: int = 1024) -> tuple[float, int]:
    """``(sum of NLL, number of scored targets)`` of one window, computing only the logits of scored targets.

    Runs ``model.get_decoder()`` for the hidden states, keeps those that predict the last ``num_new`` tokens (the
    first token of the text has no prediction) and applies ``model.get_output_embeddings()`` (plus the family's
    logit post-processing) ``chunk_size`` positions at a time, in float32 for the loss."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    if decoder is model or head is None:
        raise TypeError(f"{type(model).__name__} exposes no separate decoder and output head; use fast=False")
    length = window.shape[1]
    first_target = max(1, length - num_new)
    if first_target >= length:
        return 0.0, 0
    hidden = decoder(input_ids=window).last_hidden_state[0, first_target - 1 : length - 1]
    targets = window[0, first_target:]
    scale, cap = output_logit_transform(model.config)  # what causal-LM heads do after lm_head
    total = torch.zeros((), dtype=torch.float64, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_size):
        logits = transform_logits(head(hidden[start : start + chunk_size]).float(), scale, cap)
        total += F.cross_entropy(logits, targets[start : start + chunk_size], reduction="sum").double()
    return float(total), int(targets.numel())


#: windows from this many tokens get a progress bar over the decoder layers inside each forward (minutes on a CPU)
LAYER_PROGRESS_FROM = 4096


@contextlib.contextmanager
def layer_progress(model: Any, desc: str, enabled: bool = True) -> Iterator[None]:
    """A progress bar (with tqdm's time estimate) advanced as each decoder layer of ``model`` finishes its forward:
    progress inside one long forward. Models without decoder layers at ``.model.layers`` get no bar."""
    from tqdm.auto import tqdm

    try:
        layers = decoder_layers(model) if enabled else None
    except TypeError:  # not a Transformers decoder (e.g. a bare module): nothing to count, no bar
        layers = None
    if layers is None:
        yield
        return
    bar = tqdm(total=len(layers), desc=desc, unit="layer", leave=False)

    def advance(*_: Any) -> None:  # returns None: the layer's output stays as it is
        bar.update(1)

    handles = [layer.register_forward_hook(advance) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        bar.close()


def sliding_window_perplexity(
    model: Any,
    input_ids: torch.Tensor,
    context_length: int,
    stride: int | None = None,
    *,
    name: str = "model",
    fast: bool = True,
    chunk_size: int = 1024,
    progress: bool = True,
) -> PerplexityResult:
    """Perplexity of ``model`` on ``input_ids`` ([1, n] or [n]) with windows of ``context_length`` tokens moved by
    ``stride`` (default ``context_length // 2``; ``stride == context_length`` gives disjoint windows).

    Batch size 1, ``torch.inference_mode``. Raises :class:`TextTooShortError` when the text has fewer than
    ``context_length`` tokens."""
    from tqdm.auto import tqdm

    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape [1, n] or [n] (batch size 1), got {tuple(ids.shape)}")
    if not isinstance(context_length, int) or context_length < 2:
        raise ValueError(f"context_length must be an int >= 2, got {context_length!r}")
    stride = max(1, context_length // 2) if stride is None else stride
    num_tokens = ids.shape[1]
    _check_text_length(num_tokens, context_length)
    spans = list(window_spans(num_tokens, context_length, stride))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))  # no parameters: run on the CPU
    score = window_nll if fast else window_nll_reference
    kwargs = {"chunk_size": chunk_size} if fast else {}
    total, count = 0.0, 0
    started = time.perf_counter()
    per_layer = progress and context_length >= LAYER_PROGRESS_FROM
    with torch.inference_mode():
        bar = tqdm(spans, desc=f"ppl {name} L={context_length}", unit="win", disable=not progress, leave=False)
        for begin, end, num_new in bar:
            with layer_progress(model, f"  window {begin}-{end}", per_layer):
                nll, n = score(model, ids[:, begin:end].to(device), num_new, **kwargs)
            total, count = total + nll, count + n
            bar.set_postfix(ppl=f"{math.exp(min(total / max(count, 1), 700.0)):.3f}")
    mean = total / count
    return PerplexityResult(
        model=name, context_length=context_length, stride=stride, num_tokens=num_tokens, num_scored=count,
        num_windows=len(spans), nll=mean, perplexity=math.exp(mean) if mean < 700 else math.inf,
        seconds=round(time.perf_counter() - started, 3),
    )


def perplexity_at_lengths(
    model: Any,
    input_ids: torch.Tensor,
    lengths: Sequence[int],
    stride: int | None = None,
    **kwargs: Any,
) -> list[PerplexityResult]:
    """:func:`sliding_window_perplexity` at each context length; ``stride=None`` means half of each length, and a
    stride larger than a length is clamped to that length (disjoint windows).

    Every length is checked against the text before any model runs, so a too-short text fails fast."""
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    _check_text_length(ids.shape[1], max(lengths, default=0))
    return [sliding_window_perplexity(model, ids, n, stride if stride is None else min(stride, n), **kwargs)
            for n in lengths]
