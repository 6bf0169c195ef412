"""Shared test setup.

Triton kernels run under the interpreter on machines without a GPU. The variable must be set before any
kernel module is imported, which is why it lives here, at the top of the first file pytest imports.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
