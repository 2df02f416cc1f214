"""Where prompts come from: files (JSONL, JSON, parquet, plain text), folders of them, and Hugging
Face datasets. Every record keeps its location (file and line) so a malformed one can be reported.

A source is written `LOCATION[,key=value...]` on the command line, e.g.
`sharegpt.json,weight=2`, `questions.txt,name=faq`, `hf:tatsu-lab/alpaca,split=train,weight=0.5`,
`data.parquet,column=question`, `t0.jsonl,min-chars=2000,name=t0_long` (its long prompts alone),
`chat.jsonl,validation-fraction=0.05` (this source's own held-out share: validation drawn from the
prompts like those served, not from the whole mix).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from eaglekit.artifacts import sha256_file
from eaglekit.data.formats import FORMATS, to_prompt
from eaglekit.data.records import MalformedRecord, Prompt
from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
OPTIONS = (
    "weight",
    "format",
    "name",
    "column",
    "records",
    "split",
    "subset",
    "min-chars",
    "max-chars",
    "validation-fraction",
    "template",
)
INT_OPTIONS = ("min-chars", "max-chars")
# Task templates a source's prompts can be wrapped in (`template=NAME`): work the training files rarely
# hold (translation; summaries of a given text), made from prompts they do hold. The target answers
# the wrapped prompt as it answers a user's, so the draft learns what the target writes for such work.
TEMPLATES = {
    "translate-fr": "Translate the following text into French.\n\n{prompt}",
    "translate-de": "Translate the following text into German.\n\n{prompt}",
    "translate-es": "Translate the following text into Spanish.\n\n{prompt}",
    "translate-zh": "Translate the following text into Chinese.\n\n{prompt}",
    "translate-en": "Translate the following text into English.\n\n{prompt}",
    "summarize": "Summarize the following text in a few sentences.\n\n{prompt}",
}


@dataclass(frozen=True)
class SourceSpec:
    """One source of prompts and how much of it goes into the mix.

    Attributes:
        location: a file, a folder of files, or `hf:<dataset name>`.
        weight: share in the mix (see `eaglekit.data.prompts.build_prompts`).
        format: record format, one of FORMATS ("auto" detects it per record).
        name: source name for records that carry none (default: file stem / dataset name).
        column: the string field holding the prompt, for tables with their own column names.
        records: key of the list of records when a JSON file holds an object, not a list.
        split: split of a Hugging Face dataset.
        subset: configuration name of a Hugging Face dataset.
        template: wrap each prompt's first turn in a task template (`TEMPLATES`, e.g. translate-fr),
            as a share of its own: its prompts are named SOURCE+TEMPLATE and never collide with the
            unwrapped source's.
        min_chars, max_chars: this source's own length limits, on top of the build's (`min-chars=2000`
            takes a source's long prompts alone: long-input work, e.g. summaries, as its own share; its
            `name` names the share in the manifest, while records that carry a source keep theirs).
        validation_fraction: this source's own held-out share (None: the build's `--validation-fraction`).
            With `--validation-fraction 0` and `validation-fraction=0.05` on the chat-like sources,
            training validates (predicts, and picks its best draft) on chat, not on the whole mix.
    """

    location: str
    weight: float = 1.0
    format: str = "auto"
    name: str | None = None
    column: str | None = None
    records: str | None = None
    split: str = "train"
    subset: str | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    validation_fraction: float | None = None
    template: str | None = None

    @classmethod
    def parse(cls, text: str) -> "SourceSpec":
        location, *options = text.split(",")
        kwargs: dict[str, Any] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or key.strip() not in OPTIONS:
                raise EaglekitError(
                    f"bad source option {option!r} in {text!r}",
                    hint=f"write LOCATION[,key=value...] with keys {', '.join(OPTIONS)}",
                )
            kwargs[key.strip()] = value.strip()
        for key in INT_OPTIONS:
            if key in kwargs:
                value = kwargs.pop(key)
                try:
                    number = int(value)
                except ValueError:
                    number = -1
                if number < 0:
                    raise EaglekitError(
                        f"{key} {value!r} in {text!r} is not a whole number >= 0", hint=f"e.g. {key}=2000"
                    )
                kwargs[key.replace("-", "_")] = number
        if "weight" in kwargs:
            try:
                kwargs["weight"] = float(kwargs["weight"])
            except ValueError:
                raise EaglekitError(
                    f"weight {kwargs['weight']!r} in {text!r} is not a number", hint="e.g. data.jsonl,weight=0.5"
                ) from None
            if not kwargs["weight"] > 0:
                raise EaglekitError(f"weight must be > 0 in {text!r}", hint="drop the source instead of weight 0")
        if "validation-fraction" in kwargs:
            value = kwargs.pop("validation-fraction")
            try:
                share = float(value)
            except ValueError:
                share = -1.0
            if not 0 <= share < 1:
                raise EaglekitError(
                    f"validation-fraction {value!r} in {text!r} is not a share in [0, 1)",
                    hint="e.g. chat.jsonl,validation-fraction=0.05",
                )
            kwargs["validation_fraction"] = share
        if "template" in kwargs and kwargs["template"] not in TEMPLATES:
            raise EaglekitError(
                f"unknown template {kwargs['template']!r} in {text!r}", hint=f"use one of {', '.join(TEMPLATES)}"
            )
        if kwargs.get("format", "auto") not in FORMATS:
            raise EaglekitError(
                f"unknown format {kwargs['format']!r} in {text!r}", hint=f"use one of {', '.join(FORMATS)}"
            )
        return cls(location=location.strip(), **kwargs)

    def to_config(self) -> dict:
        """The spec as the prompts manifest records it; the length limits and the held-out share only
        when set, so that a folder built before they existed hashes the same (generate's resume check
        reads that hash)."""
        return {
            k: v
            for k, v in self.__dict__.items()
            if not (k in ("min_chars", "max_chars", "validation_fraction", "template") and v is None)
        }

    def keeps(self, prompt) -> bool:
        """Within this source's own length limits."""
        return (self.min_chars or 0) <= prompt.num_chars and (
            self.max_chars is None or prompt.num_chars <= self.max_chars
        )

    @property
    def is_hf(self) -> bool:
        return self.location.startswith("hf:")

    @property
    def stem(self) -> str:
        """The dataset's or file's name."""
        return self.location[3:].split("/")[-1] if self.is_hf else Path(self.location).stem

    def display_name(self) -> str:
        if self.name:
            return self.name
        return f"{self.stem}+{self.template}" if self.template else self.stem

    def files(self) -> list[Path]:
        """The files of a file or folder source, sorted; raises when there are none."""
        path = Path(self.location).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in FILE_SUFFIXES)
            if not found:
                raise EaglekitError(f"no prompt files in {path}", hint=f"expected files ending in {FILE_SUFFIXES}")
            return found
        if not path.is_file():
            raise EaglekitError(
                f"prompt source not found: {path}", hint="pass a file, a folder of files, or hf:<dataset name>"
            )
        return [path]

    def fingerprint(self) -> dict:
        if self.is_hf:
            return {"dataset": self.location[3:], "split": self.split, "subset": self.subset}
        return {str(p): sha256_file(p) for p in self.files()}


