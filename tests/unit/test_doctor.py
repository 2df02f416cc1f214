"""Doctor static checks: clean exports pass; each planted defect fails exactly its own check."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.cli import main
from eaglekit.doctor import CHECKS, run_doctor
from eaglekit.draft import Eagle3Draft
from eaglekit.draft.checkpoint import save_draft
from oracle_draft import oracle_exports, save_repeat_target
from planted import _aux_off, _aux_off_by_one, _d2t_absolute, _rename_layers, planted


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return save_repeat_target(tmp_path_factory.mktemp("repeat-target"))


@pytest.fixture(scope="module")
def exports(target_dir, tmp_path_factory) -> dict[str, Path]:
    """The repeat oracle as a native checkpoint and as each engine's export."""
    return oracle_exports(target_dir, tmp_path_factory.mktemp("exports"))


def failed(report) -> list[str]:
    return [c.id for c in report.checks if c.status == "fail"]


@pytest.mark.parametrize(
    "name,engine", [("native", "sglang"), ("sglang", "sglang"), ("vllm", "vllm"), ("sglang", "eagle")]
)
def test_clean_exports_pass(name, engine, exports, target_dir):
    report = run_doctor(exports[name], str(target_dir), engine=engine)
    if engine == "eagle":
        # EAGLE captures its hard-coded layers (the oracle uses the last one), and a config with
        # target_hidden_size makes it skip loading the target's embedding: both are real.
        assert failed(report) == ["embedding", "aux_layer_ids"]
    else:
        assert report.ok, [c for c in report.checks if c.status == "fail"]
    assert [c.id for c in report.checks] == [check.__name__.removeprefix("check_") for check in CHECKS]


def _narrow_fc(state):
    state["fc.weight"] = state["fc.weight"][:, :128].contiguous()


def _ship_embedding(state):
    state["embed_tokens.weight"] = torch.randn(384, 64).to(torch.bfloat16)


def _nan(state):
    state["norm.weight"] = state["norm.weight"].clone()
    state["norm.weight"][0] = float("nan")


def _rope(cfg):
    layer = cfg["transformer_layer_config"]
    layer["rope_theta"] = 500000.0
    layer["rope_parameters"]["rope_theta"] = 500000.0


PLANTED = {
    # check id: (export, engine, config edit, tensor edit, manifest edit)
    "config": ("vllm", "vllm", lambda c: c.pop("norm_before_residual"), None, None),
    "names": ("sglang", "sglang", None, _rename_layers, None),
    "shapes": ("sglang", "sglang", None, _narrow_fc, None),
    "draft_vocab_size": ("sglang", "sglang", lambda c: c.pop("draft_vocab_size"), None, None),
    "d2t": ("vllm", "vllm", None, _d2t_absolute, None),
    "embedding": ("vllm", "vllm", None, _ship_embedding, None),
    "rope": ("vllm", "vllm", _rope, None, None),
    "aux_layer_ids": ("vllm", "vllm", _aux_off_by_one, None, None),
    "aux_states": ("vllm", "vllm", _aux_off, None, None),
    "vocab": ("vllm", "vllm", None, None, lambda m: m["target"].update(tokenizer_hash="0" * 16)),
    "target": ("vllm", "vllm", None, None, lambda m: m["target"].update(config_hash="0" * 16)),
    "weights": ("sglang", "sglang", None, _nan, None),
}


@pytest.mark.parametrize("check_id", sorted(PLANTED))
def test_each_planted_defect_fails_exactly_its_check(check_id, exports, target_dir, tmp_path):
    name, engine, config, tensors, manifest = PLANTED[check_id]
    folder = planted(exports[name], tmp_path / "bad", config=config, tensors=tensors, manifest=manifest)
    report = run_doctor(folder, str(target_dir), engine=engine)
    assert failed(report) == [check_id], [(c.id, c.message) for c in report.checks if c.status == "fail"]
    check = next(c for c in report.checks if c.id == check_id)
    assert check.hint, check


