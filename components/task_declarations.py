"""What a user's task declares of its raw files, read from its source without running it.

The front door routes a model's landing blobs by its [trigger] suffixes, which default to its task's
`raw_suffixes`. A user's task file imports torch, which the Function App never does (its cold start must
stay fast, and the deployment ships no training code), so the declaration is read the way core/sources.py
finds a task's imports: from the syntax tree, never by importing. `raw_suffixes` is found as Python would
find the class attribute: in the class the reference names (a class, an instance made by calling one, or
another name for one), else in its bases, left to right, each a class of the same module or one imported
from a module of the task's own folder. Its value is a literal list or tuple of text, or a module-level
name bound to one. Whatever only running the code could tell (a factory function, a computed value, a base
class from an installed package) is one line saying so, and the model's configuration then names its
suffixes itself ([trigger] suffixes).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from components.errors import ConfigError
from core.sources import module_sources
from core.task_ref import TaskRef
from core.text import escaped

RAW_SUFFIXES = "raw_suffixes"
# The rule of a [trigger] suffix (components/model_config.py) and a blob scope's (function_app/settings).
SUFFIX = re.compile(r"\.[a-z0-9]{1,10}")
MAX_SOURCE_BYTES = 4 * 1024 * 1024  # far above any task file; a bound on what a start-up reads
_MAX_HOPS = 16  # names, instances and bases followed before giving up (a cycle, or a deep hierarchy)


@dataclass(frozen=True)
class _Module:
    path: Path
    tree: ast.Module

    @property
    def shown(self) -> str:
        """The file's name, as a one-line message shows it."""
        return escaped(self.path.name)

    def top_level(self, name: str) -> ast.stmt | None:
        """The last top-level statement binding `name` (a class, a function, an assignment, an import)."""
        binding = [node for node in self.tree.body if name in _bound_names(node)]
        return binding[-1] if binding else None


def _bound_names(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds, of the kinds a task's class can come from."""
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {target.id for target in node.targets if isinstance(target, ast.Name)}
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.ImportFrom):
        return {alias.asname or alias.name for alias in node.names}
    return set()


def _binds(target: ast.expr, name: str) -> bool:
    return isinstance(target, ast.Name) and target.id == name


class _Unknown(Exception):
    """Why the declaration cannot be read without running the code (the reason, for the caller's line)."""


class _Undeclared(_Unknown):
    """A class whose body, and its bases', assign no such attribute: the next base may."""


def declared_raw_suffixes(reference: TaskRef, search_path: Sequence[str] = ()) -> tuple[str, ...]:
    """The `raw_suffixes` a user's task declares, read from its source (see the module); ConfigError, one
    line naming the task, why it cannot be read and what to write instead. `search_path` is where a module
    task is looked for (the steps' sys.path)."""
    try:
        source = _source_file(reference, search_path)
        suffixes = _class_attribute(_parse(source), reference.attribute, RAW_SUFFIXES, 0)
    except _Unknown as why:
        raise ConfigError(
            f"the raw_suffixes of task {reference.text!r} cannot be read from its code ({why})"
        ) from None
    bad = [suffix for suffix in suffixes if not SUFFIX.fullmatch(suffix)]
    if not suffixes or bad or len(set(suffixes)) != len(suffixes):
        problem = f"holds {bad[0]!r}" if bad else "is empty" if not suffixes else "repeats a suffix"
        raise ConfigError(
            f"the raw_suffixes of task {reference.text!r} {problem}; expected file suffixes such as "
            '(".csv",), lowercase, with the dot'
        )
    return suffixes


def _source_file(reference: TaskRef, search_path: Sequence[str]) -> Path:
    if reference.path is not None:
        return reference.path
    module = reference.module or ""
    sources = module_sources(module, search_path)
    parts = module.split(".")
    for name in (PurePosixPath(*parts[:-1], f"{parts[-1]}.py"), PurePosixPath(*parts, "__init__.py")):
        if name.as_posix() in sources:
            return sources[name.as_posix()]
    raise _Unknown(f"no source of module {module} on this interpreter's path")


