"""What ``torch.compile`` sees of the attention schemes that read the host (TAPA, TAPE's fused kernel): their
attention body after the mask as one opaque custom op, used while compiling a forward without gradients
(compiled static-cache ``generate``)."""

from __future__ import annotations

import itertools
import re
from typing import Callable

import torch


def opaque_op(name: str, fake: Callable[..., torch.Tensor]) -> Callable[[Callable], Callable]:
    """Decorator: the attention body after the mask, as a custom op that ``torch.compile`` calls as one opaque
    node (what a compiled static-cache ``generate`` runs), with ``fake`` giving its output's shape.

    The body reads the number of written slots on the host (``masks.written_keys``) and plans kernel launches from
    the sizes; traced, that would break the graph and recompile at every decoding step. As an op it is one call
    whose output shape does not depend on the data. It is tagged unsafe for CUDA graphs (it reads the host), so
    Inductor leaves it outside the graphs it captures. The op's name carries the defining module, so the
    installed package and a checkpoint's remote code (a copy of these modules) register distinct ops. The
    decorated function stays a plain function; callers use ``fn.op`` where they need the op.
    """
    def wrap(fn: Callable) -> Callable:
        base = name + "_" + re.sub(r"\W", "_", fn.__module__)
        qualified = next(f"hf_posenc::{base}{n or ''}" for n in itertools.count()  # a reloaded module: a new op
                         if not hasattr(torch.ops.hf_posenc, f"{base}{n or ''}"))
        tags = (torch._C.Tag.cudagraph_unsafe,) if hasattr(torch._C.Tag, "cudagraph_unsafe") else ()
        op = torch.library.custom_op(qualified, fn, mutates_args=(), tags=tags)
        op.register_fake(fake)
        fn.op = op
        return fn

    return wrap


def compiled_inference() -> bool:
    """True while ``torch.compile`` traces a forward that records no gradients (compiled generation), where the
    attention runs through its :func:`opaque_op`. Compiled training keeps the traced autograd path."""
    return torch.compiler.is_compiling() and not torch.is_grad_enabled()
