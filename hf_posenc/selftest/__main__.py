"""`python -m hf_posenc.selftest`: the same command as `hf-posenc selftest`."""

import sys

from .cli import main

sys.exit(main())
