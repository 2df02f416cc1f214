"""`truncate_log` on --resume: later steps are cut, a torn last line is dropped, corruption is refused."""

import json

import pytest

from eaglekit.errors import EaglekitError
from eaglekit.train.state import truncate_log


def write_log(path, steps, tail=""):
    lines = "".join(json.dumps({"event": "train", "step": s, "loss": 1.0 / s}) + "\n" for s in steps)
    path.write_text(lines + tail, encoding="utf-8")


def logged_steps(path):
    return [json.loads(line)["step"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_truncate_log_keeps_steps_up_to_the_resumed_one(tmp_path):
    path = tmp_path / "log.jsonl"
    write_log(path, [2, 4, 6, 8])
    truncate_log(path, 4)
    assert logged_steps(path) == [2, 4]


def test_truncate_log_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "log.jsonl"
    write_log(path, [2, 4, 6], tail='{"event": "train", "st')  # SIGKILL in the middle of a write
    truncate_log(path, 6)
    assert logged_steps(path) == [2, 4, 6]


@pytest.mark.parametrize("bad", ['{"event": "train", "st', "[1, 2]", "\x00\x00\x00"])
def test_truncate_log_refuses_a_malformed_line_before_the_last(tmp_path, bad):
    path = tmp_path / "log.jsonl"
    write_log(path, [2], tail=bad + "\n" + json.dumps({"event": "train", "step": 4}) + "\n")
    before = path.read_bytes()
    with pytest.raises(EaglekitError) as err:
        truncate_log(path, 4)
    assert f"{path}:2 " in str(err.value) and "corrupt" in err.value.hint
    assert path.read_bytes() == before  # nothing deleted
