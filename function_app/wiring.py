"""Which ledger, submitter and data pinner the app settings ask for. Heavy SDKs load only when chosen."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from components.request import Submitter
from function_app.ledger.local import open_ledger
from function_app.pinning import (
    DataPinner,
    DownloadedFolder,
    LandingFolderCopy,
    PlannedSnapshot,
    RegisteredSnapshot,
)
from function_app.service import FrontDoor, utc_now
from function_app.settings.app import PIPELINE_PARAMETERS, AppSettings, SettingsError

DATASTORE = "workspaceblobstore"


def landing_container(settings: AppSettings) -> Any:
    """The landing container client: the emulator's connection string, else the managed identity."""
    from azure.storage.blob import BlobServiceClient, ContainerClient

    scope = settings.blob
    if scope is None:
        raise ValueError("RETRAIN_BLOB_ACCOUNT and RETRAIN_BLOB_CONTAINER must be set to pin blob data")
    if settings.storage_connection_string:
        service = BlobServiceClient.from_connection_string(settings.storage_connection_string)
        return service.get_container_client(scope.container)
    from azure.identity import DefaultAzureCredential

    return ContainerClient(scope.endpoint.url, scope.container, credential=DefaultAzureCredential())


def _submitter_and_pinner(settings: AppSettings, environ: Mapping[str, str]) -> tuple[Submitter, DataPinner]:
    if settings.submitter == "dry-run":
        from components.dry_run import DryRunSubmitter

        return DryRunSubmitter(
            settings.home, datastore=DATASTORE, registered_components=True
        ), PlannedSnapshot()
    if settings.submitter == "azureml":
        from components.azureml.submitter import AzureMLSubmitter, AzureSettings
        from components.azureml.workspace import MLClientWorkspace, WorkspaceRef

        workspace = MLClientWorkspace(WorkspaceRef.from_settings(environ))
        # The deployed app carries no training code: it runs the components `retrain publish` registered.
        submitter = AzureMLSubmitter(
            workspace, AzureSettings(datastore=DATASTORE, registered_components=True)
        )
        return submitter, RegisteredSnapshot(landing_container(settings), workspace, DATASTORE)
    from components.local import RunnerOptions
    from components.submitters.local import LocalSubmitter

    submitter = LocalSubmitter(RunnerOptions(state_root=settings.home), dict(environ))
    if settings.landing_folder is not None:
        return submitter, LandingFolderCopy(settings.landing_folder, settings.home)
    return submitter, DownloadedFolder(landing_container(settings), settings.home)


def build_front_door(
    settings: AppSettings,
    environ: Mapping[str, str],
    clock: Callable[[], datetime] | None = None,
    submitter: Submitter | None = None,
) -> FrontDoor:
    _check_pipeline_parameters(settings)
    ledger = open_ledger(settings.ledger_location.spec, settings.storage_connection_string)
    chosen, pinner = _submitter_and_pinner(settings, environ)
    return FrontDoor(settings, ledger, submitter or chosen, pinner, clock or utc_now)


def _check_pipeline_parameters(settings: AppSettings) -> None:
    """Refuse at start-up, not at every submission, a parameter the pipeline has no input for or whose
    value its input refuses (its type, its `min`/`max` in the component YAML)."""
    if not settings.pipeline_parameters:
        return  # nothing to check: no cold start pays for reading the pipeline's YAMLs
    from components.errors import SubmissionError
    from components.local.plan import check_parameter_texts
    from components.specs import load_pipeline_spec

    try:
        check_parameter_texts(load_pipeline_spec(), settings.pipeline_parameters)
    except SubmissionError as error:
        raise SettingsError(f"{PIPELINE_PARAMETERS}: {error}") from None
