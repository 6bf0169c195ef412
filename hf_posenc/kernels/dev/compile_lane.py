"""Compile lane: every Triton entry kernel of hf-posenc, planned by its own host code, compiled for A100
(sm_80) and H100 (sm_90) on a machine without a GPU, with registers, spills and shared memory read back
from the binaries.

A kernel family is a module with ``lane_specs(target, dtype, head_dim) -> list[LaunchSpec]``: the launches
its host code plans (on ``meta`` tensors) for every combination of compile-time flags it can produce; each kernel
package (a subpackage of ``hf_posenc.kernels``) lists its families in ``LANE_FAMILIES`` (:data:`FAMILIES`).
The lane compiles each distinct binary once (the specs are deduplicated by Triton's own compile key), in
parallel worker processes, with binaries cached by Triton under TRITON_CACHE_DIR (keyed by kernel source and
options), and flags a record when:

* the compile fails (for instance a non-constexpr global read inside ``@triton.jit``, which only the
  interpreter accepts);
* the kernel spills registers (cuobjdump ``STACK`` or ``LOCAL`` > 0) at head dim <= 128 with 16-bit inputs (fp32
  inputs, exact "ieee" dots on the FMA units, take small tiles that fit shared memory and spill: a
  correctness path, reported but not flagged);
* the launch would request more shared memory than the architecture allows (any head dim);
* the kernel does not compile with its float arguments typed fp64, as torch.compile's Inductor types Python
  floats when it compiles user Triton kernels itself (compiled models, ``generate`` with a static cache on
  CUDA); checked in one cell per run (the newest architecture, the first dtype, the smallest head dim), once
  per kernel and code path (its boolean flags: phase mode, decode, ...), since the typing does not depend on the
  architecture, the dtype or the sizes.

Binaries are compiled without line information (TRITON_DISABLE_LINE_INFO=1, as ``run_lane_subprocess`` and
``main`` set it): it is debug metadata only, ptxas allocates the same registers, stack and shared memory either
way (checked for TAPA's and TAPE's forward and backward kernels at sm_90, D = 128), and the binaries are a
quarter of the size (compile time: 3% less over those five kernels, within noise).

Compiling everything from an empty cache takes about 5.5 minutes on 2 cores (270 binaries, ~600 s of CPU in
Triton's MLIR/LLVM passes and ptxas). A clean clone (CI) starts with an empty Triton cache, so the repository
carries the binaries of the standard runs (:data:`STANDARD_RUNS`) as a seed: ``--seed-cache ARCHIVE`` adds them to
TRITON_CACHE_DIR under Triton's own cache keys before compiling (``seed_cache``). Triton's key covers the kernel
source and everything it calls (with line numbers), the signature, the constexprs, the options, the target, the
ptxas version, the environment knobs that change a binary and Triton's own source and library, so a binary is
reused only where Triton itself would reuse it: an edited kernel misses and compiles. Each record says whether
its binary came from the cache (``cache_hit``); the test suite requires every standard binary to be in the seed
(refresh it with ``--write-cache ARCHIVE``, which runs the standard runs and writes their binaries, reproducibly)
and audits the seed by compiling one cell from an empty cache and comparing the binaries byte for byte.

Run it as ``python -m hf_posenc.kernels.dev.compile_lane`` (exit status 1 when any record is flagged). It must
not run under TRITON_INTERPRET=1 (the kernels are then interpreter objects): ``run_lane_subprocess`` starts
it with the variable removed, as the test suite does.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import multiprocessing
import os
import pkgutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._triton.launch import SPILL_FREE_MAX_HEAD_DIM

_KERNELS, _KERNELS_PACKAGE = Path(__file__).parent.parent, __package__.rpartition(".")[0]  # hf_posenc.kernels
FAMILIES = tuple(f for p in pkgutil.iter_modules([str(_KERNELS)], f"{_KERNELS_PACKAGE}.") if p.ispkg
                 for f in getattr(importlib.import_module(p.name), "LANE_FAMILIES", ()))  # the packages' LANE_FAMILIES
DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128, 256)
# What the test suite compiles: the lane itself, and fp32 inputs at head dim 128 (their own tile tables).
STANDARD_RUNS: dict[str, dict] = {"16-bit": dict(dtypes=DTYPES, head_dims=HEAD_DIMS),
                                  "fp32": dict(dtypes=("float32",), head_dims=(128,))}
LANE_ENV = {"TRITON_DEFAULT_FP_FUSION": "1", "TRITON_DISABLE_LINE_INFO": "1"}  # part of Triton's cache key


@dataclass
class LaneRecord:
    """One distinct compiled binary (all the planned launches that share it are listed in `launches`)."""

    family: str
    kernel: str
    launches: list[str]
    arch: int
    dtype: str
    head_dim: int
    constexprs: dict
    num_warps: int
    num_stages: int
    registers: int | None = None
    stack: int | None = None
    local: int | None = None
    shared: int | None = None
    shared_limit: int | None = None
    compile_s: float | None = None
    error: str | None = None
    fp64_scalars: str | None = None  # None: not checked; "ok"; or the compile error with fp64 float arguments
    cubin: str | None = None
    cache_hit: bool | None = None  # every compile of this record (fp64 check included) came from Triton's cache
    triton_keys: list[str] = field(default_factory=list)  # Triton's cache keys of those compiles
    problems: list[str] = field(default_factory=list)

    @property
    def spills(self) -> int:
        return (self.stack or 0) + (self.local or 0)


def _load_family(name: str):
    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(name).stem, name)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(name)


def code_path(rec: LaneRecord) -> tuple:
    """A binary's kernel and boolean flags (phase mode, decode, ...): what its code does, sizes aside."""
    return rec.kernel, tuple(sorted((k, v) for k, v in rec.constexprs.items() if isinstance(v, bool)))


