"""`--cache-target`: online training reads the target's states back from host memory after the first
pass, trains exactly as without it, and refuses where it would not."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.errors import EaglekitError
from eaglekit.train import target_cache
from eaglekit.train.loop import train
from train_tiny import (
    config,
    train_data,  # noqa: F401 (fixture `data`)
)

torch.set_num_threads(1)

TIMINGS = {"tokens_per_s", "elapsed_s"}  # the wall-clock fields of a log line


def online(data, out, **kw):
    """Two passes over the tiny conversations, validating twice."""
    base = dict(features=None, data=data["conv"], max_steps=None, epochs=2.0, val_every=4, save_every=100)
    return config(data, out, **{**base, **kw})


def last_weights(out):
    latest = json.loads((out / "trainer_state" / "latest.json").read_text())
    return load_file(str(out / "trainer_state" / latest["dir"] / "draft.safetensors"))


def logged(out):
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if k not in TIMINGS} for x in lines if x["event"] in ("train", "val")]


def test_cached_passes_train_exactly_as_the_target_does(data, tmp_path):
    plain = train(online(data, tmp_path / "plain"))
    cached = train(online(data, tmp_path / "cached", cache_target=True))
    assert plain["target_cache"] is None and plain["steps"] == cached["steps"]
    assert logged(tmp_path / "cached") == logged(tmp_path / "plain")
    a, b = last_weights(tmp_path / "plain"), last_weights(tmp_path / "cached")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary = cached["target_cache"]
    # the arenas hold the validation conversations too; (3 aux layers + 1) x hidden 64 x fp32 a token
    assert summary["tokens"] > cached["counts"]["train_tokens"]
    assert summary["bytes"] == summary["tokens"] * (3 + 1) * 64 * 4
    # the second pass and every validation after the first read the cache
    assert summary["batches_cached"] > summary["batches_target"] > 0


def test_a_target_whose_logits_are_not_its_head_is_refused(data, tmp_path, monkeypatch):
    from eaglekit.targets import load as load_mod

    real = load_mod.load_target

    def soft_capped(*args, **kw):  # as Gemma 2's final logit soft-cap does
        target = real(*args, **kw)

        def cap(_module, _args, output):
            output.logits = 30.0 * torch.tanh(output.logits / 30.0)
            return output

        target.model.register_forward_hook(cap)
        return target

    monkeypatch.setattr("eaglekit.train.setup.load_target", soft_capped)
    with pytest.raises(EaglekitError, match="logit soft-cap or a logit scale") as err:
        train(online(data, tmp_path / "run", cache_target=True))
    assert "drop --cache-target" in err.value.hint
    assert train(online(data, tmp_path / "plain", max_steps=1))["complete"]  # the same target trains without it


def test_cache_target_is_refused_offline_and_under_ddp(data, tmp_path):
    with pytest.raises(EaglekitError, match="--features trains from a store already") as err:
        config(data, tmp_path / "run", cache_target=True)
    assert "drop --cache-target" in err.value.hint
    with pytest.raises(EaglekitError, match="under DDP") as err:
        target_cache.check_target_cache_supported(2)
    assert "one process" in err.value.hint
    target_cache.check_target_cache_supported(1)
    # a run that cached resumes without it, and the other way round (it changes no number)
    assert "cache_target" not in online(data, tmp_path, cache_target=True).resume_key()


def test_the_memory_guard_refuses_what_the_host_cannot_hold(data, tmp_path, monkeypatch):
    monkeypatch.setattr(target_cache, "available_host_bytes", lambda: 100_000)
    with pytest.raises(EaglekitError, match=r"needs [\d.]+ MiB of host memory for [\d,]+ tokens") as err:
        train(online(data, tmp_path / "run", cache_target=True))
    assert "--train-fraction" in err.value.hint and "drop --cache-target" in err.value.hint
    monkeypatch.setattr(target_cache, "available_host_bytes", lambda: None)  # no MemAvailable: not checked
    target_cache.check_host_memory(10**15, 10**9)
