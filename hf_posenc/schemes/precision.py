"""The dtype of the attention schemes' inputs under autocast.

Under ``torch.autocast`` a Llama-style layer hands attention mixed dtypes: the projections come out in the autocast
dtype, but RoPE's rotation multiplies q and k by fp32 cos/sin tables (the hidden states of an fp32 model are fp32),
so q, k arrive in fp32 beside a bf16 v. ``scaled_dot_product_attention`` is on autocast's lower-precision list and
casts all three; the schemes' own attention (TAPA, TAPE's fused kernel) does the same here, so training an fp32
model with ``bf16=True`` (autocast) runs as it does with SDPA instead of stopping at the kernels' one-dtype check.
"""

from __future__ import annotations

import torch


def autocast_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` cast to the autocast dtype of their device while autocast is enabled there (floating-point
    tensors only), as autocast casts the inputs of ``scaled_dot_product_attention``; unchanged otherwise."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)
