"""Attention kernels, the bottom layer (imports nothing else of hf-posenc): per op a package (``tapa``, ``tape``)
with its arguments (``args.py``: the options, their checks and the op's signature, ``tapa_op`` / ``tape_op``), the
readable reference (``naive.py``: the equations, the specification every fast path is tested against), the fast paths
(Triton kernels ``triton_*.py``, whose split-K decode plan lives in ``decode.py``; TAPA's chunked CPU path
``chunked.py``, TAPE's SDPA fold ``sdpa.py``) and a dispatcher (TAPA's in ``dispatch.py``, which checkpoint remote
code carries; TAPE's in its ``__init__``), with ``LANE_FAMILIES`` in its ``__init__`` (what the compile lane compiles); ``_triton/`` holds what the Triton kernels share, one module per concern (``launch``:
targets and launch plans with their ``triton.heuristics``-derived constexprs; ``layout``: tiles, forward layouts
and the decode threshold; ``fastmath``; ``blocks``: tile loads, block schedules, the online-softmax step;
``combine``: the split-K combine and row-dot kernels), ``cpu_parallel.py`` the CPU paths' thread pool. ``dev/`` is
development tooling that no code path of the library imports: the compile lane (``dev/compile_lane.py``, every
planned launch compiled for A100/H100 without a GPU) and reading the binaries (``dev/binaries.py``).
Triton is optional: without it ``kernels.tapa`` / ``kernels.tape`` keep their CPU paths and their Triton entry
points raise an ImportError that says how to install it."""
