"""The prompts stage: every source format, malformed records, dedup, length filters, mixing, the
stable split, and the atomic output folder. Small data written by the tests themselves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eaglekit.artifacts import atomic_dir
from eaglekit.cli import main
from eaglekit.data.folder import read_prompt_folder
from eaglekit.data.prompts import Filters, build_prompts
from eaglekit.data.readers import SourceSpec, read_source
from eaglekit.data.records import Prompt, split_of
from eaglekit.errors import EaglekitError


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read(spec: str):
    return read_source(SourceSpec.parse(spec))


def lines(folder: Path, split: str) -> list[dict]:
    return [json.loads(x) for x in (folder / f"{split}.jsonl").read_text().splitlines()]


def test_sharegpt(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "system", "value": "Be brief."},
                        {"from": "human", "value": "Hi there"},
                        {"from": "gpt", "value": "Hello!"},
                        {"from": "human", "value": "And you?"},
                        {"from": "gpt", "value": "Fine."},
                    ],
                },
                # A leading assistant greeting is dropped; role/content inside `conversations` is accepted too.
                {"conversations": [{"from": "gpt", "value": "Welcome"}, {"from": "human", "value": "Question one"}]},
                {"id": "c", "conversations": [{"role": "user", "content": "Role content variant"}]},
            ]
        )
    )
    report = read(str(path))
    assert not report.malformed
    a, b, c = report.prompts
    assert (a.id, a.source, a.turns, a.system) == ("a", "sg", ["Hi there", "And you?"], "Be brief.")
    assert (b.id, b.turns, b.system) == ("sg-1", ["Question one"], None)
    assert c.turns == ["Role content variant"]


def test_openai_messages_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "a1"},
                    {"role": "user", "content": "u2"},
                ]
            },
            {"id": 7, "source": "mine", "messages": [{"role": "user", "content": "only"}]},
        ],
    )
    p, q = read(str(path)).prompts
    assert (p.turns, p.system, p.id, p.source) == (["u1", "u2"], "sys", "chat-0", "chat")
    assert (q.id, q.source) == ("7", "mine")


def test_alpaca_with_and_without_input(tmp_path):
    path = tmp_path / "alpaca.json"
    path.write_text(
        json.dumps(
            [
                {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
                {"instruction": "Name three colours.", "input": "", "output": "red"},
            ]
        )
    )
    p, q = read(str(path)).prompts
    assert p.turns == ["Translate to French.\n\nGood morning"]
    assert q.turns == ["Name three colours."]


def test_mt_bench_question_jsonl_and_eaglekit_turns(tmp_path):
    path = write_jsonl(
        tmp_path / "question.jsonl",
        [
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
            {"id": "x-1", "source": "x", "turns": ["Plain"], "system": "Sys"},
        ],
    )
    mt, own = read(str(path)).prompts
    assert (mt.id, mt.source, mt.turns) == ("81", "question", ["Write a poem.", "Now shorter."])
    assert (own.id, own.source, own.system) == ("x-1", "x", "Sys")


def test_plain_text_one_prompt_per_line(tmp_path):
    path = tmp_path / "faq.txt"
    path.write_text("What is 2+2?\n\n  Why is the sky blue?  \n")
    report = read(f"{path},name=faq")
    assert [p.turns for p in report.prompts] == [["What is 2+2?"], ["Why is the sky blue?"]]
    assert [p.id for p in report.prompts] == ["faq-0", "faq-1"]


def test_json_object_with_records_key_and_custom_column(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"version": 1, "data": [{"question": "Q1?"}, {"question": "Q2?"}]}))
    assert [p.turns[0] for p in read(f"{path},column=question").prompts] == ["Q1?", "Q2?"]
    path.write_text(json.dumps(["First prompt", "Second prompt"]))
    assert [p.turns for p in read(str(path)).prompts] == [["First prompt"], ["Second prompt"]]
    path.write_text(json.dumps({"a": [], "b": []}))
    with pytest.raises(EaglekitError, match="records=KEY"):
        read(str(path))


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is the optional extra eaglekit[parquet]")
    import pyarrow.parquet as pq

    table = pa.table({"instruction": ["Sum 1 and 2.", "Sort a list."], "input": ["", "[3, 1, 2]"]})
    pq.write_table(table, tmp_path / "alp.parquet")
    prompts = read(str(tmp_path / "alp.parquet")).prompts
    assert [p.turns[0] for p in prompts] == ["Sum 1 and 2.", "Sort a list.\n\n[3, 1, 2]"]


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):  # hide pyarrow even where it is installed
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(EaglekitError, match=r"needs pyarrow") as err:
        read(str(tmp_path / "x.parquet"))
    assert "eaglekit[parquet]" in err.value.hint


def test_hf_dataset_needs_datasets_or_network(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(EaglekitError, match="needs the `datasets` package"):
            read("hf:tatsu-lab/alpaca")
    else:  # installed: offline, the load fails and says which dataset and what to check
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        with pytest.raises(EaglekitError, match="could not load the Hugging Face dataset"):
            read("hf:eaglekit-test/does-not-exist")


def test_malformed_lines_reported_with_file_and_line(tmp_path, caplog):
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"turns": ["good one"]},
            "{not json",
            {"messages": [{"role": "tool", "content": "x"}]},
            {"turns": []},
            {"unknown": 1},
            {"turns": ["good two"]},
        ],
    )
    out = tmp_path / "out"
    manifest = build_prompts([SourceSpec.parse(str(path))], out, validation_fraction=0.0)
    report = (out / "malformed.txt").read_text().splitlines()
    assert [r.split(": ")[0] for r in report] == [f"{path}:{n}" for n in (2, 3, 4, 5)]
    assert (
        "invalid JSON" in report[0] and "unsupported role 'tool'" in report[1] and "unknown record layout" in report[3]
    )
    assert manifest["counts"]["malformed"] == 4 and len(lines(out, "train")) == 2
    assert f"{path}:2" in caplog.text
    with pytest.raises(EaglekitError, match=rf"{path}:2: invalid JSON"):
        build_prompts([SourceSpec.parse(str(path))], tmp_path / "strict", strict=True)
    assert not (tmp_path / "strict").exists()
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"foo": 1}, {"bar": 2}])
    with pytest.raises(EaglekitError, match="no record could be read") as err:
        build_prompts([SourceSpec.parse(str(bad))], tmp_path / "none")
    assert "format=" in err.value.hint


def test_dedup_within_and_across_sources_and_length_filters(tmp_path):
    a = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"turns": ["Hello   World"]},
            {"turns": ["hello world"]},
            {"turns": ["x"]},
            {"turns": ["y" * 500]},
            {"turns": ["keep me"]},
            {"turns": ["one", "two", "three"]},
        ],
    )
    b = write_jsonl(tmp_path / "b.jsonl", [{"turns": ["HELLO WORLD"]}, {"turns": ["other"]}])
    out = tmp_path / "out"
    manifest = build_prompts(
        [SourceSpec.parse(str(a)), SourceSpec.parse(str(b))],
        out,
        filters=Filters(min_chars=2, max_chars=100, max_turns=2),
        validation_fraction=0.0,
    )
    texts = sorted(p["turns"][0] for p in lines(out, "train"))
    assert texts == ["Hello   World", "keep me", "other"]
    sa, sb = manifest["counts"]["sources"]
    assert (sa["duplicates"], sa["too_short"], sa["too_long"], sa["too_many_turns"], sa["taken"]) == (1, 1, 1, 1, 2)
    assert (sb["duplicates"], sb["taken"]) == (1, 1)


def test_a_source_of_a_files_long_prompts_alone_as_its_own_share(tmp_path):
    """`FILE,min-chars=N,name=long` first, then FILE again: the long prompts are one share, the rest the other."""
    rows = [{"turns": [f"summarize {i}: " + "word " * 100]} for i in range(4)] + [
        {"turns": [f"short {i}"]} for i in range(8)
    ]
    f = write_jsonl(tmp_path / "t0.jsonl", rows)
    long_spec = SourceSpec.parse(f"{f},min-chars=300,name=t0_long,weight=1")
    assert (long_spec.min_chars, long_spec.max_chars, long_spec.name) == (300, None, "t0_long")
    manifest = build_prompts(
        [long_spec, SourceSpec.parse(f"{f},weight=0.5,max-chars=5000")], tmp_path / "out", validation_fraction=0.0
    )
    first, rest = manifest["counts"]["sources"]
    assert (first["unique"], first["too_short"], first["taken"]) == (4, 8, 4)
    assert (rest["duplicates"], rest["unique"], rest["taken"]) == (4, 8, 4)  # the long ones were the first share's
    assert Filters(min_chars=5, max_chars=400).narrowed(long_spec) == Filters(min_chars=300, max_chars=400)
    for bad in ("lots", "-3", "²"):
        with pytest.raises(EaglekitError, match="whole number"):
            SourceSpec.parse(f"{f},min-chars={bad}")
    # A source without limits is recorded as before they existed: generate's resume hash is unchanged.
    assert SourceSpec.parse(f"{f},weight=2").to_config() == {
        "location": str(f),
        "weight": 2.0,
        "format": "auto",
        "name": None,
        "column": None,
        "records": None,
        "split": "train",
        "subset": None,
    }
    assert [p.turns[0][:5] for p in read_source(long_spec).prompts if long_spec.keeps(p)] == ["summa"] * 4


def test_max_tokens_filter_uses_the_target_tokenizer(tmp_path, tiny_tok):
    path = write_jsonl(tmp_path / "t.jsonl", [{"turns": ["Hello!"]}, {"turns": ["The quick brown fox " * 20]}])
    build_prompts(
        [SourceSpec.parse(str(path))],
        tmp_path / "out",
        filters=Filters(max_tokens=20),
        tokenizer=tiny_tok,
        validation_fraction=0.0,
    )
    assert [p["turns"] for p in lines(tmp_path / "out", "train")] == [["Hello!"]]
    with pytest.raises(EaglekitError, match="needs the target's tokenizer"):
        build_prompts([SourceSpec.parse(str(path))], tmp_path / "o2", filters=Filters(max_tokens=20))


def many(path: Path, prefix: str, n: int) -> Path:
    return write_jsonl(path, [{"id": f"{prefix}{i}", "turns": [f"{prefix} question number {i}"]} for i in range(n)])


def test_split_is_stable_and_independent_of_the_mix(tmp_path):
    a = many(tmp_path / "a.jsonl", "alpha", 400)
    b = many(tmp_path / "b.jsonl", "beta", 100)
    build_prompts([SourceSpec.parse(str(a))], tmp_path / "o1", validation_fraction=0.1)
    build_prompts([SourceSpec.parse(str(b)), SourceSpec.parse(str(a))], tmp_path / "o2", validation_fraction=0.1)
    build_prompts([SourceSpec.parse(str(a))], tmp_path / "o3", validation_fraction=0.1)
    val1 = {p["id"] for p in lines(tmp_path / "o1", "validation")}
    val2 = {p["id"] for p in lines(tmp_path / "o2", "validation") if p["id"].startswith("alpha")}
    assert val1 == val2 and 20 <= len(val1) <= 60  # ~10 % of 400
    assert (tmp_path / "o1" / "train.jsonl").read_bytes() == (tmp_path / "o3" / "train.jsonl").read_bytes()
    train1 = {p["id"] for p in lines(tmp_path / "o1", "train")}
    assert not train1 & val1 and len(train1 | val1) == 400
    # The split follows the content, so the same prompt under another id lands on the same side.
    p = Prompt(id="1", source="s", turns=["alpha question number 3"])
    q = Prompt(id="zz", source="t", turns=["Alpha  question number 3 "])
    assert split_of(p, 0.5) == split_of(q, 0.5)
    with pytest.raises(EaglekitError):
        split_of(p, 1.0)


def test_a_sources_own_validation_fraction_holds_out_that_source_alone(tmp_path):
    """`--validation-fraction 0` with `chat.jsonl,validation-fraction=0.25`: validation is chat alone,
    the rest of the mix trains; the manifest counts each source's held-out prompts."""
    chat = many(tmp_path / "chat.jsonl", "chat", 200)
    tasks = many(tmp_path / "tasks.jsonl", "task", 300)
    out = tmp_path / "out"
    manifest = build_prompts(
        [SourceSpec.parse(f"{chat},validation-fraction=0.25"), SourceSpec.parse(str(tasks))],
        out,
        validation_fraction=0.0,
    )
    val = lines(out, "validation")
    assert val and {r["source"] for r in val} == {"chat"} and 30 <= len(val) <= 70  # ~25 % of 200
    assert sum(r["source"] == "tasks" for r in lines(out, "train")) == 300
    assert [(s["name"], s["validation"]) for s in manifest["counts"]["sources"]] == [("chat", len(val)), ("tasks", 0)]
    # The source's share is the same hash split the build's share would give: the same prompts held out.
    build_prompts([SourceSpec.parse(str(chat))], tmp_path / "whole", validation_fraction=0.25)
    assert {r["id"] for r in lines(tmp_path / "whole", "validation")} == {r["id"] for r in val}
    assert SourceSpec.parse(f"{chat},validation-fraction=0.25").to_config()["validation_fraction"] == 0.25
    for bad in ("1", "-0.1", "some"):
        with pytest.raises(EaglekitError, match=r"share in \[0, 1\)"):
            SourceSpec.parse(f"{chat},validation-fraction={bad}")


