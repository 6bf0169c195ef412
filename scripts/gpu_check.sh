#!/usr/bin/env bash
# The GPU lane, for a machine with an NVIDIA GPU (CI machines have none; they run the interpreter and the
# compile lane). Each step has its own time limit and log, and a failing step does not stop the next ones:
#   1. hf-posenc selftest, kernel checks at realistic shapes (bf16, fp16; forward, backward, GQA, padding, decode)
#   2. the same checks with fp32 inputs (exact "ieee" dots), beside step 1
#   3. the TAPE kernel tests on CUDA (pytest), beside steps 1-2
#   4. scripts/gpu_model_check.py: patched models on CUDA (forward, dynamic/static KV caches, compiled
#      static-cache generate, backward) (SKIP_MODEL_CHECK=1: no)
#   5. hf-posenc selftest timing: TAPA and TAPE against RoPE + SDPA flash at 1k-16k tokens (TAPE's fused and
#      deterministic backward both), and benchmarks/decode_host.py: the host time of one eager decode call
#      (SKIP_TIMING=1: no)
#   6. benchmarks/train_step.py and benchmarks/generate.py: the whole training step and generation of a ~1B
#      Llama, unpatched against CoPE, TAPA and TAPE (SKIP_MODEL_BENCH=1: no)
#   E. the experiments made for a GPU (none by default: their runs are committed; EXPERIMENTS="tape_arithmetic
#      tapa_scale" reruns them at --size gpu), beside steps 1-3
#      (training, not timing)
# Steps 4-6 time or load the GPU alone, after 1-3 and E.
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
experiments=()
for name in ${EXPERIMENTS:-}; do
    step "experiment-$name" "${EXPERIMENT_LIMIT:-330}" "$py" -m hf_posenc_cli experiment "$name" --size gpu \
        --out "$out/experiment-$name" --work "$out/work-$name" &
    experiments+=($!)
done
step pytest "${PYTEST_LIMIT:-300}" "$py" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests/test_tape_kernel.py
wait "$checks" "$fp32" "${experiments[@]}"
grep -Eq "(selftest-(checks|fp32)|experiment-[a-z_]+): rc=[1-9]" "$out/steps.txt" && status=1
rm -rf "$out"/work-*  # cached runs: only the reports come back
if [ "${SKIP_MODEL_CHECK:-0}" != 1 ]; then
    step model-check "${MODEL_LIMIT:-200}" "$py" scripts/gpu_model_check.py --json "$out/gpu-model-check.json"
fi
if [ "${SKIP_TIMING:-0}" != 1 ]; then
    step selftest-timing "${TIMING_LIMIT:-200}" "$py" -m hf_posenc.selftest --no-checks --no-progress \
        --json "$out/selftest-timing.json"
    step decode-host "${DECODE_HOST_LIMIT:-90}" "$py" benchmarks/decode_host.py --device cuda \
        --json "$out/decode-host.json"
fi
if [ "${SKIP_MODEL_BENCH:-0}" != 1 ]; then
    step train-step "${TRAIN_STEP_LIMIT:-150}" "$py" benchmarks/train_step.py ${TRAIN_STEP_ARGS:-} \
        --json "$out/train-step.json"
    step generate "${GENERATE_LIMIT:-200}" "$py" benchmarks/generate.py ${GENERATE_ARGS:-} --json "$out/generate.json"
fi
for f in selftest-checks selftest-fp32 model-check selftest-timing decode-host train-step generate \
         $(for n in ${EXPERIMENTS:-}; do echo "experiment-$n"; done); do
    [ -f "$out/$f.log" ] && { echo "== $f"; tail -25 "$out/$f.log"; }
done
tail -3 "$out/pytest.log"
exit "$status"
