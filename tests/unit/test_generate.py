"""The generate stage with the local backend on a tiny target: batching, multi-turn, shards and
manifest, the context limit, and resuming after SIGKILL with no prompt lost or answered twice."""

from __future__ import annotations

import fcntl
import json
import os

import pytest
import torch

from eaglekit.cli import main
from eaglekit.data.folder import JsonlShards
from eaglekit.data.generators import make_generator
from eaglekit.data.local_backend import LocalBackend
from eaglekit.data.records import Conversation, Prompt
from eaglekit.errors import EaglekitError
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets import load_target
from eaglekit.targets.chat import prompt_ids
from engine_tiny import one_thread  # noqa: F401 (fixture)
from generate_folders import QUESTIONS, make_prompts, read_rows


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    return load_target(tiny_target_dir)


def backend(target, batch_size=4, max_new_tokens=12, context_length=512, sampling=Sampling(), kind="hf", seed=0):
    gen = make_generator(kind, target.model, target.stop_token_ids, sampling, seed=seed, batch_size=batch_size)
    return LocalBackend(
        target.tokenizer, gen, max_new_tokens=max_new_tokens, batch_size=batch_size, context_length=context_length
    )


def answer_all(b, prompts):
    done = [c for batch in b.run([Conversation(p, "train") for p in prompts]) for c in batch]
    return {c.prompt.id: c for c in done}