def test_hidden_size_of_another_target_fails(exports, target_dir, tmp_path):
    from eaglekit.draft.checkpoint import load_draft_config

    cfg = load_draft_config(exports["native"])
    small = replace(cfg, hidden_size=32, target_hidden_size=32, intermediate_size=64, head_dim=8)
    draft = Eagle3Draft(small)
    state = load_file(str(exports["native"] / "model.safetensors"))
    draft.d2t.copy_(state["d2t"])
    draft.t2d.copy_(state["t2d"])
    save_draft(draft, tmp_path / "small")
    report = run_doctor(tmp_path / "small", str(target_dir), engine="sglang")
    assert failed(report) == ["hidden_size"]


def test_messages_name_the_causes(exports, target_dir, tmp_path):
    """The story's three bugs, as the report words them."""
    names = run_doctor(
        planted(exports["sglang"], tmp_path / "n", tensors=_rename_layers), str(target_dir), engine="sglang"
    )
    check = next(c for c in names.checks if c.id == "names")
    assert "silently drop 10" in check.message and "midlayer" in check.hint
    d2t = run_doctor(planted(exports["vllm"], tmp_path / "d", tensors=_d2t_absolute), str(target_dir))
    assert "absolute target ids" in next(c for c in d2t.checks if c.id == "d2t").message
    aux = run_doctor(planted(exports["vllm"], tmp_path / "a", config=_aux_off), str(target_dir))
    message = next(c for c in aux.checks if c.id == "aux_states").message
    assert "64 wide" in message and "192 wide" in message
    ids = run_doctor(planted(exports["vllm"], tmp_path / "i", config=_aux_off_by_one), str(target_dir))
    check = next(c for c in ids.checks if c.id == "aux_layer_ids")
    assert "[0, 2, 6]" in check.message and "[2, 4, 8]" in check.hint


def test_nested_only_ids_are_misread_by_vllm(exports, target_dir):
    """vllm PR #43671's case: a SGLang-style config served by vLLM reads the nested ids one layer early."""
    report = run_doctor(exports["sglang"], str(target_dir), engine="vllm")
    assert failed(report) == ["aux_layer_ids"]


def test_sglang_cannot_read_the_speculators_layout(exports, target_dir):
    report = run_doctor(exports["vllm"], str(target_dir), engine="sglang")
    assert "config" in failed(report)


