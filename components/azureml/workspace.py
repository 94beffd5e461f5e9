"""The one seam to Azure ML's control plane: a small protocol, and its MLClient implementation.

Everything above this seam (building jobs, the quota check, the dedicated fallback, publishing, schedules)
is plain code that tests run for real; only the calls into `azure.ai.ml.MLClient` sit behind it. Each
method of `MLClientWorkspace` makes exactly one MLClient call and turns what comes back into the plain
records below, so the decisions made on them never touch SDK objects.

azure-ai-ml is imported lazily, inside methods: the Function App imports this package, and its cold start
must not pay for the SDK until a submission actually happens.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from components.errors import SubmissionError

if TYPE_CHECKING:
    from azure.ai.ml import MLClient
    from azure.ai.ml.entities import Component, Compute, Data, Environment, JobSchedule, PipelineJob

log = logging.getLogger(__name__)


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, str]:
    return MappingProxyType({str(key): str(value) for key, value in (mapping or {}).items()})


@dataclass(frozen=True)
class JobRecord:
    """A job as Azure ML reports it: a pipeline job, or one step's child job."""

    name: str
    status: str
    display_name: str | None = None
    compute: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)
    studio_url: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", _frozen(self.tags))
        object.__setattr__(self, "properties", _frozen(self.properties))


@dataclass(frozen=True)
class ComputeRecord:
    name: str
    size: str
    tier: str  # "dedicated" or "low_priority"
    max_instances: int
    location: str | None = None

    @property
    def low_priority(self) -> bool:
        return self.tier.replace("_", "").lower() == "lowpriority"


@dataclass(frozen=True)
class VmSizeRecord:
    name: str
    family: str
    vcpus: int
    gpus: int = 0


@dataclass(frozen=True)
class UsageRecord:
    """One quota row: e.g. 'Standard NCADSA100v4 Family Cluster Dedicated vCPUs', 24 used of 96."""

    name: str
    type: str
    current: int
    limit: int


# Azure ML's type of a datastore on a blob container (`type: azure_blob` in YAML).
BLOB_DATASTORE = "AzureBlob"


@dataclass(frozen=True)
class DatastoreRecord:
    """A datastore: its type, and for a blob datastore where its container is."""

    name: str
    account_name: str | None
    container_name: str | None
    kind: str = BLOB_DATASTORE
    # The account's blob service URL, https://<account>.blob.<cloud suffix> (Azurite's is path-style,
    # http://127.0.0.1:<port>/<account>); None where Azure ML names no blob account.
    blob_endpoint: str | None = None

    @property
    def container_url(self) -> str | None:
        """The blob container's URL; None unless a blob datastore with a known endpoint and container."""
        if self.kind != BLOB_DATASTORE or not self.blob_endpoint or not self.container_name:
            return None
        return f"{self.blob_endpoint.rstrip('/')}/{self.container_name}"


@dataclass(frozen=True)
class AssetRecord:
    """A registered environment, component, data asset, compute or schedule."""

    kind: str
    name: str
    version: str | None = None
    path: str | None = None


class AzureMLWorkspace(Protocol):
    """What the Azure side of retrain asks of a workspace; one MLClient call per method."""

    def get_job(self, name: str) -> JobRecord | None: ...

    def create_job(self, job: PipelineJob) -> JobRecord: ...

    def child_jobs(self, parent_name: str) -> list[JobRecord]: ...

    def output_file(self, job_name: str, output_name: str, file_name: str) -> bytes | None:
        """The file `file_name` of an ended job's named output; None when the job has no such output or
        the output no such file."""
        ...

    def output_uri(self, job_name: str, output_name: str) -> str | None:
        """Where an ended job's named output lies, as a URI a later job can take as an input (an
        `azureml://` datastore path); None when the job has no such output."""
        ...

    def get_compute(self, name: str) -> ComputeRecord | None: ...

    def vm_sizes(self, location: str | None) -> list[VmSizeRecord]: ...

    def usages(self, location: str | None) -> list[UsageRecord]: ...

    def get_datastore(self, name: str) -> DatastoreRecord | None: ...

    def get_data(self, name: str, version: str) -> AssetRecord | None: ...

    def create_data(self, data: Data) -> AssetRecord: ...

    def create_environment(self, environment: Environment) -> AssetRecord: ...

    def create_component(self, component: Component) -> AssetRecord: ...

    def create_compute(self, compute: Compute) -> AssetRecord: ...

    def create_schedule(self, schedule: JobSchedule) -> AssetRecord: ...


