#!/usr/bin/env bash
# Install SafeAILab/EAGLE's own code (EAGLE-3, `eagle.model`) on a CPU torch and transformers 4.x
# in its own venv, for eaglekit's loader interop tests (tests/helpers/interop_eagle.py runs in it).
#
#   scripts/install_eagle_venv.sh [VENV]    # default ${EAGLEKIT_EAGLE_VENV:-$HOME/.cache/eaglekit/eagle-venv}
#
# Idempotent: exits at once when VENV already holds the pinned versions and EAGLE's commit.
# Env: EAGLEKIT_EAGLE_PYTHON (default python3.11); EAGLEKIT_EAGLE_SRC: a folder holding
# SafeAILab/EAGLE at the pinned commit (its eagle/, setup.py, README.md), for machines that cannot
# reach GitHub; without it pip fetches git+https://github.com/SafeAILab/EAGLE@COMMIT.
#
# Why not PyPI: the `eagle-llm` package there is 1.2.1 (2024-04), EAGLE-1/2 only; EAGLE-3 lives in
# the repository. Its setup.py pins torch 2.0.1 and gradio/fschat/openai for the demos, so it goes
# in with --no-deps; `eagle.model` needs only torch, transformers 4.x and safetensors.
# Cold install: ~1 min, ~1.2 GB.
set -euo pipefail

VENV="${1:-${EAGLEKIT_EAGLE_VENV:-$HOME/.cache/eaglekit/eagle-venv}}"
PYTHON="${EAGLEKIT_EAGLE_PYTHON:-python3.11}"
COMMIT="cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b"   # SafeAILab/EAGLE main, 2026-02-19
PINS=("torch==2.13.0" "transformers==4.53.1" "safetensors==0.8.0" "numpy==2.3.5")

check() {
  "$VENV/bin/python" - "$COMMIT" "${PINS[@]}" <<'PY' 2>/dev/null
import json, sys
from importlib.metadata import PackageNotFoundError, distribution, version
commit, pins = sys.argv[1], sys.argv[2:]
bad = [p for p in pins if not version(p.split("==")[0]).startswith(p.split("==")[1])]
try:
    marker = json.loads(distribution("eagle-llm").read_text("eaglekit_source.json") or "{}")
    bad += [] if marker.get("commit") == commit else ["eagle-llm commit"]
except PackageNotFoundError:
    bad.append("eagle-llm")
sys.exit(1 if bad else 0)
PY
}

if [[ -x "$VENV/bin/python" ]] && check; then
  echo "eagle venv already complete: $VENV"
  exit 0
fi

start=$SECONDS
. "$(dirname "${BASH_SOURCE[0]}")/venv_lib.sh"
new_venv "$VENV" "$PYTHON"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"   # the local CPU wheel; a looser pin pulls a CUDA build

"${PIP[@]}" install --progress-bar off -c "$CONSTRAINTS" "${PINS[@]}"
if [[ -n "${EAGLEKIT_EAGLE_SRC:-}" ]]; then
  [[ -f "$EAGLEKIT_EAGLE_SRC/eagle/model/ea_model.py" ]] || {
    echo "error: EAGLEKIT_EAGLE_SRC=$EAGLEKIT_EAGLE_SRC holds no eagle/model/ea_model.py" >&2; exit 1; }
  SRC="$EAGLEKIT_EAGLE_SRC"
else
  SRC="git+https://github.com/SafeAILab/EAGLE@$COMMIT"
fi
"${PIP[@]}" install --progress-bar off --no-deps --force-reinstall "$SRC" || {
  echo "error: could not install EAGLE from $SRC; on a machine without GitHub set EAGLEKIT_EAGLE_SRC to a" \
       "copy of SafeAILab/EAGLE at $COMMIT" >&2; exit 1; }

# Record the commit beside the installed package (EAGLE's setup.py says version 3.0.0 for every commit).
"$VENV/bin/python" - "$COMMIT" "$SRC" <<'PY'
import json, sys
from importlib.metadata import distribution
from pathlib import Path
dist = distribution("eagle-llm")
info = Path(dist._path)  # the .dist-info folder
(info / "eaglekit_source.json").write_text(json.dumps({"commit": sys.argv[1], "source": sys.argv[2]}))
import torch, transformers
from eagle.model.ea_model import EaModel  # noqa: F401
from eagle.model.cnets import Model  # noqa: F401
print(f"torch {torch.__version__}, transformers {transformers.__version__}, EAGLE {sys.argv[1][:10]}")
PY
check || { echo "error: pinned versions not satisfied in $VENV" >&2; exit 1; }
echo "eagle venv ready: $VENV ($(( SECONDS - start )) s)"
