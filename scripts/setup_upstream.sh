#!/usr/bin/env bash
# The upstream lane's environment (.venv-upstream): what `pip install hf-posenc` users get today. It starts from the
# lock, like scripts/setup.sh, then upgrades the packages hf-posenc builds on to the newest releases the registry
# serves (torch stays at the CPU pin, a constraint every step obeys). scripts/upstream_lane.py runs the suite's fast
# core in it and names the release that broke what. Re-running the script upgrades again (quick when nothing moved).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HF_POSENC_UPSTREAM_VENV:-.venv-upstream}"
BASE_PY="${PYTHON:-python3}"
UPSTREAM=(transformers peft accelerate trl datasets huggingface-hub deepspeed triton)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" > "$constraints"
PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
LOCKED="${HF_POSENC_VENV:-.venv}"
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
    "${PIP[@]}" install -c "$constraints" torch==2.13.0 2> >(grep -v "is neither a file nor a directory" >&2)
    "${PIP[@]}" install --no-deps -r requirements/lock.txt 2> >(grep -v "is neither a file nor a directory" >&2)
    "${PIP[@]}" install --no-deps -e . 2> >(grep -v "is neither a file nor a directory" >&2)
  fi
  touch "$VENV/.hf-posenc-upstream"
fi
# Newest releases, and whatever they need in turn (only-if-needed: the rest stays at the lock).
"${PIP[@]}" install -c "$constraints" --upgrade --upgrade-strategy only-if-needed "${UPSTREAM[@]}" \
  2> >(grep -v "is neither a file nor a directory" >&2)
source scripts/lib/check_env.sh
check_env "$VENV" "setup_upstream: the newest releases do not install together"
