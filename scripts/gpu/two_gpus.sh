#!/usr/bin/env bash
# A better draft and the multi-GPU figures on two H200 of one host, in three calls made back to back
# (the machine keeps /root/work only while it is warm). Run after setup.sh, from the repo root:
#   . scripts/gpu/setup.sh && bash scripts/gpu/two_gpus.sh data  PROMPTS_DIR   # ~8 min
#   . scripts/gpu/setup.sh && bash scripts/gpu/two_gpus.sh train               # ~9 min
#   . scripts/gpu/setup.sh && bash scripts/gpu/two_gpus.sh bench MT_BENCH.jsonl # ~7 min
# data:  GPU 0 answers the prompt files (gsm8k down-weighted), GPU 1 first synthesizes Magpie chat
#        prompts from the target itself, then answers them; the two folders are merged, features are
#        captured once, and train_draft.py --mode ddp measures 1 vs 2 GPUs on them.
# train: torchrun on both GPUs, offline features, TTT 7, within TRAIN_S seconds; the best draft is
#        exported in bf16 parts under $OUT/draft.
# bench: MT-bench chain k=5 and tree on GPU 0, while GPU 1 runs the oracle/random-draft part of
#        bench_engine.py (engine overhead apart from draft quality).
# This is the script that produced docs/results/2026-11-29-h200x2, kept as run. Its data stage
# parallelizes by hand (two generate runs + merge_conversations.py); the product path now does the
# same with `eaglekit generate --devices` after a Magpie top-up (`eaglekit run --recipe smollm2-h200
# gpus=2`), which ran on 2026-11-30 through scripts/gpu/recipe_two_gpus.sh.
# Env: W (work folder), N_MAGPIE, GSM_WEIGHT, GEN_S, TRAIN_S, LIMIT (MT-bench questions), MAX_NEW and
# BENCH_NEW (answer tokens), BATCH, SYN_BATCH, REPEATS, DDP_STEPS, DDP_ARGS / TRAIN_ARGS (extra flags); small values
# make a CPU smoke run.
set -u
STAGE=${1:?data, train or bench}
T=${EAGLEKIT_SMOLLM2_DIR:?run setup.sh first}
W=${W:-/root/work}
OUT=${OUT:?OUT is the folder that comes back}
EK="python3 -m eaglekit"
mkdir -p "$W" "$OUT"
stamp() { echo "[two_gpus $(date +%H:%M:%S)] $*"; }
quiet() { grep -v "it/s\]\|s/it\]" ; }

data() {
  local prompts=${1:?prompts folder}
  local t0; t0=$(date +%s)
  $EK prompts build --out "$W/prompts-files" --overwrite \
    --source "$prompts/gsm8k_train.jsonl,weight=${GSM_WEIGHT:-0.3}" --source "$prompts/codealpaca.jsonl,weight=0.8" \
    --source "$prompts/gpteacher_roleplay.jsonl" --source "$prompts/alpaca_eval_805.jsonl" \
    --source "$prompts/alpaca_seed_tasks.jsonl" 2>&1 | tail -2
  stamp "GPU 0: answer the prompt files; GPU 1: Magpie prompts, then their answers"
  ( CUDA_VISIBLE_DEVICES=0 timeout "${GEN_S:-330}" $EK generate --prompts "$W/prompts-files" --target "$T" \
      --out "$W/conv-files" --backend local --batch-size "${BATCH:-256}" --max-new-tokens "${MAX_NEW:-256}" 2>&1 | quiet | tail -3 ) &
  ( export CUDA_VISIBLE_DEVICES=1
    timeout 150 $EK prompts synthesize --target "$T" --out "$W/prompts-magpie" --num-prompts "${N_MAGPIE:-5000}" \
      --batch-size "${SYN_BATCH:-512}" --max-new-tokens 96 --overwrite 2>&1 | quiet | tail -2
    timeout "$(( ${GEN_S:-330} - 120 ))" $EK generate --prompts "$W/prompts-magpie" --target "$T" \
      --out "$W/conv-magpie" --backend local --batch-size "${BATCH:-256}" --max-new-tokens "${MAX_NEW:-256}" 2>&1 | quiet | tail -3 ) &
  wait
  cp "$W/conv-files/manifest.json" "$OUT/generate_files_manifest.json" 2>/dev/null
  cp "$W/conv-magpie/manifest.json" "$OUT/generate_magpie_manifest.json" 2>/dev/null
  stamp "generation took $(( $(date +%s) - t0 )) s; merge"
  python3 scripts/gpu/merge_conversations.py "$W/conv" "$W/conv-files" "$W/conv-magpie" || return 1
  stamp "capture features, then DDP: 1 GPU vs 2 GPUs (train_draft.py --mode ddp)"
  timeout 300 python3 scripts/gpu/train_draft.py --mode ddp --target "$T" --conversations "$W/conv" \
    --work "$W/train" --steps "${DDP_STEPS:-150}" ${DDP_ARGS:-} --out "$OUT" 2>&1 | quiet | tail -8
  stamp "data stage took $(( $(date +%s) - t0 )) s"
}

