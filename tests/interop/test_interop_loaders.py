"""Proof in the engines' own loaders: SGLang's and SafeAILab/EAGLE's code load eaglekit's exports.

For each engine the export goes through the engine's own loading code in its own venv
(tests/helpers/interop_sglang.py, tests/helpers/interop_eagle.py), with every parameter set to NaN first, and the
engine's draft runs one forward. Five checks, each a function returning what is wrong (or None):

- params:    every parameter written by the loader (no NaN left; for SGLang the embedding, which
             its EAGLE worker replaces by the target's, is the one exception, and is checked as such)
- bits:      every parameter bit-equal to the checkpoint (SGLang's fused qkv_proj / gate_up_proj
             equal to the concatenated q, k, v / gate, up)
- d2t:       the draft->target map as the engine reads it equals the draft vocab's target ids
- aux:       the target layers the engine captures are the ones the draft was trained on
             (SGLang: its own capture resolution on the target it loaded; EAGLE: the states its
             target code hands the draft, matched against each layer's output)
- forward:   the engine's draft forward (logits, the hidden state it carries) equals eaglekit's

The clean export passes all five; each planted bug fails the check named for it (and possibly
others). Needs the venvs of scripts/install_sglang_cpu.sh and scripts/install_eagle_venv.sh;
EAGLEKIT_REQUIRE_SGLANG=1 / EAGLEKIT_REQUIRE_EAGLE=1 turn a missing venv into an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglekit.draft import DraftConfig, Eagle3Draft
from eaglekit.draft.checkpoint import save_draft
from eaglekit.formats import export_draft
from eaglekit.targets.capture import capture_aux_states
from eaglekit.targets.info import default_aux_layer_ids
from oracle_draft import save_repeat_target
from planted import planted

HERE = Path(__file__).parents[1] / "helpers"  # interop_sglang.py, interop_eagle.py
CACHE = Path.home() / ".cache/eaglekit"
SGLANG_VENV = Path(os.environ.get("EAGLEKIT_SGLANG_VENV", CACHE / "sglang-venv"))
EAGLE_VENV = Path(os.environ.get("EAGLEKIT_EAGLE_VENV", CACHE / "eagle-venv"))
T = 16  # tokens in the forward

pytestmark = [pytest.mark.interop, pytest.mark.slow]


# ---- the draft, its exports, and eaglekit's own forward ------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """A tiny target, a seeded random draft (every weight non-trivial, pruned vocab) and its exports."""
    return make_setup(tmp_path_factory.mktemp("interop"), ("sglang", "eagle"))


@pytest.fixture(scope="module")
def layout_setup(tmp_path_factory) -> dict:
    """The same in EAGLE-3.1's layout (fc_norm + norm_output), exported for SGLang."""
    return make_setup(tmp_path_factory.mktemp("interop-layout"), ("sglang",), fc_norm=True, norm_output=True)