def _judge(rec: LaneRecord) -> None:
    if rec.error is not None:
        rec.problems.append(f"compile failed: {rec.error}")
        return
    if rec.spills > 0 and rec.head_dim <= SPILL_FREE_MAX_HEAD_DIM and rec.dtype != "float32":
        rec.problems.append(f"register spills: {rec.spills} bytes (STACK {rec.stack}, LOCAL {rec.local})")
    if rec.shared > rec.shared_limit:
        rec.problems.append(f"shared memory {rec.shared} B > sm_{rec.arch} limit {rec.shared_limit} B")
    if rec.fp64_scalars not in (None, "ok"):
        rec.problems.append(f"compile failed with fp64 float arguments (torch.compile): {rec.fp64_scalars}")


def _describe(exc: BaseException) -> str:
    """One line: the root error (Triton wraps the front end's NameError etc. in a CompilationError whose text
    is the offending source line) and where it happened."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    root = exc.__cause__ or exc.__context__
    what = f"{type(root).__name__}: {root}" if root is not None else (lines[-1] if lines else "")
    where = f"{type(exc).__name__} {lines[0]}" if lines else type(exc).__name__
    return " ".join(f"{what} ({where})".split())[:800]


def _plain(v):
    return v if isinstance(v, (bool, int, float, str)) or v is None else repr(v)


def run_job(family: str, arch: int, dtype: str, head_dim: int, cubin_dir: str | None = None,
            fp64_scalars: bool = False) -> list[dict]:
    """Plan and compile one (family, arch, dtype, head dim) cell; returns LaneRecord dicts. With `fp64_scalars`
    each binary is compiled a second time with its fp32 scalar arguments typed fp64 (Inductor's typing)."""
    import torch

    from .._triton.launch import SHARED_LIMIT, Target
    from .binaries import compile_inputs, resources

    import triton

    events: list[tuple[str, bool]] = []  # (Triton cache key, hit) of each compile, from Triton's listener

    def listen(*, metadata, cache_hit, **_):
        events.append((metadata["hash"], cache_hit))

    triton.knobs.compilation.listener = listen
    mod = _load_family(family)
    target = Target.gpu(arch)
    specs = mod.lane_specs(target, getattr(torch, dtype), head_dim)
    records: dict[str, LaneRecord] = {}
    typed: set[tuple] = set()  # (kernel, boolean flags) already compiled with fp64 float arguments
    for spec in specs:
        rec = LaneRecord(family, getattr(spec.jit, "__name__", spec.name), [spec.name], arch, dtype, head_dim,
                         {k: _plain(v) for k, v in spec.constexprs.items()}, spec.num_warps, spec.num_stages,
                         shared_limit=SHARED_LIMIT[arch])
        try:
            src, options, gpu = compile_inputs(spec, arch)
            key = src.hash() + repr(sorted(options.items()))
        except Exception as exc:  # planning / binding failed: that is the finding
            rec.error = f"{type(exc).__name__}: {exc}"
            key = f"error:{spec.name}:{len(records)}"
        if key in records:
            if spec.name not in records[key].launches:
                records[key].launches.append(spec.name)
            continue
        records[key] = rec
        if rec.error is not None:
            continue
        events.clear()
        t0 = time.perf_counter()
        try:
            compiled = triton.compile(src, target=gpu, options=options)
        except Exception as exc:  # the compile error is the lane's finding, recorded with its message
            rec.error = _describe(exc)
            continue
        rec.compile_s = round(time.perf_counter() - t0, 2)
        res = resources(compiled)
        rec.registers, rec.stack, rec.local, rec.shared = res.registers, res.stack, res.local, res.shared
        if fp64_scalars and code_path(rec) not in typed:
            typed.add(code_path(rec))
            rec.fp64_scalars = _compile_fp64_scalars(src, gpu, options)
        rec.triton_keys = [k for k, _ in events]
        rec.cache_hit = all(hit for _, hit in events)
        if cubin_dir is not None:
            variant = "-".join(f"{k}{v}" for k, v in sorted(rec.constexprs.items()) if k in ("LINEAR",))
            name = f"{spec.name}-sm{arch}-{dtype}-d{head_dim}{'-' + variant if variant else ''}-{key[:8]}.cubin"
            path = Path(cubin_dir) / name
            path.write_bytes(compiled.asm["cubin"])
            rec.cubin = str(path)
    out = []
    for rec in records.values():
        _judge(rec)
        out.append(asdict(rec))
    return out


def _compile_fp64_scalars(src, gpu, options: dict) -> str:
    """Compile `src` again with every fp32 scalar argument typed fp64; "ok" or the error."""
    import triton
    from triton.compiler import ASTSource

    signature = {k: "fp64" if v == "fp32" else v for k, v in src.signature.items()}
    try:
        triton.compile(ASTSource(src.fn, signature, dict(src.constants), src.attrs), target=gpu, options=options)
    except Exception as exc:  # the compile error is the finding
        return _describe(exc)
    return "ok"


def _run_job_args(args: tuple) -> list[dict]:
    return run_job(*args)


def run_lane(families=FAMILIES, archs=(80, 90), dtypes=DTYPES, head_dims=HEAD_DIMS, jobs: int | None = None,
             cubin_dir: str | None = None, seed: str | Path | None = None) -> list[LaneRecord]:
    """Compile every cell (family × arch × dtype × head dim) in `jobs` worker processes (default: CPU count),
    after adding the binaries of the archive `seed` to Triton's cache (:func:`seed_cache`)."""
    from .._triton.launch import interpreting

    if interpreting():
        raise RuntimeError("the compile lane cannot run under TRITON_INTERPRET=1 (the kernels are interpreter "
                           "objects then); use run_lane_subprocess, which removes the variable")
    if seed is not None:
        seed_cache(seed)
    if cubin_dir is not None:
        Path(cubin_dir).mkdir(parents=True, exist_ok=True)
    scalar_cell = (max(archs), dtypes[0], min(head_dims))  # where the fp64-argument compile runs (module doc)
    cells = [(f, a, d, h, cubin_dir, (a, d, h) == scalar_cell) for h in sorted(head_dims, reverse=True)
             for f in families for a in archs for d in dtypes]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(cells)))
    for family in families:  # import once here: forked workers inherit the modules (and torch, triton)
        _load_family(family)
    if jobs == 1:
        results = [run_job(*c) for c in cells]
    else:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context(method)) as pool:
            results = list(pool.map(_run_job_args, cells))
    return [LaneRecord(**r) for cell in results for r in cell]


