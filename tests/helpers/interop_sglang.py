"""Load an EAGLE-3 draft with SGLang's own code on CPU and report what SGLang made of it.

Runs inside the SGLang venv (scripts/install_sglang_cpu.sh), never imports eaglekit:

    $VENV/bin/python tests/helpers/interop_sglang.py REQUEST.json

REQUEST: {"target", "inputs": safetensors with input_ids [T], aux_hidden [T, 3*H], embed_tokens,
          "jobs": [{"draft", "out"}, ...]}: one process loads every draft (SGLang's import is
          the slow part), each into its own OUT folder:
OUT:     result.json   {"sglang_version", "class", "loader", "stubbed", "nan_left", "params",
                        "layers_to_capture", "captured_output_of"} or {"error", "traceback"}
         params.safetensors   every parameter of the draft after loading, plus hot_token_id
         forward.safetensors  logits [T, draft_vocab] and the carried state [T, H] (pre-norm, normed with norm_output) of one forward

How: SGLang's `ServerArgs` (EAGLE3, CPU) is published, a gloo process group of one is built, the
draft's `ModelConfig` comes from `ModelConfig.from_server_args(..., is_draft_model=True)` and
`get_model_loader` picks the loader. The model is built with the loader module's
`_initialize_model`, every parameter is filled with NaN, and the loader's
`load_weights_and_postprocess` (which calls `LlamaForCausalLMEagle3.load_weights`) fills it from
the folder: exactly `DefaultModelLoader.load_model`, with the NaN fill in between. The target is
loaded the same way, and SGLang's own `resolve_spec_aux_hidden_state_config` +
`configure_aux_hidden_state_capture` set the layers it captures. The forward is
`LlamaModel.forward` of the draft (fc, the decoder layer, norm) with SGLang's
`TorchNativeAttnBackend` over real `ReqToTokenPool` / `MHATokenToKVPool`, one extend of T tokens.

Stubbed (import-time only, nothing that touches weights): `torchvision` (its PyPI build does
not load against the CPU torch; only multimodal processors import it) and `sgl_kernel` (CUDA
kernels; with SGLANG_USE_CPU_ENGINE=1 SGLang imports a CPU KV-cache copy op from it at import).
"""

import importlib.abc
import importlib.machinery
import json
import os
import socket
import sys
import traceback
import types

STUB_ROOTS = ("torchvision", "sgl_kernel")
STUBBED: list[str] = []


class _Anything:
    """What a stubbed module hands out: callable, subscriptable, any attribute."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Anything(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a stub (interop_sglang.py): it must not be called")

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Anything(f"{self.__name__}.{key}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUB_ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        STUBBED.append(spec.name)
        return module

    def exec_module(self, module):
        pass


def install_stubs():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    # transformers decides once, at import, whether torchvision exists: let it see that it does not.
    import transformers.utils.import_utils  # noqa: F401

    sys.meta_path.insert(0, _StubFinder())


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def publish_server_args(target, draft):
    """SGLang's server arguments for serving `target` with the EAGLE-3 `draft` on CPU, published
    process-wide (SGLang allows re-publishing: the last one wins)."""
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(
        model_path=target,
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=draft,
        device="cpu",
        dtype="float32",
        tp_size=1,
        disable_cuda_graph=True,
        attention_backend="torch_native",
    )
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    return server_args


def init_parallel():
    """A gloo process group of one: tensor and pipeline parallel size 1."""
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{free_port()}"
    )
    initialize_model_parallel()


def load(model_config):
    """DefaultModelLoader.load_model, with every parameter set to NaN before the weights load."""
    import torch
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import get_model_loader
    from sglang.srt.model_loader import loader as loader_module
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    load_config = LoadConfig(load_format="auto")
    loader = get_model_loader(load_config, model_config)
    device = torch.device(DeviceConfig("cpu").device)
    with set_default_torch_dtype(model_config.dtype):
        with device:
            model = loader_module._initialize_model(
                model_config, load_config, loader_module._get_quantization_config(model_config, load_config)
            )
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        loader.load_weights_and_postprocess(model, loader._get_all_weights(model_config, model), device)
    return model.eval(), type(loader).__name__


def captured_layers(server_args, target_config):
    """The target layers SGLang captures for this draft, through its own resolution code."""
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        configure_aux_hidden_state_capture,
    )
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    target, _ = load(target_config)
    aux = resolve_spec_aux_hidden_state_config(
        server_args=server_args,
        model_config=target_config,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"),
    )
    configure_aux_hidden_state_capture(
        model=target,
        eagle_use_aux_hidden_state=aux.eagle_use_aux_hidden_state,
        eagle_aux_hidden_state_layer_ids=aux.eagle_aux_hidden_state_layer_ids,
        dflash_use_aux_hidden_state=aux.dflash_use_aux_hidden_state,
        dflash_target_layer_ids=aux.dflash_target_layer_ids,
        is_dspark=aux.is_dspark,
    )
    return aux.eagle_use_aux_hidden_state, list(getattr(target.model, "layers_to_capture", []) or [])


def draft_forward(model, model_config, input_ids, aux_hidden):
    """One extend of T tokens through the draft's LlamaModel.forward on SGLang's torch-native attention."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    cfg = model_config.hf_config
    T = int(input_ids.shape[0])
    req_pool = ReqToTokenPool(size=2, max_context_len=T + 8, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        size=T + 8,
        page_size=1,
        dtype=torch.float32,
        head_num=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        layer_num=cfg.num_hidden_layers,
        device="cpu",
        enable_memory_saver=False,
    )
    slots = torch.arange(1, T + 1, dtype=torch.int64)  # slot 0 is the pool's padding slot
    req_pool.req_to_token[1, :T] = slots.to(req_pool.req_to_token.dtype)
    backend = TorchNativeAttnBackend(
        SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=kv_pool)
    )
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        mm_input_embeds=None,
        contains_mm_inputs=lambda: False,
        spec_info=SimpleNamespace(hidden_states=aux_hidden),
        out_cache_loc=slots,
        encoder_out_cache_loc=None,
        req_pool_indices=torch.tensor([1]),
        seq_lens=torch.tensor([T]),
        extend_prefix_lens=torch.tensor([0]),
        extend_seq_lens=torch.tensor([T]),
        encoder_lens=None,
        mha_return_lse=False,
        global_num_token_non_padded_cpu=None,
        moe_num_token_non_padded=None,
        mrope_positions=None,
    )
    backend.init_forward_metadata(batch)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend), forward_batch=batch):
        to_logits, (carried,) = model.model(input_ids, torch.arange(T), batch)  # pre-norm, or normed (norm_output)
        logits = model.logits_processor._compute_lm_head(to_logits, model.lm_head)
    return logits, carried


