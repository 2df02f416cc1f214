"""Offline capture through vLLM: the target runs in vLLM's engine (tensor parallel), the shards are
the same as the HF path's (`eaglekit.features.capture`), so training cannot tell them apart.

How the states come out of vLLM (0.32): every model vLLM can serve an EAGLE-3 draft for implements
`SupportsEagle3`; `set_aux_hidden_state_layers(ids)` makes its forward return `(hidden, [aux...])`,
the aux states being the residual stream `hidden + residual` at vLLM's ids (id k = output of layer
k-1, so eaglekit's id i is vLLM's i + 1), all-gathered where the model shards the sequence. These
are exactly the tensors vLLM hands an EAGLE-3 draft when it serves one. `AuxStateWorker` is mixed
into every vLLM worker (`worker_extension_cls`); through `collective_rpc` it turns that on and wraps
the model runner's `_model_forward`: each forward's aux states and its top-k teacher (the model's
own `compute_logits` over every position, a collective under TP, so every rank calls it) are kept
per request and position, then written by TP rank 0 to one safetensors file a shard (data goes
through files, the RPC carries names only, as vLLM recommends).

Each conversation is one request of `max_tokens=1` over the tokenized conversation (the same
`Sample`s as the HF path, so the same chat template and loss mask), prefix caching off (a cached
prefix would skip its forward), eager mode (a compiled graph would not return the aux states;
prefill does not need CUDA graphs). A position that no forward covered is an error, never a zero.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglekit.errors import EaglekitError
from eaglekit.features.capture import capture_conversations, shard_tensors
from eaglekit.features.conversations import Sample
from eaglekit.features.options import FeaturesOptions
from eaglekit.features.teacher import topk_from_logits
from eaglekit.formats.facts import target_facts
from eaglekit.formats.vllm import VLLM
from eaglekit.targets.load import engine_dtype_name, generation_eos_ids, stop_token_ids

log = logging.getLogger(__name__)
WORKER_EXTENSION = "eaglekit.features.vllm_capture.AuxStateWorker"
LOGITS_CHUNK = 1024  # positions per compute_logits call in the worker ([chunk, V] fp32 at a time)


def import_vllm():
    """vLLM, imported only when a vLLM backend is asked for."""
    try:
        import vllm
    except ImportError as err:
        raise EaglekitError(
            f"--backend vllm needs vLLM in this environment ({err})",
            hint="pip install vllm (GPU) in the same environment as eaglekit; on CPU see "
            "scripts/install_vllm_cpu.sh, or use --backend hf",
        ) from err
    return vllm


class AuxStateWorker:
    """Methods mixed into vLLM's worker class (`self` is the worker; `self.model_runner` runs the model)."""

    def eaglekit_start(self, vllm_layer_ids: list[int], topk: int) -> str:
        from vllm.model_executor.models.interfaces import supports_eagle3

        runner = self.model_runner
        model = runner.get_model()
        if not supports_eagle3(model):
            return (
                f"vLLM's {type(model).__name__} does not implement SupportsEagle3: vLLM cannot return its "
                "aux hidden states (nor serve an EAGLE-3 draft for it)"
            )
        model.set_aux_hidden_state_layers(tuple(vllm_layer_ids))
        self._eaglekit = {
            "order": sorted(set(vllm_layer_ids)),
            "ids": list(vllm_layer_ids),
            "topk": int(topk),
            "states": {},
        }
        if getattr(runner, "_eaglekit_forward", None) is None:
            runner._eaglekit_forward = runner._model_forward
            runner._model_forward = self._eaglekit_model_forward
        return ""

    def _eaglekit_model_forward(self, *args, **kwargs):
        runner = self.model_runner
        out = runner._eaglekit_forward(*args, **kwargs)
        if not isinstance(out, tuple):
            if isinstance(out, torch.Tensor):
                raise RuntimeError("the model returned no aux hidden states: capture needs enforce_eager=True")
            return out  # IntermediateTensors of a pipeline stage (eaglekit sets up no pipeline parallelism)
        hidden, aux = out
        state = self._eaglekit
        if len(aux) != len(state["order"]):
            raise RuntimeError(f"vLLM returned {len(aux)} aux states for layers {state['order']}")
        by_id = dict(zip(state["order"], aux))
        fused = torch.cat([by_id[i] for i in state["ids"]], dim=-1)  # [N, k*H], eaglekit's id order
        num_reqs = runner.input_batch.num_reqs
        req_ids = runner.input_batch.req_ids[:num_reqs]
        starts = runner.query_start_loc.np[: num_reqs + 1].tolist()
        positions = kwargs.get("positions")
        n = starts[-1]
        model = runner.get_model()
        top_ids, top_logp = [], []
        for lo in range(0, n, LOGITS_CHUNK):  # every rank: compute_logits gathers over TP
            logits = model.compute_logits(hidden[lo : min(lo + LOGITS_CHUNK, n)])
            if logits is not None:
                ids, logp = topk_from_logits(logits, state["topk"])
                top_ids.append(ids.cpu())
                top_logp.append(logp.cpu())
        if not self._eaglekit_rank0():
            return hidden
        # Copies: on CPU `.cpu()` is the tensor itself, and the runner reuses its input buffers every step.
        fused = fused[:n].to("cpu", torch.bfloat16, copy=True)
        top_ids, top_logp = torch.cat(top_ids), torch.cat(top_logp)
        pos = positions[:n].to("cpu", torch.long, copy=True)
        for r, req in enumerate(req_ids):
            lo, hi = starts[r], starts[r + 1]
            if hi > lo:
                state["states"].setdefault(req, []).append((pos[lo:hi], fused[lo:hi], top_ids[lo:hi], top_logp[lo:hi]))
        return hidden

    def _eaglekit_rank0(self) -> bool:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0

    def eaglekit_dump(self, path: str, req_ids: list[str], lengths: list[int]) -> str:
        """Write requests' states to `path` (TP rank 0): `{i}.aux` [T, k*H] bf16, `{i}.topk_ids`,
        `{i}.topk_logp`, i the request's index in `req_ids`. Returns an error message, or ""."""
        if not self._eaglekit_rank0():
            return ""
        states = self._eaglekit["states"]
        tensors = {}
        for i, (req, length) in enumerate(zip(req_ids, lengths)):
            parts = states.pop(req, [])
            if not parts:
                return f"request {req} ran no forward"
            pos = torch.cat([p[0] for p in parts])
            # Positions past the conversation (a decode step scheduled ahead of knowing max_tokens=1 was
            # reached) are not part of it; each position of it must have been computed exactly once.
            order = pos.argsort()
            order = order[pos[order] < length]
            pos = pos[order]
            if pos.tolist() != list(range(length)):
                missing = sorted(set(range(length)) - set(pos.tolist()))
                return (
                    f"request {req}: positions {missing[:8]} of {length} were not computed"
                    if missing
                    else f"request {req}: some of its {length} positions were computed twice"
                )
            for j, key in ((1, "aux"), (2, "topk_ids"), (3, "topk_logp")):
                tensors[f"{i}.{key}"] = torch.cat([p[j] for p in parts])[order].contiguous()
        save_file(tensors, path)
        return ""


