"""Tables from `walk_by_source.py`'s JSON lines: per set, conversations, positions, step-0 accuracy
(per position), the walk for chains of 1..3 and the per-step estimate.

    python collect.py WALKS.jsonl
"""

import json
import sys

print("| validation set | conversations | positions | acc[0] (per position) | walk k=1 | walk k=2 | walk k=3 | sim tau k=3 |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for line in open(sys.argv[1]):
    m = json.loads(line)
    by_k = m["walk_accept_length_by_k"] or []
    walk = " | ".join(f"{by_k[k - 1]:.3f}" if k <= len(by_k) else "-" for k in (1, 2, 3))
    print(f"| {m['set']} | {m['conversations']} | {m['positions']} | {m['acc'][0]:.3f} | {walk} | {m['sim_accept_length']:.3f} |")
