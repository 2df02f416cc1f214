"""Loading targets, `target info`, `target prepare`, and clear errors on bad input."""

import json
import shutil

import pytest
import torch

from eaglekit.cli import main
from eaglekit.errors import EaglekitError
from eaglekit.targets import default_aux_layer_ids, load_target, target_info
from eaglekit.targets.prepare import prepare_target


def test_default_aux_ids_follow_eagle3():
    assert default_aux_layer_ids(30) == [1, 14, 26]
    assert default_aux_layer_ids(32) == [1, 15, 28]
    with pytest.raises(EaglekitError, match="no distinct default"):
        default_aux_layer_ids(4)


def test_info_of_tiny_target(tiny_target_dir):
    info = target_info(str(tiny_target_dir))
    assert (info.num_layers, info.hidden_size, info.vocab_size) == (8, 64, 384)
    assert info.aux_layer_ids == [1, 3, 4]  # eaglekit's convention; the command adds the formats'
    assert info.has_chat_template and info.architecture == "LlamaForCausalLM"


def test_prepare_round_trip_keeps_weights_and_fingerprint(tiny_target_dir, tmp_path):
    out = tmp_path / "prepared"
    manifest = prepare_target(str(tiny_target_dir), out)
    a, b = load_target(str(tiny_target_dir)), load_target(str(out))
    assert manifest["target"]["config_hash"] == a.fingerprint()["config_hash"] == b.fingerprint()["config_hash"]
    ids = torch.tensor([[1, 5, 9, 30]])
    torch.testing.assert_close(a.model(ids).logits, b.model(ids).logits)
    with pytest.raises(EaglekitError, match="not empty"):
        prepare_target(str(tiny_target_dir), out)


def test_cli_info_json(tiny_target_dir, tmp_path, capsys):
    assert main(["target", "info", "--target", str(tiny_target_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert main(["target", "info", "--target", str(tiny_target_dir), "--json", str(tmp_path / "info.json")]) == 0
    assert json.loads((tmp_path / "info.json").read_text()) == info
    assert "architecture" in capsys.readouterr().out  # the text form is printed beside the file
    for key in (
        "architecture",
        "num_layers",
        "hidden_size",
        "vocab_size",
        "aux_layer_ids",
        "aux_layer_ids_sglang",
        "aux_layer_ids_vllm",
    ):
        assert key in info
    # Each format's convention (docs/contracts.md): SGLang's nested ids are eaglekit's numbers, vLLM's one higher.
    assert info["aux_layer_ids_sglang"] == [1, 3, 4] and info["aux_layer_ids_vllm"] == [2, 4, 5]


def test_missing_path_is_one_clear_error(tmp_path, capsys):
    assert main(["target", "info", "--target", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "target not found" in err and "hint" in err and "Traceback" not in err


def test_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(EaglekitError, match="not a model folder"):
        load_target(str(tmp_path))


def test_truncated_safetensors(tiny_target_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_target_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(EaglekitError, match="truncated"):
        load_target(str(broken))


def test_corrupt_safetensors_header(tiny_target_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_target_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(EaglekitError, match="corrupt"):
        load_target(str(broken))


def test_not_a_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(EaglekitError, match="not a GGUF file"):
        load_target(str(fake))


def test_truncated_gguf(tmp_path):
    from eaglekit.targets.source import smollm2_gguf_path

    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf_path(), "rb") as f:
        cut.write_bytes(f.read(5_000_000))
    with pytest.raises(EaglekitError, match="corrupt or truncated|truncated"):
        load_target(str(cut))


def test_tokenizer_without_chat_template(tiny_target_dir, tmp_path):
    from eaglekit.targets.chat import tokenize_conversation

    plain = tmp_path / "plain"
    shutil.copytree(tiny_target_dir, plain)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    target = load_target(str(plain))
    assert not target_info(str(plain)).has_chat_template
    with pytest.raises(EaglekitError, match="no chat template"):
        tokenize_conversation(
            target.tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        )


def test_pickle_only_folder_is_refused(tiny_target_dir, tmp_path):
    pick = tmp_path / "pickle"
    shutil.copytree(tiny_target_dir, pick)
    (pick / "model.safetensors").rename(pick / "pytorch_model.bin")
    with pytest.raises(EaglekitError, match="pickle"):
        load_target(str(pick))


def test_corrupt_generation_config_is_an_error(tiny_target_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_target_dir, broken)
    (broken / "generation_config.json").write_text("{ not json")
    with pytest.raises(EaglekitError, match="EOS ids"):
        load_target(str(broken))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_one_device_resolver_refuses_cuda_where_there_is_none():
    from eaglekit.targets.load import resolve_device

    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    for name in ("cuda", "cuda:1"):
        with pytest.raises(EaglekitError, match=f"device '{name}' asked for, but no CUDA device") as err:
            resolve_device(name)
        assert err.value.hint == "use --device cpu"


def test_an_engine_that_loads_the_checkpoint_itself_gets_auto_resolved_by_the_one_rule():
    """vLLM's own "auto" downcasts a float32 checkpoint (the run folder's target/) to its platform's first
    dtype; the vLLM
    backends get eaglekit's "auto" instead (bf16 on CUDA, fp32 on CPU), as the HF backends do."""
    import torch

    from eaglekit.targets.load import engine_dtype_name, resolve_dtype

    assert engine_dtype_name("auto", "cpu") == "float32" == str(resolve_dtype("auto", "cpu")).removeprefix("torch.")
    assert engine_dtype_name("bf16") == "bfloat16" and engine_dtype_name("fp16") == "float16"
    assert engine_dtype_name("auto") == ("bfloat16" if torch.cuda.is_available() else "float32")
    with pytest.raises(EaglekitError, match="unknown dtype 'int8'"):
        engine_dtype_name("int8")
