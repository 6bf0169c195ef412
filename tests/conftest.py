"""Shared test setup.

Triton kernels run under the interpreter on machines without a GPU. The variable must be set before any
kernel module is imported, which is why it lives here, at the top of the first file pytest imports.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite builds many small models with flex_attention; each shape is one more compilation.
torch._dynamo.config.recompile_limit = 256
torch._dynamo.config.accumulated_recompile_limit = 4096
