#!/usr/bin/env bash
# Install SGLang's PyPI wheel on a CPU torch in its own venv, for eaglekit's loader interop tests
# (tests/interop/test_interop_loaders.py runs tests/helpers/interop_sglang.py in it).
#
#   scripts/install_sglang_cpu.sh [VENV]    # default ${EAGLEKIT_SGLANG_VENV:-$HOME/.cache/eaglekit/sglang-venv}
#
# Idempotent: exits at once when VENV already holds the pinned versions.
# Env: EAGLEKIT_SGLANG_PYTHON (default python3.11).
#
# SGLang's wheel requires a CUDA torch and ~70 packages (flashinfer, sgl-kernel, deep-gemm, ...).
# Only its Python code is needed to build the draft model and run its weight loader, so the
# wheel goes in with --no-deps on the CPU torch, plus the pure-Python packages its import chain
# needs (found by importing until nothing was missing). Every pip call is constrained to the
# pinned torch/transformers, so nothing pulls a CUDA build. Cold install: ~1.5 min, ~2.5 GB
# (triton, imported by torch and SGLang at import time, is 1 GB of it).
set -euo pipefail

VENV="${1:-${EAGLEKIT_SGLANG_VENV:-$HOME/.cache/eaglekit/sglang-venv}}"
PYTHON="${EAGLEKIT_SGLANG_PYTHON:-python3.11}"

SGLANG="sglang==0.5.23"
# torch 2.13.0 resolves to the local CPU wheel (pip find-links on these machines); SGLang 0.5.23
# asks for torch 2.14.1 (CUDA) and transformers 5.19.0.
BASE=("torch==2.13.0" "transformers==5.19.0")
DEPS=("safetensors==0.8.0" "numpy==2.4.6" "triton==3.9.0" "orjson==3.13.0" "psutil==7.2.2" "pybase64==1.5.1"
      "requests==2.34.2" "pillow==13.0.0" "starlette==1.10.0" "msgspec==0.23.0" "pyzmq==27.3.0"
      "ipython==9.18.1" "aiohttp==3.14.5" "dill==0.4.1" "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1"
      "compressed-tensors==0.20.1" "gguf==0.19.0" "einops==0.8.2" "openai==2.8.0"
      "partial-json-parser==0.2.1.1.post7")
PINS=("$SGLANG" "${BASE[@]}" "${DEPS[@]}")

check() {  # fast version check through package metadata (no heavy imports)
  "$VENV/bin/python" - "$@" <<'PY' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version
want = dict(p.split("==") for p in sys.argv[1:])
bad = []
for n, v in want.items():
    try:
        if not version(n).startswith(v):
            bad.append(n)
    except PackageNotFoundError:
        bad.append(n)
try:
    bad.append(f"torchvision {version('torchvision')} present")  # breaks against the CPU torch
except PackageNotFoundError:
    pass
sys.exit(1 if bad else 0)
PY
}

if [[ -x "$VENV/bin/python" ]] && check "${PINS[@]}"; then
  echo "sglang venv already complete: $VENV"
  exit 0
fi

start=$SECONDS
. "$(dirname "${BASH_SOURCE[0]}")/venv_lib.sh"
new_venv "$VENV" "$PYTHON"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "${BASE[@]}" > "$CONSTRAINTS"

"${PIP[@]}" install --progress-bar off -c "$CONSTRAINTS" "${BASE[@]}" "${DEPS[@]}"
"${PIP[@]}" install --progress-bar off --no-deps "$SGLANG"
"${PIP[@]}" uninstall -y torchvision 2>/dev/null || true

# Smoke test: SGLang's EAGLE-3 draft class imports with only the runner's import-time stubs.
HERE="$(cd "$(dirname "$0")/.." && pwd)"
"$VENV/bin/python" - "$HERE/tests/helpers/interop_sglang.py" <<'PY'
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import interop_sglang
interop_sglang.install_stubs()
import torch, transformers
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3  # noqa: F401
from importlib.metadata import version
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"torch {torch.__version__}, transformers {transformers.__version__}, sglang {version('sglang')}, "
      f"stubbed {sorted({m.split('.')[0] for m in interop_sglang.STUBBED})}")
PY
check "${PINS[@]}" || { echo "error: pinned versions not satisfied in $VENV" >&2; exit 1; }
echo "sglang venv ready: $VENV ($(( SECONDS - start )) s)"
