#!/usr/bin/env bash
# Prompts -> target answers -> trained draft -> tau on MT-bench, on one H200, each stage under a
# time limit so a slow stage still returns what the others measured. Run after setup.sh:
#   . scripts/gpu/setup.sh && bash scripts/gpu/pipeline.sh PROMPTS_DIR MT_BENCH.jsonl
# Env: N (prompts, default 4000), GEN_S / TRAIN_S (stage budgets in seconds).
set -u
PROMPTS=${1:?prompts folder or file}
EVAL=${2:?mt_bench.jsonl}
T=${EAGLEKIT_SMOLLM2_DIR:?run setup.sh first}
W=/root/work
mkdir -p "$W" "$OUT"
N=${N:-4000}
stamp() { echo "[pipeline $(date +%H:%M:%S)] $*"; }
t0=$(date +%s)
stamp "prompts: $N from $PROMPTS"
python3 -m eaglekit prompts build --source "$PROMPTS" --num-prompts "$N" --out "$W/prompts" --overwrite 2>&1 | tail -2
stamp "generate (engine batch decoder)"
timeout "${GEN_S:-240}" python3 -m eaglekit generate --prompts "$W/prompts" --target "$T" --out "$W/conv" \
  --backend local --batch-size 256 --max-new-tokens 256 2>&1 | grep -v "it/s\]" | tail -4
cp "$W/conv/manifest.json" "$OUT/generate_manifest.json" 2>/dev/null
t1=$(date +%s); stamp "generate took $((t1 - t0)) s"
stamp "train (full mode, capture + TTT + export)"
timeout "${TRAIN_S:-330}" python3 scripts/gpu/train_draft.py --mode full --target "$T" --conversations "$W/conv" \
  --time-budget-s "$(( ${TRAIN_S:-330} - 30 ))" --work "$W/train" --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12
t2=$(date +%s); stamp "train took $((t2 - t1)) s; prompts -> draft $((t2 - t0)) s"
for spec in "--mode chain --k 5" "--mode tree"; do
  name=$(echo "$spec" | tr -d ' -')
  timeout 150 python3 -m eaglekit bench --target "$T" --draft "$W/train/full" --prompts "$EVAL" --limit 10 \
    --max-new-tokens 256 --no-hf $spec --out "$W/bench_$name" 2>&1 | tail -6
  cp "$W/bench_$name/results.json" "$OUT/bench_$name.json" 2>/dev/null
done
stamp "total $(( $(date +%s) - t0 )) s"
