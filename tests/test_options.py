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
    assert "betas" not in flags and "extra" not in flags            # settings without a flag


def test_parsed_flags_equal_the_dataclass_defaults_and_convert_types():
    assert parse("--out", "o", "--features", "f") == TrainConfig(target="smollm2", out="o", features="f")
    cfg = parse("--out", "o", "--data", "d", "--no-progress", "--aux-layer-ids", "1,4,7", "--lr", "1e-3",
                "--max-steps", "5", "--resume", "--schedule", "linear")
    assert (cfg.progress, cfg.aux_layer_ids, cfg.lr, cfg.max_steps, cfg.resume, cfg.schedule) == \
        (False, (1, 4, 7), 1e-3, 5, True, "linear")
    with pytest.raises(SystemExit):
        parse("--out", "o", "--features", "f", "--schedule", "bogus")    # choices come from the field
    with pytest.raises(SystemExit):
        parse("--features", "f")                                         # --out is required


def test_an_option_of_an_unknown_type_needs_a_parser():
    import argparse

    assert flag_type("int | None") is int and flag_type("bool") is None

    @dataclass(frozen=True)
    class Odd:
        pair: tuple[int, int] = option((1, 2), "a pair", group="g")

    with pytest.raises(EaglekitError, match="parse="):
        add_options(argparse.ArgumentParser(), Odd, groups={"g": "g"})
