#!/usr/bin/env bash
# llama.cpp for the GGUF export and its checks, from llama-cpp-python's source distribution (which vendors llama.cpp):
#   * llama-cpp-python (llama.cpp's Python bindings, built from source) into the project's .venv: the engine that
#     tests/test_serving_llamacpp.py and scripts/serving/llamacpp_compare.py run the exported files in, and
#     llama.cpp's quantizer (Q4_K_M);
#   * llama.cpp's converter (convert_hf_to_gguf.py with its conversion/ and gguf-py/ folders), unpacked to
#     build/llama-cpp-python/llama.cpp: what hf_posenc.export_gguf runs (set HF_POSENC_LLAMA_CPP to that folder);
#   * sentencepiece, which the converter imports for every Llama model, and diskcache, which llama_cpp imports.
#
# Portable CPU flags: the default native build picks up AVX-512/AMX where the CPU has them and segfaults on the first
# evaluation on such machines, so ggml is built for AVX2/FMA/F16C without -march=native. The source and the wheel
# are cached under build/llama-cpp-python/ (the build takes about 5 minutes on 2 cores); scripts/setup.sh rebuilds
# .venv when the lock changes, after which this script reinstalls the cached wheel in seconds. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${HF_POSENC_VENV:-.venv}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="build/llama-cpp-python"
CONVERTER="$CACHE/llama.cpp"
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  echo "setup_llamacpp: $VENV missing; run scripts/setup.sh first" >&2
  exit 1
fi
PIP=("$PY" -m pip --quiet --disable-pip-version-check)
quiet() { "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
mkdir -p "$CACHE"
sdist="$CACHE/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
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
wheel="$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$wheel" ]; then
  echo "setup_llamacpp: building llama-cpp-python $VERSION from source (about 5 minutes on 2 cores)" >&2
  CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    quiet "${PIP[@]}" wheel --no-deps "$sdist" -w "$CACHE"
  wheel="$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -1)"
fi
if ! "$PY" -c "import llama_cpp, sentencepiece, diskcache, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  quiet "${PIP[@]}" install --no-deps diskcache==5.6.3 sentencepiece==0.2.3
  quiet "${PIP[@]}" install --no-deps --force-reinstall "$wheel"
fi
"$PY" -c "import llama_cpp, sentencepiece; print('llama-cpp-python', llama_cpp.__version__)"
echo "llama.cpp converter: $CONVERTER (export HF_POSENC_LLAMA_CPP=$PWD/$CONVERTER)"
