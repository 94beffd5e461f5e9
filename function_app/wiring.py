"""Which ledger, submitter and data pinner the app settings ask for. Heavy SDKs load only when chosen.

Each served model pins its batches from its own landing container: one pinner per model, behind
`ModelPinners`, which the front door calls as one `DataPinner`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from components.data_version import DataManifest
from components.request import DataRef, Submitter
from components.submitters import AZUREML, DRY_RUN, LOCAL, SubmitterContext, open_submitter
from function_app.ledger.ledger import open_ledger
from function_app.pinning import (
    DataPinner,
    DownloadedFolder,
    LandingFolderCopy,
    PinError,
    PlannedSnapshot,
    RegisteredSnapshot,
    Vanished,
)
from function_app.service import FrontDoor, utc_now
from function_app.settings.app import (
    BLOB_ACCOUNT,
    BLOB_CONTAINER,
    PIPELINE_PARAMETERS,
    AppSettings,
    BlobScope,
    SettingsError,
)
from function_app.settings.models import ModelRoute
from function_app.task_check import PreflightTaskCheck


class ModelPinners:
    """A `DataPinner` that pins each model's batch with that model's own pinner."""

    def __init__(self, pinners: Mapping[str, DataPinner]) -> None:
        self._pinners = dict(pinners)

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        return self.pinner(model_name).pin(manifest, model_name)

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        return self.pinner(model_name).folder_manifest(url, suffixes, model_name)

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        return self.pinner(model_name).vanished(manifest, model_name)

    def pinner(self, model_name: str) -> DataPinner:
        """The pinner of `model_name`; a PinError for a model not served here."""
        pinner = self._pinners.get(model_name)
        if pinner is None:
            served = ", ".join(map(repr, self._pinners))
            raise PinError(f"model {model_name!r} is not served here; expected one of {served}")
        return pinner


class NoLandingContainer:
    """The pinner of a model without a landing container: it has no landed blobs to pin."""

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        raise PinError(
            f"model {model_name!r} has no landing container to pin {manifest.version} from; expected "
            f"[trigger] account and container in its file (or {BLOB_ACCOUNT} and {BLOB_CONTAINER})"
        )

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        return ()  # nothing is landed here: `pin` refuses the manifest, naming why

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        raise PinError(
            f"model {model_name!r} has no landing container to list {url} in; expected [trigger] account "
            f"and container in its file (or {BLOB_ACCOUNT} and {BLOB_CONTAINER})"
        )


def landing_container(settings: AppSettings, scope: BlobScope) -> Any:
    """The client of a model's landing container: the emulator's connection string, else the managed
    identity."""
    from azure.storage.blob import BlobServiceClient, ContainerClient

    if settings.storage_connection_string:
        service = BlobServiceClient.from_connection_string(settings.storage_connection_string)
        return service.get_container_client(scope.container)
    from azure.identity import DefaultAzureCredential

    return ContainerClient(scope.endpoint.url, scope.container, credential=DefaultAzureCredential())


def _submitter_and_pinner(
    settings: AppSettings, environ: Mapping[str, str], task_check: PreflightTaskCheck | None
) -> tuple[Submitter, DataPinner]:
    # Jobs and data assets go through one workspace, connected at first use; only Azure ML has one.
    workspace = _workspace(environ) if settings.submitter == AZUREML else None
    # The deployed app carries no training code: its jobs run the components `retrain publish` registered.
    # A local run checks the task as the flush did, with the same kept verdicts: one check per version.
    context = SubmitterContext(
        home=settings.home,
        environ=environ,
        datastore=settings.azureml_datastore,
        registered_components=True,
        preflight=task_check.preflight if task_check is not None else None,
        workspace=workspace,
    )
    submitter = open_submitter(settings.submitter, context)
    if settings.submitter == DRY_RUN:
        return submitter, _planned_snapshots(settings)
    if settings.submitter == AZUREML:
        return submitter, _registered_snapshots(settings, workspace)
    return submitter, _local_copies(settings)


def _workspace(environ: Mapping[str, str]) -> Any:
    from components.azureml.workspace import MLClientWorkspace, WorkspaceRef

    return MLClientWorkspace(WorkspaceRef.from_settings(environ))


def _planned_snapshots(settings: AppSettings) -> DataPinner:
    """The dry run's: pins nothing; a request's own folder is listed in the model's landing container, whose
    client connects only when a listing is asked for. The job's planned snapshot is in the data datastore."""
    return ModelPinners(
        {
            route.name: PlannedSnapshot(
                settings.data_datastore,
                None if route.scope is None else functools.partial(landing_container, settings, route.scope),
                1 if route.scope is None else route.scope.depth,
            )
            for route in settings.models
        }
    )


