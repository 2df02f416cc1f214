"""EAGLE-3.1's draft layouts (`fc_norm`, `norm_before_fc`, `norm_output`): the draft's math, training's
unroll against serving, the engine's draft runner against the draft's own forward, the option, and
the formats that carry them (SGLang and vLLM) or refuse them (EAGLE). SGLang's own code runs them in
tests/interop/test_interop_loaders.py."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.cli import main
from eaglekit.doctor import run_doctor
from eaglekit.draft import DraftConfig, Eagle3Draft
from eaglekit.draft.checkpoint import load_draft, save_draft
from eaglekit.engine import DraftRunner, Engine, SpecConfig
from eaglekit.engine.reference import speculative_decode
from eaglekit.errors import EaglekitError
from eaglekit.formats import export_draft, import_draft
from eaglekit.formats.names import NATIVE_TENSORS, layout_tensors
from eaglekit.runtime import Sampling, make_target_runner
from eaglekit.targets.capture import capture_aux_states
from engine_tiny import PROMPTS, one_thread, peaked_model  # noqa: F401 (fixture)
from oracle_draft import oracle_checkpoint, repeat_draft, save_repeat_target
from planted import planted
from train_tiny import train_args, train_data  # noqa: F401 (fixture `data`)
from ttt_batch import check_unroll_against_naive, make_draft

LAYOUTS = {
    "eagle-3.1": dict(fc_norm=True, norm_output=True),
    "norm_before_fc": dict(norm_before_fc=True),
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True),
    "both norms": dict(norm_before_fc=True, fc_norm=True),  # the engines apply input_norm, then fc_norm
}


def layout_draft(arch: str = "llama", **layout) -> Eagle3Draft:
    """`make_draft` in a layout, every norm's weight random so a norm read as another shows."""
    base = make_draft(arch)
    draft = Eagle3Draft(replace(base.config, **layout)).eval()
    draft.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 1:  # seeded by name: a norm holds the same weights in every layout
                g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return draft


def test_the_layouts_add_the_engines_tensors_and_round_trip_the_config():
    cfg = make_draft().config
    assert set(NATIVE_TENSORS) <= set(Eagle3Draft(cfg).draft_state_dict())
    for layout in LAYOUTS.values():
        lcfg = replace(cfg, **layout)
        names = set(Eagle3Draft(lcfg).draft_state_dict())
        added = layout_tensors(norm_before_fc=lcfg.norm_before_fc, fc_norm=lcfg.fc_norm, num_aux=lcfg.num_aux)
        assert names == set(NATIVE_TENSORS) | set(added)
        assert DraftConfig.from_hf_dict(lcfg.to_hf_dict()) == lcfg
    assert layout_tensors(norm_before_fc=False, fc_norm=True, num_aux=3) == tuple(
        f"fc_norm.{i}.weight" for i in range(3)
    )


def test_fuse_normalizes_the_aux_states_and_norm_output_carries_the_normed_state():
    draft = layout_draft(fc_norm=True, norm_output=True)
    plain = layout_draft()  # the same weights without the layout
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(1, 4, draft.config.fused_width, generator=g) * 7
    chunks = aux.chunk(draft.config.num_aux, -1)
    normed = torch.cat([norm(c) for norm, c in zip(draft.fc_norm, chunks)], -1)
    torch.testing.assert_close(draft.fuse(aux), plain.fuse(normed))
    ids = torch.randint(3, 300, (1, 4), generator=g)
    logits, carried, _ = draft(ids, draft.fuse(aux))
    plain_logits, pre_norm, _ = plain(ids, draft.fuse(aux))
    torch.testing.assert_close(logits, plain_logits)  # the same head on the same normed output
    torch.testing.assert_close(carried, plain.norm(pre_norm))  # but the next step reads it normed

    whole = layout_draft(norm_before_fc=True)
    torch.testing.assert_close(whole.fuse(aux), plain.fuse(whole.input_norm(aux)))
    both = layout_draft(norm_before_fc=True, fc_norm=True)  # SGLang's and vLLM's order: input_norm, then fc_norm
    chunks = both.input_norm(aux).chunk(both.config.num_aux, -1)
    torch.testing.assert_close(both.fuse(aux), plain.fuse(torch.cat([n(c) for n, c in zip(both.fc_norm, chunks)], -1)))