def greedy_reference(target, ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding, one full forward per token: the independent reference."""
    ids = list(ids)
    out = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = target.model(torch.tensor([ids])).logits[0, -1]
        tok = int(logits.argmax())
        out.append(tok)
        ids.append(tok)
        if tok in target.stop_token_ids:
            break
    return out


@pytest.mark.parametrize("kind", ["hf", "engine"])
def test_batched_answers_match_plain_greedy_decoding(tiny, kind):
    prompts = [Prompt(id=str(i), source="t", turns=[q]) for i, q in enumerate(QUESTIONS)]
    batched = answer_all(backend(tiny, batch_size=4, max_new_tokens=10, kind=kind), prompts)
    single = answer_all(backend(tiny, batch_size=1, max_new_tokens=10, kind=kind), prompts)
    for p in prompts:
        ids = prompt_ids(tiny.tokenizer, p.messages())
        ref = greedy_reference(tiny, ids, 10)
        a, b = batched[p.id].answers[0], single[p.id].answers[0]
        assert (a.text, a.num_tokens, a.finish_reason) == (b.text, b.num_tokens, b.finish_reason)
        stopped = ref[-1] in tiny.stop_token_ids
        assert a.text == tiny.tokenizer.decode(ref[:-1] if stopped else ref, skip_special_tokens=True)
        assert (a.num_tokens, a.finish_reason, a.prompt_tokens) == (len(ref), "stop" if stopped else "length", len(ids))


def test_later_turns_follow_the_targets_own_answers(tiny):
    p = Prompt(id="m", source="t", turns=["Hello!", "Count from one to ten.", "Solve 12 * 7."], system="Be brief.")
    conv = answer_all(backend(tiny, max_new_tokens=8, kind="engine"), [p])["m"]
    assert len(conv.answers) == 3
    msgs = conv.to_json()["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    for turn in (1, 2):  # each answer is what the target writes after its own earlier answers
        history = msgs[: 2 + 2 * turn]
        ref = greedy_reference(tiny, prompt_ids(tiny.tokenizer, history), 8)
        ref = ref[:-1] if ref[-1] in tiny.stop_token_ids else ref
        assert msgs[2 + 2 * turn]["content"] == tiny.tokenizer.decode(ref, skip_special_tokens=True)


@pytest.mark.parametrize("kind", ["hf", "engine"])
def test_sampling_follows_the_seed(tiny, kind):
    prompts = [Prompt(id=str(i), source="t", turns=[q]) for i, q in enumerate(QUESTIONS)]

    def texts(seed):
        sampling = Sampling(temperature=1.0, top_p=0.95, top_k=50)
        done = answer_all(backend(tiny, max_new_tokens=8, sampling=sampling, kind=kind, seed=seed), prompts)
        return [done[p.id].answers[0].text for p in prompts]

    first = texts(1)
    assert texts(1) == first and texts(2) != first
    greedy = answer_all(backend(tiny, max_new_tokens=8, kind=kind), prompts)
    assert first != [greedy[p.id].answers[0].text for p in prompts]


def test_cli_writes_shards_and_manifest(tmp_path, tiny_target_dir, tiny):
    prompts = make_prompts(tmp_path, 12)
    out = tmp_path / "gen"
    argv = [
        "generate",
        "--prompts",
        str(prompts),
        "--target",
        str(tiny_target_dir),
        "--out",
        str(out),
        "--backend",
        "hf",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "3",
        "--shard-size",
        "5",
    ]
    assert main(argv) == 0
    assert sorted(p.name for p in out.glob("conversations-*")) == [f"conversations-0000{i}.jsonl" for i in range(3)]
    rows = read_rows(out)
    assert sorted(r["id"] for r in rows) == sorted(f"p{i}" for i in range(12))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "generate" and manifest["target"] == tiny.fingerprint()
    cfg = manifest["config"]
    assert cfg["max_new_tokens"] == 6 and cfg["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}
    assert cfg["backend"] == "hf"
    counts = manifest["counts"]
    assert counts["conversations"] == 12 and sum(counts["by_split"].values()) == 12 and counts["skipped"] == 0
    assert counts["answer_tokens"] == sum(r["meta"]["num_tokens"] for r in rows)
    assert counts["assistant_turns"] == 12 + 3  # p0, p5, p10 have two turns
    turns = [t for r in rows for t in r["meta"]["turns"]]
    assert sum(counts["answer_finish_reason"].values()) == 15  # per answer, where finish_reason is per conversation
    assert counts["answer_tokens_cut_at_limit"] == sum(t["num_tokens"] for t in turns if t["finish_reason"] == "length")
    # A local backend looks for loops in every answer; only answers cut at the limit can hold one.
    assert counts["answer_tokens_checked_for_loops"] == counts["answer_tokens"]
    assert 0 <= counts["answer_tokens_in_loops"] <= counts["answer_tokens_cut_at_limit"]
    for r in rows:
        assert set(r) == {"id", "source", "split", "messages", "meta"}
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"] * (len(r["messages"]) // 2)
        assert r["meta"]["finish_reason"] in ("stop", "length") and r["meta"]["num_tokens"] >= 1
    # Rerunning a finished command does nothing; other settings are refused, finished or not.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(argv) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(argv[:-6] + ["--max-new-tokens", "7", "--batch-size", "3", "--shard-size", "5"]) == 2
    (out / "manifest.json").unlink()
    assert main(argv) == 0  # nothing left to do: the manifest is written again
    assert len(read_rows(out)) == 12
    (out / "manifest.json").unlink()
    assert main(argv[:-6] + ["--max-new-tokens", "7", "--batch-size", "3", "--shard-size", "5"]) == 2


def test_cli_sampling_flags_drive_the_engines_sampling(tmp_path, tiny_target_dir):
    """One Sampling class for the engine and the data stage; --seed travels beside it and is recorded with it."""
    import eaglekit.data.generators as generators

    assert generators.Sampling is Sampling
    prompts = make_prompts(tmp_path, 3)

    def answers(name: str, seed: int) -> list[list[dict]]:
        out = tmp_path / name
        assert (
            main(
                [
                    "generate",
                    "--prompts",
                    str(prompts),
                    "--target",
                    str(tiny_target_dir),
                    "--out",
                    str(out),
                    "--backend",
                    "hf",
                    "--max-new-tokens",
                    "8",
                    "--batch-size",
                    "3",
                    "--temperature",
                    "1.0",
                    "--top-p",
                    "0.9",
                    "--top-k",
                    "20",
                    "--seed",
                    str(seed),
                ]
            )
            == 0
        )
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["config"]["sampling"] == {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "seed": seed}
        return [r["messages"] for r in sorted(read_rows(out), key=lambda r: r["id"])]

    first = answers("a", 7)
    assert answers("b", 7) == first and answers("c", 8) != first


def test_context_limit_skips_or_stops_conversations(tmp_path, tiny_target_dir):
    src = tmp_path / "p.jsonl"
    long = "The quick brown fox jumps over the lazy dog. " * 6
    src.write_text(
        json.dumps({"id": "short", "turns": ["Hello!", long]})
        + "\n"
        + json.dumps({"id": "long", "turns": [long * 2]})
        + "\n"
    )
    out = tmp_path / "gen"
    assert (
        main(
            [
                "generate",
                "--prompts",
                str(src),
                "--target",
                str(tiny_target_dir),
                "--out",
                str(out),
                "--max-new-tokens",
                "8",
                "--context-length",
                "60",
            ]
        )
        == 0
    )
    (row,) = read_rows(out)
    assert row["id"] == "short" and row["meta"]["finish_reason"] == "context_length"
    assert row["meta"]["unanswered_turns"] == 1 and len(row["messages"]) == 2
    (skip,) = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert skip["id"] == "long" and "context" in skip["reason"]
    assert json.loads((out / "manifest.json").read_text())["counts"]["skipped"] == 1


def test_shards_drop_a_torn_line_and_refuse_duplicates(tmp_path):
    shards = JsonlShards(tmp_path, "c", 2)
    shards.append([{"id": "a"}, {"id": "b"}, {"id": "c"}])
    shards.close()
    with open(tmp_path / "c-00001.jsonl", "ab") as f:
        f.write(b'{"id": "d", "mess')  # killed mid-write
    again = JsonlShards(tmp_path, "c", 2)
    assert [r["id"] for r in again.recover()] == ["a", "b", "c"]
    assert (tmp_path / "c-00001.jsonl").read_bytes() == b'{"id": "c"}\n'
    again.append([{"id": "d"}, {"id": "e"}])
    again.close()
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["c-00000.jsonl", "c-00001.jsonl", "c-00002.jsonl"]
    with pytest.raises(EaglekitError, match="written twice"):
        again.append([{"id": "a"}])
    with open(tmp_path / "c-00000.jsonl", "ab") as f:
        f.write(b'{"id": "e"}\n')
    with pytest.raises(EaglekitError, match="appears twice"):
        JsonlShards(tmp_path, "c", 2).recover()


def test_a_second_writer_is_refused(tmp_path, tiny_target_dir):
    prompts = make_prompts(tmp_path, 3)
    out = tmp_path / "gen"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert (
            main(
                [
                    "generate",
                    "--prompts",
                    str(prompts),
                    "--target",
                    str(tiny_target_dir),
                    "--out",
                    str(out),
                    "--backend",
                    "hf",
                    "--max-new-tokens",
                    "4",
                ]
            )
            == 2
        )
    finally:
        os.close(fd)
    assert not any(out.iterdir())


def test_attention_is_a_setting_of_the_engine_backend_only():
    from eaglekit.data.generators import EngineSettings, make_generator
    from eaglekit.runtime.sampling import Sampling

    with pytest.raises(EaglekitError, match="--attention sdpa is a setting of eaglekit's engine"):
        make_generator("hf", None, [1], Sampling(), engine=EngineSettings(attention="sdpa"))
    with pytest.raises(EaglekitError, match="--cache-slots 0"):
        make_generator("local", None, [1], Sampling(), engine=EngineSettings(cache_slots=0))
    with pytest.raises(EaglekitError, match="--stop-loops 128 is a setting of eaglekit's engine"):
        make_generator("hf", None, [1], Sampling(), engine=EngineSettings(stop_loops=128))
    with pytest.raises(EaglekitError, match="--stop-loops 1"):
        make_generator("local", None, [1], Sampling(), engine=EngineSettings(stop_loops=1))
    with pytest.raises(EaglekitError, match="--refill-padding 2.0 is a setting of eaglekit's engine"):
        make_generator("hf", None, [1], Sampling(), engine=EngineSettings(refill_padding=2.0))
    with pytest.raises(EaglekitError, match="--refill-padding 0.5 is below 1"):  # before any model loads
        make_generator("local", None, [1], Sampling(), engine=EngineSettings(refill_padding=0.5))


def test_engine_settings_for_a_server_backend_are_refused_before_anything_runs(tmp_path, capsys):
    from eaglekit.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "turns": ["hi"]}\n')
    assert (
        main(
            [
                "generate",
                "--prompts",
                str(prompts),
                "--out",
                str(tmp_path / "o"),
                "--backend",
                "openai",
                "--server-url",
                "http://127.0.0.1:9",
                "--cache-slots",
                "4096",
            ]
        )
        == 2
    )
    assert "--cache-slots 4096 is a setting of eaglekit's engine, not of backend 'openai'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_stop_loops_is_part_of_a_generate_folder_identity():
    """--stop-loops cuts answers, so a folder records it (and a resume with another value is another
    run); folders written before it existed (no key) still match a run without it."""
    from eaglekit.data.regenerate import GenerateConfig

    assert "stop_loops" not in GenerateConfig().to_json()
    assert GenerateConfig(stop_loops=128).to_json()["stop_loops"] == 128
    assert GenerateConfig(stop_loops=128).to_json() != GenerateConfig().to_json()
