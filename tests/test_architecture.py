"""The arrows between the three rooms point one way only (docs/architecture.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# core/ is the vocabulary every room speaks (model names, task references, data versions, blob URLs and
# masking, files written whole, the storage seam, the one error root): each room may import it, and it
# imports no room. The Function App ships it whole and nothing of training/ (.funcignore).
CORE_MAY_IMPORT = ("core", "azure.core", "azure.storage.blob", "azure.identity")


def _file_imports(path: Path) -> list[tuple[str, str, bool]]:
    """(file, imported module, imported at module level) for every import in one file; a relative import
    is resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    file = path.relative_to(REPO_ROOT).as_posix()
    package = path.parent.relative_to(REPO_ROOT).parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[: len(package) - node.level + 1]
            modules = [".".join((*base, node.module)) if node.module else ".".join(base)]
        else:
            continue
        found += [(file, module, id(node) in top_level) for module in modules]
    return found


def _imports(package: str) -> list[tuple[str, str, bool]]:
    """(file, imported module, imported at module level) for every import in a package."""
    return [found for path in sorted((REPO_ROOT / package).rglob("*.py")) for found in _file_imports(path)]


def _within(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in names)


def _offenders(
    package: str, forbidden: tuple[str, ...], module_level_only: bool = False, allowed: tuple[str, ...] = ()
) -> list[str]:
    return [
        f"{file} imports {module}"
        for file, module, at_module_level in _imports(package)
        if _within(module, forbidden) and module not in allowed
        if at_module_level or not module_level_only
    ]


@pytest.mark.parametrize(
    ("package", "forbidden", "allowed"),
    [
        ("function_app", ("torch", "mlflow", "training", "demo"), ()),
        ("components", ("torch", "mlflow", "function_app", "training", "demo"), ()),
        ("training", ("function_app", "components", "demo", "azure.functions", "azure.ai.ml"), ()),
        ("core", ("training", "components", "function_app", "demo", "torch", "mlflow"), ()),
    ],
)
def test_rooms_import_only_downstream(package, forbidden, allowed):
    assert _offenders(package, forbidden, allowed=allowed) == []


def test_nothing_deployed_imports_the_local_stand_ins():
    # function_app/local/ (the CLI, the folder watch, the loopback topic) is left out of the deployment
    # (.funcignore): a deployed module that imported it, even lazily, would fail in Azure.
    deployed = [
        (file, module)
        for file, module, _ in _imports("function_app") + _imports("components")
        if not file.startswith("function_app/local/")
    ]
    assert [
        f"{file} imports {module}" for file, module in deployed if _within(module, ("function_app.local",))
    ] == []


# components/ is one contract and two twins, as core/storage/ is: the root (the request, the specs, the
# parameters, the Submitter protocol and its registry), the Azure ML twin in azureml/ and the local runner in
# local/. The Function App ships no components/local/ (.funcignore), so the root, the Azure ML twin and every
# module of function_app/ reach the local runner only by its name in the registry (components/submitters.py,
# importlib), never by an import, even a lazy one: one would fail in Azure, or ship the runner.
COMPONENTS_ROOT_FILES = tuple(
    path.relative_to(REPO_ROOT).as_posix() for path in sorted((REPO_ROOT / "components").glob("*.py"))
)
TWINS = ("components.azureml", "components.local")


def _files_imports(files: tuple[str, ...]) -> list[tuple[str, str, bool]]:
    return [found for file in files for found in _file_imports(REPO_ROOT / file)]


