#!/usr/bin/env bash
# A peer trainer beside eaglekit: vLLM's `speculators` trains an EAGLE-3 draft on the conversations
# of an `eaglekit run` folder, for the minutes eaglekit's train stage took there, with its own
# recommended settings; its draft is imported (`eaglekit import`) and both drafts are benched in
# eaglekit's engine and probed by the doctor (scripts/peer/compare.py prints one table).
#
#   scripts/peer/run_speculators.sh RUN [WORK]        (from the repo root, eaglekit's venv active)
#
# RUN holds target/, conversations/, draft/ and pipeline.json (`eaglekit run ... --stop-before
# export-sglang` is enough). WORK defaults to RUN/peer-speculators. Settings (environment):
#   PEER_PY    the peer venv's python (default /tmp/peer-venv/bin/python; docs/peers.md installs it)
#   BUDGET_S   the peer's wall-clock budget (default: RUN's train stage seconds from pipeline.json)
#   PEER_ARGS  extra `speculators train` arguments (e.g. "--epochs 12")
#   BENCH_ARGS `eaglekit bench` arguments for both drafts (default: a CPU-sized chain)
#   REUSE_CKPT set: keep WORK/ckpt from an earlier peer run (e.g. one run beside eaglekit's, at once)
#   DEVICE     cpu or cuda for the hidden-state capture (default: cuda when torch sees one)
set -euo pipefail
RUN=${1:?usage: run_speculators.sh RUN [WORK]}
WORK=${2:-$RUN/peer-speculators}
PEER_PY=${PEER_PY:-/tmp/peer-venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
TARGET=$RUN/target CONV=$RUN/conversations OURS=$RUN/draft
DEVICE=${DEVICE:-$(python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}
say() { echo "+ $*" >&2; }

[[ -x $PEER_PY ]] || { echo "no peer python at $PEER_PY (see docs/peers.md)" >&2; exit 2; }
for d in "$TARGET" "$CONV" "$OURS"; do [[ -d $d ]] || { echo "missing $d" >&2; exit 2; }; done
BUDGET_S=${BUDGET_S:-$(python -c "import json,sys; print(round(json.load(open(sys.argv[1]))['stages']['train']['seconds']))" "$RUN/pipeline.json")}
read -r VOCAB AUX < <(python - "$OURS/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
# speculators takes vLLM's convention (input of layer k = output of layer k-1), eaglekit stores outputs
print(c["draft_vocab_size"], " ".join(str(i + 1) for i in c["eaglekit"]["aux_layer_ids"]))
PY
)
mkdir -p "$WORK"
echo "peer: speculators $($PEER_PY -c 'import importlib.metadata as m; print(m.version("speculators"))'), budget ${BUDGET_S}s, draft vocab $VOCAB, target layers (vLLM convention) $AUX, device $DEVICE" | tee "$WORK/peer.txt"

# 1. the same tokens and loss masks eaglekit trained on, through the peer's own preparation
say python "$HERE/speculators_data.py" tokens "$CONV" --target "$TARGET" --out "$WORK/tokens.jsonl"
python "$HERE/speculators_data.py" tokens "$CONV" --target "$TARGET" --out "$WORK/tokens.jsonl"
if [[ ! -f $WORK/data/token_freq.pt ]]; then
  say "$PEER_PY" -m speculators prepare-data --model "$TARGET" --data "$WORK/tokens.jsonl" --output "$WORK/data" ...
  "$PEER_PY" -m speculators prepare-data --model "$TARGET" --data "$WORK/tokens.jsonl" --output "$WORK/data" \
    --seq-length 8192 --num-preprocessing-workers 1 --no-skip-token-freq --overwrite > "$WORK/prepare.log" 2>&1
fi
# 2. the target's hidden states in the peer's offline format (what vLLM's extraction would write)
say python "$HERE/speculators_data.py" hidden "$WORK/data" --target "$TARGET" --device "$DEVICE"
python "$HERE/speculators_data.py" hidden "$WORK/data" --target "$TARGET" --device "$DEVICE"

# 3. the peer trains with its own defaults for the budget (SIGTERM: it saves ckpt/interrupted itself).
# Kept off its defaults, and why: norm_before_fc / norm_output (EAGLE 3.1 layout that eaglekit's
# draft and SGLang cannot load: docs/peers.md); on a CPU, sdpa and the eager loss (flex attention and
# the fused loss want a GPU); num-workers 0 (2 shared cores).
ARGS=(train --verifier-name-or-path "$TARGET" --data-path "$WORK/data" --save-path "$WORK/ckpt"
      --log-dir "$WORK/logs" --on-missing raise --draft-vocab-size "$VOCAB" --target-layer-ids $AUX
      --no-norm-before-fc --no-norm-output --num-workers 0)
[[ $DEVICE == cpu ]] && ARGS+=(--draft-attn-impl sdpa --loss-implementation eager)
# shellcheck disable=SC2206
ARGS+=(${PEER_ARGS:-})
if [[ -z ${REUSE_CKPT:-} ]]; then
rm -rf "$WORK/ckpt"
say timeout -s TERM -k 300 "$BUDGET_S" "$PEER_PY" scripts/peer/cpu_shim.py "${ARGS[@]}"
start=$(date +%s)
timeout -s TERM -k 300 "$BUDGET_S" "$PEER_PY" "$HERE/cpu_shim.py" "${ARGS[@]}" > "$WORK/train.log" 2>&1 || echo "peer train exit $? (124: stopped at the budget)" | tee -a "$WORK/peer.txt"
echo "peer train wall: $(( $(date +%s) - start ))s" | tee -a "$WORK/peer.txt"
fi
CKPT=$WORK/ckpt/interrupted
[[ -f $CKPT/model.safetensors ]] || CKPT=$(ls -d "$WORK"/ckpt/[0-9]* | sort -V | tail -1)
[[ -f $CKPT/model.safetensors ]] || { echo "the peer saved no checkpoint: see $WORK/train.log" >&2; exit 1; }
echo "peer checkpoint: $CKPT ($(cat "$CKPT/training_state.json" 2>/dev/null))" | tee -a "$WORK/peer.txt"

# 4. import, then bench and probe both drafts the same way
say eaglekit import "$CKPT" --target "$TARGET" --out "$WORK/imported" --overwrite
eaglekit import "$CKPT" --target "$TARGET" --out "$WORK/imported" --overwrite
say python "$HERE/compare.py" --target "$TARGET" --out "$WORK/compare" eaglekit="$OURS" speculators="$WORK/imported"
# shellcheck disable=SC2086
python "$HERE/compare.py" --target "$TARGET" --out "$WORK/compare" ${BENCH_ARGS:+--bench-args "$BENCH_ARGS"} \
  eaglekit="$OURS" speculators="$WORK/imported"
