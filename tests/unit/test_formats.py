"""Export / import: round trips for every format, third-party layouts, aux-id conventions, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglekit.cli import main
from eaglekit.draft import DraftConfig, Eagle3Draft
from eaglekit.draft.checkpoint import load_draft, save_draft
from eaglekit.errors import EaglekitError
from eaglekit.formats import export_draft, import_draft, interpret, read_folder
from eaglekit.formats.export import verify_export
from eaglekit.formats.names import NATIVE_TENSORS
from eaglekit.formats.registry import FORMATS

N = 8  # tiny target layers


@pytest.fixture(scope="module")
def native_ckpt(tiny_target_dir, tmp_path_factory) -> Path:
    """A random draft with a reduced vocab (d2t offsets, t2d mask) and the default aux layers."""
    from transformers import AutoConfig

    cfg = DraftConfig.for_target(
        AutoConfig.from_pretrained(tiny_target_dir), aux_layer_ids=[1, 3, 4], draft_vocab_size=200
    )
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    ids = torch.randperm(cfg.vocab_size)[:200].sort().values
    draft.d2t.copy_(ids - torch.arange(200))
    draft.t2d.zero_()
    draft.t2d[ids] = True
    return save_draft(draft, tmp_path_factory.mktemp("native") / "ckpt")


def test_native_names_table_matches_the_model(native_ckpt):
    draft = load_draft(native_ckpt)
    assert set(NATIVE_TENSORS) == set(draft.draft_state_dict())


def test_each_format_converts_aux_ids_at_its_edge():
    ids = [1, 14, 26]
    assert FORMATS["sglang"].engine_ids(ids) == [1, 14, 26]  # nested ids: output of layer k
    assert FORMATS["vllm"].engine_ids(ids) == [2, 15, 27]  # top-level ids: input of layer k
    for fmt in FORMATS.values():
        assert fmt.eaglekit_ids(fmt.engine_ids(ids)) == ids


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "eagle"])
def test_export_import_round_trip_is_bit_identical(fmt, native_ckpt, tiny_target_dir, tmp_path):
    manifest = export_draft(native_ckpt, fmt, tmp_path / "exp", target=str(tiny_target_dir))
    assert manifest["stage"] == "export" and manifest["config"]["dtype"] == "bfloat16"
    exported = load_file(str(tmp_path / "exp" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in exported.values() if t.is_floating_point())
    layer = "layers.0." if fmt == "vllm" else "midlayer."
    assert any(n.startswith(layer) for n in exported) and not any(n.startswith("model.") for n in exported)
    assert "embed_tokens.weight" not in exported  # every engine uses the target's own embedding

    import_draft(tmp_path / "exp", tmp_path / "back")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    renamed = FORMATS[fmt].to_format(back, same_vocab=False)
    assert set(renamed) == set(exported)
    for name, tensor in exported.items():
        assert renamed[name].dtype == tensor.dtype and torch.equal(renamed[name], tensor), name
    original = json.loads((native_ckpt / "config.json").read_text())
    again = json.loads((tmp_path / "back" / "config.json").read_text())
    original["eaglekit"]["target_num_layers"] = N  # the native draft did not know it; --target filled it in
    assert again == original
    # native weights (float32) cast to the exported dtype are the exported bits
    native = load_file(str(native_ckpt / "model.safetensors"))
    assert torch.equal(native["fc.weight"].to(torch.bfloat16), back["fc.weight"])


def test_vllm_config_is_the_speculators_layout(native_ckpt, tiny_target_dir, tmp_path):
    export_draft(native_ckpt, "vllm", tmp_path / "v", target=str(tiny_target_dir))
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(Path(tiny_target_dir).resolve())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 3  # vLLM sizes fc by it
    assert cfg["norm_before_residual"] is False  # explicit: vLLM assumes true when absent
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM: input of layer k = output of k-1
    assert cfg["draft_vocab_size"] == 200


def test_sglang_and_eagle_configs(native_ckpt, tiny_target_dir, tmp_path):
    export_draft(native_ckpt, "sglang", tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 200
    assert cfg["eagle_config"] == {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    export_draft(native_ckpt, "eagle", tmp_path / "e", target=str(tiny_target_dir))
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "eagle_config" not in cfg and cfg["bias"] is False
    assert "target_hidden_size" not in cfg  # EAGLE would then skip loading the target's embedding


def test_eagle_export_refuses_ids_eagle_cannot_capture(tiny_target_dir, tmp_path):
    from transformers import AutoConfig

    cfg = DraftConfig.for_target(
        AutoConfig.from_pretrained(tiny_target_dir), aux_layer_ids=[0, 3, 6], draft_vocab_size=384
    )
    save_draft(Eagle3Draft(cfg), tmp_path / "ckpt")
    with pytest.raises(EaglekitError, match="hard-coded"):
        export_draft(tmp_path / "ckpt", "eagle", tmp_path / "e", target=str(tiny_target_dir))
    assert not (tmp_path / "e").exists()


def test_export_refuses_existing_output_and_unknown_format(native_ckpt, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")  # a file no export wrote: refused, --overwrite or not
    for overwrite in (False, True):
        with pytest.raises(EaglekitError, match="did not write"):
            export_draft(native_ckpt, "sglang", tmp_path / "out", overwrite=overwrite)
    assert (tmp_path / "out" / "config.json").read_text() == "{}"
    export_draft(native_ckpt, "sglang", tmp_path / "own")
    with pytest.raises(EaglekitError, match="already exists"):  # its own finished export: --overwrite replaces it
        export_draft(native_ckpt, "sglang", tmp_path / "own")
    with pytest.raises(EaglekitError, match="unknown format"):
        export_draft(native_ckpt, "trtllm", tmp_path / "x")


def test_reload_check_catches_a_wrong_export(native_ckpt, tmp_path):
    export_draft(native_ckpt, "vllm", tmp_path / "v")
    folder = read_folder(tmp_path / "v")
    reading = interpret(folder)
    expected = dict(folder.tensors)
    verify_export(tmp_path / "v", "vllm", expected, reading.config)  # the export itself passes
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    cfg["transformer_layer_config"]["rms_norm_eps"] = 1e-3
    (tmp_path / "v" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EaglekitError, match="rms_norm_eps"):
        verify_export(tmp_path / "v", "vllm", expected, reading.config)


def third_party(src: Path, out: Path, *, rename: str | None = None, config: dict, drop=()) -> Path:
    """A folder as another trainer writes it: same tensors, its own names and config."""
    out.mkdir(parents=True)
    tensors = load_file(str(src / "model.safetensors"))
    if rename:
        tensors = {k.replace("midlayer.", rename): v for k, v in tensors.items()}
    save_file({k: v for k, v in tensors.items() if k not in drop}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def flat(native_ckpt: Path, **changes) -> dict:
    cfg = json.loads((native_ckpt / "config.json").read_text())
    cfg.pop("eaglekit")
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not None}


def test_import_specforge_style_reads_nested_ids_as_output_of_layer(native_ckpt, tmp_path):
    src = third_party(native_ckpt, tmp_path / "sf", config=flat(native_ckpt))  # nested [1, 3, 4]
    import_draft(src, tmp_path / "out")
    assert load_draft(tmp_path / "out").config.aux_layer_ids == (1, 3, 4)


def test_import_modelopt_style_layers0_without_t2d(native_ckpt, tmp_path):
    src = third_party(native_ckpt, tmp_path / "mo", rename="layers.0.", drop=("t2d",), config=flat(native_ckpt))
    import_draft(src, tmp_path / "out")
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    orig = load_file(str(native_ckpt / "model.safetensors"))
    assert set(back) == set(orig) and all(torch.equal(back[k], orig[k]) for k in orig)  # t2d derived from d2t


def test_import_refuses_a_pruned_vocab_without_d2t(native_ckpt, tmp_path):
    src = third_party(native_ckpt, tmp_path / "nod2t", drop=("d2t", "t2d"), config=flat(native_ckpt))
    with pytest.raises(EaglekitError, match="no d2t"):
        import_draft(src, tmp_path / "out")


def test_import_speculators_top_level_ids_are_vllm_convention(native_ckpt, tmp_path):
    export_draft(native_ckpt, "vllm", tmp_path / "v")
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    cfg.pop("eaglekit")  # as the speculators package writes it
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 5, 7]
    (tmp_path / "v" / "config.json").write_text(json.dumps(cfg))
    import_draft(tmp_path / "v", tmp_path / "out")
    assert load_draft(tmp_path / "out").config.aux_layer_ids == (1, 4, 6)


def test_import_eagle_style_needs_the_target_for_default_ids(native_ckpt, tiny_target_dir, tmp_path):
    cfg = flat(native_ckpt, eagle_config=None, architectures=["LlamaForCausalLM"])
    src = third_party(native_ckpt, tmp_path / "eagle", config=cfg)
    with pytest.raises(EaglekitError, match="pass --target"):
        import_draft(src, tmp_path / "out")
    import_draft(src, tmp_path / "out", target=str(tiny_target_dir))
    assert load_draft(tmp_path / "out").config.aux_layer_ids == (1, N // 2 - 1, N - 4)


def test_import_refuses_unknown_and_conflicting(native_ckpt, tmp_path):
    cfg = flat(native_ckpt, eagle_aux_hidden_state_layer_ids=[1, 3, 4])  # top-level says outputs 0, 2, 3
    src = third_party(native_ckpt, tmp_path / "conflict", config=cfg)
    with pytest.raises(EaglekitError, match="name different layers"):
        import_draft(src, tmp_path / "out")
    src = third_party(native_ckpt, tmp_path / "bias", config=flat(native_ckpt))
    tensors = load_file(str(src / "model.safetensors"))
    tensors["fc.bias"] = torch.zeros(64)
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(EaglekitError, match="fc.bias"):
        import_draft(src, tmp_path / "out2")


def test_cli_export_then_import(native_ckpt, tiny_target_dir, tmp_path, capsys):
    assert (
        main(
            [
                "export",
                str(native_ckpt),
                "--format",
                "vllm",
                "--out",
                str(tmp_path / "v"),
                "--target",
                str(tiny_target_dir),
            ]
        )
        == 0
    )
    assert "reload check passed" in capsys.readouterr().out
    assert main(["import", str(tmp_path / "v"), "--out", str(tmp_path / "n")]) == 0
    assert main(["export", str(native_ckpt), "--format", "vllm", "--out", str(tmp_path / "v")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_export_refuses_shapes_the_config_does_not_imply(native_ckpt, tmp_path):
    src = third_party(native_ckpt, tmp_path / "narrow", config=flat(native_ckpt))
    tensors = load_file(str(src / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"][:, :128].contiguous()
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(EaglekitError, match="fc.weight is \\(64, 128\\)"):
        export_draft(src, "vllm", tmp_path / "out")
