"""Remote code written into every patched checkpoint, so ``from_pretrained(path, trust_remote_code=True)`` loads it
where hf-posenc is not installed.

The files are hf-posenc's own modules, copied as they are, with their relative imports pointed at the one flat
folder Transformers' dynamic modules use, plus a small entry module per model family that ``auto_map`` points to.
Which modules travel is derived, not listed: the patched classes (``families.base``) and the package of every
registered scheme of hf-posenc (:data:`hf_posenc.schemes.REGISTRY`), closed under their relative imports (read with
``ast``). A scheme registered from outside (another package, or a script or notebook whose module is ``__main__``
and has no package) does not travel: its checkpoints save like any other and load where its module is imported.
The modules left out are declared in :data:`OPTIONAL` (the Triton kernels): they are imported only inside ``try``
(Transformers' rule for custom code: an import there may fail), point at the installed hf-posenc, and without it
the remote code runs the readable references. An optional module imported outside ``try``, or a ``try`` import
of a module not declared, is refused when the bundle is built.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .families import family_for
from .families.base import register_publisher
from .record import LIBRARY_VERSION
from .schemes import REGISTRY

PACKAGE = "hf_posenc"
# Modules the remote code leaves out: the kernel packages' dispatchers, which import the Triton kernels (their
# readable and CPU submodules travel). Imported inside ``try`` only, from the installed package.
OPTIONAL = ("kernels.tapa", "kernels.tape")
ENTRY = "hf_posenc_remote"
_ROOT = Path(__file__).parent
_FROM = re.compile(r"from\s+\.+[\w.]*\s+import")  # the head of one located ``from .x import`` statement


def flat_name(module: str) -> str:
    """``schemes.tapa.config`` → ``hf_posenc_schemes_tapa_config`` (the file name in the checkpoint)."""
    return f"{PACKAGE}_{module.replace('.', '_')}"


def _path(module: str) -> tuple[Path, bool]:
    path = _ROOT / Path(*module.split("."))
    return (path / "__init__.py", True) if path.is_dir() else (path.with_suffix(".py"), False)


@dataclass(frozen=True)
class _Import:
    node: ast.ImportFrom
    target: str  # the imported module, relative to the package root
    optional: bool  # inside ``try``: may be missing where the remote code runs


def _relative_imports(module: str) -> tuple[_Import, ...]:
    """The relative ``from … import`` statements of a package module, resolved; anything else that imports
    hf-posenc (absolute imports, ``from . import submodule``) is refused, since it could not be flattened."""
    path, is_package = _path(module)
    return _imports_in(module, path, path.read_text(), is_package)


@functools.lru_cache(maxsize=None)
def _imports_in(module: str, path: Path, source: str, is_package: bool) -> tuple[_Import, ...]:
    """:func:`_relative_imports` of one version of a module's source. Cached by the file and its source: every
    ``save_pretrained`` of a patched model bundles the same modules, and parsing them (about a second of one core
    for the whole bundle) would otherwise be most of a small model's save; an edited file is parsed anew. (The
    ``from . import`` refusal also looks for the named submodule's file: one added later to a package whose
    ``__init__`` is unchanged is seen by the next process.)"""
    tree = ast.parse(source, filename=str(path))
    package = module.split(".") if is_package else module.split(".")[:-1]
    in_try = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for s in t.body for n in ast.walk(s)}
    found: list[_Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
            raise RuntimeError(f"remote code: {path.name}:{node.lineno} imports {PACKAGE} absolutely; use a relative "
                               "import.")
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0:
            if (node.module or "").split(".")[0] == PACKAGE:
                raise RuntimeError(f"remote code: {path.name}:{node.lineno} imports {node.module} absolutely; "
                                   "use a relative import.")
            continue
        base = package[: len(package) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
        if node.module is None and any(_path(f"{target}.{a.name}".lstrip("."))[0].exists() for a in node.names):
            raise RuntimeError(f"remote code: {path.name}:{node.lineno} imports a submodule with `from . import`;"
                               " write `from .<submodule> import <names>`.")
        optional = target in OPTIONAL
        if optional != (id(node) in in_try):
            raise RuntimeError(
                f"remote code: {path.name}:{node.lineno} imports {target!r} "
                + ("outside `try`, but it is declared optional (remote_code.OPTIONAL): import it inside `try`."
                   if optional else "inside `try`: declare it in remote_code.OPTIONAL to leave it out of the "
                   "remote code, or import it outside `try` to bundle it.")
            )
        found.append(_Import(node, target, optional))
    return tuple(found)


def bundle(roots: list[str] | None = None) -> tuple[str, ...]:
    """The modules the remote code carries: ``roots`` (default: ``families.base`` and every registered hf-posenc
    scheme's package) and every module they import, except the :data:`OPTIONAL` ones."""
    if roots is None:
        roots = ["families.base"] + [s.package.removeprefix(f"{PACKAGE}.") for s in REGISTRY.values()
                                    if s.package.startswith(f"{PACKAGE}.")]
    seen: dict[str, None] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen[module] = None
        todo += [imp.target for imp in _relative_imports(module) if not imp.optional]
    return tuple(sorted(seen))


def _flattened(module: str, modules: tuple[str, ...]) -> str:
    """The module's source with each relative import pointing at its flat file (``from .hf_posenc_x import``), or, for
    an optional import of a module that does not travel, at the installed package (``from hf_posenc.x import``)."""
    path, _ = _path(module)
    lines = path.read_text().splitlines()
    for imp in _relative_imports(module):
        row = imp.node.lineno - 1
        head = _FROM.match(lines[row], imp.node.col_offset)
        if head is None:
            raise RuntimeError(f"remote code: cannot locate the import at {path.name}:{imp.node.lineno}.")
        if imp.target in modules:
            new = f"from .{flat_name(imp.target)} import"
        elif imp.optional:
            new = f"from {PACKAGE}.{imp.target} import"
        else:
            raise RuntimeError(f"remote code: {module} imports {imp.target!r}, which is not bundled.")
        lines[row] = lines[row][: head.start()] + new + lines[row][head.end():]
    return "\n".join(lines) + "\n"


def _entry(family: Any) -> str:
    config_cls, model_cls = family.stock_config_class.__name__, family.stock_model_class.__name__
    prefix = family.config_class.__name__.removesuffix("PosencConfig")
    config_mod, model_mod = family.stock_config_class.__module__, family.stock_model_class.__module__
    return f'''"""Loads this hf-posenc checkpoint without hf-posenc installed:
``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``.

Written by hf-posenc {LIBRARY_VERSION}; the other ``{PACKAGE}_*.py`` files are its modules, copied unchanged apart from
their imports. With hf-posenc installed, ``import hf_posenc`` loads the checkpoint without remote code.
"""

from {config_mod} import {config_cls}
from {model_mod} import {model_cls}

from .{flat_name("families.base")} import make_family
from .{flat_name("schemes")} import register_with_transformers

register_with_transformers()

_FAMILY = make_family({config_cls}, {model_cls}, __name__, name_prefix={prefix!r})
{family.config_class.__name__} = _FAMILY.config_class
{family.model_class.__name__} = _FAMILY.model_class
'''


def write_remote_code(directory: str | os.PathLike, family: Any) -> dict[str, str]:
    """Write the remote-code files into ``directory`` and add ``auto_map`` to its ``config.json``."""
    directory = Path(directory)
    modules = bundle()
    for module in modules:
        _, is_package = _path(module)
        header = f"# hf-posenc {LIBRARY_VERSION}: {PACKAGE}/{module.replace('.', '/')}{'/__init__' if is_package else ''}.py\n"
        (directory / f"{flat_name(module)}.py").write_text(header + _flattened(module, modules))
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
