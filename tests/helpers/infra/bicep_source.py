"""Reads a .bicep file the way checkov does (pycep-parser) and lists the resources it declares.

pycep gives each resource as `{type, api_version, config}`; a deploy condition or a loop wraps the body one
level deeper (`{condition, config}` / `{loop_type, condition, config}`), and a nested child resource comes
out as its own entry named `parent__child`, with the full type and the parent's API version. Identifiers
and string literals both come out as Python strings, so `symbols` (parameters, variables, resources,
modules, loop variables) is what tells a reference from a literal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lark import UnexpectedInput, v_args
from pycep import BicepParser
from pycep.transformer import BicepToJson
from pycep.validator import BicepValidator

# Keys of a resource body that Bicep itself consumes; they never reach the resource provider's PUT body.
BICEP_ONLY_KEYS = frozenset({"name", "parent", "scope", "dependsOn", "depends_on"})


class BicepParseError(Exception):
    """A .bicep file that pycep cannot read: the message names the file and the line."""


@dataclass(frozen=True)
class BicepResource:
    file: Path
    symbol: str
    type: str
    api_version: str
    line: int
    end_line: int
    body: dict[str, Any]
    existing: bool


@dataclass(frozen=True)
class BicepFile:
    path: Path
    tree: dict[str, Any]
    symbols: frozenset[str]

    def resources(self) -> Iterator[BicepResource]:
        for symbol, attrs in self.tree.get("resources", {}).items():
            body = attrs["config"]
            # `if (cond) {...}` and `[for x in xs: {...}]` wrap the body once; `[for ...: if (c) {...}]` too.
            while (
                isinstance(body, dict) and "config" in body and ("condition" in body or "loop_type" in body)
            ):
                body = body["config"]
            yield BicepResource(
                file=self.path,
                symbol=symbol,
                type=attrs["type"],
                api_version=attrs["api_version"],
                line=attrs.get("__start_line__", 0),
                end_line=attrs.get("__end_line__", 0),
                body=body if isinstance(body, dict) else {},
                existing=attrs["existing"],
            )


class _StrictBicepToJson(BicepToJson):
    """pycep's transformer, refusing an object with a repeated key.

    pycep builds an object with dict(pairs), so of two nested child resources in one body it keeps only the
    last and the first would go unchecked; a repeated property key is an error in Bicep too (BCP025).
    """

    @v_args(meta=True)
    def object(self, meta: Any, args: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in args:
            if key in seen:
                what = (
                    "two nested child resources in one body (pycep keeps only the last): declare them at the "
                    "top level with `parent:`"
                    if key == "__child_resource__"
                    else f"the key {key!r} twice"
                )
                raise BicepParseError(f"line {meta.line}: an object has {what}")
            seen.add(key)
        return dict(args)


_PARSER = BicepParser(add_line_numbers=True)


def parse_bicep(path: Path) -> BicepFile:
    """Parses one file, or raises BicepParseError naming the file and the line."""
    text = path.read_text(encoding="utf-8")
    if not BicepValidator.is_valid(text):
        last = text.rfind("'''")
        raise BicepParseError(
            f"{path}:{text.count(chr(10), 0, last) + 1}: a multi-line string (''') is never closed"
        )
    try:
        tree = _PARSER.lark_parser.parse(text)
        result = _StrictBicepToJson(add_line_numbers=True).transform(tree)
    except UnexpectedInput as exc:
        context = exc.get_context(text).rstrip()
        raise BicepParseError(
            f"{path}:{exc.line}:{exc.column}: pycep cannot parse this:\n{context}"
        ) from None
    except BicepParseError as exc:
        raise BicepParseError(f"{path}: {exc}") from None
    except Exception as exc:  # lark wraps a transformer error in VisitError
        inner = getattr(exc, "orig_exc", exc)
        if isinstance(inner, BicepParseError):
            raise BicepParseError(f"{path}: {inner}") from None
        raise
    return BicepFile(path=path, tree=result, symbols=frozenset(_symbols(result)))


def _symbols(tree: dict[str, Any]) -> Iterator[str]:
    for section in ("parameters", "variables", "resources", "modules", "functions", "types"):
        yield from (name for name in tree.get(section, {}) if not name.startswith("__"))
    for name in tree.get("resources", {}):
        # a nested child `parent__child` is referenced in its parent's body as `child`
        yield name.rsplit("__", 1)[-1]
    yield from _loop_variables(tree)


def _loop_variables(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        loop = node.get("loop_type")
        if isinstance(loop, dict):
            detail = loop.get("detail", {})
            yield from (str(detail[k]) for k in ("item_name", "index_name") if k in detail)
        if node.get("type") == "lambda_expression":
            detail = node.get("detail", {})
            yield from (str(v) for k, v in detail.items() if k.startswith("var_"))
        for value in node.values():
            yield from _loop_variables(value)
    elif isinstance(node, list):
        for value in node:
            yield from _loop_variables(value)
