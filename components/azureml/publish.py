"""Register the training environment and the components in a workspace, at the versions in their YAMLs.

The environment goes first, because every component names it (`azureml:retrain-training:<version>`). A
component that names another environment version than environment.yml's is refused before anything is
registered: publishing half a release would leave the workspace with components that do not run. The
three computes (components/compute/*.yml) are created or updated on request.

Each component's code is uploaded from a staged snapshot of its `code` folder (components/code_snapshot.py),
written once per publish: exactly the files `.amlignore` keeps, so azure-ai-ml's walk of the folder does not
cross the checkout's `.venv` and `node_modules`.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from components.code_snapshot import stage_code_snapshot
from components.errors import SpecError
from components.specs import (
    COMPONENTS_DIR,
    COMPUTE_FILES,
    ENVIRONMENT_FILE,
    PIPELINE_FILE,
    ComponentSpec,
    load_component_spec,
    load_yaml,
)

if TYPE_CHECKING:
    from components.azureml.workspace import AssetRecord, AzureMLWorkspace

log = logging.getLogger(__name__)


def component_files(components_dir: Path = COMPONENTS_DIR) -> list[Path]:
    """Every component YAML: the .yml files beside the pipeline, except the pipeline itself."""
    return sorted(path for path in components_dir.glob("*.yml") if path.name != PIPELINE_FILE.name)


def environment_reference(environment_file: Path = ENVIRONMENT_FILE) -> str:
    document = load_yaml(environment_file)
    if "name" not in document or "version" not in document:
        raise SpecError(f"{environment_file}: expected a 'name' and a 'version'")
    return f"azureml:{document['name']}:{document['version']}"


def check_components(specs: list[ComponentSpec], environment: str) -> None:
    """Every component must run in exactly the environment version being published."""
    for spec in specs:
        if spec.environment != environment:
            raise SpecError(
                f"{spec.path}: environment {spec.environment}; expected {environment} (environment.yml's "
                "version): bump the component's environment when the environment changes"
            )


def publish(
    workspace: AzureMLWorkspace,
    *,
    computes: bool = False,
    components_dir: Path = COMPONENTS_DIR,
    environment_file: Path = ENVIRONMENT_FILE,
) -> list[AssetRecord]:
    """Register the environment, then each component; then the computes when asked. Returns what was
    registered, in order."""
    from azure.ai.ml import load_component, load_compute, load_environment

    environment = environment_reference(environment_file)
    files = component_files(components_dir)
    specs = [load_component_spec(path) for path in files]
    check_components(specs, environment)
    records = [workspace.create_environment(load_environment(source=environment_file))]
    log.info("published environment %s", environment)
    with tempfile.TemporaryDirectory(prefix="retrain-code-") as scratch:
        staged: dict[Path, Path] = {}  # a component's code folder -> its snapshot, staged once
        for spec in specs:
            component = load_component(source=spec.path)
            if spec.code not in staged:
                staged[spec.code] = stage_code_snapshot(None, Path(scratch), spec.code)
            component.code = str(staged[spec.code])
            records.append(workspace.create_component(component))
            log.info("published component %s", spec.reference)
    if computes:
        for path in COMPUTE_FILES.values():
            records.append(workspace.create_compute(load_compute(source=path)))
            log.info("created or updated compute from %s", path.name)
    return records
