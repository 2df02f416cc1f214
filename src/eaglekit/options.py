"""A stage's options, declared once: the fields of its frozen config dataclass carry their default,
type and help, and generate the stage's command-line flags (and so the recipe keys `eaglekit run`
accepts, which are checked against those flags).

    @dataclass(frozen=True, kw_only=True)
    class TrainConfig:
        lr: float = option(3e-4, "peak learning rate", group="training")
        ...

    add_options(parser, TrainConfig, groups={"training": "training"})   # --lr ...
    config = options_from_args(TrainConfig, args)                        # TrainConfig(lr=args.lr, ...)

The flag is the field's name with dashes; its type comes from the annotation (int, float, str,
each optionally `| None`); a bool that defaults to False is a switch (`--resume`), one that
defaults to True is switched off (`--no-progress`). A valued flag's help ends with its default, so a
help text never states it. A field declared with plain `field()` or a plain default has no flag
(settings only code or a recipe's nested keys set).
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, field, fields
from typing import Any, Callable

from eaglekit.errors import EaglekitError

_KEY = "eaglekit_option"
_TYPES = {"int": int, "float": float, "str": str}


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    group: str,
    choices: tuple | None = None,
    parse: Callable[[str], Any] | None = None,
    cli_default: Any = MISSING,
    required: bool = False,
    aliases: tuple[str, ...] = (),
    flag: dict | None = None,
):
    """A dataclass field that is also a flag.

    Args:
        default: the field's default (MISSING: the dataclass requires it).
        help: the flag's help text.
        group: the argument group (a key of `add_options`' groups).
        choices: allowed values.
        parse: turns the flag's text into the field's value (else the annotation's type).
        cli_default: the flag's default where it differs from the dataclass's (e.g. a target name).
        required: the flag must be given.
        aliases: more names of the flag (`-k` beside `--k`).
        flag: more `add_argument` settings (nargs, const, metavar) of a valued flag.
    """
    meta = {
        _KEY: dict(
            help=help,
            group=group,
            choices=choices,
            parse=parse,
            cli_default=cli_default,
            required=required,
            aliases=aliases,
            flag=flag or {},
        )
    }
    return field(default=default, metadata=meta)


JSON_STDOUT = "-"  # `--json` without a PATH: the JSON goes to stdout


def json_option(what: str):
    """`--json [PATH]`, the one form every subcommand takes: print `what` as JSON to stdout, or with
    a PATH write it there (and print the usual text)."""
    return option(
        None,
        f"print {what} as JSON, or write it to PATH",
        group="main",
        flag={"nargs": "?", "const": JSON_STDOUT, "metavar": "PATH"},
    )


def int_tuple(text: str) -> tuple[int, ...] | None:
    """ "1,14,26" -> (1, 14, 26); "" -> None (not given)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip()) or None
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from err


def flag_type(annotation: str) -> type | None:
    """int / float / str (with an optional `| None`) -> that type; bool -> None (a switch)."""
    base = annotation.replace(" ", "").replace("|None", "")
    if base == "bool":
        return None
    if base not in _TYPES:
        raise EaglekitError(f"an option of type {annotation!r} needs parse=", hint="give option(..., parse=FUNC)")
    return _TYPES[base]


def add_options(
    parser: argparse.ArgumentParser,
    cls,
    groups: dict[str, str | None],
    only: tuple[str, ...] | None = None,
    names: tuple[str, ...] | None = None,
) -> None:
    """Add a flag for every `option` field of `cls`, in `groups` (key -> the group's title; None: the
    parser's own options). `only`: the flags of these groups alone; `names`: of these fields alone
    (a parser that shares some)."""
    made = {
        key: parser if title is None else parser.add_argument_group(title)
        for key, title in groups.items()
        if only is None or key in only
    }
    for f in fields(cls):
        meta = f.metadata.get(_KEY)
        if (
            meta is None
            or (only is not None and meta["group"] not in only)
            or (names is not None and f.name not in names)
        ):
            continue
        group = made[meta["group"]]
        name = f.name.replace("_", "-")
        default = f.default if meta["cli_default"] is MISSING else meta["cli_default"]
        kind = meta["parse"] or flag_type(str(f.type))
        if kind is None and (meta["aliases"] or meta["flag"]):
            raise EaglekitError(
                f"option {f.name!r}: a switch takes no aliases or flag settings",
                hint="give a switch its one --name (or --no-name) form",
            )
        if kind is None and default is True:
            group.add_argument(f"--no-{name}", dest=f.name, action="store_false", help=meta["help"])
        elif kind is None:
            group.add_argument(f"--{name}", dest=f.name, action="store_true", help=meta["help"])
        else:
            extra = {} if default is MISSING else {"default": default}
            shown = default not in (MISSING, None, "") and not isinstance(default, tuple)
            text = meta["help"] + (f" (default {str(default).replace('%', '%%')})" if shown else "")  # said once
            group.add_argument(
                f"--{name}",
                *meta["aliases"],
                dest=f.name,
                type=kind,
                choices=meta["choices"],
                required=meta["required"],
                help=text,
                **extra,
                **meta["flag"],
            )


def options_argv(
    cls, args: argparse.Namespace, skip: tuple[str, ...] = (), skip_groups: tuple[str, ...] = ()
) -> list[str]:
    """The flags that give `cls`'s options the values they have in `args` (a child process's command
    line): every option but those in `skip` or `skip_groups`; None values and switches left at their
    default are not written."""
    argv: list[str] = []
    for f in fields(cls):
        meta = f.metadata.get(_KEY)
        if meta is None or f.name in skip or meta["group"] in skip_groups:
            continue
        value, name = getattr(args, f.name), f.name.replace("_", "-")
        if isinstance(value, bool):
            default = f.default if meta["cli_default"] is MISSING else meta["cli_default"]
            if value != default:
                argv.append(f"--{name}" if value else f"--no-{name}")
        elif value is not None:
            argv += [f"--{name}", ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return argv


def options_from_args(cls, args: argparse.Namespace):
    """`cls` built from the parsed flags of its `option` fields."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if _KEY in f.metadata})
