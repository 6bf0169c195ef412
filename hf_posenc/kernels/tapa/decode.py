"""TAPA decode: the launch plan of forward calls with at most ``DECODE_MAX_LQ`` queries
(:func:`~hf_posenc.kernels._triton.layout.use_decode_path`): the prefill forward kernel (``triton_tapa._tapa_fwd_kernel``)
with the split-K layout of :class:`~hf_posenc.kernels._triton.layout.ForwardLayout` (a whole GQA group's query rows packed
into one 16-row tile, so each K/V block is read once per kv head; the key axis split across programs, the partials
merged by the shared split-combine kernel), its lazy rescaling off (`lazy_max`).

This module holds the decode tile per target, the layout, the buffers and the combine launch; the forward
kernel's arguments come from the op's ``_forward_spec``, handed in by ``triton_tapa.plan_forward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._triton.combine import plan_split_combine
from .._triton.launch import LaunchSpec, Target
from .._triton.layout import INTERPRETER_TILE, ForwardLayout, Tile, table_row
from .args import TapaArgs

# GPU decode tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per architecture and row-width bucket
# (`triton_tapa.row_width`), chosen offline by benchmarks/tune_tiles.py --kernel decode as the other tables are: no
# register spills at head dims <= 128, shared memory within the limit, fewest issued instructions per score element.
# sm_90 at widths 64 and 128: measured instead on an H100 (benchmarks/tune_decode.py, kernel time over 1k-16k keys:
# a decode kernel waits on memory, which instruction counts do not see): three stages, 3.5% and 10% faster than the
# static choice (16, 128, 4, 2) and (16, 64, 4, 1); 16% at 16k keys, D = 128.
_TILES = {
    "sm90": {64: (16, 64, 4, 3), 128: (16, 64, 4, 3), 256: (16, 64, 4, 1)},
    "sm80": {64: (16, 128, 4, 2), 128: (16, 128, 4, 2), 256: (16, 64, 4, 1)},
    "fp32": {64: (16, 64, 4, 1), 128: (16, 32, 4, 1), 256: (16, 16, 4, 1)},  # fp32 inputs: `table_row`
}

# (launch name, layout, tile, O or its partials, LSE or its partials) -> the forward kernel's launch
ForwardSpec = Callable[[str, ForwardLayout, Tile, torch.Tensor, torch.Tensor], LaunchSpec]


def tile(target: Target, width: int, itemsize: int = 2) -> Tile:
    """Decode tile for a target and padded row width (buckets up to 64, up to 128, larger; the sm_90 table for
    Hopper and newer, the sm_80 table otherwise, the fp32 table for fp32 inputs); 16 × 16 in the interpreter."""
    if target.interpreter:
        return INTERPRETER_TILE
    return Tile(*table_row(_TILES, target, width, itemsize))


def plan_decode(q: torch.Tensor, k: torch.Tensor, args: TapaArgs, target: Target, width: int,
                forward: ForwardSpec) -> tuple[list[LaunchSpec], torch.Tensor, torch.Tensor]:
    """Launch plan of a decode forward: (specs, O [B, Hq, Lq, D], LSE [B, Hq, Lq] base 2, +inf for rows without
    a visible key): the forward launch "tapa_decode", then the split combine when the keys are split."""
    B, H, Lq, D = q.shape
    t = tile(target, width, q.element_size())
    layout = ForwardLayout.split_k(target, B, k.shape[1], args.group, Lq, k.shape[2], t)
    o = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    if layout.splits == 1:
        return [forward("tapa_decode", layout, t, o, lse)], o, lse
    o_parts = torch.empty((B, H, layout.splits, Lq, D), dtype=torch.float32, device=q.device)
    lse_parts = torch.empty((B, H, layout.splits, Lq), dtype=torch.float32, device=q.device)
    fwd = forward("tapa_decode", layout, t, o_parts, lse_parts)
    return [fwd, plan_split_combine(o_parts, lse_parts, o, lse)], o, lse
