#!/usr/bin/env bash
# The test suite (CPU only; Triton kernels run under TRITON_INTERPRET=1, set by tests/conftest.py), in the
# project-local environment that scripts/setup.sh builds from the lock file.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# Two workers (pytest-xdist), each taking whole test files (module fixtures stay shared): on 2 cores the suite's
# many single-threaded tests and waits on subprocesses leave a core idle otherwise. HF_POSENC_TEST_WORKERS=0: serial.
# --no-loadscope-reorder: the files go out in collection order, the longest first (tests/conftest.py); xdist's
# default order (most tests first) would leave a long file of few tests to run alone at the end.
WORKERS="${HF_POSENC_TEST_WORKERS:-2}"
"${HF_POSENC_VENV:-.venv}/bin/python" -m pytest -q -ra -p no:cacheprovider -n "$WORKERS" --dist loadfile \
  --no-loadscope-reorder "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests (exit 5): treating as failure, the suite must not be empty" >&2
  exit 1
fi
exit "$rc"
