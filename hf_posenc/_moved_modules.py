"""Module names kept for one release after a rename, each an alias module that :func:`alias` turns into the new one.

An import by the old name yields the very module of the new name (objects imported by either name are identical;
pickles naming the old path still load) and warns with a ``FutureWarning`` at the importing line. No module of
the package imports an old name.
"""

from __future__ import annotations

import importlib
import sys
import warnings

MOVED = {"hf_posenc.patches": "hf_posenc.families", "hf_posenc.layers": "hf_posenc.decoder_layers"}  # old -> new
SUBMODULES = {"hf_posenc.patches": ("base", "derive", "table")}  # the old package's submodules, aliased as well


def message(old: str) -> str:
    return f"{old} is now {MOVED[old]}; the old name will be removed"


def alias(old: str) -> None:
    """Called by the alias module ``old`` as it is imported: warn its importer, then make ``old`` (and its
    :data:`SUBMODULES`) resolve to the new modules in ``sys.modules``."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals.get("__name__", "") in MOVED
                                 or frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib"))):
        frame = frame.f_back  # past the alias module and the import machinery, to the code that imports it
    if frame is not None:
        warnings.warn_explicit(message(old), FutureWarning, frame.f_code.co_filename, frame.f_lineno,
                               module=frame.f_globals.get("__name__"),
                               registry=frame.f_globals.setdefault("__warningregistry__", {}))
    new = MOVED[old]
    for name in SUBMODULES.get(old, ()):  # by module name: a package's attribute may shadow it (families.derive)
        sys.modules[f"{old}.{name}"] = importlib.import_module(f"{new}.{name}")
    sys.modules[old] = importlib.import_module(new)
