#!/usr/bin/env bash
# CPU sanity A/B on the quick run's features: same 120 steps, adamw vs muon vs frozen head
. /work/main/.venv/bin/activate
common="--target /tmp/q/target --features /tmp/q/features --draft-vocab-size 2048 --allow-smaller-vocab --ttt-steps 3 --batch-tokens 4096 --max-steps 120 --lr 1e-3 --val-every 40 --no-progress --device cpu --overwrite"
for arm in "adamw:" "muon:--optimizer muon" "frozen:--freeze-lm-head" "muonfrozen:--optimizer muon --freeze-lm-head"; do
  name=${arm%%:*}; flags=${arm#*:}
  /usr/bin/time -f "%e s" nice python -m eaglekit train $common $flags --out /tmp/muon-cpu/$name > /tmp/muon-cpu/$name.log 2>&1
  python3 -c "import json; m=json.load(open('/tmp/muon-cpu/$name/manifest.json')); b=m['best']; print('$name', b['step'], b['cum_acc'], b['walk_accept_length'], b['sim_accept_length'])"
done