def test_weighted_mixing(tmp_path):
    a = many(tmp_path / "a.jsonl", "alpha", 300)
    b = many(tmp_path / "b.jsonl", "beta", 50)
    # num_prompts: shares follow the weights (3:1), the small source repeats its prompts.
    out = tmp_path / "mix"
    manifest = build_prompts(
        [SourceSpec.parse(f"{a},weight=3"), SourceSpec.parse(f"{b},weight=1")],
        out,
        num_prompts=200 + 1,
        validation_fraction=0.2,
    )
    rows = lines(out, "train") + lines(out, "validation")
    assert len(rows) == 201 and len({r["id"] for r in rows}) == 201
    assert sum(r["source"] == "a" for r in rows) == 151 and sum(r["source"] == "b" for r in rows) == 50
    assert [s["taken"] for s in manifest["counts"]["sources"]] == [151, 50]
    # Without num_prompts a weight scales the source: 0.5 keeps half, 2 repeats every prompt once.
    out2 = tmp_path / "scaled"
    build_prompts(
        [SourceSpec.parse(f"{a},weight=0.5"), SourceSpec.parse(f"{b},weight=2")], out2, validation_fraction=0.2
    )
    rows = lines(out2, "train") + lines(out2, "validation")
    assert sum(r["source"] == "a" for r in rows) == 150
    beta = [r for r in rows if r["source"] == "b"]
    assert len(beta) == 100 and sum(r["id"].endswith("#r1") for r in beta) == 50
    # A repeat lands in the same split as its original (no validation leak).
    side = {r["id"]: s for s in ("train", "validation") for r in lines(out2, s)}
    assert all(side[r["id"]] == side[r["id"].removesuffix("#r1")] for r in beta)
    # Rows are interleaved, not one source after the other.
    sources = [r["source"] for r in lines(out2, "train")]
    assert sources[: len(sources) // 2].count("b") > 10


def test_folder_source_and_id_clashes(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "one.jsonl", [{"id": "1", "turns": ["first file"]}])
    write_jsonl(folder / "two.jsonl", [{"id": "1", "turns": ["second file"]}])
    (folder / "notes.md").write_text("ignored")
    build_prompts([SourceSpec.parse(str(folder))], tmp_path / "out", validation_fraction=0.0)
    assert sorted(p["id"] for p in lines(tmp_path / "out", "train")) == ["one/1", "two/1"]


def test_a_template_makes_a_share_of_task_prompts_from_a_source(tmp_path):
    """`FILE,template=translate-fr` beside FILE: each prompt again, wrapped in the task, under its own ids
    and source name, so both shares survive dedup; the manifest records the template."""
    f = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {"id": "a", "turns": ["Write a haiku about rain."]},
            {"id": "b", "turns": ["Name three rivers.", "And lakes?"]},
        ],
    )
    spec = SourceSpec.parse(f"{f},template=translate-fr,weight=0.5")
    wrapped = read_source(spec).prompts
    assert [p.id for p in wrapped] == ["a+translate-fr", "b+translate-fr"]
    assert {p.source for p in wrapped} == {"chat+translate-fr"}
    assert wrapped[0].turns == ["Translate the following text into French.\n\nWrite a haiku about rain."]
    assert wrapped[1].turns[1] == "And lakes?"  # later turns stay the user's
    manifest = build_prompts([SourceSpec.parse(str(f)), spec], tmp_path / "out", validation_fraction=0.0)
    plain, task = manifest["counts"]["sources"]
    assert (plain["unique"], task["unique"], task["duplicates"]) == (2, 2, 0)
    assert (plain["name"], task["name"]) == ("chat", "chat+translate-fr")
    assert manifest["config"]["sources"][1]["template"] == "translate-fr"
    assert "template" not in SourceSpec.parse(str(f)).to_config()  # unchanged for sources without one
    with pytest.raises(EaglekitError, match="unknown template"):
        SourceSpec.parse(f"{f},template=translate-klingon")


