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
#   PY         eaglekit's python (default python3)
#   OURS       eaglekit's draft to compare with (default RUN/draft)
#   BUDGET_S   the GPU seconds both trainers get (default: RUN's train stage seconds from pipeline.json).
#              eaglekit's train stage runs the target inside them (online); the peer captures the target's
#              hidden states first, so with COUNT_CAPTURE=1 (default) that capture's seconds come out of its
#              training budget: equal GPU minutes. COUNT_CAPTURE=0: equal train seconds (capture free)
#   CALIBRATE  steps of a first, short peer run that measures its step time (default 60; 0: none). The
#              peer's schedule decays over its steps (`--max-steps`), not over wall-clock time, so
#              without this a budget cuts it mid-schedule. The real run then gets
#              max-steps = (BUDGET_S - its start-up) / step time. The calibration run's minutes are
#              not counted in the budget (said in peer.txt): the peer is given the benefit.
#   PEER_ARGS  extra `speculators train` arguments (e.g. "--epochs 12")
#   BENCH_ARGS `eaglekit bench` arguments for both drafts (default: a CPU-sized chain)
#   PROBE_ARGS `eaglekit doctor --probe` arguments for both drafts (default: compare.py's, CPU-sized)
#   REUSE_CKPT set: keep WORK/ckpt from an earlier peer run (e.g. one run beside eaglekit's, at once)
#   DEVICE     cpu or cuda for the hidden-state capture (default: cuda when torch sees one)
#   PREP_WORKERS  the peer's prepare-data processes (default 1)
set -euo pipefail
RUN=${1:?usage: run_speculators.sh RUN [WORK]}
WORK=${2:-$RUN/peer-speculators}
PEER_PY=${PEER_PY:-/tmp/peer-venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
TARGET=$RUN/target CONV=$RUN/conversations OURS=${OURS:-$RUN/draft}
DEVICE=${DEVICE:-$($PY -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}
say() { echo "+ $*" >&2; }
secs() { echo $(( $(date +%s) - $1 )); }

[[ -x $PEER_PY ]] || { echo "no peer python at $PEER_PY (see docs/peers.md)" >&2; exit 2; }
for d in "$TARGET" "$CONV" "$OURS"; do [[ -d $d ]] || { echo "missing $d" >&2; exit 2; }; done
BUDGET_S=${BUDGET_S:-$($PY -c "import json,sys; print(round(json.load(open(sys.argv[1]))['stages']['train']['seconds']))" "$RUN/pipeline.json")}
read -r VOCAB AUX < <($PY - "$OURS/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
# speculators takes vLLM's convention (input of layer k = output of layer k-1), eaglekit stores outputs
print(c["draft_vocab_size"], " ".join(str(i + 1) for i in c["eaglekit"]["aux_layer_ids"]))
PY
)
mkdir -p "$WORK"
echo "peer: speculators $($PEER_PY -c 'import importlib.metadata as m; print(m.version("speculators"))'), budget ${BUDGET_S}s, draft vocab $VOCAB, target layers (vLLM convention) $AUX, device $DEVICE" | tee "$WORK/peer.txt"

# 1. the same tokens and loss masks eaglekit trained on, through the peer's own preparation
t0=$(date +%s)
say $PY "$HERE/speculators_data.py" tokens "$CONV" --target "$TARGET" --out "$WORK/tokens.jsonl"
$PY "$HERE/speculators_data.py" tokens "$CONV" --target "$TARGET" --out "$WORK/tokens.jsonl" | tee -a "$WORK/peer.txt"
if [[ ! -f $WORK/data/token_freq.pt ]]; then
  say "$PEER_PY" -m speculators prepare-data --model "$TARGET" --data "$WORK/tokens.jsonl" --output "$WORK/data" ...
  "$PEER_PY" -m speculators prepare-data --model "$TARGET" --data "$WORK/tokens.jsonl" --output "$WORK/data" \
    --seq-length 8192 --num-preprocessing-workers "${PREP_WORKERS:-1}" --no-skip-token-freq --overwrite > "$WORK/prepare.log" 2>&1
fi
# 2. the target's hidden states in the peer's offline format (what vLLM's extraction would write)
say $PY "$HERE/speculators_data.py" hidden "$WORK/data" --target "$TARGET" --device "$DEVICE"
# a capture found on disk is not redone: what it cost is its first run's seconds, kept beside it
reused=$([[ -s $WORK/data/capture_seconds ]] && compgen -G "$WORK/data/hidden_states/hs_*.safetensors" >/dev/null && echo 1 || true)
t_capture=$(date +%s)
$PY "$HERE/speculators_data.py" hidden "$WORK/data" --target "$TARGET" --device "$DEVICE" | tee -a "$WORK/peer.txt"
if [[ -n $reused ]]; then CAPTURE_S=$(cat "$WORK/data/capture_seconds")
else CAPTURE_S=$(secs "$t_capture"); echo "$CAPTURE_S" > "$WORK/data/capture_seconds"; fi
echo "peer data (tokens, prepare-data, hidden states): $(secs "$t0")s, $(du -sh "$WORK/data" | cut -f1) on disk" | tee -a "$WORK/peer.txt"
if [[ ${COUNT_CAPTURE:-1} == 1 ]]; then
  (( BUDGET_S - CAPTURE_S > 0 )) || { echo "the capture (${CAPTURE_S}s) took the whole budget (${BUDGET_S}s)" >&2; exit 1; }
  echo "peer train budget: ${BUDGET_S}s less its capture's ${CAPTURE_S}s (the target's forwards, which eaglekit's train stage runs inside its own): $(( BUDGET_S - CAPTURE_S ))s" | tee -a "$WORK/peer.txt"
  BUDGET_S=$(( BUDGET_S - CAPTURE_S ))
fi

# 3. the peer trains with its own defaults for the budget (SIGTERM: it saves ckpt/interrupted itself).
# Its own draft layout (norm_before_fc, norm_output, norm_before_residual: eaglekit imports and runs
# it). Kept off its defaults on a CPU only: sdpa and the eager loss (flex attention and the fused loss
# want a GPU), num-workers 0 (2 shared cores).
ARGS=(train --verifier-name-or-path "$TARGET" --data-path "$WORK/data"
      --on-missing raise --draft-vocab-size "$VOCAB" --target-layer-ids $AUX)
[[ $DEVICE == cpu ]] && ARGS+=(--draft-attn-impl sdpa --loss-implementation eager --num-workers 0)
# shellcheck disable=SC2206
ARGS+=(${PEER_ARGS:-})
if [[ -z ${REUSE_CKPT:-} ]]; then
rm -rf "$WORK/ckpt" "$WORK/calibrate"
STEPS=()
if (( ${CALIBRATE:-60} > 0 )); then   # the peer's step time, from its own per-step log (profile/step_ms)
  start=$(date +%s)
  say "$PEER_PY" "$HERE/cpu_shim.py" "${ARGS[@]}" --max-steps "${CALIBRATE:-60}" ...
  "$PEER_PY" "$HERE/cpu_shim.py" "${ARGS[@]}" --save-path "$WORK/calibrate/ckpt" --log-dir "$WORK/calibrate/logs" \
    --max-steps "${CALIBRATE:-60}" --epochs 1 > "$WORK/calibrate.log" 2>&1 || { echo "the peer's calibration run failed: see $WORK/calibrate.log" >&2; exit 1; }
  wall=$(secs "$start")
  # --max-steps ends an epoch, not the run (each later epoch trains one more step and validates), so
  # the real run also gets the epochs that hold its steps: the loader's length is its progress bar's total.
  read -r STEP_MS MAX_STEPS EPOCHS < <($PY "$HERE/calibration.py" "$WORK/calibrate.log" --wall "$wall" --budget "$BUDGET_S")
  [[ -n ${MAX_STEPS:-} ]] || { echo "no plan from the calibration run (the reason is above; its log: $WORK/calibrate.log)" >&2; exit 1; }
  STEPS=(--max-steps "$MAX_STEPS" --epochs "$EPOCHS")
  echo "peer calibration: ${CALIBRATE:-60} steps in ${wall}s (not counted), ${STEP_MS} ms a step (step time or the bar's rate, the slower) -> --max-steps $MAX_STEPS --epochs $EPOCHS for ${BUDGET_S}s" | tee -a "$WORK/peer.txt"
fi
say timeout -s TERM -k 300 "$BUDGET_S" "$PEER_PY" scripts/peer/cpu_shim.py "${ARGS[@]}" "${STEPS[@]}"
start=$(date +%s)
# the budget is a cap: a calibrated run ends at its steps; a run left over is stopped (SIGTERM: it saves)
timeout -s TERM -k 300 "$(( BUDGET_S + ${BUDGET_SLACK_S:-30} ))" "$PEER_PY" "$HERE/cpu_shim.py" "${ARGS[@]}" "${STEPS[@]}" \
  --save-path "$WORK/ckpt" --log-dir "$WORK/logs" > "$WORK/train.log" 2>&1 || echo "peer train exit $? (124: stopped at the budget)" | tee -a "$WORK/peer.txt"
echo "peer train wall: $(secs "$start")s" | tee -a "$WORK/peer.txt"
fi
CKPT=$WORK/ckpt/interrupted
[[ -f $CKPT/model.safetensors ]] || CKPT=$(ls -d "$WORK"/ckpt/[0-9]* | sort -V | tail -1)
[[ -f $CKPT/model.safetensors ]] || { echo "the peer saved no checkpoint: see $WORK/train.log" >&2; exit 1; }
echo "peer checkpoint: $CKPT ($(cat "$CKPT/training_state.json" 2>/dev/null))" | tee -a "$WORK/peer.txt"

# 4. import, then bench and probe both drafts the same way
say $PY -m eaglekit import "$CKPT" --target "$TARGET" --out "$WORK/imported" --overwrite
$PY -m eaglekit import "$CKPT" --target "$TARGET" --out "$WORK/imported" --overwrite
say $PY "$HERE/compare.py" --target "$TARGET" --out "$WORK/compare" eaglekit="$OURS" speculators="$WORK/imported"
$PY "$HERE/compare.py" --target "$TARGET" --out "$WORK/compare" ${BENCH_ARGS:+--bench-args "$BENCH_ARGS"} \
  ${PROBE_ARGS:+--probe-args "$PROBE_ARGS"} eaglekit="$OURS" speculators="$WORK/imported"
