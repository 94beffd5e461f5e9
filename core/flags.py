"""A command's flags generated from its frozen config dataclass, and a config written back as those flags.

Each field of the dataclass carries its flag in its metadata (`field(metadata=flag(...))`): the
flag's name (`--` and the field's name with dashes, unless given), help, metavar, argparse group, choices,
and how its text is read and written. From that one definition:

- `add_flags(parser, Config)` adds the flags to an argparse parser (required when the field has no default);
- `config_from_namespace(Config, namespace)` builds the config from the parsed flags;
- `config_to_argv(config)` writes the flags that make those two rebuild `config` exactly, which is how a
  launcher hands its config to a worker process, visibly (the process list) and reproducibly (by hand).

Reading a flag's text happens in two places, on purpose: `parse` is argparse's `type` (a value of the wrong
form is a usage error, exit 2 with the command's usage), `read` runs while the config is built (it may raise
core.errors.InputError, the command's one-line error). A field whose type is itself a flag-carrying dataclass
adds that class's flags (in the group its own `flag(group=...)` names), and is built from them.

Standard library only, like the rest of core/: the Function App ships it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from collections.abc import Callable, Collection, Iterator
from typing import Any, TypeVar

FLAG = "retrain.flag"  # the metadata key a field's Flag is kept under
C = TypeVar("C")


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one field of a config appears on a command line."""

    help: str | None = None
    name: str | None = None  # default: `--` and the field's name, underscores as dashes
    metavar: str | None = None
    group: str | None = None  # the argparse group listing it in --help
    choices: tuple[Any, ...] | None = None
    parse: Callable[[str], Any] | None = None  # argparse's type: raises ValueError/ArgumentTypeError
    read: Callable[[Any], Any] | None = None  # the parsed value -> the field's, as the config is built
    format: Callable[[Any], str] = str  # the field's value -> text `parse` and `read` turn back into it
    none: str | None = None  # the word written for None ('off'); unset: None is written by leaving it out
    optional_value: bool = False  # a boolean that takes an optional true/false: `--x`, `--x false`


def flag(**options: Any) -> dict[str, Flag]:
    """A field's flag, as its metadata: `epochs: int = field(default=5, metadata=flag(parse=int))`."""
    return {FLAG: Flag(**options)}


def flag_of(field: dataclasses.Field[Any]) -> Flag | None:
    found = field.metadata.get(FLAG)
    return found if isinstance(found, Flag) else None


def flag_name(field: dataclasses.Field[Any]) -> str:
    spec = flag_of(field)
    return (spec.name if spec and spec.name else None) or "--" + field.name.replace("_", "-")


def default_of(field: dataclasses.Field[Any]) -> Any:
    """The field's default value; dataclasses.MISSING for a required one."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@functools.cache
def _type_hints(config_class: type) -> dict[str, Any]:
    """The class's field types, resolved once: resolving evaluates every annotation's text, and a command's
    parser asks for each field's (0.1 s a process for `training.cli`'s, uncached)."""
    return typing.get_type_hints(config_class)


def nested_class(config_class: type, field: dataclasses.Field[Any]) -> type | None:
    """The flag-carrying dataclass a field holds, if it holds one."""
    kind = _type_hints(config_class).get(field.name)
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def flag_fields(config_class: type) -> Iterator[tuple[type, dataclasses.Field[Any]]]:
    """Every (class, field) pair with a flag, nested configs' fields included, in definition order."""
    for field in dataclasses.fields(config_class):
        inner = nested_class(config_class, field)
        if inner is not None:
            yield from flag_fields(inner)
        elif flag_of(field) is not None:
            yield config_class, field


