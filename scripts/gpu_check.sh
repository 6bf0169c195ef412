#!/usr/bin/env bash
# The GPU lane, for a machine with an NVIDIA GPU (CI machines have none; they run the interpreter and the
# compile lane). Each step has its own time limit and log, and a failing step does not stop the next ones:
#   1. hf-posenc selftest, kernel checks at realistic shapes (bf16, fp16; forward, backward, GQA, padding, decode)
#   2. the same checks with fp32 inputs (exact "ieee" dots), beside step 1
#   3. the TAPE kernel tests on CUDA (pytest), beside steps 1-2
#   4. scripts/gpu_model_check.py: patched models on CUDA (forward, dynamic/static KV caches, compiled
#      static-cache generate, backward)
#   5. hf-posenc selftest timing: TAPA and TAPE against RoPE + SDPA flash at 1k-16k tokens (SKIP_TIMING=1: no)
# Usage: bash scripts/gpu_check.sh [OUTDIR]   (hf-posenc importable: installed, or run from the repo root)
set -uo pipefail
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
status=0
step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log to $out/NAME.log, remember a failure
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "step $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$out/steps.txt"
    [ "$rc" -eq 0 ] || status=1
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} > "$out/steps.txt" 2>&1
cat "$out/steps.txt"
step selftest-checks "${CHECKS_LIMIT:-300}" "$py" -m hf_posenc.selftest --no-timing --no-progress \
    --json "$out/selftest-checks.json" &
checks=$!
step selftest-fp32 "${CHECKS_LIMIT:-300}" "$py" -m hf_posenc.selftest --no-timing --no-progress --dtypes fp32 \
    --json "$out/selftest-fp32.json" &
fp32=$!
step pytest "${PYTEST_LIMIT:-300}" "$py" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/test_tape_kernel.py
wait "$checks" "$fp32"
grep -Eq "selftest-(checks|fp32): rc=[1-9]" "$out/steps.txt" && status=1
step model-check "${MODEL_LIMIT:-200}" "$py" scripts/gpu_model_check.py --json "$out/gpu-model-check.json"
if [ "${SKIP_TIMING:-0}" != 1 ]; then
    step selftest-timing "${TIMING_LIMIT:-200}" "$py" -m hf_posenc.selftest --no-checks --no-progress \
        --json "$out/selftest-timing.json"
fi
for f in selftest-checks selftest-fp32 model-check selftest-timing; do
    [ -f "$out/$f.log" ] && { echo "== $f"; tail -25 "$out/$f.log"; }
done
tail -3 "$out/pytest.log"
exit "$status"
