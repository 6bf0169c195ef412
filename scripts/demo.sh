#!/usr/bin/env bash
# The main job: SmolLM2-135M patched with each scheme (frequencies changed, perplexity, greedy continuation),
# run in the project-local environment that scripts/setup.sh builds from the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${HF_POSENC_VENV:-.venv}/bin/python" -m hf_posenc.cli demo "$@"
