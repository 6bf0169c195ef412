"""``python -m hf_posenc_cli``: the ``hf-posenc`` command."""

import sys

from . import main

sys.exit(main())
