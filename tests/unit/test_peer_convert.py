"""scripts/peer/speculators_data.py: the peer trainer reads the tokens eaglekit trains on and the
target states it would get from vLLM (aux layers, then the last layer before the final norm)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.features.conversations import read_conversations, tokenize_conversations
from eaglekit.targets.capture import capture_aux_states
from eaglekit.targets.load import load_target
from tiny import TRAIN_TEXT, VOCAB
from tiny_conversations import write_jsonl

torch.set_num_threads(1)
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "peer" / "speculators_data.py"


def load_script():
    spec = importlib.util.spec_from_file_location("speculators_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        row = {
            "id": f"c{i}",
            "source": "test",
            "messages": [
                {"role": "user", "content": TRAIN_TEXT[i % len(TRAIN_TEXT)]},
                {"role": "assistant", "content": TRAIN_TEXT[(i + 2) % len(TRAIN_TEXT)]},
            ],
        }
        if i == 0:
            row["split"] = "validation"  # held out by eaglekit's training, so by the peer's too
        out.append(row)
    return out


def test_tokens_are_what_eaglekit_trains_on(tiny_target_dir, tmp_path):
    conv = write_jsonl(tmp_path / "conv.jsonl", rows(5))
    out = tmp_path / "tokens.jsonl"
    assert load_script().main(["tokens", str(conv), "--target", str(tiny_target_dir), "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    target = load_target(str(tiny_target_dir))
    samples, _ = tokenize_conversations(target.tokenizer, read_conversations(conv)[0], max_length=2048)
    kept = [s for s in samples if not s.held_out]
    assert [w["id"] for w in written] == [s.id for s in kept] == ["c1", "c2", "c3", "c4"]
    for w, s in zip(written, kept):
        assert w["input_ids"] == s.input_ids.tolist()
        assert w["loss_mask"] == s.loss_mask.to(torch.int64).tolist()
        assert 0 < sum(w["loss_mask"]) < len(w["loss_mask"])


def test_hidden_states_hold_aux_layers_then_the_prenorm_last_layer(tiny_target_dir, tmp_path):
    pa = pytest.importorskip("pyarrow")
    data = tmp_path / "data"
    data.mkdir()
    ids = [[5, 17, 42, 9, 11, 3], [7, 8, 100, 2]]
    # The layout `datasets.save_to_disk` writes: an Arrow IPC stream per shard.
    table = pa.table({"input_ids": ids, "seq_len": [len(x) for x in ids]})
    with (
        pa.OSFile(str(data / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as writer,
    ):
        writer.write_table(table)
    assert load_script().main(["hidden", str(data), "--target", str(tiny_target_dir), "--aux-layer-ids", "1,3,4"]) == 0

    target = load_target(str(tiny_target_dir))
    for i, row in enumerate(ids):
        saved = load_file(str(data / "hidden_states" / f"hs_{i}.safetensors"))
        hs = saved["hidden_states"]  # [T, 4, H] bf16
        assert saved["token_ids"].tolist() == row
        assert hs.dtype == torch.bfloat16 and hs.shape == (len(row), 4, target.config.hidden_size)
        ref = capture_aux_states(target.model, torch.tensor([row]), [1, 3, 4])
        # the trainer's own slicing: hidden_states[:, :-1].flatten(1) is the fused aux input
        torch.testing.assert_close(hs[:, :-1].flatten(1).float(), ref.aux_hidden[0], atol=2e-2, rtol=2e-2)
        # the last slot is pre-norm: the target's final norm of it is the model's own last hidden state
        normed = target.model.model.norm(hs[:, -1].float())
        torch.testing.assert_close(normed, ref.last_hidden[0], atol=5e-2, rtol=5e-2)
        assert not torch.allclose(hs[:, -1].float(), ref.last_hidden[0], atol=5e-2, rtol=5e-2)


def test_a_speculators_config_with_null_target_hidden_size_imports(tiny_target_dir, tmp_path):
    """speculators' trainer writes `target_hidden_size: null` (vLLM then reads the draft's hidden size)."""
    from transformers import AutoConfig

    from eaglekit.draft import DraftConfig, Eagle3Draft
    from eaglekit.draft.checkpoint import load_draft, save_draft
    from eaglekit.formats import export_draft, import_draft

    cfg = DraftConfig.for_target(
        AutoConfig.from_pretrained(tiny_target_dir), aux_layer_ids=[1, 3, 4], draft_vocab_size=VOCAB
    )
    torch.manual_seed(0)
    native = save_draft(Eagle3Draft(cfg), tmp_path / "native")
    export_draft(native, "vllm", tmp_path / "peer", target=str(tiny_target_dir))
    config = json.loads((tmp_path / "peer" / "config.json").read_text())
    config["target_hidden_size"] = None
    (tmp_path / "peer" / "config.json").write_text(json.dumps(config))
    import_draft(tmp_path / "peer", tmp_path / "back", target=str(tiny_target_dir))
    assert load_draft(tmp_path / "back").config.target_hidden_size == cfg.target_hidden_size


def test_the_peers_default_layout_imports_and_keeps_its_norm(tiny_target_dir, tmp_path):
    """speculators' eagle3 defaults: norm_before_fc (`input_norm.weight`), norm_output and
    norm_before_residual, written in its layout; eaglekit reads all three and the norm's weights."""
    from dataclasses import replace

    from transformers import AutoConfig

    from eaglekit.draft import DraftConfig, Eagle3Draft
    from eaglekit.draft.checkpoint import load_draft, save_draft
    from eaglekit.formats import export_draft, import_draft

    cfg = DraftConfig.for_target(
        AutoConfig.from_pretrained(tiny_target_dir), aux_layer_ids=[1, 3, 4], draft_vocab_size=VOCAB
    )
    cfg = replace(cfg, norm_before_fc=True, norm_output=True, norm_before_residual=True)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        draft.input_norm.weight.uniform_(0.5, 1.5)
    export_draft(save_draft(draft, tmp_path / "native"), "vllm", tmp_path / "peer", target=str(tiny_target_dir))
    config = json.loads((tmp_path / "peer" / "config.json").read_text())
    assert config["norm_before_fc"] and config["norm_output"] and config["norm_before_residual"]
    assert "input_norm.weight" in load_file(str(tmp_path / "peer" / "model.safetensors"))
    import_draft(tmp_path / "peer", tmp_path / "back", target=str(tiny_target_dir))
    back = load_draft(tmp_path / "back")
    assert back.config.norm_before_fc and back.config.norm_output and back.config.norm_before_residual
    expected = draft.input_norm.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(back.input_norm.weight.detach(), expected)
