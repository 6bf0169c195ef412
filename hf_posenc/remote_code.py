"""Remote code written into every patched checkpoint, so ``from_pretrained(path, trust_remote_code=True)`` loads it
where hf-posenc is not installed.

The files are hf-posenc's own modules (the scheme configs, the rope types, the TAPA reference, the TAPE modules,
the patched classes), copied as they are with their relative imports flattened to the one folder Transformers'
dynamic modules use, plus a small entry module per model family that ``auto_map`` points to. Nothing is
generated from templates: what runs remotely is the code the package runs, minus the Triton kernels (the remote
code uses the readable references).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .patches import family_for
from .patches.base import register_publisher
from .record import LIBRARY_VERSION

PACKAGE = "hf_posenc"
ENTRY = "hf_posenc_remote"
# The package modules the remote code needs (closed under their relative imports; checked when writing).
BUNDLE = (
    "record", "schemes", "schemes.base", "schemes.masks", "schemes.cope", "schemes.prope", "schemes.rope",
    "schemes.tapa", "schemes.tape", "patches.base", "kernels.tapa.naive", "kernels.tapa.chunked",
    "kernels.cpu_parallel",
)
_RELATIVE = re.compile(r"^(?P<indent>\s*)from\s+(?P<dots>\.+)(?P<rest>[\w.]*)\s+import\s+(?P<names>.+)$")
_ROOT = Path(__file__).parent


def flat_name(module: str) -> str:
    return f"{PACKAGE}_{module.replace('.', '_')}"


def _source(module: str) -> tuple[str, bool]:
    path = _ROOT / Path(*module.split("."))
    if path.is_dir():
        return (path / "__init__.py").read_text(), True
    return path.with_suffix(".py").read_text(), False


def _flatten_imports(source: str, module: str, is_package: bool) -> str:
    """Rewrite ``from .x import y`` / ``from ..x import y`` to ``from .hf_posenc_<x> import y``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    lines = []
    for line in source.splitlines():
        match = _RELATIVE.match(line)
        if match:
            up = len(match["dots"]) - 1
            base = package[: len(package) - up] if up else package
            target = ".".join(base + ([match["rest"]] if match["rest"] else []))
            if target not in BUNDLE:
                raise RuntimeError(f"remote code: {module} imports {target!r}, which is not in the bundle.")
            line = f"{match['indent']}from .{flat_name(target)} import {match['names']}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _entry(family: Any) -> str:
    config_cls, model_cls = family.stock_config_class.__name__, family.stock_model_class.__name__
    prefix = family.config_class.__name__.removesuffix("PosencConfig")
    config_mod, model_mod = family.stock_config_class.__module__, family.stock_model_class.__module__
    return f'''"""Loads this hf-posenc checkpoint without hf-posenc installed:
``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``.

Written by hf-posenc {LIBRARY_VERSION}; the other ``{PACKAGE}_*.py`` files are its modules, copied unchanged apart from
flattened imports. With hf-posenc installed, ``import hf_posenc`` loads the checkpoint without remote code.
"""

from {config_mod} import {config_cls}
from {model_mod} import {model_cls}

from .{flat_name("patches.base")} import make_family
from .{flat_name("schemes.cope")} import register_rope_types
from .{flat_name("schemes.tapa")} import register_tapa_attention
from .{flat_name("schemes.tape")} import register_tape_attention

register_rope_types()
register_tapa_attention()
register_tape_attention()

_FAMILY = make_family({config_cls}, {model_cls}, __name__, name_prefix={prefix!r})
{family.config_class.__name__} = _FAMILY.config_class
{family.model_class.__name__} = _FAMILY.model_class
'''


def write_remote_code(directory: str | os.PathLike, family: Any) -> dict[str, str]:
    """Write the remote-code files into ``directory`` and add ``auto_map`` to its ``config.json``."""
    directory = Path(directory)
    for module in BUNDLE:
        source, is_package = _source(module)
        header = f"# hf-posenc {LIBRARY_VERSION}: {PACKAGE}/{module.replace('.', '/')}{'/__init__' if is_package else ''}.py\n"
        (directory / f"{flat_name(module)}.py").write_text(header + _flatten_imports(source, module, is_package))
    (directory / f"{ENTRY}.py").write_text(_entry(family))
    auto_map = {
        "AutoConfig": f"{ENTRY}.{family.config_class.__name__}",
        "AutoModelForCausalLM": f"{ENTRY}.{family.model_class.__name__}",
    }
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return auto_map


def _write_for(directory: str | os.PathLike, config: Any) -> None:
    write_remote_code(directory, family_for(config.model_type))


register_publisher("remote_code", _write_for)
