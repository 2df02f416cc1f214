#!/usr/bin/env bash
# The product path on this host's GPUs: `eaglekit run --recipe smollm2-h200` from prompt files to a
# verified draft, then the measurements that belong to it, in ONE background process (setsid), so
# that the run outlives each <= 10-minute device call and no stage is cut at a call's boundary.
# After setup.sh, from the repo root:
#   bash scripts/gpu/recipe_gpu.sh start PROMPTS_DIR EVAL_DIR   # launch the session, return at once
#   bash scripts/gpu/recipe_gpu.sh wait SECONDS                 # follow it; pack what exists into $OUT
#   bash scripts/gpu/recipe_gpu.sh bench DRAFT_DIR EVAL_DIR     # steps 1's bench stage, 2 and 3 for an earlier draft
#   bash scripts/gpu/recipe_gpu.sh only [EVAL_DIR]              # BENCHES alone, those that need no draft (kernels, gputests)
# The session, in order (each step timed in $W/session.log):
#   1. eaglekit run --recipe smollm2-h200 on every prompt file of PROMPTS_DIR (weights below), bench
#      stage on MT-bench (EVAL_DIR/mt_bench.jsonl), in the recipe's bench shape;
#   2. the benches named in BENCHES, in its order (default "chain heldout generate"):
#      tree      eaglekit bench on MT-bench in the recipe's tree shape (as the recipe's bench stage, which
#                --stop-before export-sglang skips; with SPEC_ARGS);
#      chain     eaglekit bench chain k=5 on MT-bench with the new draft;
#      sweep     eaglekit bench --sweep on 8 MT-bench questions (SWEEP_SHAPES: --sweep-shapes, default two chains and
#                two trees; SWEEP_PROMPTS: --sweep-prompts, default 4): the fastest shape;
#      heldout   eaglekit bench tree on prompts the recipe never saw or tuned on (HumanEval, Alpaca, translation: 20 each);
#      generate  bench_generate.py: the engine's batch decoder beside HF generate at the same batch;
#      regen     eaglekit generate again on the run's prompts (REGEN_LIMIT, default 10,000), once per REGEN variant
#                (extra flags, ';' between variants), into $W/regen-N: the decoder lines side by side;
#      profile   profile_batch.py (one decode step and one refill, top kernels) at each of PROFILE_ROWS rows;
#      kernels   bench_engine.py part c (oracle chain 5 and tree 32) for each VARIANT[%COMPILE_MODE] in KERNELS
#                (default "reduce+matvec reduce+matvec%max-autotune-no-cudagraphs": Inductor's own GEMMs),
#                with BE_ARGS (more bench_engine flags, e.g. "--trees 6/8/32,4/4/16"); KERNELS_DRAFTS=both adds
#                the random-draft rows (a real draft's device work: its catch-up, steps, top-k and tree build);
#      arms      issue 39's A/B: a draft per ARMS variant (train flags, ';' between, "-" the recipe's own) trained
#                ARM_S seconds each in turn (or ARM_STEPS steps, all at once) on the run's conversations, each
#                benched on MT-bench and the held-out set (HumanEval, Alpaca, translation);
#      peer      issue 39's peer: speculators trained beside the run's draft for its train seconds, both benched;
#      gputests  the gpu tier, tests/gpu (CUDA against the CPU, token for token), at most 600 s (GPUTESTS_K: pytest -k).
#   SPEC_ARGS: more `eaglekit bench` flags for every bench of a draft (tree, chain, sweep, heldout, arms, peer),
#   e.g. "--no-plain-fallback": one run, speculating throughout (by default each bench also runs its turns
#   that way beside the fallback's run: the draft's own tau is `summary.throughout`).
#   PRE names benches to run before the recipe (e.g. PRE=kernels: timings on an idle GPU, first), BESIDE
#   benches to run beside its data stages (BESIDE=gputests: checks, not timings; training waits for them).
# Env: W (work folder, /root/work), GPUS (1), TRAIN_S (train.time-budget-s; default the recipe's), LIMIT (MT-bench prompts),
# REFILL (generate.refill: graphs, the recipe's, eager or compiled), PROFILE (train.profile-steps A:B: the
# training loop's torch.profiler table, run/draft/profile.txt), EXTRA (more SECTION.KEY=VALUE overrides,
# split at spaces, e.g. "generate.limit=null": answer every training prompt, not the recipe's 20,000),
# BENCHES, PRE and KERNELS (step 2).
set -u
VERB=${1:?start or wait}
W=${W:-/root/work}
RUN=$W/run
LOG=$W/session.log
mkdir -p "$W"
stamp() { echo "[recipe_gpu $(date +%H:%M:%S)] $*" >> "$LOG"; }
quiet() { grep --line-buffered -v "it/s\]\|s/it\]\|s/it$\|it/s$" ; }

