"""Answer conversations with the target running in vLLM's offline engine, in this process.

`VllmGenerator` is a token-level generator like `eaglekit.data.generators.EngineGenerator`, so
`LocalBackend` drives it unchanged: the prompts are rendered here with the target's own chat template
(`target.chat.prompt_ids`) and sent to vLLM as token ids, multi-turn conversations go turn by turn
with the target's own answers, and the generate stage's resume rules hold. It streams (`serve`):
up to `batch_size` requests are in vLLM at once (vLLM batches them continuously), and a
conversation's next turn goes in as soon as its answer is back. For targets larger than one GPU,
`tensor_parallel_size` splits it as `vllm serve --tensor-parallel-size` would.
"""

from __future__ import annotations

import logging
from itertools import count
from typing import Iterator

from eaglekit.data.batch_decoder import Request
from eaglekit.data.generators import Completion, Streaming, cut_at_stop
from eaglekit.data.local_backend import LocalBackend, context_length
from eaglekit.errors import EaglekitError
from eaglekit.features.vllm_capture import TargetFiles, import_vllm
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets.chat import check_template_masks
from eaglekit.targets.load import engine_dtype_name

log = logging.getLogger(__name__)


class VllmGenerator(Streaming):
    """vLLM's `LLM` engine behind the token-level generator interface (`generate`, `serve`).

    Args:
        target: the target's HF model folder.
        stop_ids: token ids that end a turn (passed to vLLM as stop_token_ids).
        sampling: temperature 0 is greedy; top_k 0 is off.
        seed: vLLM's seed.
        batch_size: requests in vLLM at once.
        max_model_len: prompt + answer tokens (the generate stage's context length).
        tensor_parallel_size: GPUs the target is split over.
        dtype: vLLM's dtype, by its full name (the CLI resolves "auto" first: `engine_dtype_name`).
        engine_args: further `vllm.LLM` keyword arguments (gpu_memory_utilization, ...).
    """

    name = "vllm"

    def __init__(
        self,
        target,
        stop_ids: list[int],
        sampling: Sampling,
        *,
        seed: int = 0,
        batch_size: int = 256,
        max_model_len: int,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        engine_args: dict | None = None,
    ):
        if not stop_ids:
            raise EaglekitError("the target has no stop token", hint="set eos_token_id in generation_config.json")
        import_vllm()
        self.stop_ids, self.sampling, self.batch_size = list(stop_ids), sampling, batch_size
        self.engine_args = dict(
            model=str(target),
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=batch_size,
            **(engine_args or {}),
        )
        self.llm = None  # started by the first request: a finished folder starts no engine
        self._ids = count()

    def _engine(self):
        if self.llm is None:
            from vllm import LLM

            log.info("starting vLLM for generation: %s", self.engine_args)
            self.llm = LLM(**self.engine_args)
        return self.llm.llm_engine

    def _params(self, max_new_tokens: int):
        from vllm import SamplingParams

        s = self.sampling
        # vLLM's own defaults from generation_config.json must not change what the stage asked for.
        sample = (
            dict(temperature=0.0)
            if s.greedy
            else dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else -1)
        )
        return SamplingParams(
            max_tokens=max_new_tokens,
            stop_token_ids=self.stop_ids,
            detokenize=False,
            repetition_penalty=1.0,
            min_p=0.0,
            **sample,
        )

    def serve(self, take) -> Iterator[tuple[Request, Completion]]:
        """Answer the requests `take()` returns (None: none now) with up to `batch_size` in vLLM;
        yields (request, completion) as answers end."""
        from vllm.inputs import TokensPrompt

        inflight: dict[str, Request] = {}
        stops = set(self.stop_ids)
        while True:
            while len(inflight) < self.batch_size and (request := take()) is not None:
                engine = self._engine()
                rid = f"eaglekit-{next(self._ids)}"
                engine.add_request(
                    rid, TokensPrompt(prompt_token_ids=list(request.ids)), self._params(request.max_new_tokens)
                )
                inflight[rid] = request
            if not inflight:
                return
            for out in self._engine().step():
                if out.finished:
                    request = inflight.pop(out.request_id)
                    yield request, cut_at_stop(list(out.outputs[0].token_ids), stops, request.max_new_tokens)


def vllm_local_backend(args, sampling: Sampling):
    """`eaglekit generate --backend vllm`: (LocalBackend over a VllmGenerator, target fingerprint)."""
    target = TargetFiles(args.target)
    check_template_masks(target.tokenizer)
    context = context_length(args.context_length, target.config)
    engine_args = {}
    if args.gpu_memory_utilization is not None:
        engine_args["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.enforce_eager:
        engine_args["enforce_eager"] = True
    dtype = engine_dtype_name(args.dtype)  # "auto" resolved as the HF path does
    generator = VllmGenerator(
        target.source.path,
        target.stop_token_ids,
        sampling,
        seed=args.seed,
        batch_size=args.batch_size,
        max_model_len=context,
        tensor_parallel_size=args.tensor_parallel_size,
        dtype=dtype,
        engine_args=engine_args,
    )
    backend = LocalBackend(
        target.tokenizer,
        generator,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        context_length=context,
    )
    return backend, target.fingerprint()
