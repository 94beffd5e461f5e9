"""The flags of a task's options: `--task-options JSON` read and written, and the repeatable
`--task-option KEY=VALUE` every command with `--task-options` takes too.

A config holds one field for a task's options (`--task-options`, one JSON object); the single options are
a command line's convenience, merged over it, so they are a flag without a field.
"""

from __future__ import annotations

import argparse
from typing import Any

from core.flags import Flag, flag
from core.task_ref import options_text

TASK_OPTION_HELP = (
    "one task option (repeatable; VALUE is JSON when it parses, else text), over --task-options"
)


def task_flag(group: str | None = None) -> dict[str, Flag]:
    """`--task REF` of the commands that default to a built-in task (train, prepare)."""
    return flag(
        metavar="REF",
        group=group,
        help="the model's task: tabular, image, path/to/file.py:Attr or package.module:Attr "
        "(default %(default)s)",
    )


def task_options_flag(group: str | None = None, help_text: str | None = None) -> dict[str, Flag]:
    """`--task-options JSON`: one JSON object, read into the options (a one-line error otherwise)."""
    return flag(
        metavar="JSON",
        group=group,
        read=task_options_from_json,
        format=options_text,
        help=help_text or 'the task\'s options as a JSON object, e.g. \'{"label_column": "species"}\'',
    )


def add_task_option_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help_text: str) -> None:
    parser.add_argument("--task-option", action="append", metavar="KEY=VALUE", help=help_text)


def task_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The task options of the flags: --task-option pairs merged over --task-options."""
    # Imported here: the loader imports torch, which `retrain` must not pay for at start-up.
    from training.tasks.loader import options_from_json, parse_task_options

    return {**options_from_json(args.task_options), **parse_task_options(args.task_option)}


def task_options_from_json(text: str | dict[str, Any] | None) -> dict[str, Any]:
    """`--task-options JSON` as options (a dict already read passes), or the loader's one-line refusal."""
    if isinstance(text, dict):
        return text
    # Imported here: the loader imports torch, which `retrain` must not pay for at start-up.
    from training.tasks.loader import options_from_json

    return options_from_json(text)