def run_lane_subprocess(families=FAMILIES, archs=(80, 90), dtypes=DTYPES, head_dims=HEAD_DIMS,
                        jobs: int | None = None, cubin_dir: str | None = None, timeout: float | None = None,
                        seed: str | Path | None = None, cache_dir: str | None = None) -> list[LaneRecord]:
    """`run_lane` in a fresh interpreter without TRITON_INTERPRET (callable from the test suite); `cache_dir`
    replaces TRITON_CACHE_DIR there (an empty one compiles everything)."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for k, v in LANE_ENV.items():
        env.setdefault(k, v)  # line information: debug metadata only (module docstring)
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lane.json"
        cmd = [sys.executable, "-m", "hf_posenc.kernels.dev.compile_lane", "--json", str(out), "--quiet",
               "--family", *families, "--arch", *map(str, archs), "--dtype", *dtypes,
               "--head-dim", *map(str, head_dims)]
        if jobs is not None:
            cmd += ["--jobs", str(jobs)]
        if cubin_dir is not None:
            cmd += ["--cubin-dir", cubin_dir]
        if seed is not None:
            cmd += ["--seed-cache", str(seed)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if not out.exists():
            raise RuntimeError(f"compile lane did not run (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return [LaneRecord(**r) for r in json.loads(out.read_text())["records"]]


_TRITON_DIR = "<triton>"  # stands for the installed Triton package in archived metadata (extern_libs paths)
_ARCHIVED = (".cubin", ".json")  # what a hit needs: the binary and its metadata (no IR, no PTX)


_MANIFEST = "manifest.json"  # the Triton build the seed was compiled with


def triton_build() -> dict[str, str]:
    """The Triton build a cache key depends on: its version and the digest of Triton's own key (its compiler
    source, backends and library: another wheel, or another Python's, gives other keys)."""
    import hashlib

    import triton
    from triton.runtime.cache import triton_key

    return {"triton": triton.__version__, "triton_key": hashlib.sha256(triton_key().encode()).hexdigest()}


