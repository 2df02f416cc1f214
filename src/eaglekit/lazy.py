"""Package names that load on first use (PEP 562): a stage's options module imports its package
(`eaglekit.targets.options` runs `eaglekit/targets/__init__.py`), and `eaglekit --help` should not
pay for torch and transformers on the way."""

from __future__ import annotations

from importlib import import_module


def lazy_exports(package: str, homes: dict[str, str]):
    """A module `__getattr__` that imports `name` from `package.<homes[name]>` the first time it is read."""

    def __getattr__(name: str):
        if name in homes:
            return getattr(import_module(f"{package}.{homes[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