def _parse(path: Path) -> _Module:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as error:
        raise _Unknown(f"{escaped(path)} cannot be read: {error.strerror or error}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise _Unknown(f"{escaped(path)} is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB")
    try:
        return _Module(path, ast.parse(data, str(path)))
    except (SyntaxError, ValueError, RecursionError) as error:
        raise _Unknown(f"{escaped(path)} does not parse: {type(error).__name__}") from None


def _class_attribute(module: _Module, name: str, attribute: str, hops: int) -> tuple[str, ...]:
    """`attribute` of the class `name` stands for in `module`, looked up as Python would (see the module)."""
    module, node = _resolved(module, name, hops)
    if not isinstance(node, ast.ClassDef):
        kind = "a function" if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else "not a class"
        raise _Unknown(f"{name} in {module.shown} is {kind}; only running it tells what it makes")
    value = _assigned_in(node, attribute)
    if value is not None:
        return _text_tuple(module, value, f"{node.name}.{attribute}", hops)
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id == "object":
            continue
        if not isinstance(base, ast.Name):
            raise _Unknown(
                f"class {node.name}'s base {ast.unparse(base)} is not a class of the task's folder"
            )
        try:
            return _class_attribute(module, base.id, attribute, hops + 1)
        except _Undeclared:
            continue  # as Python's lookup: the next base
    raise _Undeclared(f"class {node.name} in {module.shown} declares no {attribute}")


def _resolved(module: _Module, name: str, hops: int) -> tuple[_Module, ast.stmt]:
    """The statement that defines what `name` is in `module`: a class or function, following other names,
    instances (`TASK = HouseTask()`) and imports from modules of the same folder."""
    if hops > _MAX_HOPS:
        raise _Unknown(f"{name}: more than {_MAX_HOPS} names, instances or bases followed")
    node = module.top_level(name)
    if node is None:
        raise _Unknown(f"{module.shown} defines no {name} at its top level")
    if isinstance(node, ast.ImportFrom):
        alias = next(alias for alias in node.names if (alias.asname or alias.name) == name)
        return _resolved(_imported(module, node), alias.name, hops + 1)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        value = node.value
        if isinstance(value, ast.Call):
            value = value.func  # an instance: its class holds the class attribute
        if isinstance(value, ast.Name):
            return _resolved(module, value.id, hops + 1)
        raise _Unknown(f"{name} in {module.shown} is made by code; only running it tells what it is")
    return module, node


def _imported(module: _Module, node: ast.ImportFrom) -> _Module:
    """The module of the task's own folder `node` imports from (`from houses import X`, `from .houses ...`);
    anything else (an installed package, Retrain itself) is the environment's, unreadable here."""
    if node.level > 1 or not node.module:
        raise _Unknown(f"{module.shown} imports from {'.' * node.level}{node.module or ''}")
    path = module.path.parent.joinpath(*node.module.split(".")).with_suffix(".py")
    if not path.is_file():
        raise _Unknown(
            f"{module.shown} imports from {node.module}, which is not a module of the task's folder"
        )
    return _parse(path)


def _assigned_in(node: ast.ClassDef, attribute: str) -> ast.expr | None:
    """The value the class body assigns to `attribute` last, or None."""
    value: ast.expr | None = None
    for statement in node.body:
        if isinstance(statement, ast.Assign) and any(_binds(t, attribute) for t in statement.targets):
            value = statement.value
        elif isinstance(statement, ast.AnnAssign) and _binds(statement.target, attribute):
            value = statement.value if statement.value is not None else value
    return value


def _text_tuple(module: _Module, value: ast.expr, what: str, hops: int) -> tuple[str, ...]:
    if isinstance(value, ast.Name):  # a module-level constant: RAW_SUFFIXES = (".csv",)
        node = module.top_level(value.id)
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and hops < _MAX_HOPS:
            return _text_tuple(module, node.value, what, hops + 1)
        raise _Unknown(f"{what} is {value.id}, which {module.shown} does not assign a literal")
    try:
        found = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        raise _Unknown(f"{what} is computed; only running it tells its value") from None
    if not isinstance(found, list | tuple) or not all(isinstance(item, str) for item in found):
        raise _Unknown(f"{what} is {found!r}, not a tuple of suffixes")
    return tuple(found)
