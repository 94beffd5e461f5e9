"""Register the training environment and the components in a workspace, at the versions in their YAMLs.

The environment goes first, because every component names it (`azureml:retrain-training:<version>`). A
component that names another environment version than environment.yml's is refused before anything is
registered: publishing half a release would leave the workspace with components that do not run. The
three computes (components/compute/*.yml) are created or updated on request.

Publishing is planned whole before anything is sent (`plan_publish`): every YAML loaded and validated by
azure-ai-ml, each component's code staged, so a bad file refuses the release offline, and `retrain publish
--dry-run` shows the same plan (`write_publish_documents`) without sending it.

Each component's code is uploaded from a staged snapshot of its `code` folder
(components/azureml/code_snapshot.py), written once per publish: exactly the files `.amlignore` keeps, so
azure-ai-ml's walk of the folder does not cross the checkout's `.venv` and `node_modules`.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.azureml.code_snapshot import stage_code_snapshot
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
from core.files import write_atomically
from core.secrets import mask_secrets

if TYPE_CHECKING:
    from components.azureml.workspace import AssetRecord, AzureMLWorkspace

log = logging.getLogger(__name__)

ENVIRONMENT, COMPONENT, COMPUTE = "environment", "component", "compute"


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


@dataclass(frozen=True)
class PublishStep:
    """One registration: what it registers, the YAML it comes from, and the azure-ai-ml entity it sends
    (loaded and validated, a component's `code` pointing at its staged snapshot)."""

    kind: str  # ENVIRONMENT, COMPONENT or COMPUTE
    name: str
    version: str | None
    source: Path
    entity: Any

    @property
    def reference(self) -> str:
        return f"{self.name}:{self.version}" if self.version else self.name

    @property
    def verb(self) -> str:
        return "create or update" if self.kind == COMPUTE else "register"

    def send(self, workspace: AzureMLWorkspace) -> AssetRecord:
        create: dict[str, Callable[[Any], AssetRecord]] = {
            ENVIRONMENT: workspace.create_environment,
            COMPONENT: workspace.create_component,
            COMPUTE: workspace.create_compute,
        }
        return create[self.kind](self.entity)


def plan_publish(
    scratch: Path,
    *,
    computes: bool = False,
    components_dir: Path = COMPONENTS_DIR,
    environment_file: Path = ENVIRONMENT_FILE,
) -> list[PublishStep]:
    """What publishing registers, in order: the environment, each component (its code staged under
    `scratch`, once per code folder), then the computes when asked. Reads no workspace and sends nothing."""
    from azure.ai.ml import load_component, load_compute, load_environment

    environment = environment_reference(environment_file)
    specs = [load_component_spec(path) for path in component_files(components_dir)]
    check_components(specs, environment)
    loaded = load_environment(source=environment_file)
    steps = [PublishStep(ENVIRONMENT, str(loaded.name), loaded.version, environment_file, loaded)]
    staged: dict[Path, Path] = {}  # a component's code folder -> its snapshot, staged once
    for spec in specs:
        component = load_component(source=spec.path)
        if spec.code not in staged:
            staged[spec.code] = stage_code_snapshot(None, Path(scratch), spec.code)
        component.code = str(staged[spec.code])
        steps.append(PublishStep(COMPONENT, str(component.name), component.version, spec.path, component))
    if computes:
        for path in COMPUTE_FILES.values():
            compute = load_compute(source=path)
            steps.append(PublishStep(COMPUTE, str(compute.name), None, path, compute))
    return steps


def publish(
    workspace: AzureMLWorkspace,
    *,
    computes: bool = False,
    components_dir: Path = COMPONENTS_DIR,
    environment_file: Path = ENVIRONMENT_FILE,
) -> list[AssetRecord]:
    """Register the environment, then each component; then the computes when asked. Returns what was
    registered, in order."""
    with tempfile.TemporaryDirectory(prefix="retrain-code-") as scratch:
        steps = plan_publish(
            Path(scratch), computes=computes, components_dir=components_dir, environment_file=environment_file
        )
        records = []
        for step in steps:
            records.append(step.send(workspace))
            log.info("published %s %s", step.kind, step.reference)
        return records


def document_name(step: PublishStep) -> str:
    return f"{step.kind}-{step.reference.replace(':', '-')}.yml"


def write_publish_documents(steps: Sequence[PublishStep], folder: Path) -> list[Path]:
    """Each step's entity as the YAML azure-ai-ml serializes it (what publishing would send, less secrets),
    one file per step in `folder`; the folder's other documents, from an earlier plan, are removed so that
    it holds this plan alone. Returns the files, in the steps' order."""
    written = []
    for step in steps:
        path = Path(folder) / document_name(step)
        # azure-ai-ml serializes some entities as OrderedDicts, which yaml.safe_dump refuses.
        document = json.loads(json.dumps(step.entity._to_dict(), default=str))
        write_atomically(path, mask_secrets(yaml.safe_dump(document, sort_keys=False)).encode())
        written.append(path)
    for stale in set(Path(folder).glob("*.yml")) - set(written):
        stale.unlink(missing_ok=True)
    return written
