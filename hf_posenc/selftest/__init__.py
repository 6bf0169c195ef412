"""Selftest for a user's machine: every TAPA/TAPE kernel against its readable reference, then TAPA and
TAPE attention timed against RoPE attention through SDPA's flash backend (`hf-posenc selftest`).

```python
from hf_posenc.selftest import run_selftest
report = run_selftest()                 # CUDA when available, else CPU through the Triton interpreter
print(report.format()); assert report.passed, report.failures
```

Each scheme with kernels names its cases, kernels and timing in its kernel package (``SchemeConfig.selftest``:
``hf_posenc/kernels/tapa/selftest.py``, ``kernels/tape/selftest.py``); the timing code is the one
`benchmarks/tapa_attention.py` and `benchmarks/tape_attention.py` run. Importing this package imports no kernel
(see `environment.py`).
"""

from .checks import TOLERANCES, CheckCase, CheckResult
from .report import SelftestReport, TimingRow
from .runner import run_selftest

__all__ = ["TOLERANCES", "CheckCase", "CheckResult", "SelftestReport", "TimingRow", "run_selftest"]
