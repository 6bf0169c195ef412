# Sourced by the environment scripts (scripts/setup.sh, scripts/setup_upstream.sh, scripts/lib/venv.sh): BYTECODE,
# the `pip install` options that decide who compiles the installed packages' bytecode.
#
# pip compiles every module of every package it installs: for torch and the lock, most of an install's CPU time (the
# locked environment took 228 s with it and 143 s without on 2 otherwise idle cores, 2026-12-03). Python compiles a
# module on its first import and caches it beside the source, so only what is imported is ever compiled, once.
# That holds unless PYTHONDONTWRITEBYTECODE is set: then Python caches nothing, every process would compile torch
# and Transformers from source again (a fresh-clone CI run was 8 % through the suite after 26 minutes), and pip's
# compilation is what keeps imports fast, so it stays. An environment built without it and used later with
# PYTHONDONTWRITEBYTECODE set works, with slow imports; `python -m compileall -q .venv` compiles it ahead.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  BYTECODE=()
else
  BYTECODE=(--no-compile)
fi
