"""TAPE decode: the launch plan of forward calls with at most ``DECODE_MAX_LQ`` queries
(:func:`~hf_posenc.kernels._triton.layout.use_decode_path`), as TAPA's (``kernels/tapa/decode.py``): the prefill forward
kernel (``triton_tape._tape_fwd_kernel``) with the split-K layout of :class:`~hf_posenc.kernels._triton.layout.ForwardLayout`.
With several splits each one writes its normalised O and Ẽ side by side in one fp32 buffer, with its base-2 LSE,
and one launch of the shared split-combine kernel merges both.

This module holds the decode tile per target, the layout, the buffers and the combine launch; the forward
kernel's arguments come from the op's ``_forward_spec``, handed in by ``triton_tape.plan_forward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._triton.combine import plan_split_combine
from .._triton.launch import LaunchSpec, Target, pow2
from .._triton.layout import INTERPRETER_TILE, ForwardLayout, Tile, table_row
from .args import TapeArgs

# GPU decode tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per architecture and padded width of [V | E], chosen
# offline by benchmarks/tune_tiles.py --kernel decode as the other tables are: no spills at D <= 128, shared
# memory within the limit, fewest issued instructions per score element. sm_90 at widths 128 and 256 (D = 64, 128):
# measured on an H100 by benchmarks/tune_decode.py; width 128 takes (16, 64, 4, 3), 4% faster than the static
# (16, 128, 4, 2); width 256 keeps its static choice, which the measurement ranks first.
_TILES = {
    "sm90": {128: (16, 64, 4, 3), 256: (16, 64, 4, 2), 512: (16, 32, 4, 2)},
    "sm80": {128: (16, 128, 4, 2), 256: (16, 128, 4, 2), 512: (16, 32, 4, 2)},
    "fp32": {128: (16, 64, 4, 1), 256: (16, 32, 4, 1), 512: (16, 16, 4, 1)},  # fp32 inputs: `table_row`
}

# (launch name, layout, tile, O, Ẽ, LSE or their partials) -> the forward kernel's launch
ForwardSpec = Callable[[str, ForwardLayout, Tile, torch.Tensor, torch.Tensor, torch.Tensor], LaunchSpec]


def tile(target: Target, block_d: int, block_de: int, itemsize: int = 2) -> Tile:
    """Decode tile for a target and the padded widths of V and E (buckets by their sum; the sm_90 table for
    Hopper and newer, the sm_80 table otherwise, the fp32 table for fp32 inputs); 16 × 16 in the interpreter."""
    if target.interpreter:
        return INTERPRETER_TILE
    return Tile(*table_row(_TILES, target, block_d + block_de, itemsize))


def plan_decode(q: torch.Tensor, args: TapeArgs, target: Target, forward: ForwardSpec
                ) -> tuple[list[LaunchSpec], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch plan of a decode forward: (specs, o, e_out, lse) as `triton_tape.plan_forward` returns them: the
    forward launch "tape_decode", then the split combine when the keys are split."""
    B, Hq, Lq, D, De = args.batch, args.q_heads, args.q_len, args.head_dim, args.e_dim
    t = tile(target, pow2(D), pow2(De), q.element_size())
    layout = ForwardLayout.split_k(target, B, args.kv_heads, args.group, Lq, args.k_len, t)
    lse = torch.empty(B, Hq, Lq, device=q.device, dtype=torch.float32)
    if layout.splits == 1:
        o = torch.empty(B, Hq, Lq, D, device=q.device, dtype=q.dtype)
        eo = torch.empty(B, Hq, Lq, De, device=q.device, dtype=q.dtype)
        return [forward("tape_decode", layout, t, o, eo, lse)], o, eo, lse
    parts = torch.empty(B, Hq, layout.splits, Lq, D + De, device=q.device, dtype=torch.float32)
    lse_parts = torch.empty(B, Hq, layout.splits, Lq, device=q.device, dtype=torch.float32)
    out = torch.empty(B, Hq, Lq, D + De, device=q.device, dtype=q.dtype)
    fwd = forward("tape_decode", layout, t, parts[..., :D], parts[..., D:], lse_parts)
    return [fwd, plan_split_combine(parts, lse_parts, out, lse)], out[..., :D], out[..., D:], lse
