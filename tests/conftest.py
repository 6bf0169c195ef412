"""Shared test setup.

Triton kernels run under the interpreter on machines without a GPU. The variable must be set before any
kernel module is imported, which is why it lives here, at the top of the first file pytest imports.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Each pytest-xdist worker runs single-threaded, and so do the processes its tests start (OMP_NUM_THREADS): two
# workers on 2 cores with torch's default of one thread per core oversubscribe the cores, and OpenMP's waiting
# threads then make a small model's operations many times slower (measured here: a toy experiment took 412 s with
# torch's default beside a busy core, 31 s single-threaded).
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# The suite builds many small models with flex_attention; each shape is one more compilation.
torch._dynamo.config.recompile_limit = 256
torch._dynamo.config.accumulated_recompile_limit = 4096


# The longest test files first (each 2 to 17 minutes of one core, measured on 2 cores on 2026-12-03): scripts/test.sh
# hands whole files to two pytest-xdist workers in collection order (--no-loadscope-reorder; xdist's own order, most
# tests first, would leave a long file of few tests to run alone at the end while the other worker idles). Order
# inside each file is kept; the files' own order does not matter to any test. Only the workers sort (the order they
# collect is the order xdist schedules): a run in one process keeps the order its command line gives, which the
# mutation check relies on (a cheap test listed first ends a run under -x before a long one starts).
LONGEST_FIRST = ("test_distributed.py", "test_experiments.py", "test_training.py", "test_serving_llamacpp.py",
                 "test_tapa_kernel.py", "test_tape.py", "test_serving_vllm.py", "test_families.py",
                 "test_tape_kernel.py", "test_real_model.py", "test_static_cache.py", "test_compile_lane.py",
                 "test_sequence_parallel.py")


def pytest_collection_modifyitems(session, config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files and tests keep their order
