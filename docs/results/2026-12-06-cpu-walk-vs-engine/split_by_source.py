"""Write the validation conversations of a generate folder as one JSONL per prompt source (and all of
them as all.jsonl), labelled `split: train`, to validate a draft on each source with
`eaglekit train --init-from DRAFT --max-steps 0 --val-data FILE`.

    python split_by_source.py CONVERSATIONS OUT
"""

import json
import sys
from pathlib import Path

conversations, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
by_source: dict[str, list[dict]] = {}
for shard in sorted(conversations.glob("conversations-*.jsonl")):
    for line in shard.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("split") == "validation":
            by_source.setdefault(row["source"], []).append({**row, "split": "train"})
for name, rows in [*sorted(by_source.items()), ("all", [r for rows in by_source.values() for r in rows])]:
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(name, len(rows))