@dataclass
class ReadReport:
    """What a source gave: prompts, and the records that could not be read (with their location)."""

    prompts: list[Prompt] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # "file:line: reason"
    records: int = 0


def read_source(spec: SourceSpec) -> ReadReport:
    """Read every record of a source; malformed ones are collected, not fatal."""
    report = ReadReport()
    for path, raw_iter in _raw_records(spec):
        default_name = spec.name or (spec.stem if spec.is_hf else path_stem(path))
        fmt = "text" if spec.format == "auto" and str(path).endswith(".txt") else spec.format
        for index, (where, raw) in enumerate(raw_iter):
            report.records += 1
            try:
                if isinstance(raw, MalformedRecord):
                    raise raw
                prompt = to_prompt(raw, fmt=fmt, source=default_name, index=index, column=spec.column)
                report.prompts.append(wrapped(prompt, spec) if spec.template else prompt)
            except MalformedRecord as err:
                report.malformed.append(f"{where}: {err}")
    return report


def wrapped(prompt: Prompt, spec: SourceSpec) -> Prompt:
    """The prompt with its first turn in `spec.template`, under its own id and source name."""
    first = TEMPLATES[spec.template].format(prompt=prompt.turns[0])
    return replace(
        prompt,
        id=f"{prompt.id}+{spec.template}",
        source=spec.name or f"{prompt.source}+{spec.template}",
        turns=[first, *prompt.turns[1:]],
    )