def one(req, draft, out):
    from importlib.metadata import version

    import torch
    from safetensors.torch import load_file, save_file

    server_args = publish_server_args(req["target"], draft)
    from sglang.srt.configs.model_config import ModelConfig

    draft_config = ModelConfig.from_server_args(server_args, model_path=draft, is_draft_model=True)
    model, loader_name = load(draft_config)
    params = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    nan_left = [n for n, p in params.items() if p.is_floating_point() and bool(torch.isnan(p).any())]
    saved = dict(params)
    if model.hot_token_id is not None:
        saved["hot_token_id"] = model.hot_token_id.contiguous()
    save_file(saved, os.path.join(out, "params.safetensors"))
    use_aux, to_capture = captured_layers(server_args, ModelConfig.from_server_args(server_args))
    result = {
        "sglang_version": version("sglang"),
        "class": type(model).__name__,
        "loader": loader_name,
        "stubbed": sorted(set(STUBBED)),
        "nan_left": nan_left,
        "params": sorted(params),
        "use_aux_hidden_state": use_aux,
        "layers_to_capture": to_capture,
        # SGLang captures the stream entering layer k, i.e. the output of layer k-1
        "captured_output_of": [k - 1 for k in to_capture],
        "dtype": str(draft_config.dtype),
    }
    if req.get("inputs"):
        inputs = load_file(req["inputs"])
        embed = model.model.embed_tokens.weight
        if "embed_tokens" in inputs:  # what the EAGLE worker does: the target's embedding replaces the draft's
            with torch.no_grad():
                embed.copy_(inputs["embed_tokens"])
        logits, carried = draft_forward(
            model, draft_config, inputs["input_ids"], inputs["aux_hidden"].to(draft_config.dtype)
        )
        save_file(
            {"logits": logits.contiguous(), "carried": carried.contiguous()}, os.path.join(out, "forward.safetensors")
        )
        result["forward"] = True
    return result


def report(out, result):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


def failure(err):
    return {
        "error": f"{type(err).__name__}: {err}",
        "traceback": traceback.format_exc()[-4000:],
        "stubbed": sorted(set(STUBBED)),
    }


if __name__ == "__main__":
    request = json.loads(open(sys.argv[1]).read())
    try:
        install_stubs()
        publish_server_args(request["target"], request["jobs"][0]["draft"])  # the groups read its widths
        init_parallel()
    except Exception as err:  # SGLang itself does not start: every job says so
        for job in request["jobs"]:
            report(job["out"], failure(err))
        raise
    for job in request["jobs"]:
        os.makedirs(job["out"], exist_ok=True)
        try:
            result = one(request, job["draft"], job["out"])
        except Exception as err:  # a refusal of this draft; the test decides what it means
            result = failure(err)
        report(job["out"], result)
