"""One table row per `eaglekit train --max-steps 0` validation folder: positions, step-0 accuracy,
the walk's accept length for chains of 1..k and the per-step estimate.

    python collect.py VAL_FOLDER...
"""

import json
import sys
from pathlib import Path

print("| validation set | conversations | positions | acc[0] | walk k=1 | walk k=2 | walk k=3 | walk k=5 | sim tau |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for folder in sys.argv[1:]:
    m = json.loads((Path(folder) / "manifest.json").read_text())
    b, by_k = m["best"], m["best"]["walk_accept_length_by_k"]
    walk = [f"{by_k[k - 1]:.3f}" if k <= len(by_k) else "-" for k in (1, 2, 3, 5)]
    print(f"| {Path(folder).name} | {m['counts']['val_samples']} | {b['positions']} | {b['acc'][0]:.3f} | "
          + " | ".join(walk) + f" | {b['sim_accept_length']:.3f} |")