bench_shape() {  # the recipe's bench shape as flags (one source: the recipe file), for the benches below
  python3 -c "from eaglekit.pipeline.recipe import load_recipe, to_flags
b = load_recipe('smollm2-h200')['bench']
print(' '.join(to_flags({k: b[k] for k in ('mode', 'depth', 'tree-top-k', 'total-tokens') if k in b})))"
}

train_flags() {  # the recipe's train section as flags (one source: the recipe file), less its time budget, for the arms
  python3 -c "from eaglekit.pipeline.recipe import load_recipe, to_flags
t = load_recipe('smollm2-h200')['train']
print(' '.join(to_flags({k: v for k, v in t.items() if k != 'time-budget-s'})))"
}

heldout_set() {  # EVAL N OUT: N HumanEval, N Alpaca and N translation prompts (the last N MT-bench first turns
                 # wrapped in `prompts build`'s translate-fr template, category "translation"), none trained on
  python3 - "$1" "$2" "$3" <<'PY'
import itertools, json, sys
from pathlib import Path
from eaglekit.data.readers import TEMPLATES
ev, n, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
lines = [l for name in ("humaneval.jsonl", "alpaca.jsonl") for l in itertools.islice(open(ev / name), n)]
for r in [json.loads(l) for l in open(ev / "mt_bench.jsonl")][-n:]:
    turn = TEMPLATES["translate-fr"].format(prompt=r["turns"][0])
    lines.append(json.dumps({"id": f"{r['id']}+translate-fr", "source": "mt_bench+translate-fr", "category": "translation", "turns": [turn]}) + "\n")
out.write_text("".join(lines))
PY
}

bench_tree() {  # what the recipe's bench stage measures, for a draft trained earlier (HF generate on 8 prompts)
  local draft=$1 eval=$2 t0
  t0=$(date +%s)
  python3 -m eaglekit bench --target "$EAGLEKIT_SMOLLM2_DIR" --draft "$draft" --prompts "$eval/mt_bench.jsonl" \
    --limit "${LIMIT:-40}" --max-new-tokens 256 $(bench_shape) \
    ${SPEC_ARGS:-} --out "$W/bench-tree" --overwrite 2>&1 | quiet | tail -30 >> "$LOG"
  stamp "bench tree (MT-bench) done after $(( $(date +%s) - t0 )) s"
}

