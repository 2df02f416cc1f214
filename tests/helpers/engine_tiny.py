"""Test helpers: tiny targets with peaked logits, random drafts, noisy oracles, and a one-thread fixture."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from eaglekit.draft import DraftConfig, Eagle3Draft
from eaglekit.engine import SpecConfig
from tiny import tiny_model

AUX = [1, 3, 5]
PROMPTS = [[5, 17, 99, 3, 45, 200, 7], [300, 12, 13, 14], [42]]
CHAIN = SpecConfig(mode="chain", k=3)  # the engine tests' chain and tree
TREE = SpecConfig(mode="tree", depth=3, top_k=3, total_tokens=10)


@lru_cache(maxsize=None)
def peaked_model(arch: str = "llama", *, seed: int = 1, std: float = 0.5, **config_kwargs):
    """A tiny target whose logits are peaked (std 0.5 weights), so greedy text varies and has no near-ties.

    Cached: callers must not modify the model (use another seed for a model to modify).
    """
    model = tiny_model(arch, seed=seed, **config_kwargs)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def random_draft(model, *, draft_vocab: int | None = None, seed: int = 0, aux=AUX) -> Eagle3Draft:
    """A randomly initialized EAGLE-3 draft for `model` (draft vocab = a random subset of ids)."""
    vocab = model.config.vocab_size
    draft_vocab = draft_vocab or vocab
    config = DraftConfig.for_target(model.config, aux_layer_ids=aux, draft_vocab_size=draft_vocab)
    torch.manual_seed(seed)
    draft = Eagle3Draft(config)
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    draft.d2t.copy_(ids - torch.arange(draft_vocab))
    draft.t2d.zero_()
    draft.t2d[ids] = True
    draft.set_target_embedding(model.get_input_embeddings().weight)
    return draft.eval()


def noisy(reference: list[int], start: int, every: int, vocab: int) -> list[int]:
    """The reference with every `every`-th token after `start` replaced: partial acceptance."""
    out = list(reference)
    for i in range(start + 1, len(out), every):
        out[i] = (out[i] + 1) % vocab
    return out


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run faster on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cycling_model(cycles: list[list[int]], vocab: int = 128):
    """A tiny Llama whose greedy next token depends on the current one only: `cycles` (token ids)
    follow each other in a ring (the layers add nothing; the head maps a token's embedding to the
    next one's id)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    nxt = list(range(vocab))
    for ring in cycles:
        for i, t in enumerate(ring):
            nxt[t] = ring[(i + 1) % len(ring)]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        head = torch.zeros_like(embed)
        for t in range(vocab):
            head[nxt[t]] += 8 * embed[t]  # logit of nxt[t] is largest where the input is t
        model.lm_head.weight.copy_(head)
    return model


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on CPU: replay runs the captured step again."""

    def __init__(self):
        self.fn = None

    def replay(self):
        self.fn()


def fake_cuda_graphs(monkeypatch) -> None:
    """`runtime.graphs.Step` captures and replays FakeGraphs on CPU (the graph code paths without CUDA)."""
    import contextlib
    import types

    from eaglekit.runtime import graphs

    class FakeCuda:
        CUDAGraph = FakeGraph
        pending = None

        @staticmethod
        def Stream():
            return types.SimpleNamespace(wait_stream=lambda other: None)

        current_stream = Stream

        @staticmethod
        def stream(s):
            return contextlib.nullcontext()

        @staticmethod
        @contextlib.contextmanager
        def graph(g, pool=None):
            yield
            g.fn = FakeCuda.pending

        @staticmethod
        def synchronize(*args):
            pass

    original = graphs.Step.capture

    def capture(self, warmup=3, quiet=False):
        FakeCuda.pending = self.fn
        original(self, warmup, quiet)

    monkeypatch.setattr(graphs.Step, "capture", capture)
    monkeypatch.setattr(graphs, "torch", types.SimpleNamespace(cuda=FakeCuda))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    n = counts.sum()
    expected = expected_probs * n
    keep = expected >= 5  # pool the rare cells
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    stat = ((obs - exp) ** 2 / exp.clamp(min=1e-12)).sum()
    df = int(keep.sum()) - (0 if (~keep).any() else 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))
