#!/usr/bin/env bash
# The product path on two H200 of one host: `eaglekit run --recipe smollm2-h200 gpus=2`, in calls
# made back to back (the machine keeps /root/work only while it is warm; one call runs <= 10 min).
# Run after setup.sh, from the repo root:
#   bash scripts/gpu/recipe_two_gpus.sh data  PROMPTS_DIR MT_BENCH  # prompts, Magpie, answers, features
#   bash scripts/gpu/recipe_two_gpus.sh train PROMPTS_DIR MT_BENCH  # DDP training (torchrun, both GPUs)
#   bash scripts/gpu/recipe_two_gpus.sh bench PROMPTS_DIR MT_BENCH  # GPU 0: MT-bench chain and tree with
#                                        the new draft; GPU 1: bench_engine.py parts a and c (engine alone)
# Every call passes the same recipe overrides, so `eaglekit run` skips the finished stages.
# Env: W (work folder), INIT (a draft to start from: train.init-from), TRAIN_S, LIMIT, TREE_LIMIT,
# KERNELS (bench_engine variants).
set -u
STAGE=${1:?data, train or bench}
PROMPTS=${2:?prompts folder}
EVAL=${3:?mt_bench.jsonl}
T=${EAGLEKIT_SMOLLM2_DIR:?run setup.sh first}
W=${W:-/root/work}
OUT=${OUT:?OUT is the folder that comes back}
RUN=$W/run
mkdir -p "$W" "$OUT"
stamp() { echo "[recipe_two_gpus $(date +%H:%M:%S)] $*"; }
quiet() { grep -v "it/s\]\|s/it\]\|s/it$\|it/s$" ; }
init=()
[[ -n ${INIT:-} ]] && init=("train.init-from=$INIT")
run() {
  python3 -m eaglekit run --recipe smollm2-h200 --out "$RUN" gpus=2 target="$T" \
    "prompts.source=[\"$PROMPTS/gsm8k_train.jsonl,weight=0.3\", \"$PROMPTS/codealpaca.jsonl,weight=0.8\", \"$PROMPTS/gpteacher_roleplay.jsonl\", \"$PROMPTS/alpaca_eval_805.jsonl\", \"$PROMPTS/alpaca_seed_tasks.jsonl\"]" \
    "validation.source=$EVAL" "train.time-budget-s=${TRAIN_S:-400}" train.no-progress=true "${init[@]}" "$@" 2>&1 | quiet
}
keep() { for f in "$@"; do [[ -e $RUN/$f ]] && mkdir -p "$OUT/$(dirname "$f")" && cp -r "$RUN/$f" "$OUT/$f"; done; true; }

t0=$(date +%s)
case $STAGE in
  data)
    run --stop-before train | tail -20
    keep pipeline.json prompts/manifest.json conversations/manifest.json features/manifest.json \
      val-conversations/manifest.json ;;
  train)
    run --stop-before export-sglang | tail -25
    keep pipeline.json draft/manifest.json draft/log.jsonl draft/config.json draft/model.safetensors ;;
  bench)
    ( CUDA_VISIBLE_DEVICES=1 timeout 500 python3 scripts/gpu/bench_engine.py --parts a,c --oracle-only \
        --kernels "${KERNELS:-matmul,reduce+matvec}" --target "$T" --out "$W/bench-engine" 2>&1 | quiet | tail -14
      cp "$W/bench-engine/bench_engine.json" "$OUT/" ) &
    for spec in "--mode chain --k 5 --limit ${LIMIT:-40}" "--mode tree --depth 6 --top-k 8 --total-tokens 32 --limit ${TREE_LIMIT:-40}"; do
      name=$(echo "$spec" | cut -d' ' -f2)
      CUDA_VISIBLE_DEVICES=0 timeout 230 python3 -m eaglekit bench --target "$T" --draft "$RUN/draft" --prompts "$EVAL" \
        --max-new-tokens 256 --no-hf $spec --out "$W/bench-$name" 2>&1 | quiet | tail -4
      cp "$W/bench-$name/results.json" "$OUT/bench_mtbench_$name.json"
    done
    wait ;;
  *) echo "unknown stage $STAGE (data, train, bench)"; exit 2 ;;
esac
stamp "$STAGE took $(( $(date +%s) - t0 )) s"