def read_manifest(archive: str | Path) -> dict[str, str]:
    """The Triton build a seed archive was compiled with (:func:`triton_build` when it was written)."""
    import tarfile

    try:
        with tarfile.open(archive, "r:xz") as tar:
            return json.loads(tar.extractfile(_MANIFEST).read())
    except (OSError, KeyError, tarfile.TarError, ValueError) as exc:
        raise ValueError(f"{archive}: not a compile-lane seed archive ({exc}); rewrite it with "
                         "`python -m hf_posenc.kernels.dev.compile_lane --write-cache ARCHIVE`") from exc


def read_cache(archive: str | Path) -> dict[str, dict[str, bytes]]:
    """The entries of a seed archive (:func:`write_cache`): Triton cache key -> {file name: bytes}."""
    import tarfile

    read_manifest(archive)
    entries: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar.getmembers():
                if member.name == _MANIFEST:
                    continue
                key, _, name = member.name.partition("/")
                if not member.isfile() or not key or "/" in name or not name.endswith(_ARCHIVED):
                    raise ValueError(f"unexpected member {member.name!r}")
                entries.setdefault(key, {})[name] = tar.extractfile(member).read()
    except (OSError, tarfile.TarError, ValueError) as exc:
        raise ValueError(f"{archive}: not a compile-lane seed archive ({exc}); rewrite it with "
                         "`python -m hf_posenc.kernels.dev.compile_lane --write-cache ARCHIVE`") from exc
    for key, files in entries.items():
        if sorted(n.rsplit(".", 1)[1] for n in files) != ["cubin", "json"]:
            raise ValueError(f"{archive}: entry {key} holds {sorted(files)}, not one binary and its metadata")
    return entries


def _triton_dir() -> str:
    import triton

    return str(Path(triton.__file__).parent)


def _portable(metadata: bytes) -> bytes:
    """Triton's metadata with the libraries it linked (extern_libs: absolute paths into the Triton package that
    compiled it) relative to the Triton package."""
    meta = json.loads(metadata)
    meta["extern_libs"] = [[name, f"{_TRITON_DIR}/{Path(path).as_posix().rsplit('/triton/', 1)[-1]}"]
                           for name, path in meta.get("extern_libs", [])]
    return json.dumps(meta).encode()


def seed_cache(archive: str | Path) -> int:
    """Add the binaries of a seed archive to Triton's cache (TRITON_CACHE_DIR), each under the key Triton
    computed when it compiled it; entries already cached are left alone. Returns how many were added (none when
    the seed was compiled by another Triton build: no key could match)."""
    from triton.runtime.cache import get_cache_manager

    if read_manifest(archive) != triton_build():
        return 0
    here = _triton_dir()
    added = 0
    for key, files in read_cache(archive).items():
        manager = get_cache_manager(key)
        meta = next(n for n in files if n.endswith(".json"))
        if manager.get_group(meta) is not None:
            continue
        group = {}
        for name, data in files.items():
            if name.endswith(".json"):  # libdevice and friends: this machine's Triton
                data = data.decode().replace(_TRITON_DIR, here)
            group[name] = manager.put(data, name)
        manager.put_group(meta, group)
        added += 1
    return added