def test_every_reader_takes_norm_before_fc_where_the_engines_do(layout_ckpt, tiny_target_dir, tmp_path):
    """SGLang and vLLM read norm_before_fc from eagle_config first, then top-level: import, the engines'
    readings and the doctor's probe draft follow the same rule (one reader, `formats.base.read_layout`)."""
    from eaglekit.formats import interpret, read_folder
    from eaglekit.formats.registry import FORMATS

    draft = load_draft(layout_ckpt)
    whole = Eagle3Draft(replace(draft.config, fc_norm=False, norm_output=False, norm_before_fc=True))
    save_draft(whole, tmp_path / "native")
    export_draft(tmp_path / "native", "sglang", tmp_path / "exp", target=str(tiny_target_dir))
    config_path = tmp_path / "exp" / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("norm_before_fc")
    config["eagle_config"]["norm_before_fc"] = True  # where SGLang looks first
    config_path.write_text(json.dumps(config))
    interp = interpret(read_folder(tmp_path / "exp"))
    assert interp.config.norm_before_fc
    for engine in ("sglang", "vllm"):
        reading = FORMATS[engine].read(interp, target_vocab=interp.config.vocab_size, target_layers=8)
        assert reading.layout["norm_before_fc"] and "input_norm.weight" in reading.loads.values(), engine
    assert not any(FORMATS["eagle"].read(interp, target_vocab=None, target_layers=8).layout.values())
    import_draft(tmp_path / "exp", tmp_path / "back")
    assert load_draft(tmp_path / "back").config.norm_before_fc


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_ttt_unroll_equals_naive_serving_in_each_layout(layout):
    check_unroll_against_naive(layout_draft(**LAYOUTS[layout]), T=9, steps=3)


@torch.no_grad()
def eager_chain(draft: Eagle3Draft, tokens: torch.Tensor, aux: torch.Tensor, k: int) -> list[int]:
    """The draft's own forward: catch up over positions 0..n-1 (token p+1 with aux p), then k drafts."""
    logits, h, kv = draft(tokens[1:][None], draft.fuse(aux[None]))
    drafts = []
    for i in range(k):
        token = draft.draft_to_target(logits[0, -1].argmax())
        drafts.append(int(token))
        if i < k - 1:
            logits, h, kv = draft(token.view(1, 1), h[:, -1:], past_kv=kv)
    return drafts


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_engines_draft_runner_drafts_what_the_draft_itself_drafts(layout):
    draft = layout_draft(**LAYOUTS[layout])
    k, n = 4, 7
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, draft.config.vocab_size, (n + 1,), generator=g)  # the prompt and the root
    aux = torch.randn(n, draft.config.fused_width, generator=g)
    runner = DraftRunner(draft, spec=SpecConfig(mode="chain", k=k), sampling=Sampling(), max_len=32)
    with torch.no_grad():
        runner.catch_up(tokens[1:], aux, 0, n - 1)
        proposal = runner.propose(tokens[n].view(1), torch.tensor([n]))
    assert proposal.tree.tokens[1:].tolist() == eager_chain(draft, tokens, aux, k)


def test_the_engine_accepts_what_the_reference_accepts_in_eagle31():
    """The repeat oracle in EAGLE-3.1's layout (its per-aux norms matter: tests/helpers/oracle_draft.py)
    in the engine against the eager reference decode: same tokens, same accepted drafts cycle for
    cycle, and drafts really accepted. (Compiled, the same check takes minutes on 2 cores: the GPU
    tier compiles the layout, tests/gpu/test_gpu.py.)"""
    model = peaked_model("llama", std=0.1)
    draft = repeat_draft(model, draft_vocab=model.config.vocab_size, fc_norm=True, norm_output=True).eval()
    aux = list(draft.config.aux_layer_ids)
    spec = SpecConfig(mode="chain", k=3)
    engine = Engine(
        make_target_runner(model, max_len=128, aux_layer_ids=aux),
        drafter=DraftRunner(draft, spec=spec, sampling=Sampling(), max_len=128),
        spec=spec,
    )

    def target(ids: torch.Tensor):
        cap = capture_aux_states(model, ids[None], aux)
        return cap.logits[0].argmax(-1), cap.aux_hidden[0]

    accepted = 0
    for prompt in PROMPTS:
        tokens, counts = speculative_decode(target, draft, prompt, 40, k=3)
        gen = engine.generate(prompt, 40)
        assert gen.tokens == tokens
        assert gen.accept_lengths[:-1] == counts[:-1]
        accepted += sum(counts)
    assert accepted > 20


