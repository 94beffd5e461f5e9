"""The arrows between the three rooms point one way only (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str) -> list[tuple[str, str, bool]]:
    """(file, imported module, imported at module level) for every import in a package."""
    found = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            else:
                continue
            file = path.relative_to(REPO_ROOT).as_posix()
            found += [(file, module, id(node) in top_level) for module in modules]
    return found


def _offenders(package: str, forbidden: tuple[str, ...], module_level_only: bool = False) -> list[str]:
    return [
        f"{file} imports {module}"
        for file, module, at_module_level in _imports(package)
        if any(module == name or module.startswith(f"{name}.") for name in forbidden)
        if at_module_level or not module_level_only
    ]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("function_app", ("torch", "mlflow", "training")),
        ("components", ("torch", "mlflow", "function_app", "training")),
        ("training", ("function_app", "components", "azure.functions", "azure.eventgrid", "azure.ai.ml")),
    ],
)
def test_rooms_import_only_downstream(package, forbidden):
    assert _offenders(package, forbidden) == []


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
