"""The MLflow model registry, as the gate and `retrain models|lineage|rollback|serve` use it.

Aliases carry the state: `champion` is the version in service and `previous` the one it replaced. Each
version carries its lineage as `retrain.*` tags (see training/gate/lineage.py) and its weights' sha256, which
is checked whenever a version is loaded. A version is a pyfunc model (training/gate/pyfunc_model.py) logged
into the candidate's training run, so the version's source run is the one with its loss curves and metrics.
Reads and tag/alias writes go through an MlflowClient bound to an explicit store; logging a model goes
through MLflow's module-level API, pointed at the same store for the duration of the call only.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from core.errors import InputError, RetrainError
from core.names import check_model_name
from core.secrets import displayable_url, mask_secrets, mask_secrets_in
from core.task_ref import parse_task_ref
from training.engine.outputs import weights_sha256
from training.gate.lineage import WEIGHTS_SHA256
from training.local_state import (
    artifacts_beside,
    default_mlflow_artifact_location,
    default_mlflow_tracking_uri,
)
from training.mlflow_names import keyed, record_renamed, version_tags

if TYPE_CHECKING:
    from training.gate.pyfunc_model import Rebuilt, ServedModel

log = logging.getLogger(__name__)

CHAMPION = "champion"
PREVIOUS = "previous"
MODEL_ARTIFACT = "model"
ARTIFACTS_FOLDER = "artifacts"  # pyfunc_model.ARTIFACTS_FOLDER: model.pt, the task file and the lineage files
MODEL_FILE_NAME = "model.pt"
DEFAULT_EXPERIMENT = "retrain"
_ERROR_CHARS = 300
_MLFLOW_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


class RegistryError(RetrainError):
    """The registry cannot be read or changed: an unreachable store, a missing version."""


class ModelLoadError(RetrainError):
    """A registered version whose model cannot be loaded, or whose weights are not the ones registered."""


def displayable_uri(uri: str) -> str:
    """`uri` without user info or query: where a password or token could hide."""
    return displayable_url(uri)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return mask_secrets(lines[0] if lines else type(error).__name__)[:_ERROR_CHARS]


@dataclass(frozen=True)
class MlflowStore:
    """Where MLflow keeps runs and the registry, and where new experiments put their artifacts."""

    tracking_uri: str
    artifact_location: str | None = None

    def __post_init__(self) -> None:
        if not self.tracking_uri.strip() or self.tracking_uri.strip().lower() == "off":
            raise InputError(
                f"--mlflow-tracking-uri {self.tracking_uri!r}: the champion lives in the MLflow registry, so "
                "this command needs one; give a tracking URI or leave the option out for the local store"
            )


def resolve_store(option: str | None, environ: Mapping[str, str], state_root: Path) -> MlflowStore:
    """`--mlflow-tracking-uri`, else $MLFLOW_TRACKING_URI (Azure ML sets the workspace's), else the SQLite
    store in the local state folder, the same one `retrain train` tracks to."""
    if option is not None:
        return MlflowStore(option, artifacts_beside(option))
    if environ.get("MLFLOW_TRACKING_URI"):
        return MlflowStore(environ["MLFLOW_TRACKING_URI"])
    state_root.mkdir(parents=True, exist_ok=True)
    return MlflowStore(default_mlflow_tracking_uri(state_root), default_mlflow_artifact_location(state_root))


@dataclass(frozen=True)
class VersionInfo:
    model_name: str
    version: str
    aliases: tuple[str, ...]
    tags: Mapping[str, str]
    run_id: str | None
    source: str
    created_ms: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))

    @property
    def weights_sha256(self) -> str | None:
        return self.tags.get(WEIGHTS_SHA256)

    @property
    def uri(self) -> str:
        return f"models:/{self.model_name}/{self.version}"


@contextmanager
def _registry_errors(action: str, store: MlflowStore) -> Iterator[None]:
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as error:
        raise RegistryError(
            f"cannot {action} in the MLflow registry at {displayable_uri(store.tracking_uri)}: "
            f"{_first_line(error)}"
        ) from error


def _is_missing(error: BaseException) -> bool:
    from mlflow.exceptions import MlflowException

    return isinstance(error, MlflowException) and error.error_code == "RESOURCE_DOES_NOT_EXIST"


class ModelRegistry:
    """Registered models in one MLflow store."""

    def __init__(self, store: MlflowStore) -> None:
        from training.mlflow_setup import mlflow_client

        self.store = store
        self._client = mlflow_client(store.tracking_uri, registry_uri=store.tracking_uri)

    # -- reading -------------------------------------------------------------------------------------------

    def aliases(self, name: str) -> dict[str, str]:
        """alias -> version of the registered model `name`; {} when it has not been registered yet."""
        from mlflow.exceptions import MlflowException

        with _registry_errors(f"read model {name!r}", self.store):
            try:
                model = self._client.get_registered_model(name)
            except MlflowException as error:
                if _is_missing(error):
                    return {}
                raise
        return {alias: str(version) for alias, version in model.aliases.items()}

    def alias_holder(self, name: str, alias: str) -> VersionInfo | None:
        version = self.aliases(name).get(alias)
        return None if version is None else self.version(name, version)

    def version(self, name: str, version: str) -> VersionInfo:
        from mlflow.exceptions import MlflowException

        with _registry_errors(f"read {name} v{version}", self.store):
            try:
                found = self._client.get_model_version(name, version)
            except MlflowException as error:
                if _is_missing(error):
                    raise RegistryError(
                        f"model {name!r} has no version {version!r}; `retrain models --model-name {name}` "
                        "lists its versions"
                    ) from None
                raise
        return self._info(found, self.aliases(name))

    def model_names(self) -> list[str]:
        """Every registered model's name, sorted."""
        names: list[str] = []
        with _registry_errors("list the registered models", self.store):
            token = None
            while True:
                page = self._client.search_registered_models(max_results=1000, page_token=token)
                names += [model.name for model in page]
                token = page.token
                if not token:
                    return sorted(names)

    def versions(self, name: str) -> list[VersionInfo]:
        """Every version of `name`, newest first; [] when it has not been registered yet."""
        aliases = self.aliases(name)
        with _registry_errors(f"list the versions of {name!r}", self.store):
            found = self._client.search_model_versions(f"name = '{check_model_name(name, '--model-name')}'")
        infos = [self._info(version, aliases) for version in found]
        return sorted(infos, key=lambda info: int(info.version), reverse=True)

    def _info(self, version: Any, aliases: Mapping[str, str]) -> VersionInfo:
        number = str(version.version)
        return VersionInfo(
            model_name=version.name,
            version=number,
            aliases=tuple(sorted(alias for alias, holder in aliases.items() if holder == number)),
            tags=dict(version.tags or {}),
            run_id=version.run_id or None,
            source=version.source,
            created_ms=int(version.creation_timestamp or 0),
        )

    def load_model(self, info: VersionInfo) -> Rebuilt:
        """The version's model rebuilt from its model.pt by its task, after checking its weights are the
        ones registered. A file task is loaded from the copy registered with the model."""
        from training.engine.outputs import read_model_payload
        from training.gate.pyfunc_model import rebuild

        expected = info.weights_sha256
        if not expected:
            raise ModelLoadError(f"{info.uri} has no {WEIGHTS_SHA256} tag, so its weights cannot be verified")
        try:
            with tempfile.TemporaryDirectory(prefix="retrain-model-") as scratch:
                folder = self.download_model_file(info, ARTIFACTS_FOLDER, Path(scratch))
                model_file = folder / MODEL_FILE_NAME
                ref = parse_task_ref(str(read_model_payload(model_file)["task"]), Path.cwd())
                rebuilt = rebuild(model_file, folder / ref.path.name if ref.path is not None else None)
            actual = weights_sha256(rebuilt.model)
        except Exception as error:  # whatever breaks a load, the version cannot serve as a champion
            raise ModelLoadError(f"{info.uri} cannot be loaded: {_first_line(error)}") from error
        if actual != expected:
            raise ModelLoadError(
                f"{info.uri} has weights {actual[:12]}, not the registered {expected[:12]}; "
                "its artifacts were changed"
            )
        return rebuilt

    def download_model_file(self, info: VersionInfo, relative_path: str, folder: Path) -> Path:
        """One file of the version's model artifacts, copied into `folder`."""
        import mlflow.artifacts

        with _registry_errors(f"download {relative_path} of {info.uri}", self.store), self._fluent_store():
            return Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{info.uri}/{relative_path}",
                    dst_path=str(folder),
                    tracking_uri=self.store.tracking_uri,
                )
            )

    # -- runs ----------------------------------------------------------------------------------------------

    def load_served(self, name: str, alias: str = CHAMPION) -> Any:
        """The version holding `alias`, loaded as any MLflow client loads it: `mlflow.pyfunc.load_model(
        "models:/NAME@ALIAS")`, answering what callers have (training/gate/model_from_code.py)."""
        import mlflow.pyfunc

        with _registry_errors(f"load {name}@{alias} for serving", self.store), self._fluent_store():
            return mlflow.pyfunc.load_model(f"models:/{name}@{alias}")

    def run_exists(self, run_id: str | None) -> bool:
        from mlflow.exceptions import MlflowException

        if not run_id:
            return False
        with _registry_errors(f"read run {run_id}", self.store):
            try:
                self._client.get_run(run_id)
            except MlflowException as error:
                if _is_missing(error):
                    return False
                raise
        return True

    def tag_run(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        with _registry_errors(f"tag run {run_id}", self.store):
            masked, renamed = keyed(mask_secrets_in(tags))  # a lineage tag may quote a location
            record_renamed(self._client, run_id, renamed)
            self._client.log_batch(run_id, tags=[RunTag(key, value) for key, value in masked.items()])

    def log_run_results(self, run_id: str, metrics: Mapping[str, float], files: Sequence[Path]) -> None:
        import time

        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        logged, renamed = keyed(metrics)  # a user task's metric may have any name
        entries = [Metric(key, float(value), timestamp, 0) for key, value in sorted(logged.items())]
        with _registry_errors(f"log results to run {run_id}", self.store):
            record_renamed(self._client, run_id, renamed)
            self._client.log_batch(run_id, metrics=entries)
            for path in files:
                self._client.log_artifact(run_id, str(path))

    # -- changing ------------------------------------------------------------------------------------------

    def register(self, request: NewVersion) -> VersionInfo:
        """Log the serving model into the candidate's training run (or, when that run is not in this store,
        a register run of its own) and make it a new version of the model."""
        import mlflow

        from training.gate.pyfunc_model import log_served_model

        # All of it against this store: creating the version looks the logged model up through MLflow's
        # module-level tracking URI, not the client's.
        with (
            _registry_errors(f"register a version of {request.model_name!r}", self.store),
            self._fluent_store(),
        ):
            training_run = request.training_run_id if self.run_exists(request.training_run_id) else None
            if training_run is None:
                log.info(
                    "the candidate's training run %s is not in this store; logging the model in a register "
                    "run of its own, which has no training metrics",
                    request.training_run_id or "(none recorded)",
                )
                run = mlflow.start_run(
                    experiment_id=self._experiment_id(request.experiment), run_name=request.run_name
                )
            else:
                run = mlflow.start_run(run_id=training_run)
            with run:  # ends the run FINISHED, or FAILED on any exception: never left RUNNING
                if training_run is None:
                    run_tags, renamed = keyed(mask_secrets_in(request.run_tags))
                    record_renamed(self._client, run.info.run_id, renamed)
                    mlflow.set_tags(run_tags)
                logged = log_served_model(request.served, MODEL_ARTIFACT)
            self._ensure_registered_model(request.model_name)
            created = self._client.create_model_version(
                request.model_name,
                logged.model_uri,
                run_id=logged.run_id,
                tags=version_tags(mask_secrets_in(request.tags)),  # a lineage tag may quote a location
                model_id=logged.model_id,
            )
        log.info("registered %s v%s from %s", request.model_name, created.version, logged.model_uri)
        return self.version(request.model_name, str(created.version))

    def set_alias(self, name: str, alias: str, version: str) -> None:
        with _registry_errors(f"point alias {alias!r} of {name!r} at v{version}", self.store):
            self._client.set_registered_model_alias(name, alias, version)

    def remove_alias(self, name: str, alias: str) -> None:
        with _registry_errors(f"remove alias {alias!r} of {name!r}", self.store):
            self._client.delete_registered_model_alias(name, alias)

    def tag_version(self, name: str, version: str, tags: Mapping[str, str]) -> None:
        with _registry_errors(f"tag {name} v{version}", self.store):
            existing = self._client.get_model_version(name, version).tags
            for key, value in version_tags(mask_secrets_in(tags), existing).items():
                self._client.set_model_version_tag(name, version, key, value)

    def _ensure_registered_model(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self._client.create_registered_model(name)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    def _experiment_id(self, name: str) -> str:
        from training.mlflow_setup import experiment_id

        return experiment_id(self._client, name, self.store.artifact_location)

    @contextmanager
    def _fluent_store(self) -> Iterator[None]:
        """Point MLflow's module-level API at this store, and back when done.

        `mlflow.set_tracking_uri` also exports MLFLOW_TRACKING_URI (and the registry's its variable), so the
        variables are put back as they were: a default URI left in the environment would send every
        process started later, a pipeline step included, to the working directory's store."""
        import mlflow

        # Unset before (MLflow's default, or the environment's), unset after: pinning the default would
        # make MLflow ignore a tracking URI exported later in this process.
        was_set = mlflow.is_tracking_uri_set() and not os.environ.get("MLFLOW_TRACKING_URI")
        tracking = mlflow.get_tracking_uri() if was_set else None
        registry = mlflow.get_registry_uri() if was_set else None
        exported = {name: os.environ.get(name) for name in _MLFLOW_URI_VARIABLES}
        mlflow.set_tracking_uri(self.store.tracking_uri)
        mlflow.set_registry_uri(self.store.tracking_uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(tracking)
            mlflow.set_registry_uri(registry)
            for name, value in exported.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@dataclass(frozen=True)
class NewVersion:
    """A model to register: what serves (model file, task, input example, files kept beside it), its
    version tags, and the training run to log it into."""

    model_name: str
    served: ServedModel
    tags: Mapping[str, str]
    training_run_id: str | None = None
    experiment: str = DEFAULT_EXPERIMENT
    run_name: str | None = None
    run_tags: Mapping[str, str] = field(default_factory=dict)  # on a register run, when one is needed

    def __post_init__(self) -> None:
        check_model_name(self.model_name, "--model-name")
