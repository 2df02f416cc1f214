# Sourced by scripts/install_*.sh: one way to make the venv of an interop engine.
# new_venv VENV PYTHON: creates VENV with PYTHON unless it exists; sets PIP to its pip (an array).
new_venv() {
  local venv=$1 python=$2
  if [[ ! -x "$venv/bin/python" ]]; then
    command -v "$python" >/dev/null || { echo "error: $python not found (the local torch wheel is cp311)" >&2; exit 1; }
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
  fi
  PIP=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
}
