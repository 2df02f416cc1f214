"""The EAGLE-3.1 repeat oracle's probe tau as eaglekit runs it, with its per-aux norms skipped, and
with bf16 weights (tests/helpers/oracle_draft.py; run from tests/helpers: `python oracle_layout.py`)."""

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, ".")
from oracle_draft import repeat_draft, save_repeat_target  # noqa: E402

from eaglekit.doctor.probe import ProbeSetup, probe, run_target  # noqa: E402
from eaglekit.doctor.run import load_prompts  # noqa: E402
from eaglekit.targets.load import load_target  # noqa: E402

root = Path(tempfile.mkdtemp())
target = load_target(str(save_repeat_target(root / "t", seed=4, heads=1)))
runs = [
    run_target(target.model, target.tokenizer, m, max_new_tokens=32, stop_ids=target.stop_token_ids)
    for m in load_prompts(None, 4)
]
used = sorted({t for r in runs for t in r.tokens.tolist()})
draft = repeat_draft(target.model, draft_vocab=256, must=used, fc_norm=True, norm_output=True)
emb = target.model.get_input_embeddings().weight.detach()
state = draft.draft_state_dict()
print("layout", probe(ProbeSetup("a", draft.config, state), runs, emb, 3).tau)
skipped = {k: v for k, v in state.items() if not k.startswith("fc_norm")}
print("fc_norm skipped", probe(ProbeSetup("b", replace(draft.config, fc_norm=False), skipped), runs, emb, 3).tau)
bf16 = {k: (v.to(torch.bfloat16).float() if v.is_floating_point() else v) for k, v in state.items()}
print("bf16 weights", probe(ProbeSetup("c", draft.config, bf16), runs, emb, 3).tau)
