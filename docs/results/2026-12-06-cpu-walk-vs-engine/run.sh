#!/usr/bin/env bash
# The commands behind README.md, in order (CPU, fp32, greedy). W: a scratch folder.
set -euo pipefail
W=${W:-/tmp/e39}; D=${D:-../shared/data}; R=${R:-/tmp/q39}; HERE=$(dirname "$0")
mkdir -p "$W"

# 1. A draft from the quick recipe on a 10-source mix (320 prompts, a quarter held out, answers of 128 tokens).
S=""; for f in sharegpt_sample oasst alpaca_eval_805 gpteacher_roleplay awesome_chatgpt_prompts flan_cot t0_train gsm8k_train codealpaca sgd_dialogues; do S+="\"$D/train/$f.jsonl\", "; done
eaglekit run --recipe quick --out "$R" --stop-before export-sglang "prompts.source=[${S%, }]" prompts.num-prompts=320 \
  prompts.validation-fraction=0.25 prompts.max-turns=2 prompts.max-new-tokens=null prompts.batch-size=null \
  generate.max-new-tokens=128 train.no-progress=true

# 2. MT-bench: 2 questions of each of its 8 categories, both turns, answered by the target as the bench answers them (64 tokens a turn).
python3 - "$D/eval/mt_bench.jsonl" "$W/mt16.jsonl" <<'PY'
import json, sys
seen, out = {}, []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if seen.get(r["category"], 0) < 2:
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        out.append(line)
open(sys.argv[2], "w").write("".join(out))
PY
eaglekit generate --prompts "$W/mt16.jsonl" --target "$R/target" --max-new-tokens 64 --batch-size 16 --device cpu --out "$W/mt-conv"

# 3. Training's walk on those conversations (the draft as trained; --max-steps 0 only validates), chains of 1..5.
val() {  # val NAME VAL_DATA
  eaglekit train --target "$R/target" --data "$W/mt-conv" --val-data "$2" --init-from "$R/draft" --max-steps 0 \
    --ttt-steps 5 --device cpu --no-progress --out "$W/val/$1" --overwrite
}
val mt_bench "$W/mt-conv"

# 4. The engine on the same prompts, the same answer length, chains of 2 and 3.
for k in 2 3; do
  eaglekit bench --target "$R/target" --draft "$R/draft" --prompts "$W/mt16.jsonl" --mode chain --k "$k" \
    --max-new-tokens 64 --no-hf --device cpu --out "$W/bench-k$k" --overwrite
done

# 5. The training mix's own held-out split, whole and by source.
python3 "$HERE/split_by_source.py" "$R/conversations" "$W/by-source"
for f in "$W"/by-source/*.jsonl; do val "$(basename "$f" .jsonl)" "$f"; done
python3 "$HERE/collect.py" "$W"/val/*