@dataclass(frozen=True)
class WorkspaceRef:
    """Which workspace: from flags, or the settings AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP and
    AZUREML_WORKSPACE."""

    subscription_id: str
    resource_group: str
    workspace: str

    def __post_init__(self) -> None:
        missing = [
            label
            for label, value in (
                ("--subscription (or AZURE_SUBSCRIPTION_ID)", self.subscription_id),
                ("--resource-group (or AZURE_RESOURCE_GROUP)", self.resource_group),
                ("--workspace (or AZUREML_WORKSPACE)", self.workspace),
            )
            if not value
        ]
        if missing:
            raise SubmissionError(f"Azure ML workspace: missing {', '.join(missing)}; set them to submit")

    @classmethod
    def from_settings(
        cls,
        environ: Mapping[str, str],
        subscription_id: str | None = None,
        resource_group: str | None = None,
        workspace: str | None = None,
    ) -> WorkspaceRef:
        return cls(
            subscription_id=subscription_id or environ.get("AZURE_SUBSCRIPTION_ID", ""),
            resource_group=resource_group or environ.get("AZURE_RESOURCE_GROUP", ""),
            workspace=workspace or environ.get("AZUREML_WORKSPACE", ""),
        )


# -- translations from SDK entities to records -----------------------------------------------------------
# azure-ai-ml 1.35 builds Usage and VmSize entities by copying the REST model's `as_dict()`, whose keys are
# the wire names (currentValue, vCPUs), so the snake_case attributes stay None. Read both spellings.


def _read(entity: Any, *names: str) -> Any:
    attributes = vars(entity) if hasattr(entity, "__dict__") else {}
    for name in names:
        value = attributes.get(name, getattr(entity, name, None))
        if value is not None:
            return value
    return None


def _word(value: Any) -> str:
    """An SDK enum as REST spells it: str(JobStatus.FAILED) is 'JobStatus.FAILED', the REST word 'Failed'."""
    return str(value.value if isinstance(value, Enum) else value)


def job_record(job: Any) -> JobRecord:
    return JobRecord(
        name=str(job.name),
        status=_word(_read(job, "status") or "Unknown"),
        display_name=_read(job, "display_name"),
        compute=_read(job, "compute"),
        tags=_read(job, "tags") or {},
        properties=_read(job, "properties") or {},
        studio_url=_read(job, "studio_url"),
    )


def compute_record(compute: Any) -> ComputeRecord:
    return ComputeRecord(
        name=str(compute.name),
        size=str(_read(compute, "size") or ""),
        tier=str(_read(compute, "tier") or "dedicated"),
        max_instances=int(_read(compute, "max_instances") or 0),
        location=_read(compute, "location"),
    )


def vm_size_record(size: Any) -> VmSizeRecord:
    return VmSizeRecord(
        name=str(_read(size, "name")),
        family=str(_read(size, "family") or ""),
        vcpus=int(_read(size, "v_cp_us", "vCPUs") or 0),
        gpus=int(_read(size, "gpus") or 0),
    )


def usage_record(usage: Any) -> UsageRecord:
    name = _read(usage, "name")
    if isinstance(name, Mapping):
        label = name.get("value") or name.get("localizedValue") or name.get("localized_value")
    else:
        label = _read(name, "value", "localized_value") if name is not None else None
    return UsageRecord(
        name=str(label or ""),
        type=str(_read(usage, "type") or ""),
        current=int(_read(usage, "current_value", "currentValue") or 0),
        limit=int(_read(usage, "limit") if _read(usage, "limit") is not None else -1),
    )


def datastore_record(datastore: Any) -> DatastoreRecord:
    """azure-ai-ml's AzureBlobDatastore keeps the account, the container, the cloud's storage suffix
    (`endpoint`, core.windows.net) and the protocol apart; the blob endpoint is made of them here."""
    kind = _read(datastore, "type")
    kind = str(getattr(kind, "value", kind) or "")
    account = _read(datastore, "account_name")
    endpoint = None
    if kind == BLOB_DATASTORE and account:
        protocol = _read(datastore, "protocol") or "https"
        endpoint = f"{protocol}://{account}.blob.{_read(datastore, 'endpoint') or 'core.windows.net'}"
    return DatastoreRecord(
        name=str(datastore.name),
        account_name=account,
        container_name=_read(datastore, "container_name", "filesystem"),
        kind=kind,
        blob_endpoint=endpoint,
    )