def path_stem(path: str) -> str:
    return Path(path).stem


def _raw_records(spec: SourceSpec) -> Iterator[tuple[str, Iterator[tuple[str, Any]]]]:
    if spec.is_hf:
        yield spec.location, _read_hf(spec)
        return
    for path in spec.files():
        reader = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".txt": _read_text}.get(
            path.suffix, _read_jsonl
        )
        yield str(path), reader(path, spec)


def _read_jsonl(path: Path, _spec: SourceSpec) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(_lines(f, path), start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                yield (
                    f"{path}:{lineno}",
                    MalformedRecord(f"invalid JSON ({err.msg.removesuffix(' at')} at column {err.colno})"),
                )


def _lines(f, path: Path) -> Iterator[str]:
    try:
        yield from f
    except UnicodeDecodeError as err:
        raise EaglekitError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start})", hint="convert the file to UTF-8"
        ) from err


def _read_text(path: Path, _spec: SourceSpec) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(_lines(f, path), start=1):
            if line.strip():
                yield f"{path}:{lineno}", line.rstrip("\n")


def _read_json(path: Path, spec: SourceSpec) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise EaglekitError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})",
            hint="a file with one JSON object per line must end in .jsonl",
        ) from err
    except UnicodeDecodeError as err:
        raise EaglekitError(f"{path} is not UTF-8 text", hint="convert the file to UTF-8") from err
    if isinstance(data, dict):
        key = spec.records
        if key is None:
            lists = [k for k, v in data.items() if isinstance(v, list)]
            if len(lists) != 1:
                raise EaglekitError(
                    f"{path} holds a JSON object, not a list of records",
                    hint=f"name the key holding the records: {path},records=KEY",
                )
            key = lists[0]
        if not isinstance(data.get(key), list):
            raise EaglekitError(f"{path} has no list of records under {key!r}", hint="check records=KEY")
        data = data[key]
    elif not isinstance(data, list):
        raise EaglekitError(
            f"{path} holds a JSON {type(data).__name__}, expected a list of records",
            hint="a list of objects, or one object per line in a .jsonl file",
        )
    for n, record in enumerate(data):
        yield f"{path}: record {n}", record


def _read_parquet(path: Path, _spec: SourceSpec) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise EaglekitError(
            f"reading {path} needs pyarrow, which is not installed",
            hint="pip install 'eaglekit[parquet]' (or pip install pyarrow)",
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for broken files
        raise EaglekitError(f"could not read parquet file {path}: {err}", hint="is the file complete?") from err
    for n, record in enumerate(table.to_pylist()):
        yield f"{path}: row {n}", record


def _read_hf(spec: SourceSpec) -> Iterator[tuple[str, Any]]:
    name = spec.location[3:]
    try:
        import datasets
    except ImportError:
        raise EaglekitError(
            f"reading the Hugging Face dataset {name!r} needs the `datasets` package",
            hint="pip install datasets, or download the data and pass the file",
        ) from None
    try:
        dataset = datasets.load_dataset(name, spec.subset, split=spec.split)
    except Exception as err:  # offline, unknown name, gated ...: datasets raises many types
        raise EaglekitError(
            f"could not load the Hugging Face dataset {name!r} (split {spec.split!r}): {type(err).__name__}: {err}",
            hint="check the name and the network (HF_HUB_OFFLINE), or pass a local file",
        ) from err
    for n, record in enumerate(dataset):
        yield f"hf:{name}[{spec.split}] row {n}", record
