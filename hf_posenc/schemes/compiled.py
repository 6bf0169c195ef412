"""What ``torch.compile`` sees of the attention schemes that plan their kernels on the host (TAPA, TAPE's fused
kernel): their attention body after the mask as one opaque custom op, used while compiling a forward without
gradients (compiled static-cache ``generate``): a CUDA-graph-safe one for decoding steps, which reads every slot of
the cache (``masks.every_slot``), and one that reads the host for the rest (``masks.written_keys``)."""

from __future__ import annotations

import itertools
import re
from typing import Callable

import torch

from .masks import reads_every_slot


def opaque_op(name: str, fake: Callable[..., torch.Tensor], graph_safe: bool = False
              ) -> Callable[[Callable], Callable]:
    """Decorator: the attention body after the mask, as a custom op that ``torch.compile`` calls as one opaque
    node (what a compiled static-cache ``generate`` runs), with ``fake`` giving its output's shape.

    The body plans kernel launches from the sizes; traced, that would break the graph. As an op it is one call
    whose output shape does not depend on the data. A body that reads the host (``masks.written_keys``) is tagged
    unsafe for CUDA graphs, so Inductor leaves it outside the graphs it captures; ``graph_safe=True`` declares a
    body that reads nothing on the host and launches the same kernels for the same shapes, which a CUDA graph
    captures with the rest of the decoding step (mode "reduce-overhead"). The op's name carries the defining
    module, so the installed package and a checkpoint's remote code (a copy of these modules) register distinct
    ops. The decorated function stays a plain function; callers use ``fn.op`` where they need the op.
    """
    def wrap(fn: Callable) -> Callable:
        base = name + "_" + re.sub(r"\W", "_", fn.__module__)
        qualified = next(f"hf_posenc::{base}{n or ''}" for n in itertools.count()  # a reloaded module: a new op
                         if not hasattr(torch.ops.hf_posenc, f"{base}{n or ''}"))
        unsafe = hasattr(torch._C.Tag, "cudagraph_unsafe") and not graph_safe
        tags = (torch._C.Tag.cudagraph_unsafe,) if unsafe else ()
        op = torch.library.custom_op(qualified, fn, mutates_args=(), tags=tags)
        op.register_fake(fake)
        fn.op = op
        return fn

    return wrap


def attention_call(plain: Callable, every_slot: Callable | None, q_len: int, kv_len: int,
                   attention_mask: torch.Tensor | None, sliding_window: int | None = None) -> Callable:
    """What an attention function calls: ``plain`` (its body over the written keys) eagerly; while compiling a
    forward without gradients, the op of ``every_slot`` (its body over ``masks.every_slot``, safe for CUDA graphs)
    where ``masks.reads_every_slot`` holds, else ``plain``'s op. ``every_slot`` None: a backend that reads the
    host itself."""
    if not compiled_inference():
        return plain
    every = every_slot is not None and reads_every_slot(q_len, kv_len, attention_mask, sliding_window)
    return (every_slot if every else plain).op


def compiled_inference() -> bool:
    """True while ``torch.compile`` traces a forward that records no gradients (compiled generation), where the
    attention runs through its :func:`opaque_op`. Compiled training keeps the traced autograd path."""
    return torch.compiler.is_compiling() and not torch.is_grad_enabled()