benches() {  # after the recipe, each of $BENCHES in turn (default: chain heldout generate)
  local draft=$1 eval=$2 prompts=${3:-} t=$EAGLEKIT_SMOLLM2_DIR t0 b
  for b in ${BENCHES:-chain heldout generate}; do
    t0=$(date +%s)
    case $b in
      tree)      bench_tree "$draft" "$eval"; continue ;;   # it stamps its own line
      chain)     # the draft on MT-bench as a chain of 5
        python3 -m eaglekit bench --target "$t" --draft "$draft" --prompts "$eval/mt_bench.jsonl" --limit "${LIMIT:-40}" \
          --max-new-tokens 256 --no-hf --mode chain --k 5 ${SPEC_ARGS:-} --out "$W/bench-chain" --overwrite 2>&1 | quiet | tail -30 >> "$LOG" ;;
      sweep)     # the bench's own shape sweep (SWEEP_SHAPES, default its four) on SWEEP_PROMPTS (4) of 8 MT-bench questions
        python3 -m eaglekit bench --target "$t" --draft "$draft" --prompts "$eval/mt_bench.jsonl" --limit 8 \
          --max-new-tokens 256 --no-hf --sweep ${SWEEP_SHAPES:+--sweep-shapes "$SWEEP_SHAPES"} \
          ${SWEEP_PROMPTS:+--sweep-prompts "$SWEEP_PROMPTS"} ${SPEC_ARGS:-} --out "$W/bench-sweep" --overwrite 2>&1 | quiet | tail -30 >> "$LOG" ;;
      heldout)   # a tree on prompts the recipe never saw or tuned on
        heldout_set "$eval" 20 "$W/heldout.jsonl"
        python3 -m eaglekit bench --target "$t" --draft "$draft" --prompts "$W/heldout.jsonl" \
          --max-new-tokens 256 --no-hf $(bench_shape) ${SPEC_ARGS:-} --out "$W/bench-heldout" --overwrite \
          2>&1 | quiet | tail -30 >> "$LOG" ;;
      generate)  # the engine's batch decoder beside HF generate at the same batch
        [[ -n $prompts ]] || { stamp "bench_generate skipped: no prompts folder"; continue; }
        python3 scripts/gpu/bench_generate.py --target "$t" --prompts "$prompts" --num-prompts 4096 --hf-prompts 512 \
          --batch-size 512 --max-new-tokens 512 --out "$W/bench-generate" 2>&1 | quiet | tail -30 >> "$LOG" ;;
      kernels)   # issue 11: the oracle cycle with each of $KERNELS (bench_engine part c), one process each
        local k v mode
        for k in ${KERNELS:-reduce+matvec reduce+matvec%max-autotune-no-cudagraphs}; do
          v=${k%%%*}; mode=default; [[ $k == *%* ]] && mode=${k#*%}     # VARIANT[%COMPILE_MODE]
          python3 scripts/gpu/bench_engine.py --parts c $([[ ${KERNELS_DRAFTS:-oracle} == both ]] || echo --oracle-only) --kernels "$v" --compile-mode "$mode" --target "$t" ${BE_ARGS:-} \
            --out "$W/be-${k//[^a-z0-9]/_}" 2>&1 | quiet | grep "^| c " >> "$LOG"
        done ;;
      regen)     # issue 12: the generate stage again on the run's prompts, once per REGEN variant (flags; ';' between)
        local i=0 flags variants
        [[ -d $RUN/prompts ]] || { stamp "regen skipped: no $RUN/prompts (the recipe's data stages make it)"; continue; }
        IFS=';' read -ra variants <<< "${REGEN:- }"          # unset: one run with the stage's own flags
        for flags in "${variants[@]}"; do
          i=$((i + 1)); stamp "regen $i: $flags"
          python3 -m eaglekit generate --prompts "$RUN/prompts" --target "$RUN/target" --limit "${REGEN_LIMIT:-10000}" \
            --max-new-tokens 1024 --batch-size 512 --context-length 2048 --cache-slots 2048 --stop-loops 128 \
            --refill graphs $flags --device cuda --overwrite --out "$W/regen-$i" 2>&1 | quiet \
            | grep "decoder\|wrote\|captured\|compiled\|Error\|error" >> "$LOG"
        done ;;
      profile)   # where the batch decoder's step and refill go, at each of PROFILE_ROWS (default 512)
        local rows
        [[ -n $prompts ]] || { stamp "profile skipped: no prompts folder"; continue; }
        for rows in ${PROFILE_ROWS:-512}; do
          python3 scripts/gpu/profile_batch.py --target "$t" --prompts "$prompts" --batch-size "$rows" --attention flex \
            --out "$W/profile-$rows" 2>&1 | quiet | tail -40 >> "$LOG"
        done ;;
      arms)      # issue 39's A/B: one draft per ARMS variant (train flags; ';' between; "-" = the recipe's own),
                 # each trained on the run's conversations, then benched on MT-bench (the recipe's tree, LIMIT
                 # questions) and on the held-out set (HumanEval, Alpaca, translation: 10 each), compiled as the recipe benches.
                 # ARM_S seconds each, one after another (variants whose step costs differ: --compile, a vocab);
                 # or, with ARM_STEPS, ARM_STEPS optimizer steps each, all arms at once on the one GPU (variants of
                 # equal step cost: an objective, a layout, an lr), their benches at once too: tau, not speed
        local i=0 flags pids=()
        heldout_set "$eval" 10 "$W/heldout10.jsonl"
        IFS=';' read -ra variants <<< "${ARMS:--}"
        for flags in "${variants[@]}"; do
          flags=${flags#"${flags%%[![:space:]]*}"}; flags=${flags%"${flags##*[![:space:]]}"}   # "- ; run": "-", "run"
          i=$((i + 1)); [[ $flags == "-" ]] && flags=""
          if [[ -n ${ARM_STEPS:-} ]]; then
            arm "$i" "$t" "$eval" "--max-steps $ARM_STEPS" "$flags" & pids+=($!)
          else
            arm "$i" "$t" "$eval" "--time-budget-s ${ARM_S:-240}" "$flags"
          fi
        done
        (( ${#pids[@]} )) && wait "${pids[@]}" ;;
      peer)      # issue 39: vLLM's speculators beside eaglekit (scripts/peer/run_speculators.sh): the run's
                 # conversations and target, the train stage's seconds (calibrated to its step time), its draft
                 # imported, both benched on MT-bench in the recipe's shape and probed by the doctor
        [[ -f $RUN/draft/config.json ]] || { stamp "peer skipped: no draft in $RUN (the recipe's train stage makes it)"; continue; }
        if [[ ! -d /tmp/peer-site ]]; then     # the peer's wheels (docs/peers.md), in a folder of their own
          python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-site .device/peerwhl/*.whl 2>&1 | tail -2 >> "$LOG"
        fi
        printf '#!/usr/bin/env bash\nPYTHONPATH=/tmp/peer-site:${PYTHONPATH:-} exec python3 "$@"\n' > "$W/peer-py"; chmod +x "$W/peer-py"
        # its fused loss (a Triton autotuner) does not trace under this image's torch.compile: its eager
        # loss instead, the one deviation from its defaults here (docs/results/2026-12-07-h100-peer-run)
        PEER_ARGS=${PEER_ARGS:---loss-implementation eager} PEER_PY=$W/peer-py PREP_WORKERS=8 PROBE_ARGS="--engine vllm --device cuda" \
          BENCH_ARGS="--prompts $eval/mt_bench.jsonl --limit ${LIMIT:-20} --max-new-tokens 256 --no-hf $(bench_shape) ${SPEC_ARGS:-} --device cuda" \
          bash scripts/peer/run_speculators.sh "$RUN" "$W/peer" 2>&1 | quiet | grep -v "^+ " | tail -30 >> "$LOG" ;;
      gputests)  # the engine's and the batch decoder's CUDA paths against the CPU's, token for token
        # the whole output to gputests.log (packed): the log's tail holds a failure's name, not its cause
        timeout 600 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu ${GPUTESTS_K:+-k "$GPUTESTS_K"} 2>&1 \
          | grep -v "^DEBUG" > "$W/gputests.log"; tail -15 "$W/gputests.log" >> "$LOG" ;;
      none) continue ;;   # BENCHES=none: the recipe's run alone
      *) stamp "unknown bench $b (tree, chain, sweep, heldout, generate, kernels, regen, profile, arms, peer, gputests, none)"; continue ;;
    esac
    stamp "bench $b done after $(( $(date +%s) - t0 )) s"
  done
}

arm() {  # one arm of the `arms` bench: train (with its budget flags, then its own), bench on MT-bench and held out
  local i=$1 t=$2 eval=$3 budget=$4 flags=$5 log=$W/arm-$1/arm.log base f
  # `--no-X` in an arm's flags drops the recipe's switch `--X` (train's switches have one form only)
  base=" $(train_flags) "
  for f in $flags; do
    if [[ $f == --no-* && $base == *" --${f#--no-} "* ]]; then base=${base/" --${f#--no-} "/ }; flags=${flags/$f/}; fi
  done
  mkdir -p "$W/arm-$i"
  # "run": the recipe's own draft, benched as the arms are and not trained again: a baseline for arms of
  # ARM_S = the recipe's TRAIN_S on the run's conversations (its steps and seconds are stamped: compare)
  local draft=$W/arm-$i/draft
  if [[ $flags == run ]]; then
    draft=$RUN/draft
    [[ -f $draft/manifest.json ]] || { stamp "arm $i skipped: no draft in $RUN (drop --stop-before train, or use -)"; return; }
    stamp "arm $i: the run's own draft ($(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['steps']['done'], 'steps,', m['config']['time_budget_s'], 's budget')" "$draft/manifest.json"))"
  else stamp "arm $i: train ($budget) with [$flags] on [$base]"; fi
  { [[ $flags == run ]] || python3 -m eaglekit train --target "$t" --data "$RUN/conversations" $base --device cuda --no-progress \
      $budget $flags --out "$draft" 2>&1 | quiet | grep -v "^step" | tail -8
    python3 -m eaglekit bench --target "$t" --draft "$draft" --prompts "$eval/mt_bench.jsonl" --limit "${LIMIT:-20}" \
      --max-new-tokens 256 --no-hf $(bench_shape) ${SPEC_ARGS:-} --out "$W/arm-$i/bench" 2>&1 | quiet | tail -12
    python3 -m eaglekit bench --target "$t" --draft "$draft" --prompts "$W/heldout10.jsonl" \
      --max-new-tokens 256 --no-hf $(bench_shape) ${SPEC_ARGS:-} --out "$W/arm-$i/heldout" 2>&1 | quiet | tail -12
  } > "$log"
  { echo "--- arm $i [$flags]"; cat "$log"; } >> "$LOG"
  stamp "arm $i [$flags] done"
}

session() {
  local prompts=$1 eval=$2 t=$EAGLEKIT_SMOLLM2_DIR t0
  # Chat, code and role play at full weight; the large templated sets (FLAN CoT, P3 prompts, GSM8K,
  # task-oriented dialogues) down-weighted so that they do not drown the conversations; P3's long
  # prompts (>= 2000 characters: passages to summarize or answer from) at full weight first, so that
  # long-input work is a share of its own (3,303 prompts, where T0's 0.2 took ~660).
  local w="\"$prompts/flan_cot.jsonl,weight=0.3\", \"$prompts/t0_train.jsonl,min-chars=2000,name=t0_long\", \"$prompts/t0_train.jsonl,weight=0.2\", \"$prompts/gsm8k_train.jsonl,weight=0.5\", \"$prompts/sgd_dialogues.jsonl,weight=0.1\""
  # TASKS: task shares made from the files (`template=`: translation, summaries; eaglekit prompts build
  # --help), ';' between, e.g. TASKS="sharegpt_sample.jsonl,template=translate-fr,weight=0.5"
  local full=""
  for f in "$prompts"/*.jsonl; do
    case $(basename "$f") in flan_cot.jsonl|t0_train.jsonl|gsm8k_train.jsonl|sgd_dialogues.jsonl) ;; *) full+="\"$f\", " ;; esac
  done
  recipe() {  # the recipe with this session's overrides, plus any given (STOP: --stop-before, which comes last)
    local tasks="" task
    IFS=';' read -ra task_specs <<< "${TASKS:-}"
    for task in "${task_specs[@]}"; do tasks+=", \"$prompts/$task\""; done
    python3 -m eaglekit run --recipe smollm2-h200 --out "$RUN" gpus="${GPUS:-1}" target="$t" \
      "prompts.source=[$full$w$tasks]" ${TRAIN_S:+"train.time-budget-s=$TRAIN_S"} train.no-progress=true \
      "bench.prompts=$eval/mt_bench.jsonl" "bench.limit=${LIMIT:-40}" "generate.refill=${REFILL:-graphs}" ${PROFILE:+"train.profile-steps=$PROFILE"} "$@" ${EXTRA:-} ${STOP:+--stop-before "$STOP"} 2>&1 | quiet >> "$LOG"
    return "${PIPESTATUS[0]}"
  }
  [[ -n ${PRE:-} ]] && BENCHES=$PRE benches "" "$eval" "$prompts"     # before the recipe: an idle GPU
  # beside the recipe's data stages, checks whose figures are not timings (BESIDE=gputests: the GPU
  # tier while the target answers the prompts); training is timed, so it starts once they are done
  local beside=""
  if [[ -n ${BESIDE:-} ]]; then BENCHES=$BESIDE benches "" "$eval" "$prompts" & beside=$!; fi
  t0=$(date +%s); stamp "pipeline starts"
  if [[ -n $beside && ${EXTRA:-} != *--stop-before* ]]; then   # the data stages, then training alone
    STOP=train recipe
    stamp "data stages exit $? after $(( $(date +%s) - t0 )) s; waiting for the benches beside ($BESIDE)"
    wait "$beside"; beside=""
  fi
  recipe
  local code=$?
  stamp "pipeline exit $code after $(( $(date +%s) - t0 )) s"
  if [[ $code != 0 ]] && grep -q "stage generate failed" "$LOG" && [[ ${REFILL:-graphs} != eager ]]; then
    stamp "generate failed: the pipeline again with generate.refill=eager (said so in the results)"
    REFILL=eager recipe
    code=$?
    stamp "pipeline (refill eager) exit $code after $(( $(date +%s) - t0 )) s"
  fi
  if [[ $code != 0 ]] && grep -q "stage generate failed" "$LOG"; then   # flex attention did not compile here?
    stamp "generate failed: the pipeline again with generate.attention=sdpa (said so in the results)"
    REFILL=eager recipe generate.attention=sdpa
    stamp "pipeline (sdpa) exit $? after $(( $(date +%s) - t0 )) s"
  fi
  if [[ $code != 0 ]] && grep -q "stage train failed" "$LOG" && [[ ${EXTRA:-} == *train.compile=true* ]]; then
    stamp "train failed with --compile: the pipeline again with train.compile=false, its draft folder cleared (said so in the results)"
    rm -rf "$RUN/draft"        # another train command starts fresh, and train refuses a non-empty folder
    recipe train.compile=false
    stamp "pipeline (no compile) exit $? after $(( $(date +%s) - t0 )) s"
  fi
  if [[ -n ${ALT_TASKS:-} ]]; then   # a second data set for the arms: the same mix plus these task shares
    t0=$(date +%s)
    RUN=$W/run-alt TASKS=$ALT_TASKS STOP=train recipe
    stamp "the data stages with ALT_TASKS into $W/run-alt: exit $? after $(( $(date +%s) - t0 )) s"
  fi
  [[ -n $beside ]] && { stamp "waiting for the benches beside ($BESIDE)"; wait "$beside"; }
  benches "$RUN/draft" "$eval" "$prompts"
  stamp "session done"
}

pack() {  # what exists so far, in one archive (files back from $OUT: at most 8)
  local files=()
  for f in pipeline.json report.html prompts/manifest.json conversations/manifest.json draft/manifest.json \
           draft/log.jsonl draft/config.json draft/profile.txt doctor/report.json bench/results.json bench/report.md; do
    [[ -e $RUN/$f ]] && files+=("run/$f")
  done
  for f in bench-tree/results.json bench-tree/report.md bench-chain/results.json bench-chain/report.md \
           bench-sweep/results.json bench-heldout/results.json bench-heldout/report.md bench-generate/bench_generate.json \
           gputests.log; do
    [[ -e $W/$f ]] && files+=("$f")
  done
  for f in "$RUN"/scaling/scaling.{json,md,svg} "$RUN"/scaling/frac-*/draft/{manifest.json,log.jsonl} \
           "$RUN"/scaling/frac-*/bench/results.json; do   # the data-scaling curve, when the recipe has one
    [[ -e $f ]] && files+=("${f#"$W"/}")
  done
  for f in "$W"/be-*/bench_engine.json "$W"/be-*/bench_engine.md "$W"/regen-*/manifest.json "$W"/profile-*/profile_batch.json; do
    [[ -e $f ]] && files+=("${f#"$W"/}")
  done
  for f in "$W"/be-*/partial.json; do   # a kernels variant still running: the rows it has measured so far
    [[ -e $f && ! -e ${f%partial.json}bench_engine.json ]] && files+=("${f#"$W"/}")
  done
  for f in "$W"/arm-*/draft/{manifest.json,log.jsonl,config.json} "$W"/arm-*/{bench,heldout}/{results.json,report.md}; do
    [[ -e $f ]] && files+=("${f#"$W"/}")
  done
  for f in "$W"/peer/{peer.txt,calibrate.log,train.log,prepare.log,compare/table.md} "$W"/peer/compare/*/{doctor.json,bench/results.json}; do
    [[ -e $f ]] && files+=("${f#"$W"/}")
  done
  tar -czf "$OUT/results.tar.gz" -C "$W" "${files[@]}" 2>/dev/null
  # The exported draft (bf16, ~29 MB), in parts under the 16 MiB a returned file may have, so that a
  # later session can bench it without training again (cat draft.part-* | tar -x).
  local bytes
  bytes=$(du -sb "$RUN/export/vllm" 2>/dev/null | cut -f1)
  if [[ -e $RUN/export/vllm/model.safetensors ]] && (( bytes < 45000000 )); then   # 3 parts + 3 files <= 8
    tar -cf - -C "$RUN/export" vllm | split -b 15m - "$OUT/draft.part-"
  elif [[ -e $RUN/export/vllm/model.safetensors ]]; then
    stamp "the exported draft is $bytes bytes: too large to return in parts (at most 8 files of 16 MiB)"
  fi
  cp "$LOG" "$OUT/session.log"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null
}

case $VERB in
  start)
    : "${EAGLEKIT_SMOLLM2_DIR:?run setup.sh first}"
    PROMPTS=${2:?prompts folder}; EVAL=${3:?eval folder}
    export -f session benches bench_tree arm heldout_set bench_shape train_flags stamp quiet; export W RUN LOG PROFILE EXTRA BENCHES SPEC_ARGS LIMIT PRE BESIDE KERNELS BE_ARGS ARMS ARM_S ARM_STEPS REGEN REGEN_LIMIT PROFILE_ROWS GPUTESTS_K KERNELS_DRAFTS SWEEP_SHAPES SWEEP_PROMPTS
    setsid nohup bash -c "session '$PROMPTS' '$EVAL'" > "$W/session.out" 2>&1 < /dev/null &
    stamp "session launched (pid $!)"; sleep 2; cat "$LOG" ;;
  bench)   # a draft trained in an earlier session: the three benches alone, in the background
    : "${EAGLEKIT_SMOLLM2_DIR:?run setup.sh first}"
    DRAFT=${2:?draft folder}; EVAL=${3:?eval folder}
    export -f bench_tree benches heldout_set bench_shape stamp quiet; export W RUN LOG BENCHES SPEC_ARGS LIMIT KERNELS KERNELS_DRAFTS BE_ARGS GPUTESTS_K SWEEP_SHAPES SWEEP_PROMPTS
    setsid nohup bash -c "bench_tree '$DRAFT' '$EVAL'; benches '$DRAFT' '$EVAL'; stamp 'session done'" \
      > "$W/session.out" 2>&1 < /dev/null &
    stamp "benches launched (pid $!)"; sleep 2; cat "$LOG" ;;
  only)    # BENCHES that need no draft of this session (kernels, gputests), in the background
    : "${EAGLEKIT_SMOLLM2_DIR:?run setup.sh first}"
    export -f benches bench_tree heldout_set bench_shape stamp quiet; export W RUN LOG BENCHES SPEC_ARGS LIMIT KERNELS KERNELS_DRAFTS BE_ARGS GPUTESTS_K SWEEP_SHAPES SWEEP_PROMPTS
    setsid nohup bash -c "benches '' '${2:-}'; stamp 'session done'" > "$W/session.out" 2>&1 < /dev/null &
    stamp "benches launched (pid $!)"; sleep 2; cat "$LOG" ;;
  wait)
    OUT=${OUT:?OUT is the folder that comes back}
    # A fresh machine (the one that ran `start` was given back between the calls) has no session:
    # say so at once instead of waiting out the call on nothing (2026-12-02: 570 s lost that way).
    [[ -e $LOG ]] || { echo "no session on this machine ($LOG is missing): it is not the one that ran start" >&2; exit 3; }
    end=$(( $(date +%s) + ${2:?seconds} ))
    while (( $(date +%s) < end )) && ! grep -q "session done" "$LOG"; do sleep 10; done
    pack; tail -40 "$LOG"
    echo "[wait] $(ls "$OUT" | wc -l) files in \$OUT; at most 8 come back: copy nothing more there (add it to pack)" ;;
  *) echo "unknown verb $VERB (start, bench, only, wait)"; exit 2 ;;
esac