def make_setup(root: Path, formats: tuple[str, ...], **layout) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    target = save_repeat_target(root / "target", seed=4, heads=1)
    cfg = AutoConfig.from_pretrained(target)
    N = cfg.num_hidden_layers
    aux = default_aux_layer_ids(N)
    draft_cfg = DraftConfig.for_target(cfg, aux_layer_ids=aux, draft_vocab_size=cfg.vocab_size // 2)
    draft_cfg = replace(draft_cfg, **layout)
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 1:  # norms: not all ones, so a norm read as another shows
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "q_proj" in name or "k_proj" in name or "o_proj" in name:
                p.mul_(8)  # attention that matters: a misread q, k or o shows in the output
    ids = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(1))[: draft_cfg.draft_vocab_size]
    ids = ids.sort().values
    draft.d2t.copy_(ids - torch.arange(len(ids)))
    draft.t2d.zero_()
    draft.t2d[ids] = True
    native = save_draft(draft, root / "native")
    exports = {fmt: root / fmt for fmt in formats}
    for fmt, out in exports.items():
        export_draft(native, fmt, out, target=str(target))

    # eaglekit's forward with the weights the engines hold (the bf16 export, read as float32)
    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(2)
    input_ids = torch.randint(0, cfg.vocab_size, (T,), generator=g)
    with torch.no_grad():
        layers = capture_aux_states(model, input_ids[None], list(range(N)), return_logits=False)
        layer_states = layers.aux_hidden[0].view(T, N, cfg.hidden_size).transpose(0, 1)  # [N, T, H]
        aux_hidden = torch.cat([layer_states[i] for i in aux], dim=-1)  # [T, 3H]
        reference = Eagle3Draft(draft_cfg)
        reference.load_state_dict(
            {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v for k, v in draft.state_dict().items()}
        )
        embedding = model.get_input_embeddings().weight.detach().float()
        reference.set_target_embedding(embedding)
        reference.float().eval()
        logits, carried, _ = reference(input_ids[None], reference.fuse(aux_hidden[None]))
    inputs = root / "inputs.safetensors"
    save_file(
        {"input_ids": input_ids, "aux_hidden": aux_hidden.contiguous(), "embed_tokens": embedding.contiguous()},
        str(inputs),
    )
    return dict(
        root=root,
        target=target,
        exports=exports,
        aux=aux,
        ids=ids,
        num_layers=N,
        inputs=inputs,
        layer_states=layer_states,
        logits=logits[0],
        carried=carried[0],
        checkpoint=load_file(str(exports["sglang"] / "model.safetensors")),
    )