def _is_bool(config_class: type, field: dataclasses.Field[Any]) -> bool:
    return _type_hints(config_class).get(field.name) in (bool, bool | None)


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config_class: type,
    group: str | None = None,
    only: Collection[str] | None = None,
) -> None:
    """Add a flag per field of `config_class` (and of the configs it nests) to `parser`, each in the
    argparse group its flag names (else `group`, a nested config's); `only`: just these fields' (another
    command sharing some of a config's flags)."""
    groups: dict[str, argparse._ArgumentGroup] = {}

    def target(title: str | None) -> argparse.ArgumentParser | argparse._ArgumentGroup:
        if title is None or not isinstance(parser, argparse.ArgumentParser):
            return parser
        if title not in groups:
            # A group the caller made already (to order the groups in --help) takes the flags.
            made = [each for each in parser._action_groups if each.title == title]
            groups[title] = made[0] if made else parser.add_argument_group(title)
        return groups[title]

    for field in dataclasses.fields(config_class):
        spec = flag_of(field)
        inner = nested_class(config_class, field)
        if inner is not None:
            add_flags(target(spec.group if spec else group), inner, only=only)
        elif spec is not None and (only is None or field.name in only):
            options = _argparse_options(config_class, field, spec)
            target(spec.group or group).add_argument(flag_name(field), **options)


def _argparse_options(config_class: type, field: dataclasses.Field[Any], spec: Flag) -> dict[str, Any]:
    default = default_of(field)
    options: dict[str, Any] = {"dest": field.name}
    if spec.help is not None:
        options["help"] = spec.help
    if spec.metavar is not None:
        options["metavar"] = spec.metavar
    if _is_bool(config_class, field) and not spec.optional_value:
        # A switch: `--x` sets it; a field that may be None (unset) is negatable, `--no-x` clears it.
        options["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
        options["default"] = default
        return options
    if spec.optional_value:
        options.update(nargs="?", const=True)
    if default is dataclasses.MISSING:
        options["required"] = True
    else:
        options["default"] = default
    if spec.parse is not None:
        options["type"] = spec.parse
    if spec.choices is not None:
        options["choices"] = spec.choices
    return options


def config_from_namespace(config_class: type[C], namespace: argparse.Namespace, **given: Any) -> C:
    """The config the parsed flags describe; `given` values (already the fields') are taken as they are."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config_class):  # type: ignore[arg-type]
        inner = nested_class(config_class, field)
        spec = flag_of(field)
        if field.name in given:
            values[field.name] = given[field.name]
        elif inner is not None:
            values[field.name] = config_from_namespace(inner, namespace, **given)
        elif spec is not None and hasattr(namespace, field.name):
            value = getattr(namespace, field.name)
            values[field.name] = spec.read(value) if spec.read is not None else value
    return config_class(**values)


def config_to_argv(config: object) -> list[str]:
    """The flags that make `config_from_namespace` (after a parser from `add_flags`) rebuild `config`."""
    argv: list[str] = []
    config_class = type(config)
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, field.name)
        spec = flag_of(field)
        if nested_class(config_class, field) is not None:
            argv += config_to_argv(value)
            continue
        if spec is None:
            continue
        name = flag_name(field)
        if _is_bool(config_class, field) and not spec.optional_value:
            if value is not None and (value or default_of(field) is not False):
                argv.append(name if value else "--no-" + name[2:])
        elif value is None:
            if spec.none is not None:
                argv += [name, spec.none]
        else:
            argv += [name, spec.format(value)]
    return argv


# -- readers and writers for the usual kinds of value ---------------------------------------------------


def number_text(value: float | int) -> str:
    """A number written so that reading it back gives the same number (`repr`: 0.003, 1e-05)."""
    return repr(value)


def boolean_text(value: bool) -> str:
    return "true" if value else "false"


TRUE_WORDS = ("true", "yes", "1", "on")
FALSE_WORDS = ("false", "no", "0", "off")


def read_boolean(text: str) -> bool:
    """`true`/`false` (and yes/no, 1/0, on/off), for argparse: a usage error otherwise."""
    if text.lower() in TRUE_WORDS:
        return True
    if text.lower() in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
