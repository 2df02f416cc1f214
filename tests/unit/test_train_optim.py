"""The training levers of train/optim.py: `--optimizer muon` (Muon over the hidden matrices, AdamW over
the rest) and `--freeze-lm-head`; their optimizer state round trip and an exact resume, on a tiny target."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.draft.checkpoint import load_draft
from eaglekit.draft.vocab import DraftVocab
from eaglekit.errors import EaglekitError
from eaglekit.targets.load import load_target
from eaglekit.train import loop
from eaglekit.train.loop import train
from eaglekit.train.optim import make_draft_optimizer, make_optimizer, optimizer_tensors
from train_tiny import (
    config,
    train_data,  # noqa: F401 (fixture `data`)
)
from ttt_batch import make_draft, take_steps

torch.set_num_threads(1)

MUON = [
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
]
ADAMW = [  # in the optimizer's order: the matrix (weight decay), then the norms (none)
    "lm_head.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
]


def draft_optimizer(draft, cfg):
    return make_draft_optimizer([(n, p) for n, p in draft.named_parameters() if p.requires_grad], cfg)


def test_muon_holds_the_hidden_matrices_and_adamw_the_rest(data, tmp_path):
    """Keller Jordan's convention: Muon orthogonalizes the matrices of fc and the draft layer; lm_head
    (a matrix that maps to tokens), the norms and the frozen embedding are not Muon's."""
    draft = make_draft()
    optimizer = draft_optimizer(draft, config(data, tmp_path, optimizer="muon", muon_lr=0.02, muon_weight_decay=0.1))
    assert optimizer.names() == {"muon": MUON, "adamw": ADAMW}
    assert isinstance(optimizer.parts["muon"].optimizer, torch.optim.Muon)
    group = optimizer.parts["muon"].optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["adjust_lr_fn"]) == (
        0.02,
        0.95,
        0.1,
        "match_rms_adamw",
    )
    assert optimizer.parts["adamw"].peak_lr == 3e-3  # --lr; --muon-lr defaults to it
    assert draft_optimizer(draft, config(data, tmp_path, optimizer="muon")).parts["muon"].peak_lr == 3e-3
    adamw = draft_optimizer(draft, config(data, tmp_path)).names()["adamw"]
    assert sorted(adamw) == sorted(MUON + ADAMW)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_optimizers_state_round_trips_exactly(data, tmp_path, optimizer):
    draft = make_draft()
    cfg = config(data, tmp_path, optimizer=optimizer)
    first = draft_optimizer(draft, cfg)
    take_steps(draft, first)
    tensors, meta = first.state_tensors()
    params = dict(draft.named_parameters())
    for key, value in tensors.items():  # each state tensor is named by its own parameter
        name, state_key = key.rsplit(".", 1)
        assert value.shape == (() if state_key == "step" else params[name].shape), key
    meta = json.loads(json.dumps(meta))  # as state.json holds it
    again = draft_optimizer(draft, cfg)
    again.load_state_tensors(tensors, meta)
    for kind, part in first.parts.items():
        a, b = part.optimizer.state_dict(), again.parts[kind].optimizer.state_dict()
        assert a["param_groups"] == b["param_groups"], kind  # tuples (betas, ns_coefficients) come back
        assert a["state"].keys() == b["state"].keys()
        for i in a["state"]:
            for key in a["state"][i]:
                assert torch.equal(a["state"][i][key], b["state"][i][key]), (kind, i, key)


def test_a_state_written_before_the_optimizer_option_still_loads(data, tmp_path):
    """Such a state holds one AdamW's, its tensors named by the trainable parameters' order."""
    draft = make_draft()
    named = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    old = make_optimizer(named, lr=3e-3, weight_decay=0.0, betas=(0.9, 0.95))
    take_steps(draft, old)
    tensors, meta = optimizer_tensors(old, [n for n, _ in named])  # as the trainer wrote it then
    new = draft_optimizer(draft, config(data, tmp_path))
    new.load_state_tensors(tensors, json.loads(json.dumps(meta)))
    a, b = old.state_dict(), new.parts["adamw"].optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for key in a["state"][i]:
            assert torch.equal(a["state"][i][key], b["state"][i][key]), (i, key)


def logged(out, key):
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return [x[key] for x in lines if x["event"] == "train"]


def test_muon_trains_the_draft_and_the_loss_falls(data, tmp_path):
    out = tmp_path / "run"
    manifest = train(config(data, out, optimizer="muon", max_steps=24, log_every=4, val_every=24, save_every=24))
    assert manifest["complete"] and manifest["config"]["optimizer"] == "muon"
    assert manifest["optimizers"] == {"muon": MUON, "adamw": ADAMW}
    losses = logged(out, "loss")
    assert len(losses) == 6 and losses[-1] < 0.8 * losses[0], losses
    # one schedule for both optimizers, each from its own peak (here both --lr)
    assert logged(out, "muon_lr") == logged(out, "lr")


