# Shared by scripts/demo.sh and scripts/serving/setup_vllm.sh (sourced): the small environments they keep beside
# the project's .venv, each rebuilt when what it was built from changes.
#   venv_current VENV STAMP WANT   true when VENV exists and its STAMP file holds WANT (nothing to do)
#   fresh_venv VENV                VENV rebuilt empty; then "${PIP[@]}" is its quiet pip, `quiet CMD` drops setuptools'
#                                  "is neither a file nor a directory" noise from CMD's stderr
venv_current() {
  [ -x "$1/bin/python" ] && [ -f "$1/$2" ] && [ "$(cat "$1/$2")" = "$3" ]
}
fresh_venv() {
  rm -rf "$1"
  "${PYTHON:-python3}" -m venv "$1"
  PIP=("$1/bin/python" -m pip --quiet --disable-pip-version-check)
}
quiet() { "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
