"""Development tooling for the kernels, imported by no code path of the library (the test suite and the benchmarks
use it): ``compile_lane`` compiles every launch the kernels' host code plans for A100 (sm_80) and H100 (sm_90)
on a machine without a GPU (``python -m hf_posenc.kernels.dev.compile_lane``), ``binaries`` compiles one planned
launch and reads registers, spills, shared memory and SASS from the binary with the tools the Triton wheel bundles."""