def _asset(kind: str, entity: Any) -> AssetRecord:
    return AssetRecord(
        kind=kind,
        name=str(entity.name),
        version=_read(entity, "version"),
        path=_read(entity, "path"),
    )


class MLClientWorkspace:
    """The real workspace: `MLClient(DefaultAzureCredential(), subscription, resource group, workspace)`."""

    def __init__(self, ref: WorkspaceRef, credential: Any = None) -> None:
        self.ref = ref
        self._credential = credential
        self._client: MLClient | None = None

    @property
    def client(self) -> MLClient:
        if self._client is None:
            from azure.ai.ml import MLClient
            from azure.identity import DefaultAzureCredential

            self._client = MLClient(
                self._credential or DefaultAzureCredential(),
                self.ref.subscription_id,
                self.ref.resource_group,
                self.ref.workspace,
            )
        return self._client

    def get_job(self, name: str) -> JobRecord | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return job_record(self.client.jobs.get(name))
        except ResourceNotFoundError:
            return None

    def create_job(self, job: PipelineJob) -> JobRecord:
        return job_record(self.client.jobs.create_or_update(job))

    def child_jobs(self, parent_name: str) -> list[JobRecord]:
        return [job_record(child) for child in self.client.jobs.list(parent_job_name=parent_name) if child]

    def output_file(self, job_name: str, output_name: str, file_name: str) -> bytes | None:
        import tempfile

        from azure.core.exceptions import AzureError, ResourceNotFoundError

        with tempfile.TemporaryDirectory(prefix="retrain-output-") as folder:
            try:
                self.client.jobs.download(job_name, download_path=folder, output_name=output_name)
            except ResourceNotFoundError:
                return None
            except AzureError as error:  # one line; the caller decides what an unknown output costs
                raise SubmissionError(
                    f"job {job_name!r}: its output {output_name!r} could not be read "
                    f"({str(error).splitlines()[0] if str(error) else type(error).__name__})"
                ) from None
            # azure-ai-ml downloads a named output into <download_path>/named-outputs/<output name>/.
            path = Path(folder, "named-outputs", output_name, file_name)
            return path.read_bytes() if path.is_file() else None

    def output_uri(self, job_name: str, output_name: str) -> str | None:
        from azure.core.exceptions import AzureError

        try:
            # Run history's record of the output's data, as `jobs.download` asks it (azure-ai-ml 1.35): the
            # job ARM returns need not carry a step's output URI (an output without a path of its own).
            found = self.client.jobs._get_named_output_uri(job_name, output_name)
        except AzureError as error:  # one line; the caller decides what an unknown output costs
            raise SubmissionError(
                f"job {job_name!r}: where its output {output_name!r} lies could not be read "
                f"({str(error).splitlines()[0] if str(error) else type(error).__name__})"
            ) from None
        uri = found.get(output_name)
        return str(uri) if uri else None

    def get_compute(self, name: str) -> ComputeRecord | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return compute_record(self.client.compute.get(name))
        except ResourceNotFoundError:
            return None

    def vm_sizes(self, location: str | None) -> list[VmSizeRecord]:
        return [vm_size_record(size) for size in self.client.compute.list_sizes(location=location)]

    def usages(self, location: str | None) -> list[UsageRecord]:
        return [usage_record(usage) for usage in self.client.compute.list_usage(location=location)]

    def get_datastore(self, name: str) -> DatastoreRecord | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return datastore_record(self.client.datastores.get(name))
        except ResourceNotFoundError:
            return None

    def get_data(self, name: str, version: str) -> AssetRecord | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return _asset("data", self.client.data.get(name, version=version))
        except ResourceNotFoundError:
            return None

    def create_data(self, data: Data) -> AssetRecord:
        return _asset("data", self.client.data.create_or_update(data))

    def create_environment(self, environment: Environment) -> AssetRecord:
        return _asset("environment", self.client.environments.create_or_update(environment))

    def create_component(self, component: Component) -> AssetRecord:
        return _asset("component", self.client.components.create_or_update(component))

    def create_compute(self, compute: Compute) -> AssetRecord:
        return _asset("compute", self.client.compute.begin_create_or_update(compute).result())

    def create_schedule(self, schedule: JobSchedule) -> AssetRecord:
        return _asset("schedule", self.client.schedules.begin_create_or_update(schedule).result())
