"""Imports run one way between eaglekit's packages: a package imports only packages of a lower layer.

A lower layer never reaches up (the draft does not know training, the engine does not know the
data stage), so each package can be read, tested and changed with only what is below it in mind.
A new package must be given its layer here; an import that runs back up fails with its file.
"""

import ast
from pathlib import Path

import eaglekit

PACKAGE = Path(eaglekit.__file__).parent

# Lower numbers are lower layers. Same-layer imports are not allowed either (no sideways coupling).
LAYERS = {
    "errors": 0,
    "progress": 0,
    "lazy": 0,  # lazy: names a package loads on first use
    "metrics": 0,  # tau, acceptance, the serving walk: no imports
    "artifacts": 1,
    "options": 1,
    "cli": 1,  # cli: the dispatcher imports stage CLIs by name only
    "targets": 2,
    "draft": 3,
    "formats": 4,  # the draft's on-disk formats
    "features": 5,
    "runtime": 5,  # runtime: KV caches, CUDA graphs, sampling, target runners
    "data": 6,
    "train": 6,
    "engine": 6,  # engine: speculative decoding on the runtime
    "doctor": 7,
    "bench": 7,
    "report": 8,
    "pipeline": 9,
}
TOP_LEVEL = {"__init__", "__main__"}


def package_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_packages(path: Path) -> set[str]:
    """The eaglekit packages a module imports (at module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "eaglekit" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_has_a_layer():
    packages = {package_of(p) for p in PACKAGE.rglob("*.py")} - TOP_LEVEL
    assert packages - set(LAYERS) == set(), "give the new package a layer in LAYERS"


def test_imports_run_one_way():
    back = []
    for path in sorted(PACKAGE.rglob("*.py")):
        pkg = package_of(path)
        if pkg in TOP_LEVEL:
            continue
        for other in imported_packages(path) - {pkg}:
            if other != "__version__" and LAYERS.get(other, -1) >= LAYERS[pkg]:
                back.append(
                    f"{path.relative_to(PACKAGE)} ({pkg}, layer {LAYERS[pkg]}) imports {other} "
                    f"(layer {LAYERS.get(other)})"
                )
    assert not back, "imports that run back up or sideways:\n" + "\n".join(back)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The eaglekit modules a module imports (`from eaglekit.x import y` counts x.y where that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {n for n in [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if n in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found


def test_no_two_modules_import_each_other():
    """Inside a package too: a module pair that imports each other (even inside a function) is one
    module in two files, and the lower one's reader needs the upper one."""

    def name(path: Path) -> str:
        parts = ("eaglekit", *path.relative_to(PACKAGE).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    paths = {name(p): p for p in PACKAGE.rglob("*.py")}
    imports = {m: imported_modules(p, set(paths)) - {m} for m, p in paths.items()}
    circles = sorted(f"{a} <-> {b}" for a in imports for b in imports[a] if a < b and a in imports[b])
    assert not circles, "modules that import each other:\n" + "\n".join(circles)
