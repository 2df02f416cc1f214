"""Options declared once (eaglekit.options): `eaglekit train`'s flags come from TrainConfig's fields,
so the CLI, the dataclass and the recipe keys cannot drift apart."""

from dataclasses import dataclass, fields

import pytest

from eaglekit.cli import build_parser
from eaglekit.errors import EaglekitError
from eaglekit.options import add_options, flag_type, option
from eaglekit.pipeline.keys import stage_flags
from eaglekit.train.cli import config_from_args
from eaglekit.train.config import TrainConfig


def parse(*argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_train_flags_are_the_config_fields():
    flags = stage_flags(("train",))
    declared = {f.name.replace("_", "-") for f in fields(TrainConfig) if f.metadata}
    assert flags == (declared - {"progress"}) | {"no-progress"}
    assert "betas" not in flags and "extra" not in flags  # settings without a flag


def test_parsed_flags_equal_the_dataclass_defaults_and_convert_types():
    assert parse("--out", "o", "--features", "f") == TrainConfig(target="smollm2", out="o", features="f")
    cfg = parse(
        "--out",
        "o",
        "--data",
        "d",
        "--no-progress",
        "--aux-layer-ids",
        "1,4,7",
        "--lr",
        "1e-3",
        "--max-steps",
        "5",
        "--resume",
        "--schedule",
        "linear",
    )
    assert (cfg.progress, cfg.aux_layer_ids, cfg.lr, cfg.max_steps, cfg.resume, cfg.schedule) == (
        False,
        (1, 4, 7),
        1e-3,
        5,
        True,
        "linear",
    )
    with pytest.raises(SystemExit):
        parse("--out", "o", "--features", "f", "--schedule", "bogus")  # choices come from the field
    with pytest.raises(SystemExit):
        parse("--features", "f")  # --out is required


def test_an_option_of_an_unknown_type_needs_a_parser():
    import argparse

    assert flag_type("int | None") is int and flag_type("bool") is None

    @dataclass(frozen=True)
    class Odd:
        pair: tuple[int, int] = option((1, 2), "a pair", group="g")

    with pytest.raises(EaglekitError, match="parse="):
        add_options(argparse.ArgumentParser(), Odd, groups={"g": "g"})


def switch_names(cls) -> set[str]:
    """A dataclass's flags as `add_options` makes them: a True-by-default bool is `--no-NAME`."""
    out = set()
    for f in fields(cls):
        if f.metadata:
            name = f.name.replace("_", "-")
            out.add(f"no-{name}" if f.default is True else name)
    return out


def test_bench_and_speculate_flags_are_their_options_fields():
    from eaglekit.bench.options import BenchOptions
    from eaglekit.engine.options import EngineOptions, SpeculateOptions

    old_names = {"max-len"}  # kept as aliases of --cache-slots
    assert stage_flags(("bench",)) == switch_names(BenchOptions) | old_names
    assert stage_flags(("speculate",)) == switch_names(SpeculateOptions) | old_names
    assert build_parser().parse_args(["bench", "--draft", "d", "--max-len", "256"]).cache_slots == 256
    shared = switch_names(EngineOptions)
    assert shared <= switch_names(BenchOptions) and shared <= switch_names(SpeculateOptions)
    assert {"tree-top-k", "top-k", "no-hf", "hf-prompts", "no-graphs"} <= stage_flags(("bench",))


def test_bench_options_parse_and_rebuild_their_command_line():
    """The flags `eaglekit run` rebuilds for the record give back the same options."""
    from eaglekit.bench.cli import command_line
    from eaglekit.bench.options import BenchOptions
    from eaglekit.options import options_from_args

    argv = [
        "bench",
        "--draft",
        "d",
        "--mode",
        "chain",
        "--k",
        "4",
        "--no-hf",
        "--hf-prompts",
        "3",
        "--no-graphs",
        "--device",
        "cpu",
        "--limit",
        "2",
    ]
    opts = options_from_args(BenchOptions, build_parser().parse_args(argv))
    assert opts == BenchOptions(
        draft="d", mode="chain", k=4, hf=False, hf_prompts=3, no_graphs=True, device="cpu", limit=2
    )
    assert (opts.graphs, opts.compile, opts.spec_config().to_dict()) == (False, None, {"mode": "chain", "k": 4})
    rebuilt = command_line(build_parser().parse_args(argv)).split()[1:]  # without "eaglekit"
    assert options_from_args(BenchOptions, build_parser().parse_args(rebuilt)) == opts


def test_doctor_flags_are_its_options_fields_and_keep_their_forms():
    from eaglekit.doctor.options import DoctorOptions

    assert stage_flags(("doctor",)) == switch_names(DoctorOptions) | {"num-prompts"}  # the old name of --limit
    assert build_parser().parse_args(["doctor", "d", "--num-prompts", "2"]).limit == 2
    args = build_parser().parse_args(["doctor", "d", "-k", "4", "--probe"])
    assert (args.draft, args.k, args.probe, args.dtype) == ("d", 4, "builtin", DoctorOptions.dtype)
    assert build_parser().parse_args(["doctor", "d", "--probe", "p.jsonl"]).probe == "p.jsonl"
    assert build_parser().parse_args(["doctor", "d"]).probe is None


def test_the_parser_loads_without_torch():
    """`eaglekit --help` and every stage's options stay fast: building the parser imports no torch."""
    import subprocess
    import sys

    code = (
        "import sys; from eaglekit.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_json_is_one_form_everywhere():
    """`--json` prints to stdout, `--json PATH` writes there: doctor, bench and target info alike."""
    from eaglekit.options import JSON_STDOUT

    for argv in (["doctor", "d"], ["bench", "--draft", "d"], ["target", "info"]):
        parse = build_parser().parse_args
        assert parse(argv).json is None
        assert parse([*argv, "--json"]).json == JSON_STDOUT
        assert parse([*argv, "--json", "out.json"]).json == "out.json"


def test_export_and_import_flags_are_their_options_fields():
    from eaglekit.formats.options import ExportOptions, ImportOptions

    assert stage_flags(("export",)) == switch_names(ExportOptions)
    assert stage_flags(("import",)) == switch_names(ImportOptions)
    args = build_parser().parse_args(["import", "d", "--out", "o", "--aux-layer-ids", "1,14,25"])
    assert (args.draft, args.aux_layer_ids) == ("d", (1, 14, 25))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "c", "--out", "o", "--format", "bogus"])