def test_source_spec_errors(tmp_path):
    with pytest.raises(EaglekitError, match="bad source option"):
        SourceSpec.parse("a.jsonl,wieght=2")
    with pytest.raises(EaglekitError, match="not a number"):
        SourceSpec.parse("a.jsonl,weight=lots")
    with pytest.raises(EaglekitError, match="unknown format"):
        SourceSpec.parse("a.jsonl,format=csv")
    with pytest.raises(EaglekitError, match="not found"):
        read(str(tmp_path / "missing.jsonl"))
    (tmp_path / "broken.json").write_text('[{"turns": ["a"]},\n {"turns": ')
    with pytest.raises(EaglekitError, match="line 2"):
        read(str(tmp_path / "broken.json"))


def test_output_is_atomic(tmp_path):
    src = many(tmp_path / "a.jsonl", "alpha", 20)
    out = tmp_path / "out"
    build_prompts([SourceSpec.parse(str(src))], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(EaglekitError, match="already exists"):
        build_prompts([SourceSpec.parse(str(src))], out)
    # A failure while the new folder is being written leaves the old one untouched and no debris.
    with pytest.raises(RuntimeError):
        with atomic_dir(out, overwrite=True) as tmp:
            (tmp / "train.jsonl").write_text("half")
            raise RuntimeError("killed")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "out"]
    manifest, prompts = read_prompt_folder(out)
    assert manifest["stage"] == "prompts" and len(prompts["train"]) + len(prompts["validation"]) == 20


