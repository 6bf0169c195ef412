#!/usr/bin/env bash
# The test suite (CPU only; Triton kernels run under TRITON_INTERPRET=1, set by tests/conftest.py), in the
# project-local environment that scripts/setup.sh builds from the lock file.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
"${HF_POSENC_VENV:-.venv}/bin/python" -m pytest -q -ra -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests (exit 5): treating as failure, the suite must not be empty" >&2
  exit 1
fi
exit "$rc"
