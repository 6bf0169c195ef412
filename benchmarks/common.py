"""Helpers shared by the benchmark scripts: device naming, timing with medians, JSON output."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

RESULTS = Path(__file__).parent / "results"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {name} ({torch.get_num_threads()} threads)"


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:60]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 2):
    """Median seconds per call of each function, measured round-robin so drift hits every candidate alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}, samples


def write_results(stem: str, device: torch.device, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = device_name(device)
    path = RESULTS / f"{stem}-{slug(name)}.json"
    path.write_text(json.dumps({"device": name, "torch": torch.__version__, **payload}, indent=2))
    return path