def eagle_target(setup) -> Path:
    """The target as EAGLE's code (transformers 4.x) reads it: a safetensors index (EAGLE finds the
    embedding through it) and a tokenizer class transformers 4 knows. The weights are the same file."""
    folder = setup["root"] / "target-eagle"
    if not folder.exists():
        shutil.copytree(setup["target"], folder)
        names = list(load_file(str(folder / "model.safetensors")))
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}})
        )
        tok = json.loads((folder / "tokenizer_config.json").read_text())
        tok["tokenizer_class"] = "PreTrainedTokenizerFast"
        (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder


def run_engine(venv: Path, runner: str, target: Path, inputs: Path, jobs: dict[str, Path], root: Path) -> dict:
    """Load every draft of `jobs` (name -> folder) in one run of the engine's runner; results by name."""
    outs = {name: root / "out" / name.replace(" ", "_").replace(":", "") for name in jobs}
    request = {
        "target": str(target.resolve()),
        "inputs": str(inputs),
        "jobs": [{"draft": str(folder.resolve()), "out": str(outs[name])} for name, folder in jobs.items()],
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    env.pop("PYTHONPATH", None)  # the runner must not see eaglekit
    proc = subprocess.run(
        [str(venv / "bin/python"), str(HERE / runner), str(root / "request.json")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    results = {}
    for name, out in outs.items():
        if not (out / "result.json").exists():
            raise AssertionError(f"{runner} died (rc {proc.returncode}) before {name}:\n{proc.stderr[-3000:]}")
        result = json.loads((out / "result.json").read_text())
        for part in ("params", "forward"):
            if (out / f"{part}.safetensors").exists():
                result[f"{part}_tensors"] = load_file(str(out / f"{part}.safetensors"))
        results[name] = result
    return results


# ---- the checks, one per property; each returns what is wrong, or None ----------------------------

SGLANG_STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def sglang_expected(ckpt: dict) -> dict[str, torch.Tensor]:
    """What SGLang's parameters must hold after loading, from the checkpoint (the names SGLang
    0.5.12+ builds: model.layers.0.*, fused qkv_proj and gate_up_proj)."""
    layer = {k[len("midlayer.") :]: v for k, v in ckpt.items() if k.startswith("midlayer.")}
    out = {
        "model.fc.weight": ckpt["fc.weight"],
        "model.norm.weight": ckpt["norm.weight"],
        "lm_head.weight": ckpt["lm_head.weight"],
    }
    out.update({f"model.{k}": v for k, v in ckpt.items() if k.startswith(("fc_norm.", "input_norm."))})
    for name, v in layer.items():
        module, _, rest = name.partition(".")
        proj = rest.split(".")[0]
        fused = next((f for f, parts in SGLANG_STACKED.items() if proj in parts), None)
        if fused is None:
            out[f"model.layers.0.{name}"] = v
    for fused, parts in SGLANG_STACKED.items():
        module = "self_attn" if fused == "qkv_proj" else "mlp"
        out[f"model.layers.0.{module}.{fused}.weight"] = torch.cat([layer[f"{module}.{p}.weight"] for p in parts])
    return out


def check_params(engine: str, got: dict, setup) -> str | None:
    if "error" in got:
        return f"{engine} refused the draft: {got['error']}"
    left = [n for n in got["nan_left"] if n != "model.embed_tokens.weight"]
    if left:
        return f"{engine}'s loader left {len(left)} parameters unwritten (NaN): {left[:4]}"
    if engine == "sglang" and "model.embed_tokens.weight" not in got["nan_left"]:
        return "SGLang loaded an embedding from the draft folder; its worker replaces it by the target's anyway"
    return None


def check_bits(engine: str, got: dict, setup) -> str | None:
    if "error" in got:
        return got["error"]
    params, ckpt = got["params_tensors"], setup["checkpoint"]
    if engine == "sglang":
        expected = sglang_expected(ckpt)
    else:
        expected = {k: v for k, v in ckpt.items()}
        expected["embed_tokens.weight"] = load_file(str(setup["inputs"]))["embed_tokens"]
    bad = [
        n
        for n, v in expected.items()
        if n not in params
        or params[n].shape != v.shape
        or not torch.equal(params[n].to(v.dtype), v)
        or not torch.equal(params[n], v.to(params[n].dtype))
    ]
    return f"{engine} holds other values than the checkpoint in {bad[:4]}" if bad else None


def check_d2t(engine: str, got: dict, setup) -> str | None:
    if "error" in got:
        return got["error"]
    params = got["params_tensors"]
    if engine == "sglang":
        if "hot_token_id" not in params:
            return "SGLang read no d2t (hot_token_id is None): draft ids go to the target unmapped"
        mapped = params["hot_token_id"]
    else:
        mapped = torch.arange(params["d2t"].shape[0]) + params["d2t"]  # topK_genrate: idx + d2t[idx]
    if not torch.equal(mapped, setup["ids"]):
        wrong = int((mapped != setup["ids"]).sum())
        return f"{engine} maps {wrong} of {len(mapped)} draft ids to other target tokens (max id {int(mapped.max())})"
    return None


def engine_captures(engine: str, got: dict, setup) -> list[int]:
    """The target layers (eaglekit convention: output of layer i) whose states the engine feeds the draft."""
    if engine == "sglang":
        return list(got["captured_output_of"])
    found = []
    for i in range(3):  # EAGLE: match each handed state against every layer's output
        state = got["forward_tensors"][f"captured_{i}"]
        found.append(
            next(
                (j for j, s in enumerate(setup["layer_states"]) if torch.allclose(s, state, atol=1e-4, rtol=1e-4)), None
            )
        )
    return found


def check_aux(engine: str, got: dict, setup, folder: Path) -> str | None:
    if "error" in got:
        return got["error"]
    meant = json.loads((folder / "config.json").read_text())["eaglekit"]["aux_layer_ids"]
    captured = engine_captures(engine, got, setup)
    if captured != meant:
        return f"{engine} feeds the draft the outputs of layers {captured}, it was trained on {meant}"
    return None


def forward_error(got: dict, setup) -> tuple[float, float]:
    """Largest difference of the engine's logits and carried hidden state (what its next draft step reads:
    the pre-norm output, normed with norm_output) from eaglekit's, relative to their scale."""
    out = got["forward_tensors"]
    dl = (out["logits"].float() - setup["logits"]).abs().max().item() / setup["logits"].abs().max().item()
    dh = (out["carried"].float() - setup["carried"]).abs().max().item() / setup["carried"].abs().max().item()
    return dl, dh


def check_forward(engine: str, got: dict, setup) -> str | None:
    if "error" in got:
        return got["error"]
    out = got["forward_tensors"]
    dl, dh = forward_error(got, setup)
    same_top = torch.equal(out["logits"].argmax(-1), setup["logits"].argmax(-1))
    if dl > 1e-4 or dh > 1e-4 or not same_top:
        return (
            f"{engine}'s draft forward differs from eaglekit's: logits by {dl:.2g}, hidden by {dh:.2g} "
            f"(relative), same top token {same_top}"
        )
    return None


def findings(engine: str, got: dict, setup, folder: Path) -> dict[str, str | None]:
    return {
        "params": check_params(engine, got, setup),
        "bits": check_bits(engine, got, setup),
        "d2t": check_d2t(engine, got, setup),
        "aux": check_aux(engine, got, setup, folder),
        "forward": check_forward(engine, got, setup),
    }


# ---- planted bugs ------------------------------------------------------------------------------


def _prefix_names(state):  # names no SGLang version maps: silently dropped
    return {("draft_model." + k if k.startswith("midlayer.") else k): v for k, v in state.items()}


def _layers0(state):  # ModelOpt/speculators names: EAGLE and SGLang <= 0.5.11 drop them
    return {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}


def _d2t_absolute(state):
    state["d2t"] = state["d2t"] + torch.arange(state["d2t"].shape[0])


def _fc_transposed(state):
    state["fc.weight"] = state["fc.weight"].t().contiguous()


def _q_k_swapped(state):  # same shapes here (one head, one kv head): only the values tell
    q, k = "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight"
    state[q], state[k] = state[k], state[q]


def _aux_ids_plus1_sglang(cfg):  # nested ids one layer late: SGLang captures other layers
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]


def _trained_elsewhere(cfg):  # EAGLE's layers are hard-coded: a draft trained one layer later
    cfg["eaglekit"]["aux_layer_ids"] = [i + 1 for i in cfg["eaglekit"]["aux_layer_ids"]]


PLANTED = {
    # bug: (engine, edit, the checks that must fail)
    "sglang: names prefixed (draft_model.midlayer.*)": ("sglang", dict(tensors=_prefix_names), {"params"}),
    "sglang: d2t absolute ids": ("sglang", dict(tensors=_d2t_absolute), {"d2t"}),
    "sglang: aux ids off by one": ("sglang", dict(config=_aux_ids_plus1_sglang), {"aux"}),
    "sglang: fc transposed": ("sglang", dict(tensors=_fc_transposed), {"params", "bits", "forward"}),
    "sglang: q and k swapped": ("sglang", dict(tensors=_q_k_swapped), {"bits", "forward"}),
    "eagle: names layers.0.*": ("eagle", dict(tensors=_layers0), {"params"}),
    "eagle: d2t absolute ids": ("eagle", dict(tensors=_d2t_absolute), {"d2t"}),
    "eagle: trained on other aux layers": ("eagle", dict(config=_trained_elsewhere), {"aux"}),
    "eagle: fc transposed": ("eagle", dict(tensors=_fc_transposed), {"params", "bits", "forward"}),
    "eagle: q and k swapped": ("eagle", dict(tensors=_q_k_swapped), {"bits", "forward"}),
}


CLEAN = "clean"
LAYERS0 = "sglang: names layers.0.*"  # accepted by SGLang >= 0.5.12


def engine_runs(engine: str, setup) -> dict[str, tuple[dict, Path]]:
    """The clean export and every planted copy for `engine`, loaded in one engine process."""
    root = setup["root"] / f"runs-{engine}"
    jobs = {CLEAN: setup["exports"][engine]}
    for bug, (bug_engine, edit, _) in PLANTED.items():
        if bug_engine == engine:
            jobs[bug] = planted(setup["exports"][engine], root / "planted" / str(len(jobs)), **edit)
    if engine == "sglang":
        jobs[LAYERS0] = planted(setup["exports"][engine], root / "planted" / "layers0", tensors=_layers0)
        results = run_engine(SGLANG_VENV, "interop_sglang.py", setup["target"], setup["inputs"], jobs, root)
    else:
        results = run_engine(EAGLE_VENV, "interop_eagle.py", eagle_target(setup), setup["inputs"], jobs, root)
    return {name: (results[name], jobs[name]) for name in jobs}


@pytest.fixture(scope="module")
def sglang_runs(request):
    if not (SGLANG_VENV / "bin/python").exists():
        pytest.skip(f"no SGLang venv at {SGLANG_VENV} (scripts/install_sglang_cpu.sh)")
    return engine_runs("sglang", request.getfixturevalue("setup"))


@pytest.fixture(scope="module")
def eagle_runs(request):
    if not (EAGLE_VENV / "bin/python").exists():
        pytest.skip(f"no EAGLE venv at {EAGLE_VENV} (scripts/install_eagle_venv.sh)")
    return engine_runs("eagle", request.getfixturevalue("setup"))


# ---- the tests -------------------------------------------------------------------------------------


def test_sglang_loads_the_sglang_export(sglang_runs, setup):
    got, folder = sglang_runs[CLEAN]
    assert "error" not in got, got.get("traceback", got)
    assert got["class"] == "LlamaForCausalLMEagle3" and got["loader"] == "DefaultModelLoader", got
    assert {m.split(".")[0] for m in got["stubbed"]} <= {"torchvision", "sgl_kernel"}, got["stubbed"]
    problems = findings("sglang", got, setup, folder)
    print(
        f"\nSGLang {got['sglang_version']}: captures {got['layers_to_capture']} (inputs of), "
        f"stubbed {sorted({m.split('.')[0] for m in got['stubbed']})}; forward error {forward_error(got, setup)}; "
        f"{problems}"
    )
    assert problems == dict.fromkeys(problems), problems


def test_sglang_0512_and_later_accept_layers0_names(sglang_runs, setup):
    """SGLang >= 0.5.12 renames midlayer to layers.0 and loads both; this pins that the wheel installed
    here is such a version (the doctor's names check says 0.5.11 and older drop layers.0.* silently)."""
    got, folder = sglang_runs[LAYERS0]
    assert tuple(int(x) for x in got["sglang_version"].split(".")[:3]) >= (0, 5, 12)
    problems = findings("sglang", got, setup, folder)
    assert problems == dict.fromkeys(problems), problems


def test_sglang_runs_an_eagle31_layout_as_eaglekit_does(layout_setup):
    """fc_norm + norm_output (EAGLE-3.1): SGLang's own loader fills the per-aux norms from the export and
    its forward gives eaglekit's logits and the normed state its next draft step reads."""
    if not (SGLANG_VENV / "bin/python").exists():
        pytest.skip(f"no SGLang venv at {SGLANG_VENV} (scripts/install_sglang_cpu.sh)")
    folder = layout_setup["exports"]["sglang"]
    root = layout_setup["root"] / "runs-sglang"
    got = run_engine(
        SGLANG_VENV, "interop_sglang.py", layout_setup["target"], layout_setup["inputs"], {CLEAN: folder}, root
    )[CLEAN]
    assert "error" not in got, got.get("traceback", got)
    assert {f"model.fc_norm.{i}.weight" for i in range(3)} <= set(got["params_tensors"])
    problems = findings("sglang", got, layout_setup, folder)
    assert problems == dict.fromkeys(problems), problems


def test_eagle_loads_the_eagle_export(eagle_runs, setup):
    got, folder = eagle_runs[CLEAN]
    assert "error" not in got, got.get("traceback", got)
    assert got["same_as_eamodel"], "the step-by-step load differs from EaModel.from_pretrained's"
    assert got["missing"] == ["embed_tokens.weight"] and got["unexpected"] == [], got
    problems = findings("eagle", got, setup, folder)
    print(f"\nEAGLE {got['eagle_commit'][:10]}: {got['class']}; forward error {forward_error(got, setup)}; {problems}")
    assert problems == dict.fromkeys(problems), problems


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_its_check(bug, request):
    engine, _, must_fail = PLANTED[bug]
    runs = request.getfixturevalue(f"{engine}_runs")
    setup = request.getfixturevalue("setup")
    assert "error" not in runs[CLEAN][0], runs[CLEAN][0]  # the engine runs: what fails is the bug
    got, folder = runs[bug]
    # bits and forward compare with the clean checkpoint and eaglekit's forward: what the draft is
    problems = findings(engine, got, setup, folder)
    failed = {k for k, v in problems.items() if v}
    print(f"\n{bug}: failed {sorted(failed)}: {[v for v in problems.values() if v][:2]}")
    assert must_fail <= failed, problems