def final_state(out):
    latest = json.loads((out / "trainer_state" / "latest.json").read_text())
    folder = out / "trainer_state" / latest["dir"]
    return load_file(str(folder / "draft.safetensors")), load_file(str(folder / "optimizer.safetensors"))


class Killed(Exception):
    pass


@pytest.mark.parametrize(
    "levers",
    [{}, {"optimizer": "muon", "muon_lr": 6e-3}, {"freeze_lm_head": True}],
    ids=["adamw", "muon", "frozen-head"],
)
def test_resume_after_a_crash_is_bit_identical(data, tmp_path, monkeypatch, levers):
    """In process (the SIGKILL between checkpoints is tests/integration/test_train_loop.py's): a run that
    dies after its step-8 state, resumed, ends on the uninterrupted run's weights and optimizer state."""
    settings = dict(max_steps=16, save_every=4, val_every=6, **levers)
    reference = tmp_path / "ref"
    train(config(data, reference, **settings))
    out = tmp_path / "crashed"
    save = loop.Trainer.save_trainer_state

    def save_then_die(self):
        save(self)
        if self.step == 8:
            raise Killed

    monkeypatch.setattr(loop.Trainer, "save_trainer_state", save_then_die)
    with pytest.raises(Killed):
        train(config(data, out, **settings))
    monkeypatch.setattr(loop.Trainer, "save_trainer_state", save)
    assert json.loads((out / "trainer_state" / "latest.json").read_text())["step"] == 8
    train(config(data, out, resume=True, **settings))
    for a, b in zip(final_state(reference), final_state(out)):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name


def target_rows(data, d2t):
    head = load_target(data["target"]).model.get_output_embeddings().weight.detach().float()
    return head[DraftVocab.from_d2t(d2t, head.shape[0]).draft_ids]


def test_freeze_lm_head_keeps_the_targets_rows_and_trains_the_rest(data, tmp_path):
    start = train(config(data, tmp_path / "start", max_steps=0, freeze_lm_head=True))
    manifest = train(config(data, tmp_path / "run", max_steps=12, freeze_lm_head=True))
    assert manifest["complete"] and "lm_head.weight" not in sum(manifest["optimizers"].values(), [])
    assert start["trainable_parameters"] == manifest["trainable_parameters"]
    before, after = load_draft(tmp_path / "start"), load_draft(tmp_path / "run")
    rows = target_rows(data, after.d2t)
    assert torch.equal(after.lm_head.weight, rows)  # saved all the same (exports need it)
    assert torch.equal(final_state(tmp_path / "run")[0]["lm_head.weight"], rows)
    for name, weight in after.draft_state_dict().items():
        if name != "lm_head.weight" and weight.is_floating_point():
            assert not torch.equal(weight, before.draft_state_dict()[name]), name
    unfrozen = train(config(data, tmp_path / "unfrozen", max_steps=2))
    assert unfrozen["trainable_parameters"] == manifest["trainable_parameters"] + rows.numel()
    # --init-from keeps a frozen head frozen; a head trained away from the target's rows cannot be frozen
    again = train(config(data, tmp_path / "again", max_steps=2, freeze_lm_head=True, init_from=str(tmp_path / "run")))
    assert again["complete"] and torch.equal(load_draft(tmp_path / "again").lm_head.weight, rows)
    with pytest.raises(EaglekitError, match="trained away from them") as err:
        train(config(data, tmp_path / "refused", freeze_lm_head=True, init_from=str(tmp_path / "unfrozen")))
    assert "drop --freeze-lm-head" in err.value.hint


def test_lever_settings_that_would_do_nothing_are_refused(data, tmp_path):
    with pytest.raises(EaglekitError, match="--lm-head-init random") as err:
        config(data, tmp_path, freeze_lm_head=True, lm_head_init="random")
    assert "drop --lm-head-init" in err.value.hint
    with pytest.raises(EaglekitError, match="--muon-lr --muon-momentum: settings of Muon") as err:
        config(data, tmp_path, muon_lr=0.02, muon_momentum=0.9)
    assert "--optimizer muon" in err.value.hint
    # a state written before these options existed (adamw, a trained head) still resumes: its key lacks them
    key = config(data, tmp_path).resume_key()
    assert not {"optimizer", "muon_lr", "muon_momentum", "muon_weight_decay", "freeze_lm_head"} & set(key)
    muon = config(data, tmp_path, optimizer="muon", freeze_lm_head=True).resume_key()
    assert muon["optimizer"] == "muon" and muon["muon_momentum"] == 0.95 and muon["freeze_lm_head"]