def test_cli_json_and_exit_status(exports, target_dir, tmp_path, capsys):
    assert main(["doctor", str(exports["vllm"]), "--target", str(target_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["probe"] is None
    assert any(n.startswith("acceptance not measured") and "--probe" in n for n in out["notes"])  # static only
    assert {"id", "status", "message", "hint"} <= set(out["checks"][0])
    bad = planted(exports["vllm"], tmp_path / "bad", tensors=_d2t_absolute)
    assert main(["doctor", str(bad), "--target", str(target_dir), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and [c["id"] for c in out["checks"] if c["status"] == "fail"] == ["d2t"]
    assert main(["doctor", str(bad), "--target", str(target_dir)]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "d2t" in text and "FAILED" in text


def test_cli_json_to_a_path_keeps_the_text_report(exports, target_dir, tmp_path, capsys):
    """`--json PATH` (the form bench and target info take too) writes the JSON and prints the table."""
    path = tmp_path / "doctor.json"
    assert main(["doctor", str(exports["vllm"]), "--target", str(target_dir), "--json", str(path)]) == 0
    assert json.loads(path.read_text())["ok"] is True
    printed = capsys.readouterr().out
    assert "d2t" in printed and not printed.lstrip().startswith("{")
    assert main(["doctor", "--json", str(exports["vllm"]), "--target", str(target_dir)]) != 0  # `--json DRAFT`
    assert "took it as the JSON's path" in capsys.readouterr().err  # said, not guessed


def test_aux_order_other_than_layer_order_fails(exports, target_dir, tmp_path):
    """Engines concatenate aux states in layer order; a draft trained on another order reads them permuted."""

    def permute(cfg):
        cfg["eaglekit"]["aux_layer_ids"] = [7, 1, 3]
        cfg["eagle_aux_hidden_state_layer_ids"] = [8, 2, 4]

    report = run_doctor(planted(exports["vllm"], tmp_path / "p", config=permute), str(target_dir))
    assert failed(report) == ["aux_layer_ids"]
    assert "layer order [1, 3, 7]" in next(c for c in report.checks if c.id == "aux_layer_ids").message


def test_vllm_ignores_unexpected_bias_silently(exports, target_dir, tmp_path):
    """vLLM's AutoWeightsLoader skips unexpected *.bias tensors (docs/notes/vllm-cpu.md): a drop, not a refusal."""

    def add_bias(state):
        state["fc.bias"] = torch.ones(64, dtype=torch.bfloat16)

    report = run_doctor(planted(exports["vllm"], tmp_path / "b", tensors=add_bias), str(target_dir))
    check = next(c for c in report.checks if c.id == "names")
    assert check.status == "fail" and "silently drops 1 tensors (fc.bias)" in check.message


def test_sglang_names_finding_says_which_versions_it_applies_to(exports, target_dir, tmp_path):
    """SGLang 0.5.12+ loads layers.0.* as midlayer.*, 0.5.11 and older drop it (read in both wheels'
    llama_eagle3.py; tests/interop/test_interop_loaders.py loads layers.0.* through 0.5.23's own loader).
    Names no version maps are dropped by all of them, and the finding says so."""
    layers0 = run_doctor(
        planted(exports["sglang"], tmp_path / "l", tensors=_rename_layers), str(target_dir), engine="sglang"
    )
    check = next(c for c in layers0.checks if c.id == "names")
    assert check.status == "fail"
    assert "SGLang 0.5.11 and older silently drop 10 tensors" in check.message
    assert "SGLang 0.5.12 and later load them" in check.message
    assert "init values in SGLang 0.5.11 and older" in check.message
    assert "every SGLang version loads those" in check.hint

    def prefixed(state):
        return {("draft." + k if k.startswith("midlayer.") else k): v for k, v in state.items()}

    other = run_doctor(planted(exports["sglang"], tmp_path / "p", tensors=prefixed), str(target_dir), engine="sglang")
    check = next(c for c in other.checks if c.id == "names")
    assert (
        check.status == "fail"
        and "every SGLang version read (0.5.11, 0.5.12, 0.5.23) silently drops 10" in check.message
        and "0.5.12 and later load" not in check.message
    )
    eagle = run_doctor(
        planted(exports["sglang"], tmp_path / "e", tensors=_rename_layers), str(target_dir), engine="eagle"
    )
    assert "SGLang" not in next(c for c in eagle.checks if c.id == "names").message


def test_a_manifest_and_config_of_different_runs_fail_aux_layer_ids(exports, target_dir, tmp_path):
    """The training manifest records the aux layers it ran on; a config saying others is a folder
    put together from two runs (a resume on recaptured features made one before 2026-12-04)."""

    def other_layers(manifest):  # the training manifest the export carries, as the other run wrote it
        manifest["source_manifest"]["aux_layer_ids"] = [i + 1 for i in manifest["aux_layer_ids"]["eaglekit"]]

    clean = run_doctor(
        planted(
            exports["vllm"],
            tmp_path / "same",
            manifest=lambda m: m["source_manifest"].update(aux_layer_ids=m["aux_layer_ids"]["eaglekit"]),
        ),
        str(target_dir),
        engine="vllm",
    )
    assert failed(clean) == []  # the same layers recorded: no finding
    report = run_doctor(
        planted(exports["vllm"], tmp_path / "bad", manifest=other_layers), str(target_dir), engine="vllm"
    )
    assert failed(report) == ["aux_layer_ids"]
    check = next(c for c in report.checks if c.id == "aux_layer_ids")
    assert "the two come from different runs" in check.message and check.hint
