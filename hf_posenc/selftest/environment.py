"""Where the selftest runs: device naming, library versions, and the Triton interpreter switch.

Triton decides between compiling and interpreting its kernels when `triton` is first imported
(`import hf_posenc` already imports it through Transformers), so TRITON_INTERPRET=1 cannot be turned on
later in the same process. On CPU the selftest therefore runs in a process started with the variable set:
`hf-posenc selftest` and `run_selftest` re-execute themselves when it is missing (see `needs_fresh_process`).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import torch


def device_name(device: torch.device) -> str:
    """The GPU's name, or "CPU: <model name> (<threads> threads)"."""
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
    """A file-name-safe lower-case form of a device name (at most 60 characters)."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:60]


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` picks CUDA when available, else CPU. Raises ValueError for other device types."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"the selftest runs on 'cuda' or 'cpu', got {str(device)!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA GPU; use --device cpu for the "
                         "interpreter run, or install a CUDA build of torch")
    return dev


def needs_fresh_process(device: torch.device) -> bool:
    """True when this process cannot run the kernels the way `device` needs and a fresh one must.

    On CPU the kernels need the interpreter; without TRITON_INTERPRET=1 set at process start they were (or
    will be) built for compilation. Raises ValueError on CUDA with the interpreter switched on: the
    selftest must check the compiled kernels, so TRITON_INTERPRET has to be unset."""
    if device.type == "cuda":
        if interpreting():
            raise ValueError("TRITON_INTERPRET=1 is set, so the Triton kernels would run in the interpreter "
                             "instead of compiling for the GPU; unset it (or use --device cpu)")
        return False
    return not interpreting()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of the pieces the kernels depend on (None where absent)."""
    from .. import __version__

    capability = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        capability = f"sm_{major}{minor}"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "hf_posenc": __version__,
        "cuda": torch.version.cuda,
        "compute_capability": capability,
        "platform": f"{platform.system()} {platform.machine()}",
        "executable": sys.executable,
    }
