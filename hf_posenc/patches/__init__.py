"""Deprecated alias, kept for one release: the model families moved to :mod:`hf_posenc.families`.

``hf_posenc.patches`` and its submodules ``.base``, ``.derive``, ``.table`` are the modules of
:mod:`hf_posenc.families` under the old name; importing them warns (see :mod:`hf_posenc._moved_modules`).
"""

from .. import families  # noqa: F401  (the module this name now stands for)
from .._moved_modules import alias

alias(__name__)
