#!/usr/bin/env bash
# The main job: SmolLM2-135M patched with each scheme (frequencies changed, perplexity, greedy continuation).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m hf_posenc.cli demo "$@"
