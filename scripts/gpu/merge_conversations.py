"""Merge finished `eaglekit generate` folders of one target into one folder (after answering prompt
sets on several GPUs at once). A folder without a manifest (a generate run cut short) is refused;
conversation ids seen twice keep their first answer.

    python scripts/gpu/merge_conversations.py OUT_FOLDER GENERATED_1 GENERATED_2 ...
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from eaglekit.artifacts import check_same_target, write_manifest  # noqa: E402
from eaglekit.features.conversations import conversation_files  # noqa: E402


def merge(out: Path, folders: list[Path]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    seen: set[str] = set()
    target, counts, sources = None, {"conversations": 0, "duplicates_dropped": 0}, {}
    for i, folder in enumerate(folders):
        files, manifest = conversation_files(folder)
        if target is None:
            target = manifest["target"]
        check_same_target(target, manifest["target"], what=f"conversations in {folder}")
        sources[str(folder)] = manifest.get("counts", {})
        with open(out / f"conversations-{i:02d}-00000.jsonl", "w", encoding="utf-8") as dst:
            for file in files:
                for line in file.read_text(encoding="utf-8").split("\n"):   # not splitlines: U+2028 is text
                    if not line.strip():
                        continue
                    cid = str(json.loads(line)["id"])
                    if cid in seen:
                        counts["duplicates_dropped"] += 1
                        continue
                    seen.add(cid)
                    dst.write(line + "\n")
                    counts["conversations"] += 1
    return write_manifest(out, stage="generate", config={"merged_from": [str(f) for f in folders]}, target=target,
                          counts=counts, extra={"sources": sources})


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    result = merge(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
    print(f"merged {len(sys.argv) - 2} folders into {sys.argv[1]}: {result['counts']}")
