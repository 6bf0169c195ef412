"""Helpers shared by the benchmark scripts: device naming, timing with medians, JSON output.

Device naming and timing live in the package (`hf_posenc.selftest`), so the benchmarks and
`hf-posenc selftest` measure with the same code. Importing this module imports hf_posenc, and with it
Triton: a script that needs the Triton interpreter sets TRITON_INTERPRET=1 before importing it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hf_posenc.selftest.environment import device_name, slug
from hf_posenc.kernels.timing import sync, time_interleaved

RESULTS = Path(__file__).parent / "results"

__all__ = ["RESULTS", "device_name", "slug", "sync", "time_interleaved", "write_results"]


def write_results(stem: str, device: torch.device, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = device_name(device)
    path = RESULTS / f"{stem}-{slug(name)}.json"
    path.write_text(json.dumps({"device": name, "torch": torch.__version__, **payload}, indent=2))
    return path