train() {
  local t0; t0=$(date +%s)
  rm -rf "$W/draft-2gpu"
  timeout "$(( ${TRAIN_S:-470} + 60 ))" python3 -m torch.distributed.run --nproc_per_node 2 \
    --master_addr 127.0.0.1 --master_port 29511 -m eaglekit train --target "$T" --features "$W/train/features" \
    --out "$W/draft-2gpu" --draft-vocab-size 16384 --allow-smaller-vocab --ttt-steps 7 --batch-tokens 16384 \
    --max-batch-size 64 --lr "${LR:-3e-4}" --epochs 40 --time-budget-s "${TRAIN_S:-470}" --val-every 400 \
    --save-every 400 --val-max-samples 512 --log-every 40 --no-progress ${TRAIN_ARGS:-} 2>&1 | quiet | tail -14
  cp "$W/draft-2gpu/log.jsonl" "$OUT/train_2gpu_log.jsonl" 2>/dev/null
  python3 - "$W/draft-2gpu" "$OUT" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "scripts/gpu")
from train_draft import export_bf16
run, out = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((run / "manifest.json").read_text())
info = export_bf16(run, out / "draft", int(15 * 2**20))
(out / "train_2gpu.json").write_text(json.dumps({"export": info, "best": manifest.get("best"),
    "history": manifest.get("history"), "counts": manifest.get("counts"),
    "draft_vocab": manifest.get("draft_vocab")}, indent=2) + "\n")
print("best", manifest.get("best"))
PY
  stamp "train stage took $(( $(date +%s) - t0 )) s"
}

bench() {
  local eval=${1:?mt_bench.jsonl}
  local t0; t0=$(date +%s)
  ( CUDA_VISIBLE_DEVICES=1 timeout 400 python3 scripts/gpu/bench_engine.py --parts c --target "$T" \
      --new-tokens "${BENCH_NEW:-256}" --repeats "${REPEATS:-3}" --out "$W/bench-engine" 2>&1 | quiet | tail -10; cp "$W/bench-engine/bench_engine.json" "$OUT/" 2>/dev/null ) &
  for spec in "--mode chain --k 5" "--mode tree"; do
    name=$(echo "$spec" | tr -d ' -')
    CUDA_VISIBLE_DEVICES=0 timeout 200 $EK bench --target "$T" --draft "$W/draft-2gpu" --prompts "$eval" \
      --limit "${LIMIT:-40}" --max-new-tokens "${BENCH_NEW:-256}" --no-hf $spec --out "$W/bench_$name" 2>&1 | quiet | tail -5
    cp "$W/bench_$name/results.json" "$OUT/bench_$name.json" 2>/dev/null
  done
  wait
  stamp "bench stage took $(( $(date +%s) - t0 )) s"
}

case $STAGE in
  data) data "${2:-}" ;;
  train) train ;;
  bench) bench "${2:-}" ;;
  *) echo "unknown stage $STAGE (data, train, bench)"; exit 2 ;;
esac
