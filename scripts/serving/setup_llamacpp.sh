#!/usr/bin/env bash
# llama.cpp for the GGUF export and its checks, from llama-cpp-python's source distribution (which vendors llama.cpp).
#
#   bash scripts/serving/setup_llamacpp.sh --converter   # seconds: what `export --gguf f32|f16|bf16|q8_0` needs
#   bash scripts/serving/setup_llamacpp.sh               # several minutes: also the bindings (Q4_K_M, serving tests)
#   bash scripts/serving/setup_llamacpp.sh --wheel       # only the bindings' wheel, built without .venv
#
# --converter: llama.cpp's converter (convert_hf_to_gguf.py with its conversion/ and gguf-py/ folders), unpacked to
#   build/llama-cpp-python/llama.cpp, where hf_posenc.export_gguf finds it (elsewhere: --llama-cpp DIR or
#   HF_POSENC_LLAMA_CPP=DIR), and sentencepiece, which the converter imports for every Llama model (its other imports,
#   torch, transformers, numpy, safetensors, pyyaml, requests, tqdm, come with the project's environment). The
#   converter writes f32, f16, bf16 and Q8_0 files itself; nothing is compiled.
# Default (CI, tests/test_serving_llamacpp.py, scripts/serving/llamacpp_compare.py): the converter as above, plus
#   llama-cpp-python (llama.cpp's Python bindings, built from source) into the project's .venv: the engine the
#   serving checks run the exported files in, and llama.cpp's quantizer (Q4_K_M); and diskcache, which llama_cpp
#   imports.
# --wheel: only the compilation, into the cached wheel, with a throwaway environment of its own (the Python that
#   scripts/setup.sh uses, $PYTHON or python3), so that it can start before .venv exists: CI runs it beside the
#   installs, which wait on downloads while this keeps both cores busy. A later default run installs the cached
#   wheel in seconds.
#
# Portable CPU flags: the default native build picks up AVX-512/AMX where the CPU has them and segfaults on the first
# evaluation on such machines, so ggml is built for AVX2/FMA/F16C without -march=native. The source and the wheel
# are cached under build/llama-cpp-python/ (the build takes 4 to 7 minutes on 2 cores); scripts/setup.sh rebuilds
# .venv when the lock changes, after which this script reinstalls the cached wheel in seconds. Idempotent.
set -euo pipefail
usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }
MODE=full
for arg in "$@"; do
  case "$arg" in
    --converter) MODE=converter ;;
    --wheel) MODE=wheel ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup_llamacpp: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
VENV="${HF_POSENC_VENV:-.venv}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="build/llama-cpp-python"
CONVERTER="$CACHE/llama.cpp"
# LLAVA_BUILD=OFF: not the multimodal library (tools/mtmd, 54 files), which llama_cpp imports only for image chats;
# llamacpp_bindings_only.cmake: not llama.cpp's common library either, which llama_cpp does not load (why it takes a
# hook, and not -DLLAMA_BUILD_COMMON=OFF, is said in the file)
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF"
FLAGS="$FLAGS -DCMAKE_PROJECT_llama_cpp_INCLUDE=$PWD/scripts/serving/llamacpp_bindings_only.cmake"
PY="$VENV/bin/python"
mkdir -p "$CACHE"
if [ "$MODE" = wheel ]; then  # a pip of its own: the download and the build need nothing of .venv
  rm -rf "$CACHE/build-venv"
  "${PYTHON:-python3}" -m venv "$CACHE/build-venv"
  PY="$CACHE/build-venv/bin/python"
elif [ ! -x "$PY" ]; then
  echo "setup_llamacpp: $VENV missing; run scripts/setup.sh first" >&2
  exit 1
fi
PIP=("$PY" -m pip --quiet --disable-pip-version-check)
quiet() { "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
sdist="$CACHE/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  echo "setup_llamacpp: downloading llama-cpp-python $VERSION's source (77 MB)" >&2
  quiet "${PIP[@]}" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE"
fi
if [ ! -f "$CONVERTER/.version" ] || [ "$(cat "$CONVERTER/.version")" != "$VERSION" ]; then
  rm -rf "$CONVERTER" "$CACHE/unpack"
  mkdir -p "$CACHE/unpack"
  vendor="llama_cpp_python-$VERSION/vendor/llama.cpp"
  tar -xzf "$sdist" -C "$CACHE/unpack" "$vendor/convert_hf_to_gguf.py" "$vendor/conversion" "$vendor/gguf-py"
  mv "$CACHE/unpack/$vendor" "$CONVERTER"
  rm -rf "$CACHE/unpack"
  echo "$VERSION" > "$CONVERTER/.version"
fi
converter_ready() {
  echo "llama.cpp converter: $CONVERTER (export --gguf finds it there; elsewhere pass --llama-cpp $PWD/$CONVERTER" \
       "or set HF_POSENC_LLAMA_CPP=$PWD/$CONVERTER)"
}
if [ "$MODE" = converter ]; then
  if ! "$PY" -c "import sentencepiece" 2>/dev/null; then
    quiet "${PIP[@]}" install --no-deps sentencepiece==0.2.3
  fi
  "$PY" -c "import sentencepiece, torch, transformers, numpy, safetensors, yaml, requests, tqdm" || {
    echo "setup_llamacpp: $VENV lacks a module llama.cpp's converter imports (above); run scripts/setup.sh" >&2
    exit 1
  }
  converter_ready
  echo "ready for --gguf f32, f16, bf16 and q8_0; q4_k_m also needs llama.cpp's quantizer:" \
       "bash scripts/serving/setup_llamacpp.sh (builds llama-cpp-python, several minutes)"
  exit 0
fi
wheel="$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$wheel" ]; then
  echo "setup_llamacpp: building llama-cpp-python $VERSION from source (4 to 7 minutes on 2 cores; f32/f16/bf16/q8_0" \
       "export needs only --converter, seconds)" >&2
  start=$SECONDS
  # a line a minute, so a long compile is not taken for a hang (sleep's output goes nowhere: an orphaned sleep must
  # not hold a caller's pipe open)
  ( while sleep 60 </dev/null >/dev/null 2>&1; do
      echo "setup_llamacpp: still compiling llama.cpp ($(( (SECONDS - start) / 60 )) min)" >&2
    done ) &
  ticker=$!
  trap 'kill "$ticker" 2>/dev/null || true' EXIT
  CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    quiet "${PIP[@]}" wheel --no-deps "$sdist" -w "$CACHE"
  kill "$ticker" 2>/dev/null || true
  trap - EXIT
  wheel="$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -1)"
  echo "setup_llamacpp: built $(basename "$wheel") in $(( (SECONDS - start) / 60 )) min" >&2
fi
if [ "$MODE" = wheel ]; then
  rm -rf "$CACHE/build-venv"
  echo "setup_llamacpp: $wheel is ready; bash scripts/serving/setup_llamacpp.sh installs it into $VENV" >&2
  exit 0
fi
if ! "$PY" -c "import llama_cpp, sentencepiece, diskcache, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  quiet "${PIP[@]}" install --no-deps diskcache==5.6.3 sentencepiece==0.2.3
  quiet "${PIP[@]}" install --no-deps --force-reinstall "$wheel"
fi
"$PY" -c "import llama_cpp, sentencepiece; print('llama-cpp-python', llama_cpp.__version__)"
converter_ready
