"""`eaglekit bench` end to end on CPU with a tiny target: oracle, random and checkpoint drafts,
prompt formats, multi-turn, sweep, outputs (results.json, report.md, manifest, plot)."""

import importlib.util
import json

import pytest

from eaglekit.cli import main
from engine_tiny import one_thread  # noqa: F401 (fixture)
from tiny_conversations import bench_prompts_file  # noqa: F401 (fixture `prompts_file`)


def run_bench(tmp_path, target, prompts, draft, *extra):
    out = tmp_path / f"bench-{draft.replace('/', '_')[-12:]}"
    code = main(
        [
            "bench",
            "--target",
            str(target),
            "--draft",
            draft,
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
            "--json",
            str(out / "copy.json"),
            *extra,
        ]
    )
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert json.loads((out / "copy.json").read_text()) == result  # --json PATH: the same results
    return out, result


def test_bench_oracle_tree_multi_turn(tmp_path, tiny_target_dir, prompts_file):
    out, result = run_bench(
        tmp_path,
        tiny_target_dir,
        prompts_file,
        "oracle",
        "--hf-prompts",
        "2",
        "--mode",
        "tree",
        "--depth",
        "3",
        "--tree-top-k",
        "2",
        "--total-tokens",
        "6",
    )
    s = result["summary"]
    # HF generate ran on the first two prompts only (three turns), and is compared on those
    assert [("hf" in r) for r in result["turns"]] == [True, True, True, False]
    assert s["hf_prompts"] == 2 and s["hf_tok_s"] > 0 and s["baseline_vs_hf"] > 0
    assert "HF generate, on the first 2 of 3 prompts" in (out / "report.md").read_text()
    for key in (
        "tau",
        "speedup",
        "baseline_tok_s",
        "spec_tok_s",
        "hf_tok_s",
        "per_position_acceptance",
        "greedy_match",
        "device",
        "date",
        "command",
        "config",
    ):
        assert key in s
    assert s["greedy_match"] == 1.0 and s["hf_match"] == 1.0
    assert s["turns"] == 4 and s["prompts"] == 3  # prompt "a" has two turns
    # golden: the oracle is accepted at every position, so each cycle of a depth-3 tree gives 3 + 1 tokens
    assert s["per_position_acceptance"] == [1.0, 1.0, 1.0] and s["tau"] == 4.0
    assert [r["turn"] for r in result["turns"] if r["id"] == "a"] == [0, 1]
    assert result["turns"][1]["prompt_tokens"] > result["turns"][0]["prompt_tokens"]  # turn 2 holds answer 1
    assert json.loads((out / "copy.json").read_text())["summary"]["tau"] == s["tau"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "bench" and manifest["target"]["config_hash"]
    assert "| **all** |" in (out / "report.md").read_text()
    if importlib.util.find_spec("matplotlib"):
        assert (out / "acceptance.png").stat().st_size > 1000
    else:
        assert "matplotlib is not installed" in result["plot_note"]
        assert not (out / "acceptance.png").exists()  # nor an earlier run's plot left beside these results


def test_bench_checkpoint_draft_chain_and_sweep(tmp_path, tiny_target_dir, prompts_file):
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target
    from engine_tiny import random_draft

    target = load_target(tiny_target_dir)
    folder = save_draft(random_draft(target.model, aux=[1, 3, 4]), tmp_path / "draft")
    _, result = run_bench(
        tmp_path, tiny_target_dir, prompts_file, str(folder), "--mode", "chain", "--k", "3", "--no-hf", "--limit", "2"
    )
    s = result["summary"]
    assert s["greedy_match"] == 1.0 and s["hf_tok_s"] is None and len(s["per_position_acceptance"]) == 3
    _, result = run_bench(
        tmp_path, tiny_target_dir, prompts_file, "random", "--sweep", "--no-hf", "--limit", "1", "--cache-slots", "256"
    )
    assert len(result["sweep"]) >= 4
    assert result["summary"]["spec"] == max(result["sweep"], key=lambda r: r["spec_tok_s"])["spec"]
    assert [r["spec"] for r in result["sweep"]][:3] == ["chain k=1", "chain k=2", "chain k=3"]  # a CPU's shapes
    # one prompt, fewer than --sweep-prompts' default: the sweep's runs are the bench, every shape in every turn
    assert all(r["prompts"] == 1 for r in result["sweep"]) and result["summary"]["prompts"] == 1
    assert set(result["turns"][0]["spec"]) == {r["spec"] for r in result["sweep"]}
    assert result["summary"]["shape_choice"]["chosen"] == result["summary"]["spec"]
    # a shape given beside --sweep is one of its candidates, not silently dropped (a recipe's bench shape)
    chain_4 = ["--mode", "chain", "--k", "4", "--overwrite", "--no-hf", "--limit", "1", "--cache-slots", "256"]
    _, result = run_bench(tmp_path, tiny_target_dir, prompts_file, "random", "--sweep", *chain_4)
    assert [r["spec"] for r in result["sweep"]] == [
        "chain k=1",
        "chain k=2",
        "chain k=3",
        "tree d=2 topk=2 n=4",
        "chain k=4",
    ]
    # --sweep-shapes names the candidates, in order, each once; the --mode shape is then not added
    shapes = ["--sweep-shapes", "tree:3/2/6,chain:2,tree:3/2/6"]
    _, result = run_bench(tmp_path, tiny_target_dir, prompts_file, "random", "--sweep", *shapes, *chain_4)
    assert [r["spec"] for r in result["sweep"]] == ["tree d=3 topk=2 n=6", "chain k=2"]
    assert result["summary"]["config"]["sweep_shapes"] == "tree:3/2/6,chain:2,tree:3/2/6"


def test_speculation_shapes_parse_as_written_and_bad_ones_are_refused_before_a_model_loads():
    from eaglekit.bench.options import CPU_SWEEP_SHAPES, SWEEP_SHAPES, BenchOptions
    from eaglekit.engine.spec import SpecConfig
    from eaglekit.errors import EaglekitError

    for text in ("chain:5", "tree:6/4/16", " tree:4/4/16 "):
        assert SpecConfig.parse(text).short() == text.strip()
    assert SpecConfig.parse("tree:6/4/16") == SpecConfig(mode="tree", depth=6, top_k=4, total_tokens=16)
    defaults = BenchOptions(draft="random", sweep=True)
    assert [s.short() for s in defaults.sweep_specs("cuda:0")] == SWEEP_SHAPES.split(",")
    assert [s.short() for s in defaults.sweep_specs("cpu")] == CPU_SWEEP_SHAPES.split(",")
    for bad in ("tree:4/4", "chain:", "chain:3/3", "k=5", "tree:a/b/c", "chain:0", ","):
        with pytest.raises(EaglekitError):
            BenchOptions(draft="random", sweep=True, sweep_shapes=bad)
    with pytest.raises(EaglekitError, match="without --sweep"):
        BenchOptions(draft="random", sweep_shapes="chain:3")


def test_the_sweep_picks_a_shape_on_a_few_prompts_says_why_and_benches_it_on_all(
    tmp_path, tiny_target_dir, prompts_file
):
    out, result = run_bench(
        tmp_path,
        tiny_target_dir,
        prompts_file,
        "random",
        "--sweep",
        "--sweep-prompts",
        "1",
        "--hf-prompts",
        "1",
        "--cache-slots",
        "256",
    )
    s, sweep = result["summary"], result["sweep"]
    labels = [r["spec"] for r in sweep]
    # every shape on the first prompt (its two turns), without HF generate
    assert len(sweep) >= 4 and all((r["prompts"], r["turns"], r["hf_prompts"]) == (1, 2, 0) for r in sweep)
    # the fastest of them, then benched alone on all three prompts (four turns), HF generate on the first
    choice = s["shape_choice"]
    assert s["spec"] == choice["chosen"] == max(sweep, key=lambda r: r["spec_tok_s"])["spec"]
    assert (s["prompts"], s["turns"], s["hf_prompts"]) == (3, 4, 1)
    assert [set(t["spec"]) for t in result["turns"]] == [{s["spec"]}] * 4
    assert [("hf" in t) for t in result["turns"]] == [True, True, False, False]
    assert s["config"]["spec"]["mode"] in ("chain", "tree") and s["config"]["sweep_prompts"] == 1
    # why: the chosen shape on the sweep's prompt, against the runner-up
    assert sorted(choice["ranking"]) == sorted(labels) and choice["ranking"][0] == s["spec"]
    assert choice["runner_up"] == choice["ranking"][1] != s["spec"] and choice["prompts"] == 1
    assert choice["lead"] >= 0
    assert choice["why"].startswith(f"{s['spec']}: ") and " on 1 prompt (tau " in choice["why"]
    assert f"ahead of {choice['runner_up']} (" in choice["why"]
    text = (out / "report.md").read_text()
    assert "Each shape on the first 1 prompt; the chosen one then ran on all 3" in text
    assert f"Chosen: **{choice['why']}**" in text


def test_shape_choice_names_a_lead_within_the_drift_a_tie():
    from eaglekit.bench.report import shape_choice

    def row(label, tok_s, steps):
        return {
            "spec": label,
            "spec_tok_s": tok_s,
            "speedup": tok_s / 10,
            "tau": 2.0,
            "prompts": 4,
            "cycle": {"plain_steps": steps},
            "plain_tokens": 0,
            "plain_share": 0.0,
        }

    rows = [row("chain k=3", 15.0, 1.5), row("tree d=4 topk=4 n=16", 16.2, 1.8), row("chain k=5", 15.3, 1.6)]
    choice = shape_choice(rows, 1, {"drift": 0.02})
    assert choice["chosen"] == "tree d=4 topk=4 n=16" and choice["runner_up"] == "chain k=5"
    assert choice["ranking"] == ["tree d=4 topk=4 n=16", "chain k=5", "chain k=3"]
    assert choice["why"] == (
        "tree d=4 topk=4 n=16: 1.62x on 4 prompts (tau 2.00, a cycle 1.80 plain steps), 6 % ahead of chain k=5 (1.53x)"
    )
    assert "a tie" in shape_choice(rows, 1, {"drift": 0.10})["why"]  # 6 % ahead, plain runs 10 % apart
    assert shape_choice(rows[:1], 0)["why"].endswith("the only shape tried")


@pytest.mark.parametrize(
    "flags, message",
    [(["--sweep", "--sweep-prompts", "0"], "--sweep-prompts 1 or more"), (["--sweep-prompts", "2"], "add --sweep")],
)
def test_sweep_prompts_needs_a_sweep_and_a_prompt(tmp_path, prompts_file, capsys, flags, message):
    code = main(
        [
            "bench",
            "--target",
            "nowhere",
            "--draft",
            "random",
            "--prompts",
            str(prompts_file),
            "--out",
            str(tmp_path / "x"),
            *flags,
        ]
    )
    assert code == 2 and message in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_bench_refuses_a_draft_of_another_target(tmp_path, tiny_target_dir, prompts_file, capsys):
    from eaglekit.artifacts import write_manifest
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target
    from engine_tiny import random_draft

    target = load_target(tiny_target_dir)
    folder = save_draft(random_draft(target.model), tmp_path / "draft")
    other = dict(target.fingerprint(), config_hash="0" * 16)
    write_manifest(folder, stage="train", config={}, target=other)
    code = main(
        [
            "bench",
            "--target",
            str(tiny_target_dir),
            "--draft",
            str(folder),
            "--prompts",
            str(prompts_file),
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert code == 2 and "made for another target model config" in capsys.readouterr().err


def test_a_second_bench_into_a_finished_folder_needs_overwrite(tmp_path, tiny_target_dir, prompts_file, capsys):
    """Found 2026-12-04: bench rewrote a finished bench's --out without --overwrite (exit 0), where every
    other stage refuses its finished folder. Refused now before anything loads; --overwrite replaces it."""
    shape = ("--mode", "chain", "--k", "2", "--no-hf", "--limit", "1")
    out, first = run_bench(tmp_path, tiny_target_dir, prompts_file, "oracle", *shape)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    missing = tmp_path / "no-such-target"  # refused before the target is even looked for
    assert (
        main(
            [
                "bench",
                "--target",
                str(missing),
                "--draft",
                "oracle",
                "--prompts",
                str(prompts_file),
                "--max-new-tokens",
                "8",
                *shape,
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"output folder {out} already exists" in err and "--overwrite" in err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # untouched
    (out / "stray.txt").write_text("not a bench file")
    out, again = run_bench(tmp_path, tiny_target_dir, prompts_file, "oracle", *shape, "--overwrite")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "bench" and manifest["config"]["overwrite"] is True
    assert "--overwrite" in again["summary"]["command"] and "--overwrite" not in first["summary"]["command"]
    assert not (out / "stray.txt").exists()  # the folder was replaced, not added to
    assert not list(tmp_path.glob(f".{out.name}.*"))  # no temporary folder left beside it


def test_bench_prompts_keep_a_line_separator_inside_a_string(tmp_path):
    """JSON allows U+2028 unescaped in a string; str.splitlines would cut the record there."""
    from eaglekit.bench.prompts import load_bench_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "a", "turns": ["one\u2028two"]}, ensure_ascii=False)
        + "\n"
        + json.dumps({"id": "b", "turns": ["three"]})
        + "\n",
        encoding="utf-8",
    )
    prompts = load_bench_prompts(path)
    assert [p.turns for p in prompts] == [["one\u2028two"], ["three"]]


def test_bench_says_plainly_what_a_cycle_costs(tmp_path, tiny_target_dir, prompts_file):
    """Every bench states faster or SLOWER and the cycle's cost in plain steps (report and JSON);
    the verdict names the largest part of the cycle once it has a profile."""
    from eaglekit.bench.report import verdict

    out, result = run_bench(
        tmp_path, tiny_target_dir, prompts_file, "random", "--mode", "chain", "--k", "3", "--no-hf", "--limit", "2"
    )
    s = result["summary"]
    cycle = s["cycle"]  # no speed asserted: only that it is what it says
    assert cycle["plain_steps"] == pytest.approx(cycle["cycle_ms"] / cycle["plain_step_ms"], rel=1e-2)
    word = "SLOWER" if s["speedup"] < 1 else "faster"
    assert word in s["verdict"] and f"{s['cycle']['plain_steps']:.2f} plain steps" in s["verdict"]
    assert s["verdict"] in (out / "report.md").read_text()
    assert result["cycle_profile"] is None  # CPU: no CUDA graphs, no split
    profile = {
        "pieces": {"propose": {"ms": 2.0}, "verify": {"ms": 1.3}, "catch_up": {"ms": 0.1}},
        "host_ms": 0.3,
        "largest": "propose",
    }
    text = verdict({"speedup": 0.8, "spec": "tree", "tau": 3.2, "cycle": {"plain_steps": 4.0}}, profile)
    assert text.startswith("Speculation is SLOWER than plain decoding: 0.80x")
    assert "Largest part of the cycle: propose 2.000 ms (54 %)" in text
    assert "A draft pays here only above tau 4.00." in text  # tau tokens a cycle, for 4 steps' time
    assert "pays" not in verdict({"speedup": 1.6, "spec": "tree", "tau": 3.2, "cycle": {"plain_steps": 2.0}})


def test_cycle_profile_splits_a_real_cycle():
    """The profile's pieces (eager on CPU) add up with the derived verify to the cycle's time."""
    from eaglekit.engine import DraftRunner, Engine, SpecConfig
    from eaglekit.engine.profile import cycle_profile
    from eaglekit.runtime import Sampling, make_target_runner
    from engine_tiny import AUX, PROMPTS, peaked_model, random_draft

    model = peaked_model("llama")
    target = make_target_runner(model, max_len=96, aux_layer_ids=AUX)
    spec = SpecConfig(mode="tree", depth=3, top_k=3, total_tokens=10)
    engine = Engine(
        target, drafter=DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=96), spec=spec
    )
    profile = cycle_profile(engine, PROMPTS[0], 12)
    assert set(profile["pieces"]) == {"compaction", "catch_up", "propose", "verify"}
    assert all(p["ms"] >= 0 for p in profile["pieces"].values()) and profile["cycle_graph_ms"] > 0
    assert profile["largest"] in {*profile["pieces"], "host"}


def test_speculation_shape_follows_the_device_unless_given():
    """An unset --mode / --k: a 32-node tree on CUDA, a chain of 2 on a CPU; flags always win."""
    import argparse

    from eaglekit.engine.options import GROUPS, EngineOptions
    from eaglekit.options import add_options, options_from_args

    parser = argparse.ArgumentParser()
    add_options(parser, EngineOptions, GROUPS)

    def spec_from(argv):
        return options_from_args(EngineOptions, parser.parse_args(argv)).spec_config()

    assert spec_from(["--device", "cpu"]).to_dict() == {"mode": "chain", "k": 2}
    assert spec_from(["--device", "cuda"]).to_dict() == {"mode": "tree", "depth": 6, "top_k": 8, "total_tokens": 32}
    assert spec_from(["--device", "cpu", "--mode", "tree"]).num_nodes == 32
    assert spec_from(["--device", "cuda", "--mode", "chain"]).k == 5


def test_top_k_is_sampling_in_every_subcommand_and_the_tree_width_has_its_own_flag(tmp_path, capsys):
    """`--top-k` means the same as in `eaglekit generate`; given with greedy decoding (where it once
    was the tree's width) it is refused before any model loads, naming --tree-top-k."""
    for argv in (
        ["bench", "--draft", "oracle", "--target", str(tmp_path / "none"), "--top-k", "8"],
        ["speculate", "hi", "--draft", "random", "--target", str(tmp_path / "none"), "--top-k", "8"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "--top-k 8 is a sampling setting" in err and "--tree-top-k 8" in err, argv


def test_a_greedy_mismatch_is_explained_in_16_bits_and_flagged_in_float32():
    """bf16 answers that leave plain decoding's are explained (rounding, near-ties); in float32 the
    same finding is flagged as a bug, since speculation must then reproduce plain greedy exactly."""
    from eaglekit.bench.report import greedy_match_note, markdown

    def result(match, dtype):
        return {
            "summary": {
                "greedy_match": match,
                "config": {"dtype": dtype},
                "spec": "chain k=5",
                "device": "cpu",
                "date": "d",
                "verdict": "v",
                "turns": 1,
                "new_tokens": {"spec": 1},
                "hf_tok_s": None,
                "baseline_tok_s": 1.0,
                "spec_tok_s": 1.0,
                "speedup": 1.0,
                "tau": 1.0,
                "per_position_acceptance": [0.5],
            },
            "config": {"target": "t", "draft": "d", "sampling": "greedy", "max_new_tokens": 8},
            "prompts": [],
        }

    assert greedy_match_note(result(1.0, "torch.bfloat16")) is None
    assert greedy_match_note(result(None, "torch.float32")) is None  # sampling: no greedy reference
    bf16 = greedy_match_note(result(0.3, "torch.bfloat16"))
    assert bf16.text.startswith("Greedy match 0.30: in bfloat16") and "--dtype float32" in bf16.text and not bf16.bug
    fp32 = greedy_match_note(result(0.9, "torch.float32"))
    assert "should equal plain decoding" in fp32.text and fp32.bug
    assert bf16.text in markdown(result(0.3, "torch.bfloat16"))


def test_a_bench_of_a_few_tokens_a_turn_says_it_is_too_short_to_time():
    """Found by a newcomer review, 2026-12-04: `--max-new-tokens 4` printed "1.33x faster ... a cycle
    costs 0.99 plain steps" at tau 1.00, a speedup that a few tokens cannot measure."""
    from eaglekit.bench.report import verdict

    short = {
        "speedup": 1.33,
        "spec": "chain k=2",
        "tau": 1.0,
        "cycle": {"plain_steps": 0.99},
        "new_tokens": {"spec": 8},
        "turns": 2,
    }
    assert "The answers average 4 tokens: too short to time speculation" in verdict(short)
    assert "too short" not in verdict({**short, "new_tokens": {"spec": 512}})


def test_a_held_bench_out_is_refused_first_and_a_failed_bench_changes_nothing(
    tmp_path, tiny_target_dir, prompts_file, capsys
):
    from eaglekit.artifacts import writer_lock

    missing = str(tmp_path / "no-such-target")  # a bench that started would fail on it: the lock answers first
    out = tmp_path / "held"
    with writer_lock(out, stage="bench"):
        assert main(["bench", "--target", missing, "--draft", "oracle", "--out", str(out)]) == 2
    assert "another `eaglekit bench` is writing to" in capsys.readouterr().err
    fresh = tmp_path / "fresh"  # a failed bench leaves no empty folder of its own behind
    assert main(["bench", "--target", missing, "--draft", "oracle", "--out", str(fresh)]) == 2
    assert "target not found" in capsys.readouterr().err and not fresh.exists()
    shape = ("--mode", "chain", "--k", "2", "--no-hf", "--limit", "1")
    done, _ = run_bench(tmp_path, tiny_target_dir, prompts_file, "oracle", *shape)
    before = {f.name: f.read_bytes() for f in done.iterdir()}
    assert main(["bench", "--target", missing, "--draft", "oracle", "--overwrite", "--out", str(done)]) == 2
    assert {f.name: f.read_bytes() for f in done.iterdir()} == before  # --overwrite that failed: all kept
    assert not list(tmp_path.glob(f".{done.name}.*"))


def test_a_recipe_bench_can_sweep(tmp_path, capsys):
    """`sweep: true` (and `sweep-prompts`) under a recipe's `bench:` become the bench's flags; a bad pair is
    refused by --plan, before any stage runs."""
    out = tmp_path / "run"
    assert (
        main(["run", "--recipe", "quick", "--plan", "--out", str(out), "bench.sweep=true", "bench.sweep-prompts=2"])
        == 0
    )
    bench = [line for line in capsys.readouterr().out.splitlines() if "eaglekit bench " in line]
    assert bench and "--sweep --sweep-prompts 2" in bench[-1]
    assert main(["run", "--recipe", "quick", "--plan", "--out", str(out), "bench.sweep-prompts=2"]) == 2
    assert "--sweep-prompts 2 without --sweep" in capsys.readouterr().err and not out.exists()
