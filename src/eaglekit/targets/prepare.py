"""`eaglekit target prepare`: write a target as a plain HF folder (safetensors, config, tokenizer).

Loading a prepared folder skips GGUF dequantization, and other engines (vLLM) can serve it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from eaglekit.artifacts import atomic_dir, check_owner, has_content, write_manifest
from eaglekit.errors import EaglekitError
from eaglekit.targets.load import Target, load_target, text_config
from eaglekit.targets.options import TargetPrepareOptions

log = logging.getLogger(__name__)


def prepare_target(
    spec: str, out: str | Path, *, dtype: str = TargetPrepareOptions.dtype, overwrite: bool = False
) -> dict:
    """Load `spec` and save it as a Hugging Face folder; check the folder reloads to the same target.

    The folder is built beside `out` under `out`'s writer lock and moved into place whole. Its
    manifest records the source's fingerprint and the sample hash of the weights written, so the
    folder keeps the source's weights fingerprint while its files are unchanged (`weights.py`).

    Args:
        spec: `smollm2`, a .gguf file or an HF folder.
        out: the folder to write.
        dtype: dtype of the saved weights (float32 keeps GGUF's dequantized values exactly).
        overwrite: replace an existing folder.

    Returns:
        The manifest written to `out/manifest.json`.
    """
    out = Path(out)
    check_owner(out, "target prepare")  # before the target loads: a folder of the user's is never replaced
    if has_content(out) and not overwrite:
        raise EaglekitError(f"{out} exists and is not empty", hint="pass --overwrite or another --out")
    target = load_target(spec, device="cpu", dtype=dtype)
    with atomic_dir(out, overwrite=overwrite, stage="target prepare") as tmp:
        save_target(target, tmp)
        reloaded = load_target(tmp, device="cpu", dtype=dtype)
        before, after = target.fingerprint(), reloaded.fingerprint()
        for key in ("config_hash", "tokenizer_hash"):
            if before[key] != after[key]:
                raise EaglekitError(
                    f"the prepared folder does not reload to the same target ({key} {before[key]} != {after[key]})",
                    hint="report this model",
                )
        cfg = text_config(target.model.config)
        manifest = write_manifest(
            tmp,
            stage="target",
            config={"source": spec, "dtype": dtype},
            target=before,
            counts={
                "parameters": sum(p.numel() for p in target.model.parameters()),
                "num_layers": cfg.num_hidden_layers,
            },
            extra={"weights_files_hash": after["weights_hash"]},
        )
        give_normal_permissions(tmp)
    log.info("prepared %s -> %s", spec, out)
    return manifest


def give_normal_permissions(folder: Path) -> None:
    """Files as `open` would create them (0666 less the umask): transformers writes weights 0600,
    which another user serving the folder (a vLLM container) cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~mask)


def save_target(target: Target, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = target.model
    if target.stop_token_ids:
        model.generation_config.eos_token_id = (
            target.stop_token_ids[0] if len(target.stop_token_ids) == 1 else list(target.stop_token_ids)
        )
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