def test_cli_build(tmp_path, capsys):
    src = many(tmp_path / "a.jsonl", "alpha", 30)
    txt = tmp_path / "b.txt"
    txt.write_text("a line prompt\nanother line prompt\n")
    assert (
        main(
            [
                "prompts",
                "build",
                "--source",
                str(src),
                "--source",
                f"{txt},weight=2",
                "--out",
                str(tmp_path / "out"),
                "--validation-fraction",
                "0.1",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "a: 30 records, 0 malformed, 0 duplicates, 0 filtered, 30 taken" in printed
    assert "b: 2 records, 0 malformed, 0 duplicates, 0 filtered, 4 taken" in printed
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["train"] + manifest["counts"]["validation"] == 34
    assert main(["prompts", "build", "--source", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x")]) == 2


def test_the_evidence_prompt_script_writes_a_prompt_file_the_product_reads(tmp_path):
    """scripts/make_prompts.py (CPU evidence runs) writes prompts only; `eaglekit generate` reads them."""
    import subprocess
    import sys

    from eaglekit.data.regenerate import load_prompts

    out = tmp_path / "p.jsonl"
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_prompts.py"
    subprocess.run([sys.executable, str(script), "--num", "30", "--out", str(out)], check=True, capture_output=True)
    by_split, _ = load_prompts(str(out), ("train",), None)
    prompts = by_split["train"]
    assert len(prompts) == 30 and len({p.turns[0] for p in prompts}) == 30 and all(len(p.turns) == 1 for p in prompts)