def write_cache(archive: str | Path, records: list[LaneRecord]) -> int:
    """Write the binaries the records compiled (from Triton's cache) to a seed archive, reproducibly (sorted,
    no timestamps or owners, library paths relative to the Triton package). Returns the number of entries."""
    import io
    import tarfile

    from triton.runtime.cache import get_cache_manager

    keys = sorted({k for r in records for k in r.triton_keys})
    files: dict[str, bytes] = {}
    for key in keys:
        folder = Path(get_cache_manager(key).cache_dir)
        found = sorted(f for f in folder.iterdir() if f.suffix in _ARCHIVED and not f.name.startswith("__grp__"))
        if sorted(f.suffix for f in found) != sorted(_ARCHIVED):
            raise RuntimeError(f"Triton's cache entry {folder} lacks its binary or metadata: run the lane again")
        for f in found:
            data = f.read_bytes()
            files[f"{key}/{f.name}"] = _portable(data) if f.suffix == ".json" else data
    files[_MANIFEST] = json.dumps(triton_build(), indent=1).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tmp = Path(f"{archive}.tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(archive)  # whole or not at all
    return len(keys)


def format_table(records: list[LaneRecord]) -> str:
    rows = [f"{'kernel':<16} {'arch':>4} {'dtype':<8} {'D':>3} {'flags':<14} {'warps':>5} {'stg':>3} {'regs':>4} "
            f"{'spill':>5} {'smem':>7}  problems"]
    for r in sorted(records, key=lambda r: (r.family, r.launches[0], r.arch, r.dtype, r.head_dim)):
        flags = ",".join(f"{k}={int(v)}" for k, v in sorted(r.constexprs.items()) if k in ("LINEAR",)) or "-"
        rows.append(f"{r.launches[0]:<16} {r.arch:>4} {r.dtype:<8} {r.head_dim:>3} {flags:<14} {r.num_warps:>5} "
                    f"{r.num_stages:>3} {r.registers if r.registers is not None else '-':>4} "
                    f"{r.spills if r.error is None else '-':>5} {r.shared if r.shared is not None else '-':>7}  "
                    f"{'; '.join(r.problems)}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", nargs="+", default=list(FAMILIES), help="kernel family modules (or .py files)")
    ap.add_argument("--arch", nargs="+", type=int, default=[80, 90])
    ap.add_argument("--dtype", nargs="+", default=list(DTYPES))
    ap.add_argument("--head-dim", nargs="+", type=int, default=list(HEAD_DIMS))
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    ap.add_argument("--json", default=None, help="write the records here")
    ap.add_argument("--cubin-dir", default=None, help="keep the compiled binaries here")
    ap.add_argument("--seed-cache", default=None, metavar="ARCHIVE",
                    help="add this archive's binaries to Triton's cache first (module docstring)")
    ap.add_argument("--write-cache", default=None, metavar="ARCHIVE",
                    help="compile the standard runs (STANDARD_RUNS: all families and architectures; --dtype and "
                         "--head-dim are ignored) and write their binaries to this seed archive")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    for k, v in LANE_ENV.items():
        os.environ.setdefault(k, v)  # line information: debug metadata only (module docstring)
    t0 = time.perf_counter()
    if a.write_cache:
        records = [r for run in STANDARD_RUNS.values()
                   for r in run_lane(a.family, a.arch, jobs=a.jobs, seed=a.seed_cache, **run)]
        n = write_cache(a.write_cache, records)
        print(f"{a.write_cache}: {n} binaries ({Path(a.write_cache).stat().st_size} bytes)")
    else:
        records = run_lane(a.family, a.arch, a.dtype, a.head_dim, a.jobs, a.cubin_dir, a.seed_cache)
    wall = time.perf_counter() - t0
    if a.json:
        import triton

        Path(a.json).write_text(json.dumps({"triton": triton.__version__, "wall_s": round(wall, 1),
                                            "records": [asdict(r) for r in records]}, indent=1))
    bad = [r for r in records if r.problems]
    if not a.quiet:
        print(format_table(records))
        hits = sum(bool(r.cache_hit) for r in records)
        print(f"{len(records)} binaries ({hits} from the cache), {len(bad)} flagged, {wall:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
