"""The doctor's probe on the real SmolLM2: a random draft is caught."""

from __future__ import annotations

import pytest
import torch

from eaglekit.doctor import run_doctor
from eaglekit.draft import Eagle3Draft
from eaglekit.draft.checkpoint import save_draft
from eaglekit.formats import export_draft


@pytest.mark.slow
def test_random_draft_for_smollm2_is_caught(smollm2_dir, tmp_path):
    """The case users meet first: a random draft served by vLLM accepts nothing (tau 1.00)."""
    from transformers import AutoConfig

    from eaglekit.draft import DraftConfig
    from eaglekit.targets.info import default_aux_layer_ids

    cfg = AutoConfig.from_pretrained(smollm2_dir)
    draft_cfg = DraftConfig.for_target(
        cfg, aux_layer_ids=default_aux_layer_ids(cfg.num_hidden_layers), draft_vocab_size=8192
    )
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_cfg)
    ids = torch.arange(8192)  # the most frequent BPE tokens come first
    draft.d2t.zero_()
    draft.t2d.zero_()
    draft.t2d[ids] = True
    save_draft(draft, tmp_path / "random")
    export_draft(tmp_path / "random", "vllm", tmp_path / "vllm", target=str(smollm2_dir))
    report = run_doctor(tmp_path / "vllm", str(smollm2_dir), run_probe=True, max_new_tokens=24, num_prompts=2)
    assert [c.id for c in report.checks if c.status == "fail"] == ["probe"]
    assert report.probe["tau"] < 1.1 and report.probe["diagnosis"]["cause"] is None
    assert "like random weights" in report.probe["message"]
