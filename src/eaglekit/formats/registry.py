"""The formats eaglekit writes and reads, one module each; detect, export, import and the doctor iterate them.

A new format is one module holding its `Format` (`formats/base.py`), named here. The order is the
order `eaglekit run` exports in and the order a folder's aux id fields are tried in; the format
without a mark of its own (EAGLE) is recognised last. No torch here: the options read it.
"""

from __future__ import annotations

from eaglekit.errors import EaglekitError
from eaglekit.formats.base import Format
from eaglekit.formats.eagle import EAGLE
from eaglekit.formats.sglang import SGLANG
from eaglekit.formats.vllm import VLLM

FORMATS: dict[str, Format] = {f.name: f for f in (SGLANG, VLLM, EAGLE)}


def check_format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise EaglekitError(f"unknown format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def aux_configurable() -> str:
    """The engines whose config says which aux layers they capture, for a hint: "SGLang/vLLM"."""
    return "/".join(f.title for f in FORMATS.values() if f.aux_field)
