r"""Turn a component's `command:` line into an argument vector, as Azure ML does before running it.

`${{inputs.NAME}}` and `${{outputs.NAME}}` become the input's value or path and the output's path. An
optional part `$[[ ... ]]` is kept only when every input it references is set; otherwise the whole part is
dropped. The line is then split as a POSIX shell splits it (Azure ML runs it in one), but no shell ever
runs it: a value is quoted for where it stands, so that it becomes exactly its own text. Outside quotes it
is shell-quoted (a path with spaces stays one argument); between the command's own single quotes
(`--task-options '${{inputs.task_options}}'`, where a shell would otherwise expand braces or `*`) a single
quote in it is closed, escaped and reopened; between double quotes, `"` and `\` are escaped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.errors import SpecError

_REFERENCE = re.compile(r"\$\{\{\s*(inputs|outputs)\.(\w+)\s*\}\}")
_OPTIONAL_PART = re.compile(r"\$\[\[(.*?)\]\]")
_LEFTOVER_EXPRESSION = re.compile(r"\$\{\{|\$\[\[")


def format_value(value: Any) -> str:
    """How a value appears on the command line and in the cache key: Python's own spelling (as Azure ML
    renders it), so the parameter `2` and the string `"2"` are the same value."""
    return str(value)


def _referenced_inputs(text: str) -> list[str]:
    return [name for kind, name in _REFERENCE.findall(text) if kind == "inputs"]


def _drop_unset_optional_parts(command: str, inputs: Mapping[str, Any]) -> str:
    def keep_if_set(match: re.Match[str]) -> str:
        part = match[1]
        return "" if any(inputs.get(name) is None for name in _referenced_inputs(part)) else part

    return _OPTIONAL_PART.sub(keep_if_set, command)


def _quote_state(text: str, state: str | None) -> str | None:
    """The shell quoting in force after `text`, starting in `state` (None, "'" or '"')."""
    index = 0
    while index < len(text):
        char = text[index]
        if state == "'":
            state = None if char == "'" else state
        elif char == "\\":
            index += 1  # the next character is escaped, outside quotes and between double quotes alike
        elif state == '"':
            state = None if char == '"' else state
        elif char in ("'", '"'):
            state = char
        index += 1
    return state


def _quoted(value: str, state: str | None) -> str:
    if state == "'":
        return value.replace("'", "'\"'\"'")
    if state == '"':
        return value.replace("\\", "\\\\").replace('"', '\\"')
    return shlex.quote(value)


def _substitute_quoted(text: str, value_of: Callable[[re.Match[str]], str]) -> str:
    parts: list[str] = []
    state: str | None = None
    position = 0
    for match in _REFERENCE.finditer(text):
        state = _quote_state(text[position : match.start()], state)
        parts += [text[position : match.start()], _quoted(value_of(match), state)]
        position = match.end()
    parts.append(text[position:])
    return "".join(parts)


def render_command(
    command: str, inputs: Mapping[str, Any], outputs: Mapping[str, str | Path], step: str
) -> list[str]:
    """The argument vector of `command` with `inputs` (None: unset) and `outputs` substituted."""

    def substitute(match: re.Match[str]) -> str:
        kind, name = match[1], match[2]
        declared = inputs if kind == "inputs" else outputs
        if name not in declared:
            raise SpecError(
                f"step '{step}': its command uses ${{{{{kind}.{name}}}}}, which the component does not "
                "declare"
            )
        value = declared[name]
        if value is None:
            raise SpecError(
                f"step '{step}': its command uses input '{name}', which is unset, outside an optional "
                "$[[...]] part; make the input required or wrap its use in $[[...]]"
            )
        return format_value(value)

    text = _substitute_quoted(_drop_unset_optional_parts(command, inputs), substitute)
    if _LEFTOVER_EXPRESSION.search(text):
        raise SpecError(
            f"step '{step}': its command has an expression the local runner cannot resolve ({command!r}); "
            "expected only ${{inputs.NAME}}, ${{outputs.NAME}} and $[[...]] parts"
        )
    try:
        return shlex.split(text)
    except ValueError as error:
        raise SpecError(f"step '{step}': its command cannot be split into arguments ({error})") from None