def test_prompts_flags_are_their_options_fields():
    from eaglekit.data.options import GenerateOptions, PromptsBuildOptions, SynthesizeOptions

    assert stage_flags(("prompts", "build")) == switch_names(PromptsBuildOptions)
    local = {
        f.name.replace("_", "-")
        for f in fields(GenerateOptions)
        if f.metadata.get("eaglekit_option", {}).get("group") == "local"
    }
    assert stage_flags(("prompts", "synthesize")) == switch_names(SynthesizeOptions) | local | {"backend"}
    args = build_parser().parse_args(
        ["prompts", "build", "--source", "a.jsonl", "--source", "b.jsonl,weight=2", "--out", "o"]
    )
    assert (args.source, args.validation_fraction) == (["a.jsonl", "b.jsonl,weight=2"], 0.02)


def test_features_flags_are_its_options_fields():
    from eaglekit.features.options import FeaturesOptions

    assert stage_flags(("features",)) == switch_names(FeaturesOptions)
    args = build_parser().parse_args(
        ["features", "--data", "d", "--out", "o", "--aux-layer-ids", "1,2", "--no-progress"]
    )
    assert (args.aux_layer_ids, args.progress, args.batch_tokens) == ((1, 2), False, FeaturesOptions.batch_tokens)


def test_vocab_shares_trainings_options():
    assert stage_flags(("vocab",)) == {
        "data",
        "features",
        "out",
        "target",
        "draft-vocab-size",
        "allow-smaller-vocab",
        "max-length",
    }
    args = build_parser().parse_args(["vocab", "--data", "d", "--out", "o"])
    assert (args.target, args.draft_vocab_size, args.max_length) == (
        "smollm2",
        TrainConfig.draft_vocab_size,
        TrainConfig.max_length,
    )


def test_target_run_and_report_flags_are_their_options_fields():
    from eaglekit.pipeline.options import RunOptions
    from eaglekit.report.options import ReportOptions
    from eaglekit.targets.options import TargetInfoOptions, TargetPrepareOptions

    assert stage_flags(("target", "info")) == switch_names(TargetInfoOptions)
    assert stage_flags(("target", "prepare")) == switch_names(TargetPrepareOptions)
    assert stage_flags(("run",)) == switch_names(RunOptions)
    assert stage_flags(("report",)) == switch_names(ReportOptions)
    args = build_parser().parse_args(["run", "--stop-before", "train", "train.epochs=2"])
    assert (args.recipe, args.stop_before, args.plan, args.overrides) == ("quick", "train", False, ["train.epochs=2"])
    args = build_parser().parse_args(["target", "prepare", "--out", "o"])
    assert (args.target, args.dtype, args.overwrite) == ("smollm2", TargetPrepareOptions.dtype, False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["target", "prepare"])  # --out is required


def test_every_flag_states_its_default_once_and_from_its_field():
    """`add_options` appends a valued flag's default to its help, so no help text writes it itself:
    the default lives in the field alone (a second copy in a help text goes stale)."""
    import argparse

    from eaglekit.pipeline.keys import subcommands

    def parsers(p: argparse.ArgumentParser):
        yield p
        try:
            children = subcommands(p).values()
        except KeyError:  # a leaf subcommand
            return
        for child in children:
            yield from parsers(child)

    seen = 0
    for p in parsers(build_parser()):
        for action in p._actions:
            text = action.help or ""
            assert text.count("(default") <= 1, (p.prog, action.dest, text)
            if action.default not in (None, False, True, argparse.SUPPRESS, "") and text.count("(default"):
                seen += 1
                assert text.endswith(f"(default {action.default})".replace("%", "%%")), (p.prog, action.dest, text)
    assert seen > 50  # the rule is exercised across the subcommands
    args = build_parser().parse_args(["doctor", "d"])
    assert args.max_new_tokens == 64 and args.target == "smollm2"  # defaults unchanged by the help text
    assert args.k is None  # the folder's speculative_tokens (doctor.run)
