#!/usr/bin/env bash
# The upstream lane's environment (.venv-upstream): what `pip install hf-posenc` users get today. It starts from the
# lock, like scripts/setup.sh, then upgrades the packages hf-posenc builds on to the newest releases the registry
# serves, torch included: the newest torch pip may install here (the machines' own pip constraint caps it at the
# release they serve), with the Triton that torch pins, where the locked lane has the CPU wheel of torch 2.13.
# scripts/upstream_lane.py runs the suite's fast core, the Triton interpreter tests and the compile lane in it and
# names the release that broke what. Re-running the script upgrades again (quick when nothing moved).
# Time added to CI (measured 2026-12-02 on a 2-core machine): torch 2.14.1 is a CUDA build,
# which imports on a CPU machine only with its CUDA libraries (torch and the nvidia-*/cuda-* wheels it requires are
# 2.4 GB of wheels; the environment grows from 2.7 to 6.6 GB; with --no-deps, `import torch` fails on libcudnn.so.9).
# On that machine otherwise idle the whole script took 99 s (17 s copying the locked environment, 82 s for the newest
# releases and the check) where it took 38 s with torch at the CPU pin: about 60 s more (under load from other jobs:
# 251 s against 68 s). The time the lane's tests add: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HF_POSENC_UPSTREAM_VENV:-.venv-upstream}"
BASE_PY="${PYTHON:-python3}"
UPSTREAM=(torch transformers peft accelerate trl datasets huggingface-hub deepspeed triton)
PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
LOCKED="${HF_POSENC_VENV:-.venv}"
began=$(date +%s)
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.hf-posenc-upstream" ]; then
  rm -rf "$VENV"
  if [ -x "$LOCKED/bin/python" ] && [ -f "$LOCKED/.hf-posenc-lock" ]; then
    # A copy of the locked environment (seconds, where installing the lock again takes minutes): the same Python,
    # site-packages and editable hf-posenc; its scripts' first lines are pointed at the copy's interpreter.
    echo "setup_upstream: $VENV from a copy of $LOCKED, then the newest ${UPSTREAM[*]}" >&2
    cp -a "$LOCKED" "$VENV"
    old="$(cd "$LOCKED" && pwd)" new="$(cd "$VENV" && pwd)"
    grep -lrI --null "$old" "$VENV/bin" | xargs -0 -r sed -i "s|$old|$new|g"
    rm -f "$VENV/.hf-posenc-lock"
  else
    echo "setup_upstream: building $VENV (the lock, then the newest ${UPSTREAM[*]})" >&2
    "$BASE_PY" -m venv "$VENV"
    "${PIP[@]}" install torch 2> >(grep -v "is neither a file nor a directory" >&2)
    "${PIP[@]}" install --no-deps -r requirements/lock.txt 2> >(grep -v "is neither a file nor a directory" >&2)
    "${PIP[@]}" install --no-deps -e . 2> >(grep -v "is neither a file nor a directory" >&2)
  fi
  touch "$VENV/.hf-posenc-upstream"
fi
copied=$(date +%s)
# Newest releases, and whatever they need in turn (only-if-needed: the rest stays at the lock).
"${PIP[@]}" install --upgrade --upgrade-strategy only-if-needed "${UPSTREAM[@]}" \
  2> >(grep -v "is neither a file nor a directory" >&2)
source scripts/lib/check_env.sh
check_env "$VENV" "setup_upstream: the newest releases do not install together"
echo "setup_upstream: $VENV ready in $(( $(date +%s) - began )) s ($(( copied - began )) s for the copy, \
$(( $(date +%s) - copied )) s for the newest releases and the check)" >&2