class VllmCapture:
    """One vLLM engine for the whole capture; `capture_shard(samples)` gives one shard's tensors.

    Args:
        target: the target's HF folder (vLLM loads it).
        aux_layer_ids: eaglekit's convention (output of 0-based layer i).
        topk: teacher entries per token.
        max_model_len: longest sample + 1 (the one token each request generates).
        tensor_parallel_size: GPUs the target is split over.
        dtype: vLLM's dtype, by its full name (the CLI resolves "auto" first: `engine_dtype_name`).
        batch_tokens: vLLM's max_num_batched_tokens (tokens per forward; long samples are chunked).
        engine_args: further `vllm.LLM` keyword arguments (gpu_memory_utilization, ...).
    """

    def __init__(
        self,
        target: str | Path,
        *,
        aux_layer_ids: list[int],
        topk: int,
        max_model_len: int,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        batch_tokens: int = FeaturesOptions.batch_tokens,
        engine_args: dict | None = None,
    ):
        vllm = import_vllm()
        self.topk = topk
        args = dict(
            model=str(target),
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            enforce_eager=True,
            enable_prefix_caching=False,
            max_model_len=max_model_len,
            max_num_batched_tokens=batch_tokens,
            seed=0,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if batch_tokens < 256:  # vLLM wants at least one token a request per step
            args["max_num_seqs"] = batch_tokens
        args.update(engine_args or {})
        log.info("starting vLLM for capture: %s", args)
        self.llm = vllm.LLM(**args)
        errors = [
            e for e in self.llm.collective_rpc("eaglekit_start", args=(VLLM.engine_ids(aux_layer_ids), topk)) if e
        ]
        if errors:
            raise EaglekitError(errors[0], hint="capture this target with --backend hf (transformers hooks)")
        self._tmp = tempfile.mkdtemp(prefix="eaglekit-vllm-capture-")
        self._count = 0

    def capture_shard(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        req_ids = []
        for s in samples:
            self._count += 1
            req_ids.append(
                engine.add_request(f"ek{self._count}", TokensPrompt(prompt_token_ids=s.input_ids.tolist()), params)
            )
        while engine.has_unfinished_requests():
            engine.step()
        path = os.path.join(self._tmp, "shard.safetensors")
        errors = [
            e for e in self.llm.collective_rpc("eaglekit_dump", args=(path, req_ids, [s.length for s in samples])) if e
        ]
        if errors:
            raise EaglekitError(f"vLLM capture failed: {errors[0]}", hint="is prefix caching off? (it is by default)")
        got = load_file(path)
        os.unlink(path)
        return shard_tensors(
            samples, [(got[f"{i}.aux"], got[f"{i}.topk_ids"], got[f"{i}.topk_logp"]) for i in range(len(samples))]
        )

    def close(self) -> None:
        try:
            os.rmdir(self._tmp)
        except OSError:
            pass
        self.llm = None


class TargetFiles:
    """A target known from its files (config, tokenizer), its weights left to vLLM: what
    `capture_into` needs of a `Target` besides the model."""

    def __init__(self, spec: str):
        facts = target_facts(spec)
        if facts.source.kind != "hf_dir":
            raise EaglekitError(
                f"vLLM loads an HF model folder; {spec} is a {facts.source.kind}",
                hint=f"write one with `eaglekit target prepare --target {spec} --out DIR`",
            )
        self.source, self.config, self.tokenizer = facts.source, facts.config, facts.tokenizer
        self.stop_token_ids = stop_token_ids(generation_eos_ids(facts.source, facts.full_config), facts.tokenizer)
        self._fingerprint = facts.fingerprint

    def fingerprint(self) -> dict:
        return self._fingerprint


def run_features_vllm(args) -> int:
    """`eaglekit features --backend vllm`: the HF path's flow (`features.capture.capture_conversations`) with vLLM
    computing each shard."""
    if args.device_map:
        raise EaglekitError("--device-map is the hf backend's way to split a target", hint="use --tensor-parallel-size")
    import_vllm()  # before anything is written
    target = TargetFiles(args.target)
    engine_args = {}
    if args.gpu_memory_utilization is not None:
        engine_args["gpu_memory_utilization"] = args.gpu_memory_utilization
    dtype = engine_dtype_name(args.dtype)  # "auto" resolved as the HF path does
    capture = None

    def shard_capture_for(aux: list[int], samples):
        def shard_capture(shard_samples):
            nonlocal capture
            if capture is None:  # started at the first shard to capture: a finished folder starts no engine
                capture = VllmCapture(
                    target.source.path,
                    aux_layer_ids=aux,
                    topk=args.teacher_topk,
                    max_model_len=max(s.length for s in samples) + 1,
                    tensor_parallel_size=args.tensor_parallel_size,
                    dtype=dtype,
                    batch_tokens=args.batch_tokens,
                    engine_args=engine_args,
                )
            return capture.capture_shard(shard_samples)

        return shard_capture

    config = {"backend": "vllm", "tensor_parallel_size": args.tensor_parallel_size, "dtype": dtype}
    try:
        manifest = capture_conversations(args, target, config=config, shard_capture_for=shard_capture_for)
    finally:
        if capture is not None:
            capture.close()
    c = manifest["counts"]
    print(
        f"features (vllm, tp {args.tensor_parallel_size}): {c['samples']} conversations, {c['tokens']} tokens in "
        f"{c['shards']} shards -> {args.out} ({c['bytes_per_token']} bytes/token)"
    )
    return 0
