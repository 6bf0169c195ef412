"""Attention kernels, the bottom layer (imports nothing else of hf-posenc): per op a package (``tapa``, ``tape``)
with its arguments (``args.py``: the options, their checks and the op's signature, ``tapa_op`` / ``tape_op``), the
readable reference (``naive.py``: the equations, the specification every fast path is tested against), the fast paths
(Triton kernels ``triton_*.py``, whose split-K decode plan lives in ``decode.py``; TAPA's chunked CPU path
``chunked.py``, TAPE's SDPA fold ``sdpa.py``) and a dispatcher in its ``__init__`` (and ``LANE_FAMILIES``, what
the compile lane compiles); ``_triton.py`` holds what the Triton kernels share (targets, launch plans with their
``triton.heuristics``-derived constexprs, forward layouts and the decode threshold, fast-math helpers, tile loads,
the online-softmax step, split-K combine, resource readers), ``compile_lane.py`` compiles every planned launch for
A100/H100 without a GPU, ``cpu_parallel.py`` the CPU paths' thread pool.
Triton is optional: without it ``kernels.tapa`` / ``kernels.tape`` keep their CPU paths and their Triton entry
points raise an ImportError that says how to install it."""