@pytest.fixture(scope="module")
def layout_ckpt(tiny_target_dir, tmp_path_factory):
    """An EAGLE-3.1 draft (fc_norm + norm_output) for the tiny target, saved natively."""
    from transformers import AutoConfig

    cfg = DraftConfig.for_target(
        AutoConfig.from_pretrained(tiny_target_dir), aux_layer_ids=[1, 3, 4], draft_vocab_size=200
    )
    torch.manual_seed(0)
    draft = Eagle3Draft(replace(cfg, fc_norm=True, norm_output=True))
    with torch.no_grad():
        for p in draft.fc_norm.parameters():
            p.uniform_(0.5, 1.5)
    ids = torch.randperm(cfg.vocab_size)[:200].sort().values
    draft.d2t.copy_(ids - torch.arange(200))
    draft.t2d[ids] = True
    return save_draft(draft, tmp_path_factory.mktemp("layout") / "ckpt")


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_sglang_and_vllm_exports_carry_the_layout_and_import_back(fmt, layout_ckpt, tiny_target_dir, tmp_path):
    export_draft(layout_ckpt, fmt, tmp_path / "exp", target=str(tiny_target_dir))
    config = json.loads((tmp_path / "exp" / "config.json").read_text())
    assert (config["fc_norm"], config["norm_output"], config["norm_before_fc"]) == (True, True, False)
    if fmt == "vllm":  # the speculators fields sit top-level, not in the decoder layer's config
        assert not {"fc_norm", "norm_output", "norm_before_fc"} & set(config["transformer_layer_config"])
    exported = load_file(str(tmp_path / "exp" / "model.safetensors"))
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(exported)
    import_draft(tmp_path / "exp", tmp_path / "back")
    back = load_draft(tmp_path / "back")
    original = load_draft(layout_ckpt)
    assert back.config == replace(original.config, target_num_layers=back.config.target_num_layers)
    for i in range(3):
        assert torch.equal(back.fc_norm[i].weight, original.fc_norm[i].weight.to(torch.bfloat16).float())
    report = run_doctor(tmp_path / "exp", engine=fmt, target=str(tiny_target_dir), run_probe=False)
    failed = [c for c in report.checks if c.status == "fail"]
    assert not failed, failed


def test_eagle_refuses_a_layout_it_cannot_run(layout_ckpt, tiny_target_dir, tmp_path):
    with pytest.raises(EaglekitError, match="fc_norm=true"):
        export_draft(layout_ckpt, "eagle", tmp_path / "exp", target=str(tiny_target_dir))


def test_import_refuses_layout_tensors_the_config_does_not_use(layout_ckpt, tiny_target_dir, tmp_path):
    export_draft(layout_ckpt, "sglang", tmp_path / "exp", target=str(tiny_target_dir))
    config_path = tmp_path / "exp" / "config.json"
    config = json.loads(config_path.read_text())
    config["fc_norm"] = False
    config_path.write_text(json.dumps(config))
    with pytest.raises(EaglekitError, match="does not use"):
        import_draft(tmp_path / "exp", tmp_path / "back")
    report = run_doctor(tmp_path / "exp", engine="sglang", target=str(tiny_target_dir))
    names = next(c for c in report.checks if c.id == "names")
    assert names.status == "fail" and "write fc_norm: true in config.json" in names.hint
    config["fc_norm"], config["norm_output"] = True, False  # a layout flag dropped: imports, as another model
    config_path.write_text(json.dumps(config))
    import_draft(tmp_path / "exp", tmp_path / "back2")
    assert load_draft(tmp_path / "back2").config.norm_output is False


def test_the_diagnosis_finds_a_config_that_lost_its_layout(tmp_path):
    """An EAGLE-3.1 oracle exported for SGLang, its `fc_norm` flag stripped: SGLang drops the norms'
    weights, acceptance collapses, and the diagnosis names the layout and the line to write."""
    target = save_repeat_target(tmp_path / "target", seed=4, heads=1)
    ckpt = oracle_checkpoint(target, tmp_path / "oracle", k=3, num_prompts=4, max_new_tokens=32, fc_norm=True)
    export_draft(ckpt, "sglang", tmp_path / "export", target=str(target))
    probe = dict(run_probe=True, max_new_tokens=32, num_prompts=4, engine="sglang")
    good = run_doctor(tmp_path / "export", str(target), **probe).probe["tau"]
    lost = planted(tmp_path / "export", tmp_path / "lost", config=lambda cfg: cfg.update(fc_norm=False))
    report = run_doctor(lost, str(target), **probe)
    assert report.probe["tau"] - 1 < 0.25 * (good - 1)
    diagnosis = report.probe["diagnosis"]
    assert diagnosis["cause"] == "layout", diagnosis
    restored = next(t for t in diagnosis["tried"] if t["id"] == "layout")
    assert restored["restores"] and restored["tau"] == pytest.approx(good, abs=0.05)
    assert diagnosis["fix"] == "write fc_norm: true in config.json"


def test_a_layout_trains_from_the_cli(data, tmp_path, capsys):
    """`eaglekit train --fc-norm --norm-output` saves an EAGLE-3.1 draft whose norms trained."""
    main(train_args(data, tmp_path / "run", "--fc-norm", "--norm-output", "--max-steps", "3"))
    draft = load_draft(tmp_path / "run")
    assert draft.config.fc_norm and draft.config.norm_output and not draft.config.norm_before_fc
    assert all(not torch.all(p == 1) for p in draft.fc_norm.parameters())  # trained away from their ones
    # --init-from keeps the draft's layout; another layout is refused with the flags it was trained with
    main(train_args(data, tmp_path / "again", "--init-from", str(tmp_path / "run"), "--max-steps", "1"))
    assert load_draft(tmp_path / "again").config == draft.config
    assert main(train_args(data, tmp_path / "other", "--init-from", str(tmp_path / "run"), "--norm-before-fc")) != 0
    err = capsys.readouterr().err
    assert "another shape" in err and "in its layout (--fc-norm --norm-output)" in err