def _registered_snapshots(settings: AppSettings, workspace: Any) -> DataPinner:
    """Azure ML's: start-up has checked that every model has a landing container (AppSettings). Snapshots are
    copied beside the landed blobs and registered through the data datastore, which each pin checks is on
    that container before copying anything."""
    return _per_model(
        settings,
        lambda scope: RegisteredSnapshot(
            landing_container(settings, scope), workspace, settings.data_datastore, scope.depth
        ),
    )


def _local_copies(settings: AppSettings) -> DataPinner:
    """The local runner's: each batch downloaded into the home, or copied from the landing folder, which
    plays the one served model's prefix (AppSettings refuses it with several models)."""
    if settings.landing_folder is not None:
        [route] = settings.models
        scope = route.scope
        folder_url = f"{scope.container_url}/{scope.prefix}" if scope and scope.prefix else None
        depth = scope.depth if scope else 1
        folder = LandingFolderCopy(settings.landing_folder, settings.home, folder_url, depth)
        return ModelPinners({route.name: folder})
    return _per_model(
        settings,
        lambda scope: DownloadedFolder(landing_container(settings, scope), settings.home, scope.depth),
    )


def _per_model(settings: AppSettings, pinner_for: Callable[[BlobScope], DataPinner]) -> ModelPinners:
    return ModelPinners({route.name: _pinner(route, pinner_for) for route in settings.models})


def _pinner(route: ModelRoute, pinner_for: Callable[[BlobScope], DataPinner]) -> DataPinner:
    return NoLandingContainer() if route.scope is None else pinner_for(route.scope)


def build_front_door(
    settings: AppSettings,
    environ: Mapping[str, str],
    clock: Callable[[], datetime] | None = None,
    submitter: Submitter | None = None,
    on_step: Callable[[str], None] | None = None,
) -> FrontDoor:
    _check_pipeline_parameters(settings)
    ledger = open_ledger(settings.ledger_location.spec, settings.storage_connection_string)
    # Runs train here only with the local submitter: there a user's task is checked before each flush
    # spends anything (function_app/task_check.py); on Azure ML, by the pipeline's first step.
    task_check = PreflightTaskCheck.kept_in(settings.home, environ) if settings.submitter == LOCAL else None
    chosen, pinner = _submitter_and_pinner(settings, environ, task_check)
    return FrontDoor(settings, ledger, submitter or chosen, pinner, clock or utc_now, on_step, task_check)


def _check_pipeline_parameters(settings: AppSettings) -> None:
    """Refuse at start-up, not at every submission, a parameter the pipeline has no input for or whose
    value its input refuses (its type, its `min`/`max` in the component YAML)."""
    if not settings.pipeline_parameters:
        return  # nothing to check: no cold start pays for reading the pipeline's YAMLs
    from components.errors import SubmissionError
    from components.parameters import check_parameter_texts
    from components.specs import load_pipeline_spec

    try:
        check_parameter_texts(load_pipeline_spec(), settings.pipeline_parameters)
    except SubmissionError as error:
        raise SettingsError(f"{PIPELINE_PARAMETERS}: {error}") from None
