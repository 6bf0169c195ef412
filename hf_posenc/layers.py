"""Deprecated alias, kept for one release: finding decoder layers moved to :mod:`hf_posenc.decoder_layers`.

``hf_posenc.layers`` is :mod:`hf_posenc.decoder_layers` under the old name; importing it warns (see
:mod:`hf_posenc._moved_modules`).
"""

from . import decoder_layers  # noqa: F401  (the module this name now stands for)
from ._moved_modules import alias

alias(__name__)
