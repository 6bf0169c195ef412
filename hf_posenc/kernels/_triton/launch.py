"""Launch planning shared by the kernel families.

One source of truth for launches: a family's host code *plans* every kernel launch as a :class:`LaunchSpec`
(kernel, grid, every argument by name, num_warps, num_stages) for a :class:`Target`, and the real launcher runs
exactly those specs. Constexprs that are pure functions of other arguments (padded tile widths, padding masks,
the dot precision of the input dtype) are not planned: the kernels declare them with ``triton.heuristics``, and
:class:`LaunchSpec` evaluates those same rules, so a spec knows every value a launch binds. The compile lane
(``hf_posenc.kernels.dev.compile_lane``) plans the same calls on ``meta`` tensors for an A100 / H100 target and
compiles each spec with :func:`~hf_posenc.kernels.dev.binaries.compile_spec`, which derives the kernel signature,
constexprs and specialisation attributes through Triton's own argument binder, so what is compiled there is what
``kernel[grid](...)`` would compile on that GPU.

fp32 inputs: kernels pass ``input_precision="ieee"`` for fp32 tensors, so their dots run on the FMA units, not
the tensor cores (exact to fp32 accumulation, several times slower); bf16/fp16 inputs take the tensor cores
(``mma``/``wgmma`` with fp32 accumulation). Use bf16/fp16 on GPUs for speed.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
import triton
from triton.runtime.autotuner import Heuristics

# largest dynamic shared memory one block may use (cudaDevAttrMaxSharedMemoryPerBlockOptin): Triton's launcher
# refuses a kernel above it ("out of resources: shared memory")
SHARED_LIMIT = {80: 166912, 90: 232448}
SM_COUNT = {80: 108, 90: 132}  # A100-SXM / H100-SXM, for split-K planning in the lane


# the compile lane fails a kernel that spills registers at head dims up to this (larger ones may spill)
SPILL_FREE_MAX_HEAD_DIM = 128


def interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter (TRITON_INTERPRET=1, read at kernel import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def pow2(n: int, lo: int = 16) -> int:
    """Next power of two >= n, at least `lo` (tile extents must be powers of two; dots need >= 16). Host ints."""
    return max(lo, 1 << (n - 1).bit_length() if n >= 1 else triton.next_power_of_2(n))  # as triton's, no call cost


@dataclass(frozen=True)
class Target:
    """What the host code plans launches for: a CUDA architecture (80 = A100, 90 = H100) or the interpreter."""

    arch: int | None  # compute capability major * 10 + minor; None = Triton's CPU interpreter
    sm_count: int

    @property
    def interpreter(self) -> bool:
        return self.arch is None

    @property
    def fast_math(self) -> bool:
        """Approximate special-function instructions: CUDA only (the interpreter has no inline assembly). fp32
        inputs too: on an H200 their worst selftest error was the same with the accurate routines (4.2e-4 against
        3.6e-4), the fp32 rounding of TAPA's phase argument, which the readable reference in fp32 shares."""
        return self.arch is not None

    @property
    def hopper(self) -> bool:
        return self.arch is not None and self.arch >= 90

    @classmethod
    def gpu(cls, arch: int) -> "Target":
        """The lane's stand-in for a real device of that architecture."""
        if arch not in SM_COUNT:
            raise ValueError(f"no compile-lane target for sm_{arch}; known: {sorted(SM_COUNT)}")
        return cls(arch, SM_COUNT[arch])

    @classmethod
    def of(cls, t: torch.Tensor) -> "Target":
        """The target a launch on tensor `t` runs on (the interpreter when TRITON_INTERPRET=1)."""
        if interpreting():
            return INTERPRETER
        if t.device.type != "cuda":
            raise ValueError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got a {t.device} tensor")
        return _cuda_target(t.device.index if t.device.index is not None else torch.cuda.current_device())


INTERPRETER = Target(None, 4)


@lru_cache(maxsize=None)
def _cuda_target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    return Target(props.major * 10 + props.minor, props.multi_processor_count)


Rule = Callable[[dict[str, Any]], Any]  # a triton.heuristics rule: launch arguments by name -> one constexpr


def unwrap_heuristics(kernel: Any) -> tuple[Any, dict[str, Rule]]:
    """(the JIT function under any ``triton.heuristics`` wrappers, their rules in the order Triton applies them
    at launch: the outermost wrapper's first, each rule in its dict's order, each seeing the values before it)."""
    rules: dict[str, Rule] = {}
    while isinstance(kernel, Heuristics):
        rules.update(kernel.values)
        kernel = kernel.fn
    return kernel, rules