def _importers_of(found: list[tuple[str, str, bool]], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{file} imports {module}" for file, module, _ in found if _within(module, forbidden)]


def test_nothing_deployed_imports_the_local_runner():
    found = _files_imports(COMPONENTS_ROOT_FILES) + _imports("components/azureml") + _imports("function_app")
    assert _importers_of(found, ("components.local",)) == []


def test_the_contract_imports_neither_twin():
    assert _importers_of(_files_imports(COMPONENTS_ROOT_FILES), TWINS) == []


def test_the_twins_import_each_other_not():
    # What both need is the contract's, in the root.
    assert _importers_of(_imports("components/local"), ("components.azureml",)) == []
    assert _importers_of(_imports("components/azureml"), ("components.local",)) == []


def test_training_uses_event_grid_only_to_publish_a_drift_alert_and_only_lazily():
    # The drift check sends the project's drift event, nothing more: it knows the event's contract (the
    # front door parses a published one in test_local_topic.py), not the front door; and training steps
    # that never publish never load the SDK.
    users = {
        (file, at_module_level)
        for file, module, at_module_level in _imports("training")
        if _within(module, ("azure.eventgrid",))
    }
    assert {file for file, _ in users} == {"training/drift/publish.py"}
    assert not any(at_module_level for _, at_module_level in users)


def test_core_imports_only_the_standard_library_itself_and_the_blob_sdk():
    # core/ is imported by the Function App (no torch, no mlflow) and by every step: besides the standard
    # library it may use itself and the Blob SDK its storage seam's Azure twin speaks (requirements.txt and
    # the training environment both pin it).
    offenders = [
        f"{file} imports {module}"
        for file, module, _ in _imports("core")
        if module.split(".")[0] not in sys.stdlib_module_names and not _within(module, CORE_MAY_IMPORT)
    ]
    assert offenders == []


@pytest.mark.parametrize("package", ["function_app", "components"])
def test_azure_ml_is_imported_only_lazily(package):
    # The Function App imports components/ to build and submit; azure-ai-ml takes seconds to import.
    assert _offenders(package, ("azure.ai.ml",), module_level_only=True) == []


def test_the_function_app_deploys_without_torch_or_mlflow():
    lines = (REPO_ROOT / "requirements.txt").read_text().splitlines()
    packages = {
        line.split("==")[0].strip().lower() for line in lines if line.strip() and not line.startswith("#")
    }
    assert packages.isdisjoint({"torch", "mlflow", "mlflow-skinny"})
    assert {
        "azure-functions",
        "azure-eventgrid",
        "azure-ai-ml",
        "azure-storage-blob",
        "azure-identity",
    } <= packages


# Inside training/: the engine and everything around it know a task only through the contract
# (training/tasks/base.py) and the loader; a built-in task is no more reachable to them than a user's.
# The planner's measured scaling and `retrain sample-data` name the digits sample on purpose, as data.
BUILT_IN_TASKS = ("training.tasks.tabular", "training.tasks.image")
ENGINE_SIDE = ("engine", "gate", "drift", "checkpoint", "data")


@pytest.mark.parametrize("part", ENGINE_SIDE)
def test_the_engine_side_knows_tasks_only_through_the_contract(part):
    assert _offenders(f"training/{part}", BUILT_IN_TASKS) == []


def test_a_task_never_touches_the_engine_checkpoints_or_the_registry():
    # What a task may use: the contract, the task-agnostic data helpers, the torch-free common helpers.
    forbidden = tuple(f"training.{part}" for part in ("engine", "gate", "drift", "checkpoint", "planning"))
    assert _offenders("training/tasks", forbidden) == []


def test_the_planner_reaches_a_built_in_task_only_for_its_sample_data():
    users = {file for file, module, _ in _imports("training/planning") if _within(module, BUILT_IN_TASKS)}
    assert users <= {"training/planning/measure.py"}


def _module_graph() -> dict[str, set[str]]:
    """Each project module (a file of the rooms, demo/, infra/ or the root) and the project modules it
    imports, anywhere in it (lazily or for type checking too: a circle is one however it is closed). `from
    package import name` imports the submodule `package.name` when there is one, else the package."""
    files = [*REPO_ROOT.glob("*.py")]
    files += [
        f
        for room in ("core", "function_app", "components", "training", "demo", "infra")
        for f in (REPO_ROOT / room).rglob("*.py")
    ]
    modules = {}
    for path in files:
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def project_module(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported |= {project_module(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                imported |= {project_module(f"{base}.{alias.name}") for alias in node.names}
        graph[module] = {name for name in imported if name is not None and name != module}
    return graph


def test_no_two_project_modules_import_each_other_even_through_others():
    graph, circles = _module_graph(), []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            circle = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(circle) > 1:
                circles.append(sorted(circle))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert circles == []
