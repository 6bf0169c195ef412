"""Compiling a planned launch for a GPU that is not there, and reading the binary (development tooling: the compile
lane and the benchmarks use it; no code path of the library imports it).

:func:`compile_inputs` derives the kernel signature, constexprs and specialisation attributes through Triton's own
argument binder, so what :func:`compile_spec` compiles is what ``kernel[grid](...)`` would compile on that GPU;
:func:`resources` and :func:`sass` read the binary with the tools the Triton wheel bundles (``cuobjdump``,
``nvdisasm``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import triton

from .._triton.launch import LaunchSpec


def _tool(name: str) -> str:
    from triton.backends.nvidia import compiler as nvidia

    path = os.path.join(os.path.dirname(nvidia.__file__), "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} not found at {path}: the Triton wheel ships it under "
                                "triton/backends/nvidia/bin (reinstall triton)")
    return path


def compile_inputs(spec: LaunchSpec, arch: int) -> tuple[Any, dict, Any]:
    """(ASTSource, options dict, GPUTarget) exactly as `spec.launch()` would build them on an sm_<arch> device:
    signature, constexprs and divisibility attributes come from Triton's own argument binder over
    `spec.all_args` (planned arguments and the constexprs the kernel's heuristics derive; pointers of the planned
    tensors, which the lane allocates on the meta device, count as 16-byte aligned)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    kernel = spec.jit
    if not isinstance(kernel, JITFunction):
        raise TypeError(f"{spec.name}: {type(kernel).__name__} cannot be compiled for a GPU; unset "
                        "TRITON_INTERPRET before importing the kernels")
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(num_warps=spec.num_warps, num_stages=spec.num_stages)
    kwargs["debug"] = kernel.debug or knobs.runtime.debug
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # as JITFunction.run passes them (3.6 has one)
        if hasattr(knobs.compilation, knob):
            kwargs[knob] = getattr(knobs.compilation, knob)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    args = spec.all_args
    bound_args, specialization, _ = binder(*[args[n] for n in kernel.arg_names], **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, kwargs)
    return ASTSource(kernel, signature, constexprs, attrs), options.__dict__, target


def compile_spec(spec: LaunchSpec, arch: int) -> Any:
    """Compile one planned launch for sm_<arch> (PTX and cubin via the bundled ptxas; no GPU needed).
    Binaries are cached by Triton under TRITON_CACHE_DIR, keyed by the kernel source and options."""
    src, options, target = compile_inputs(spec, arch)
    return triton.compile(src, target=target, options=options)


@dataclass(frozen=True)
class Resources:
    """Per-thread registers, spill memory (local/stack bytes) and shared memory of one compiled kernel."""

    registers: int
    stack: int
    local: int
    shared: int  # bytes the launch requests (Triton's metadata.shared), checked against SHARED_LIMIT

    @property
    def spills(self) -> int:
        return self.stack + self.local


def _write_cubin(compiled: Any, directory: str) -> str:
    path = os.path.join(directory, f"{compiled.metadata.name}.cubin")
    with open(path, "wb") as fh:
        fh.write(compiled.asm["cubin"])
    return path


def resources(compiled: Any) -> Resources:
    """Read registers / STACK / LOCAL with the bundled `cuobjdump -res-usage`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_cubin(compiled, tmp)
        out = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"Function\s+(\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:\d+\s+LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"could not parse cuobjdump -res-usage output:\n{out}")
    return Resources(int(m.group(2)), int(m.group(3)), int(m.group(4)), int(compiled.metadata.shared))


def sass(compiled: Any) -> str:
    """SASS of the compiled kernel (bundled nvdisasm)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_cubin(compiled, tmp)
        return subprocess.run([_tool("nvdisasm"), "-c", path], capture_output=True, text=True, check=True).stdout