@dataclass
class LaunchSpec:
    """One planned kernel launch: every kernel parameter by name (tensors, ints, floats and constexprs) except
    the constexprs the kernel derives with ``triton.heuristics``; those are evaluated here from `args` by the
    kernel's own rules, as Triton evaluates them when :meth:`launch` runs the kernel, into `derived`
    (`all_args` = what the launch binds, which the compile lane compiles).

    Planning runs on every call of an op (decode calls are host-bound), so what does not change between calls is
    read once per kernel: its parameters (`kernel_info`) and the check of each list of planned names
    (`check_arg_names`). No tensor is kept from call to call."""

    name: str
    kernel: Any  # triton JITFunction (InterpretedFunction under TRITON_INTERPRET=1), maybe in triton.heuristics
    grid: tuple[int, ...]
    args: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 1
    jit: Any = field(default=None, init=False)  # `kernel` without its heuristics wrappers
    derived: dict[str, Any] = field(default_factory=dict, init=False)
    constexpr_names: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        # unwrap the heuristics and check the planned names against the kernel's parameters (once per kernel and
        # list of names: KernelInfo), evaluate the rules
        info = kernel_info(self.kernel)
        check_arg_names(self.name, info, self.args)
        self.jit, self.constexpr_names = info.jit, info.constexpr_names
        # what Heuristics.run hands each rule: the launch's keyword arguments plus the values derived before it
        self.derived = derive_constexprs(info, self.args, self.launch_options())

    def launch_options(self) -> dict[str, Any]:
        """The launch's own keywords, which Triton hands the heuristics rules beside the arguments."""
        return dict(grid=self.grid, warmup=False, num_warps=self.num_warps, num_stages=self.num_stages)

    def launch(self) -> None:
        if any(g <= 0 for g in self.grid):
            return
        # the JIT function itself with the derived constexprs evaluated once, in __post_init__ (going through the
        # heuristics wrapper would evaluate every rule again on each launch)
        self.jit[self.grid](**self.all_args, num_warps=self.num_warps, num_stages=self.num_stages)

    @property
    def all_args(self) -> dict[str, Any]:
        """Every kernel parameter as the launch binds it: the planned arguments and the derived constexprs."""
        return {**self.args, **self.derived}

    @property
    def constexprs(self) -> dict[str, Any]:
        values = self.all_args
        return {n: values[n] for n in self.constexpr_names}


def padded_widths(**widths: str) -> dict[str, Rule]:
    """``triton.heuristics`` rules for padded tile extents: ``padded_widths(BDA="DA")`` derives BDA = pow2(DA)
    from the launch's DA (a constexpr or a runtime int)."""
    return {name: (lambda a, w=width: pow2(a[w])) for name, width in widths.items()}


def dot_precision(t: torch.Tensor) -> str:
    """``input_precision`` of a kernel's dots on this input: exact fp32 ("ieee", FMA units) for fp32 tensors;
    16-bit inputs take the tensor cores (where the flag is ignored)."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def jit_runtime_ints(*names: str):
    """`triton.jit` that does not specialise the named integer parameters (those a kernel has): shapes and
    windows change from call to call, so one binary serves them all (no `== 1` / `% 16` variants), which is
    also what makes the compile lane's binaries the ones every call uses."""

    def wrap(fn):
        params = inspect.signature(fn).parameters
        return triton.jit(do_not_specialize=[n for n in names if n in params])(fn)

    return wrap


def launch_all(specs: list[LaunchSpec]) -> None:
    for spec in specs:
        spec.launch()


# ----------------------------------------------------------------------------------------------------
# Planning on every call, cheaply: what `LaunchSpec` reads once per kernel
# ----------------------------------------------------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host integers: ``triton.cdiv`` without its ``constexpr_function`` call overhead (planning
    runs on every call, and decode calls are host-bound)."""
    return -(-a // b)


@dataclass(frozen=True, eq=False)
class KernelInfo:
    """What planning a launch reads of a kernel object (`kernel_info`): the JIT function under its heuristics
    wrappers, their rules (`unwrap_heuristics`), the parameter names and the constexpr parameter names; and the
    lists of planned names that passed `check_arg_names`."""

    jit: Any
    rules: dict[str, Rule]
    arg_names: tuple[str, ...]
    constexpr_names: tuple[str, ...]
    checked: set[tuple[str, ...]] = field(default_factory=set)


_KERNEL_INFO: dict[int, tuple[Any, KernelInfo]] = {}  # id(kernel) -> (kernel, info): the entry keeps its id taken


def kernel_info(kernel: Any) -> KernelInfo:
    """`KernelInfo` of a kernel, read once per kernel object (interpreter objects have no ``params``: their
    constexprs come from the Python function's annotations, which ``inspect.signature`` parses slowly)."""
    hit = _KERNEL_INFO.get(id(kernel))
    if hit is not None and hit[0] is kernel:
        return hit[1]
    jit, rules = unwrap_heuristics(kernel)
    params = getattr(jit, "params", None)
    if params is not None:
        constexpr_names = tuple(p.name for p in params if p.is_constexpr)
    else:  # interpreter objects: read the annotations of the Python function
        sig = inspect.signature(getattr(jit, "fn", jit))
        constexpr_names = tuple(n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation))
    info = KernelInfo(jit, rules, tuple(jit.arg_names), constexpr_names)
    _KERNEL_INFO[id(kernel)] = (kernel, info)
    return info


def derive_constexprs(info: KernelInfo, args: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """The constexprs the kernel's ``triton.heuristics`` rules derive from the planned `args` and the launch
    options `launch` (grid, warmup, num_warps, num_stages), as ``Heuristics.run`` evaluates them: each rule sees
    the launch's keyword arguments plus the values derived before it."""
    seen = dict(args, **launch)
    derived = {}
    for n, rule in info.rules.items():
        seen[n] = derived[n] = rule(seen)
    return derived


def check_arg_names(name: str, info: KernelInfo, args: dict[str, Any]) -> None:
    """Raise TypeError unless `args` names every kernel parameter but the derived constexprs, and nothing else
    (checked once per kernel and list of names: `KernelInfo.checked`)."""
    planned = tuple(args)
    if planned in info.checked:
        return
    missing = [n for n in info.arg_names if n not in args and n not in info.rules]
    extra = [n for n in args if n not in info.arg_names]
    if missing or extra:
        raise TypeError(f"{name}: launch arguments do not match the kernel: missing {missing}, unknown {extra}")
    derived_planned = [n for n in info.rules if n in args]
    if derived_planned:
        raise TypeError(f"{name}: {derived_planned} are derived by the kernel's triton.heuristics and must not be "
                        "planned")
    info.checked.add(planned)
