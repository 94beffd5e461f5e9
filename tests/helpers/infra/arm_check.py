"""Checks each resource body of a .bicep file against the REST model of its type and API version.

Keys are checked exactly (Bicep's types are case-sensitive, and an unknown key is dropped by most resource
providers without a word). Values: an expression (a reference, a function call, an operator) stands for
whatever the model expects, and is not looked into, except the branches of `a ? b : c` and `a ?? b`, which
are values of the same type; object literals are walked wherever they are, in arrays and loops too.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from helpers.infra.arm_models import (
    DictOf,
    ListOf,
    ObjectSchema,
    Scalar,
    Schema,
    UnmodelledResource,
    model_for,
    resolve,
)
from helpers.infra.bicep_source import BICEP_ONLY_KEYS, BicepFile, BicepResource


@dataclass(frozen=True)
class Finding:
    resource: BicepResource
    path: str
    message: str

    def __str__(self) -> str:
        r = self.resource
        where = f"{r.file}:{r.line}: resource {r.symbol} ({r.type}@{r.api_version})"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


def check_file(bicep: BicepFile) -> list[Finding]:
    findings: list[Finding] = []
    for resource in bicep.resources():
        findings.extend(check_resource(resource, bicep.symbols))
    return findings


def check_resource(resource: BicepResource, symbols: frozenset[str]) -> Iterator[Finding]:
    if resource.existing:
        return  # a reference to a resource deployed elsewhere: its body is only `name`/`scope`
    try:
        schema = model_for(resource.type, resource.api_version)
    except UnmodelledResource as exc:
        yield Finding(resource, "", str(exc))
        return
    body = {k: v for k, v in resource.body.items() if k not in BICEP_ONLY_KEYS}
    walker = _Walker(resource, symbols)
    yield from walker.object(body, schema, "")


_SCALAR_OF_LITERAL = {bool: "bool", int: "int", float: "float", str: "str"}
_COMPATIBLE = {
    "str": {"str"},
    "int": {"int", "float"},
    "float": {"float"},
    "bool": {"bool"},
}


class _Walker:
    def __init__(self, resource: BicepResource, symbols: frozenset[str]) -> None:
        self.resource = resource
        self.symbols = symbols

    def finding(self, path: str, message: str) -> Finding:
        return Finding(self.resource, path, message)

    def is_reference(self, value: Any) -> bool:
        """A bare identifier (pycep gives it as a string, like a literal) or an interpolated string."""
        return isinstance(value, str) and (value in self.symbols or "${" in value)

    def value(self, value: Any, schema: Schema, path: str) -> Iterator[Finding]:
        schema = resolve(schema)
        if value is None:
            return  # null: "not set"
        if _is_expression(value):
            yield from self.branches(value, schema, path)
            return
        if _is_loop(value):  # `[for x in xs: {...}]` as a property's value: an array of the body
            if isinstance(schema, ListOf):
                yield from self.value(value["config"], schema.item, f"{path}[for]")
            elif not (isinstance(schema, Scalar) and schema.kind == "any"):
                yield self.finding(path, f"is a [for ...] array, but {_describe(schema)} is expected")
            return
        if isinstance(schema, Scalar) and schema.kind == "any":
            return
        if isinstance(value, dict):
            if isinstance(schema, ObjectSchema):
                yield from self.object(value, schema, path)
            elif isinstance(schema, DictOf):
                for key, item in value.items():
                    yield from self.value(item, schema.value, f"{path}.{key}")
            else:
                yield self.finding(path, f"is an object, but {_describe(schema)} is expected")
            return
        if isinstance(value, list):
            if isinstance(schema, ListOf):
                for index, item in enumerate(value):
                    yield from self.value(item, schema.item, f"{path}[{index}]")
            else:
                yield self.finding(path, f"is an array, but {_describe(schema)} is expected")
            return
        if self.is_reference(value):
            return
        if not isinstance(schema, Scalar):
            yield self.finding(path, f"is the literal {value!r}, but {_describe(schema)} is expected")
            return
        literal = _SCALAR_OF_LITERAL.get(type(value), "str")
        if schema.kind not in _COMPATIBLE[literal]:
            yield self.finding(path, f"is the literal {value!r}, but a {schema.kind} is expected")

    def branches(self, expression: dict[str, Any], schema: Schema, path: str) -> Iterator[Finding]:
        operator = expression.get("operator")
        if not isinstance(operator, dict):
            return
        operands = operator.get("operands", {})
        if operator.get("type") == "conditional":
            for branch in ("true_value", "false_value"):
                yield from self.value(operands.get(branch), schema, path)
        elif operator.get("type") == "coalesce":
            for operand in operands.values():
                yield from self.value(operand, schema, path)
        else:
            # pycep binds `a == b ? x : y` as `a == (b ? x : y)`: the conditional's branches are still values
            for operand in operands.values():
                if _is_expression(operand) and operand.get("operator", {}).get("type") == "conditional":
                    yield from self.branches(operand, schema, path)

    def object(self, value: dict[str, Any], schema: ObjectSchema, path: str) -> Iterator[Finding]:
        if schema.discriminator is not None:
            yield from self.polymorphic(value, schema, path)
            return
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            fld = schema.fields.get(key)
            if fld is None:
                if not schema.open:
                    yield self.finding(where, _unknown(key, schema))
                continue
            if fld.read_only:
                yield self.finding(where, f"is read-only in {schema.name}: the resource provider sets it")
                continue
            yield from self.value(item, fld.schema, where)

    def polymorphic(self, value: dict[str, Any], schema: ObjectSchema, path: str) -> Iterator[Finding]:
        """Checks the body against the variant its discriminator names (which may be polymorphic again)."""
        assert schema.discriminator is not None
        tag = value.get(schema.discriminator)
        where = f"{path}.{schema.discriminator}" if path else schema.discriminator
        variants = {name: thunk() for name, thunk in schema.subtypes.items()}
        variants = {name: v for name, v in variants.items() if v is not schema}
        if tag is None:
            yield self.finding(where, f"is missing: {schema.name} needs it to be one of {sorted(variants)}")
            return
        if not isinstance(tag, str) or self.is_reference(tag) or _is_expression(tag):
            # chosen at deployment: the body must fit one variant; report against the one it fits best
            attempts = [list(self.object(value, variant, path)) for variant in variants.values()]
            yield from min(attempts, key=len, default=[])
            return
        if tag not in variants:
            near = difflib.get_close_matches(tag, variants, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            yield self.finding(
                where, f"{tag!r} is not a variant of {schema.name}: one of {sorted(variants)}{hint}"
            )
            return
        yield from self.object(value, variants[tag], path)


def _unknown(key: str, schema: ObjectSchema) -> str:
    known = [name for name, fld in schema.fields.items() if not fld.read_only]
    near = [name for name in known if name.lower() == key.lower()]
    near += [n for n in difflib.get_close_matches(key, known, n=3, cutoff=0.6) if n not in near]
    hint = f"; nearest: {', '.join(near)}" if near else f"; known: {', '.join(sorted(known))}"
    return f"is not a property of {schema.name}{hint}"


def _describe(schema: Schema) -> str:
    schema = resolve(schema)
    if isinstance(schema, ObjectSchema):
        return f"an object ({schema.name})"
    if isinstance(schema, ListOf):
        return f"an array of {_describe(schema.item)}"
    if isinstance(schema, DictOf):
        return "an object of name: value pairs"
    return f"a {schema.kind}"


def _is_expression(value: Any) -> bool:
    """pycep's shape for a function call or an operator (references and accessors are operators)."""
    if not isinstance(value, dict) or len(value) != 1:
        return False
    ((key, inner),) = value.items()
    return key in ("function", "operator") and isinstance(inner, dict) and "type" in inner


def _is_loop(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"loop_type", "condition", "config"}
