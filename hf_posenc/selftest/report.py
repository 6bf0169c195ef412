"""The selftest's result: check outcomes, timing rows, device and versions; printed as tables, saved as JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..results_io import strict_json
from .checks import CheckResult

SCHEMA = "hf-posenc-selftest/1"


@dataclass
class TimingRow:
    """One candidate at one (kernel, mode, length): median time, TFLOP/s (the FLOP convention of
    `timing.py`), decode tokens/s, peak CUDA memory, time relative to RoPE + SDPA flash in the same run."""

    kernel: str  # "tapa" | "tape": which benchmark the row belongs to
    mode: str  # "fwd" | "fwd_bwd" | "decode"
    length: int
    batch: int
    candidate: str  # "TAPA (Triton)", "TAPE (Triton)", "RoPE (SDPA flash)"
    median_ms: float | None = None
    tflops: float | None = None
    tokens_per_s: float | None = None
    peak_mem_bytes: int | None = None
    vs_rope: float | None = None
    error: str | None = None


@dataclass
class SelftestReport:
    """Everything one selftest run found. `passed` is False as soon as one check failed."""

    device: str  # "cuda" | "cpu"
    device_name: str
    interpreter: bool
    size: str
    dtypes: list[str]
    versions: dict
    checks: list[CheckResult] = field(default_factory=list)
    timing: list[TimingRow] = field(default_factory=list)
    timing_shape: dict = field(default_factory=dict)
    timing_note: str = ""
    started: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[str]:
        """Names of the failed checks, then "timing/<kernel>/<mode>/L<length>" for timing runs that raised."""
        return [c.name for c in self.checks if not c.passed] + [
            f"timing/{r.kernel}/{r.mode}/L{r.length}" for r in self.timing if r.error]

    def to_dict(self) -> dict:
        """JSON-ready: non-finite numbers (a kernel that returned inf/NaN) become the strings "inf"/"nan"."""
        d = asdict(self)
        return strict_json({"schema": SCHEMA, "passed": self.passed, "failures": self.failures, **d}, nonfinite=str)

    @classmethod
    def from_dict(cls, d: dict) -> SelftestReport:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a selftest report of schema {SCHEMA!r} (got {d.get('schema')!r})")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["checks"] = [CheckResult(**{**c, "errors": {k: float(v) for k, v in c["errors"].items()}})
                        for c in d.get("checks", [])]
        kw["timing"] = [TimingRow(**t) for t in d.get("timing", [])]
        return cls(**kw)

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False))
        return path

    # ----------------------------------------------------------------------------------------------

    def format_header(self) -> str:
        v = self.versions
        mode = "Triton interpreter (TRITON_INTERPRET=1)" if self.interpreter else "compiled Triton kernels"
        return (f"hf-posenc selftest on {self.device_name} [{self.device}, {mode}]\n"
                f"torch {v.get('torch')}  triton {v.get('triton')}  transformers {v.get('transformers')}  "
                f"hf-posenc {v.get('hf_posenc')}  CUDA {v.get('cuda')}")

    def format_checks(self) -> str:
        if not self.checks:
            return "checks: none run"
        width = max(len(c.name) for c in self.checks)
        lines = [f"{'check':<{width}}  result  {'max error':>9}  {'tolerance':>9}  worst"]
        for c in self.checks:
            # the tensor closest to (or furthest over) its own tolerance
            worst = max(c.errors, key=lambda k: _sortable(c.errors[k]) / c.tolerance_of(k)) if c.errors else None
            err = c.errors[worst] if worst else None
            tol = c.tolerance_of(worst) if worst else c.tolerance
            lines.append(f"{c.name:<{width}}  {'ok' if c.passed else 'FAIL':<6}  {_num(err, '.2e'):>9}  "
                         f"{tol:>9.1e}  {worst or '-'}")
            if c.message:
                lines.append(f"{'':<{width}}    -> {c.message.splitlines()[0]}")
        bad = [c.name for c in self.checks if not c.passed]
        lines.append(f"{len(self.checks) - len(bad)}/{len(self.checks)} checks passed"
                     + (f"; FAILED: {', '.join(bad)}" if bad else ""))
        return "\n".join(lines)

    def format_timing(self) -> str:
        if not self.timing:
            return "timing: not run"
        lines = [self.timing_note] if self.timing_note else []
        lines.append(f"{'kernel':<6} {'mode':<8} {'L':>6} {'B':>4}  {'candidate':<18} {'ms':>10} {'TFLOP/s':>8} "
                     f"{'tok/s':>10} {'peak MiB':>9} {'x RoPE':>7}")
        for r in self.timing:
            row = f"{r.kernel:<6} {r.mode:<8} {r.length:>6} {r.batch:>4}  {r.candidate:<18} "
            if r.error:
                lines.append(row + r.error)
                continue
            mib = None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20
            lines.append(row + f"{_num(r.median_ms, '.3f'):>10} {_num(r.tflops, '.3g'):>8} "
                         f"{_num(r.tokens_per_s, '.0f'):>10} {_num(mib, '.0f'):>9} {_num(r.vs_rope, '.2f'):>7}")
        return "\n".join(lines)

    def format(self) -> str:
        return "\n\n".join([self.format_header(), self.format_checks(), self.format_timing()])


def _num(x: float | None, spec: str) -> str:
    if x is None:
        return "-"
    return format(x, spec)  # non-finite values come out as str() writes them: inf, -inf, nan


def _sortable(x: float) -> float:
    return math.inf if x != x else x  # NaN sorts as the worst
