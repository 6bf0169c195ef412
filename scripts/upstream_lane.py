#!/usr/bin/env python
"""The upstream lane: the suite's fast core (tests marked ``upstream``) on the newest releases the registry serves.

The lock makes CI reproducible and also hides what ``pip install hf-posenc`` users get. This lane runs in the
environment ``scripts/setup_upstream.sh`` builds (the lock, then the newest torch, transformers, peft, accelerate,
trl, datasets, huggingface-hub, deepspeed and triton, where the locked lane has torch's CPU wheel at the pin in
scripts/setup.sh), prints the versions it tested beside the locked ones, and fails CI when a test fails there,
naming the release that broke it:

    upstream lane: a newer release of transformers (5.25.0; the locked 5.24.0 passes) broke
      tests/test_tape.py::test_cached_generation_equals_full_forward_after_perturbation[llama-eager]

The tests marked ``upstream`` are the core of the library on Transformers, PEFT and the rest, and, for torch and
Triton, the Triton kernels under the interpreter and the compile lane's checks that compile without its seed (the
seed's binaries are keyed by the locked Triton build). A package can also move down: the newest torch pins its own
Triton (2026-12-02: torch 2.14.1 pins triton 3.8, the lock has 3.9), and the lane says so.

When several packages moved, each failing test is re-run with one moved package at a time put back to its locked
version (installed with --no-deps into a folder put first on PYTHONPATH, the lane's environment untouched): the
package whose locked version makes the test pass is named; if none does alone, all moved ones are. The fix is
code that supports both releases, or an upper bound in pyproject.toml with the reason: never a silent pass.

    python scripts/upstream_lane.py [--venv .venv-upstream] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UPSTREAM = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "huggingface-hub", "deepspeed",
            "triton")
MARKER = "upstream"
TORCH_PIN = re.compile(r'^TORCH_PIN="torch==([^"]+)"$', re.MULTILINE)  # the locked lane's torch (scripts/setup.sh)


def normalize(name: str) -> str:
    return name.lower().replace("_", "-")


def locked_versions(lock: Path = REPO / "requirements" / "lock.txt",
                    setup: Path = REPO / "scripts" / "setup.sh") -> dict[str, str]:
    """``name -> version`` of the lock's ``name==version`` lines (names normalized as pip does), and torch's pin,
    which scripts/setup.sh installs before the lock (the CPU wheel)."""
    pins = {}
    for line in lock.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalize(name)] = version.strip()
    torch = TORCH_PIN.search(setup.read_text())
    if torch is None:
        raise SystemExit(f"upstream lane: no TORCH_PIN=\"torch==VERSION\" line in {setup}: the locked torch is unknown")
    pins["torch"] = torch.group(1)
    return pins


def public(version: str) -> str:
    """A version without its local label (``2.13.0+cpu`` -> ``2.13.0``): the CPU and CUDA wheels of a release
    are the same release."""
    return version.split("+", 1)[0]


def direction(old: str, new: str) -> str:
    """``newer`` or ``older``: how the tested version ``new`` stands to the locked ``old``."""
    from packaging.version import Version

    return "newer" if Version(new) > Version(old) else "older"


def installed_versions(python: str, names: tuple[str, ...]) -> dict[str, str]:
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try: print(n, m.version(n))\n"
            "    except m.PackageNotFoundError: print(n, '-')\n")
    out = subprocess.run([python, "-c", code, *names], check=True, capture_output=True, text=True).stdout
    return {normalize(n): v for n, v in (line.split() for line in out.splitlines())}


def run_pytest(python: str, args: list[str], junit: Path, env: dict[str, str] | None = None) -> int:
    """The marked tests on two pytest-xdist workers taking whole files, as scripts/test.sh runs the suite
    (HF_POSENC_TEST_WORKERS=0: serial): on 2 cores the newest torch's slower imports and compiles otherwise leave
    a core idle."""
    workers = os.environ.get("HF_POSENC_TEST_WORKERS", "2")
    parallel = ["-n", workers, "--dist", "loadfile", "--no-loadscope-reorder"] if workers != "0" else []
    cmd = [python, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *parallel, f"--junitxml={junit}", *args]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def failed_tests(junit: Path) -> list[str]:
    """Node ids (``tests/x.py::name[param]``) of the failed or erred test cases of a JUnit report."""
    failed = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").replace(".", "/")
            failed.append(f"{module}.py::{case.get('name')}")
    return failed


def passes_with_locked(python: str, package: str, version: str, tests: list[str]) -> bool:
    """Whether ``tests`` pass in the lane's environment with ``package`` alone put back to its locked version."""
    with tempfile.TemporaryDirectory() as overlay:
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--target", overlay, f"{package}=={version}"]
        if subprocess.run(pip).returncode != 0:
            return False
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [overlay, os.environ.get("PYTHONPATH")])))
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
        return subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL).returncode == 0


def _older(old: str, new: str) -> bool:
    return "-" not in (old, new) and direction(old, new) == "older"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default=os.environ.get("HF_POSENC_UPSTREAM_VENV", ".venv-upstream"))
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    python = str((REPO / args.venv / "bin" / "python") if not os.path.isabs(args.venv) else Path(args.venv) / "bin/python")
    locked = locked_versions()
    tested = installed_versions(python, UPSTREAM)
    moved = {n: (locked.get(n, "-"), tested[n]) for n in map(normalize, UPSTREAM)
             if public(locked.get(n, "-")) != public(tested[n])}
    print("upstream lane: versions tested (newest the registry serves) against the lock")
    for name in map(normalize, UPSTREAM):
        old, new = locked.get(name, "-"), tested[name]
        mark = ""
        if name in moved:
            mark = (f"  <- {direction(old, new)} than the lock" if "-" not in (old, new) else
                    "  <- not in the lock" if old == "-" else "  <- not installed")
            if mark.endswith("older than the lock"):
                mark += " (what a newer release requires)"
        print(f"  {name:16} {new:12} locked {old}{mark}")

    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "upstream.xml"
        rc = run_pytest(python, ["-m", MARKER, *args.pytest_args], junit)
        if rc == 5:
            print("upstream lane: no test is marked 'upstream': the lane would test nothing", file=sys.stderr)
            return 1
        failed = failed_tests(junit) if junit.exists() else []
    if rc == 0:
        print(f"upstream lane: passed on the newest releases ({', '.join(f'{n} {v[1]}' for n, v in moved.items()) or 'equal to the lock'})")
        return 0
    if not failed:
        print(f"upstream lane: pytest exited {rc} without a failed test (collection or setup error, above)",
              file=sys.stderr)
        return 1
    if not moved:
        print("upstream lane: tests failed although every package is at its locked version: not a new release; "
              "see the locked lane", file=sys.stderr)
        return 1
    blame: dict[str, list[str]] = {}
    for test in failed:
        culprits = [n for n, (old, _) in moved.items()
                    if len(moved) > 1 and old != "-" and passes_with_locked(python, n, old, [test])]
        blame.setdefault(", ".join(culprits or moved), []).append(test)
    for names, tests in blame.items():
        which = " or ".join(f"{'an older' if _older(*moved[n]) else 'a newer'} release of {n} ({moved[n][1]}; the "
                            f"locked {moved[n][0]} passes)" for n in names.split(", "))
        print(f"upstream lane: {which} broke", file=sys.stderr)
        for test in tests:
            print(f"  {test}", file=sys.stderr)
    print("Fix: support both releases (list any private name in hf_posenc/upstream.py with its test), or bound the "
          "dependency in pyproject.toml below the breaking release with the reason.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
