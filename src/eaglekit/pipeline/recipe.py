"""Recipes: a YAML file of stage sections, plus dotted `section.key=value` overrides.

A section's keys are the flags of that stage's subcommand (`eaglekit <stage> --help`), spelled
as in the CLI without the dashes, so a recipe never invents a second vocabulary:

    target: smollm2
    generate: {max-new-tokens: 256, batch-size: 64}
    train: {ttt-steps: 7, epochs: 2}

Two keys are not flags: `synthesize: {add: N, ...}` tops the prompt files up with N Magpie prompts
of the target (its other keys are `eaglekit prompts synthesize` flags), and the top-level
`gpus: N` trains on N GPUs of this host with torchrun; `prepare: false` uses the target folder as is
(no `eaglekit target prepare`, which loads the whole target: a large one is served by vLLM from its
folder). `validation` takes `eaglekit prompts build` flags: the workload's prompts, answered by
the target, that training validates on. `scaling:
{fractions: [0.125, 0.25, 0.5, 1.0], steps: N, bench: true}` adds the data-scaling curve: one more
draft per nested share of the training data, each trained N steps (default: the main draft's), see
pipeline/scaling.py.

Built-in recipes live beside this file (`eaglekit run --recipe quick`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from eaglekit.errors import EaglekitError

BUILTIN = Path(__file__).parent / "recipes"


class RecipeLoader(yaml.SafeLoader):
    """YAML's safe loader without YAML 1.1's base-60 numbers: `10:20` stays the text 10:20 (a step
    window), where safe_load made it 620; other ints and floats read as before."""

    def base60_as_text(self, node):
        return self.construct_scalar(node) if ":" in node.value else self.numbers[node.tag](self, node)

    numbers = {
        "tag:yaml.org,2002:int": yaml.SafeLoader.construct_yaml_int,
        "tag:yaml.org,2002:float": yaml.SafeLoader.construct_yaml_float,
    }


for _tag in RecipeLoader.numbers:
    RecipeLoader.add_constructor(_tag, RecipeLoader.base60_as_text)


class DuplicateKey(Exception):
    def __init__(self, key, line: int, first: int):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


def no_duplicate_keys(loader: RecipeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A mapping whose keys are each given once: YAML's loader let a second `train:` replace the
    first without a word (its draft vocab, TTT steps and lr vanished from the command)."""
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise DuplicateKey(key, line, seen[key])
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


RecipeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicate_keys)

SECTIONS = (
    "prompts",
    "synthesize",
    "validation",
    "generate",
    "features",
    "train",
    "export",
    "doctor",
    "bench",
    "scaling",
)
TOP_LEVEL = ("name", "target", "out", "device", "gpus", "prepare")


def builtin_recipes() -> list[str]:
    return sorted(p.stem for p in BUILTIN.glob("*.yaml"))


def load_recipe(name_or_path: str, overrides: list[str] = ()) -> dict:
    """Read a recipe (a built-in name or a YAML path) and apply `a.b=value` overrides."""
    path = Path(name_or_path)
    if not path.is_file():
        path = BUILTIN / f"{name_or_path}.yaml"
    if not path.is_file():
        raise EaglekitError(
            f"no recipe {name_or_path!r}",
            hint=f"pass a YAML file or one of the built-in recipes: {', '.join(builtin_recipes())}",
        )
    text = path.read_text()
    try:
        recipe = yaml.load(text, Loader=RecipeLoader) or {}
    except DuplicateKey as dup:
        raise EaglekitError(
            f"recipe {path} line {dup.line}: {dup.key!r} is given twice (first at line {dup.first}); "
            "the second would replace the first",
            hint="merge the two into one",
        ) from None
    except yaml.YAMLError as err:
        raise EaglekitError(f"recipe {path} is not valid YAML: {err}", hint="fix the file") from err
    if not isinstance(recipe, dict):
        raise EaglekitError(f"recipe {path} must be a mapping of sections", hint="see the built-in recipes")
    check_types(recipe, f"recipe {path}", section_lines(text))
    for override in overrides:
        apply_override(recipe, override)
    check_types(recipe, "the recipe with its overrides", {})
    unknown = set(recipe) - set(SECTIONS) - set(TOP_LEVEL)
    if unknown:
        raise EaglekitError(
            f"recipe has unknown sections {sorted(unknown)}",
            hint=f"sections are {', '.join(SECTIONS)} (plus {', '.join(TOP_LEVEL)})",
        )
    gpus = recipe.get("gpus", 1)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise EaglekitError(f"recipe gpus must be a whole number >= 1, got {gpus!r}", hint="e.g. gpus=2")
    recipe["_path"] = str(path)
    return recipe


def section_lines(text: str) -> dict:
    """The line of each top-level key of a recipe's text, and of each key of its sections."""
    lines: dict = {}
    root = yaml.compose(text, Loader=RecipeLoader)
    if not isinstance(root, yaml.MappingNode):
        return lines
    for key, value in root.value:
        lines[key.value] = key.start_mark.line + 1
        if isinstance(value, yaml.MappingNode):
            for sub, _ in value.value:
                lines[f"{key.value}.{sub.value}"] = sub.start_mark.line + 1
    return lines


# Sections that are not a mapping of flags: `features: false` trains online.
SWITCH_SECTIONS = ("features",)


def check_types(recipe: dict, where, lines: dict) -> None:
    """Refuse a section that is not a mapping (`train: 5`) and a value that is neither a scalar nor
    a list of scalars (`train: {lr: {a: 1}}`), naming the line: they once ended in an AttributeError."""

    def at(key: str) -> str:
        return f"{where} line {lines[key]}" if key in lines else str(where)

    for section, value in recipe.items():
        if section not in SECTIONS or value is None or (section in SWITCH_SECTIONS and value is False):
            continue
        if not isinstance(value, dict):
            raise EaglekitError(
                f"{at(section)}: {section} must be a section, a mapping of its keys; got "
                f"{type(value).__name__} {value!r}",
                hint=f"write e.g. `{section}: {{key: value}}`, one key a flag of its stage",
            )
        for key, given in value.items():
            items = given if isinstance(given, list) else [given]
            if any(isinstance(item, (dict, list)) for item in items):
                raise EaglekitError(
                    f"{at(f'{section}.{key}')}: {section}.{key} must be a value or a list of values, got {given!r}",
                    hint="one flag's value, as on the command line",
                )
    for key in ("name", "target", "out", "device"):
        if isinstance(recipe.get(key), (dict, list)):
            raise EaglekitError(f"{at(key)}: {key} must be a single value, got {recipe[key]!r}", hint="fix the recipe")


def apply_override(recipe: dict, override: str) -> None:
    """`train.epochs=3` sets recipe["train"]["epochs"] = 3 (value parsed as YAML)."""
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise EaglekitError(f"override {override!r} is not key=value", hint="e.g. train.epochs=3")
    node = recipe
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise EaglekitError(f"override {override!r}: {part} is not a section", hint="check the recipe")
    node[leaf] = yaml.load(raw, Loader=RecipeLoader)


def to_flags(section: dict | None, *, skip: tuple[str, ...] = ()) -> list[str]:
    """{"max-new-tokens": 64, "overwrite": true, "source": [a, b]} -> CLI flags."""
    flags: list[str] = []
    for key, value in (section or {}).items():
        if key in skip or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            for item in value:
                flags += [flag, str(item)]
        else:
            flags += [flag, str(value)]
    return flags
