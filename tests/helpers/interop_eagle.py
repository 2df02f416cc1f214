"""Load an EAGLE-3 draft with SafeAILab/EAGLE's own code (`eagle.model`) on CPU and report it.

Runs inside the EAGLE venv (scripts/install_eagle_venv.sh: transformers 4.x), never imports eaglekit:

    $VENV/bin/python tests/helpers/interop_eagle.py REQUEST.json

REQUEST: {"target", "inputs": safetensors with input_ids [T] and aux_hidden [T, 3*H],
          "jobs": [{"draft", "out"}, ...]}: every draft in one process, each into its OUT folder
         (the target folder needs model.safetensors.index.json: EAGLE reads the embedding through it)
OUT:     result.json   {"eagle_commit", "class", "nan_left", "params", "missing", "unexpected",
                        "same_as_eamodel"} or {"error", "traceback"}
         params.safetensors   the draft (`ea_layer`) state after loading: parameters and d2t/t2d
         forward.safetensors  logits [T, draft_vocab], carried [T, H] (the pre-norm output) of one draft forward, and
                              captured_{0,1,2} [T, H]: the three target states EAGLE's own target
                              code (`KVLlamaForCausalLM`) hands the draft for input_ids

How: `EaModel.from_pretrained(use_eagle3=True, ...)` builds the target and the draft the way EAGLE
serves them. The same draft is also built step by step as `EaModel.__init__` does it (EConfig,
`cnets.Model(config, load_emb=True, path=target, bias=...)`, the d2t/t2d deletion for equal
vocabularies, `load_state_dict(strict=False)`), with every parameter filled with NaN between the
construction and the load, so what the load leaves unwritten shows; its state must equal
EaModel's. Nothing is stubbed.
"""

import json
import os
import sys
import traceback

EAGLE_COMMIT = "cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b"


def one(req, draft_dir, out):
    import torch
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig
    from eagle.model.ea_model import EaModel
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    ea = EaModel.from_pretrained(
        use_eagle3=True,
        base_model_path=req["target"],
        ea_model_path=draft_dir,
        torch_dtype=torch.float32,
        total_token=8,
        depth=3,
        top_k=2,
    )
    ea.eval()

    # The same draft, built as EaModel.__init__ builds it, NaN-filled before the load.
    config_path = os.path.join(draft_dir, "config.json")
    config = EConfig.from_pretrained(config_path)
    bias = json.loads(open(config_path).read()).get("bias", True)
    draft = Model(config, bias=bias, total_tokens=8, depth=3, top_k=2, path=req["target"], load_emb=True)
    if config.vocab_size == config.draft_vocab_size:
        del draft.d2t, draft.t2d
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name != "embed_tokens.weight":  # loaded from the target's checkpoint in the constructor
                p.fill_(float("nan"))
    state = load_file(os.path.join(draft_dir, "model.safetensors"))
    load = draft.load_state_dict(state, strict=False)
    draft.to(torch.float32)
    mine = {k: v.detach().clone().contiguous() for k, v in draft.state_dict().items()}
    theirs = ea.ea_layer.state_dict()
    same = sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    nan_left = [k for k, v in mine.items() if v.is_floating_point() and bool(torch.isnan(v).any())]
    save_file(mine, os.path.join(out, "params.safetensors"))
    result = {
        "eagle_commit": EAGLE_COMMIT,
        "class": f"{type(ea).__name__}.ea_layer: {type(ea.ea_layer).__module__}.{type(ea.ea_layer).__name__}",
        "nan_left": nan_left,
        "params": sorted(mine),
        "missing": list(load.missing_keys),
        "unexpected": list(load.unexpected_keys),
        "same_as_eamodel": same,
    }
    if req.get("inputs"):
        inputs = load_file(req["inputs"])
        ids = inputs["input_ids"][None]
        with torch.no_grad():
            captured = ea.base_model.model(input_ids=ids, use_cache=False, output_hidden_states=False).hidden_states
            h = ea.ea_layer(hidden_states=inputs["aux_hidden"][None].float(), input_ids=ids, use_cache=False)
            logits = ea.ea_layer.lm_head(ea.ea_layer.norm(h))  # as topK_genrate computes them
        tensors = {"logits": logits[0].contiguous(), "carried": h[0].contiguous()}
        tensors.update({f"captured_{i}": s[0].contiguous() for i, s in enumerate(captured[:3])})
        save_file(tensors, os.path.join(out, "forward.safetensors"))
        result["forward"] = True
        result["num_captured"] = len(captured)
    return result


if __name__ == "__main__":
    request = json.loads(open(sys.argv[1]).read())
    for job in request["jobs"]:
        os.makedirs(job["out"], exist_ok=True)
        try:
            result = one(request, job["draft"], job["out"])
        except Exception as err:  # a refusal of this draft; the test decides what it means
            result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        with open(os.path.join(job["out"], "result.json"), "w") as f:
            json.dump(result, f)
