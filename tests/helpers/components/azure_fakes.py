"""The one fake of the Azure side: a recording stand-in for the `AzureMLWorkspace` seam.

Everything above the seam runs for real in the tests (the builder, azure-ai-ml's local validation, the quota
check, the fallback decisions, publishing, schedules); only the MLClient calls are answered from the state
a test scripts here. Every call is recorded, so a test can assert what would have been sent to Azure ML.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from components.azureml.workspace import (
    AssetRecord,
    ComputeRecord,
    DatastoreRecord,
    JobRecord,
    UsageRecord,
    VmSizeRecord,
)

WORKSPACE_STORAGE = "https://wsstorage.blob.core.windows.net"
WORKSPACE_CONTAINER = "azureml-blobstore-0a1b2c3d"
# The lock every Azure ML build passes its register step by default: in the datastore's container.
WORKSPACE_LOCK = f"{WORKSPACE_STORAGE}/{WORKSPACE_CONTAINER}/retrain/locks"
A100_FAMILY = "standardNCADSA100v4Family"
D_V5_FAMILY = "standardDSv5Family"


def standard_computes() -> dict[str, ComputeRecord]:
    return {
        "gpu-spot": ComputeRecord("gpu-spot", "Standard_NC24ads_A100_v4", "low_priority", 4, "westeurope"),
        "gpu-dedicated": ComputeRecord(
            "gpu-dedicated", "Standard_NC24ads_A100_v4", "dedicated", 2, "westeurope"
        ),
        "cpu-cluster": ComputeRecord("cpu-cluster", "Standard_D4s_v5", "dedicated", 4, "westeurope"),
    }


def standard_sizes() -> list[VmSizeRecord]:
    return [
        VmSizeRecord("Standard_NC24ads_A100_v4", A100_FAMILY, vcpus=24, gpus=1),
        VmSizeRecord("Standard_NC96ads_A100_v4", A100_FAMILY, vcpus=96, gpus=4),
        VmSizeRecord("Standard_D4s_v5", D_V5_FAMILY, vcpus=4, gpus=0),
    ]


def standard_usages() -> list[UsageRecord]:
    provider = "Microsoft.MachineLearningServices"
    family_type = f"{provider}/vmFamily/usages"
    return [
        UsageRecord("Total Cluster Dedicated Regional vCPUs", f"{provider}/dedicatedCores/usages", 8, 200),
        UsageRecord("Standard NCADSA100v4 Family Cluster Dedicated vCPUs", family_type, 0, 48),
        UsageRecord("Standard DSv5 Family Cluster Dedicated vCPUs", family_type, 8, 100),
        UsageRecord("Total Cluster LowPriority Regional vCPUs", f"{provider}/lowPriorityCores/usages", 0, 96),
        UsageRecord("Standard NCADSA100v4 Family Cluster LowPriority vCPUs", family_type, 0, -1),
    ]  # fmt: skip


def standard_datastores() -> dict[str, DatastoreRecord]:
    """The workspace's default blob datastore, as azure-ai-ml reports it (components/azureml/workspace.py)."""
    return {
        "workspaceblobstore": DatastoreRecord(
            "workspaceblobstore", "wsstorage", WORKSPACE_CONTAINER, blob_endpoint=WORKSPACE_STORAGE
        )
    }


@dataclass
class RecordingWorkspace:
    """Answers the seam's calls from this state, and records each call as (method, argument)."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    children: dict[str, list[JobRecord]] = field(default_factory=dict)
    # The files of ended jobs' named outputs: (job name, output name, file name) -> bytes.
    outputs: dict[tuple[str, str, str], bytes] = field(default_factory=dict)
    # Where ended jobs' named outputs lie: (job name, output name) -> URI.
    output_uris: dict[tuple[str, str], str] = field(default_factory=dict)
    computes: dict[str, ComputeRecord] = field(default_factory=standard_computes)
    sizes: list[VmSizeRecord] = field(default_factory=standard_sizes)
    usage_rows: list[UsageRecord] = field(default_factory=standard_usages)
    datastores: dict[str, DatastoreRecord] = field(default_factory=standard_datastores)
    data_assets: dict[tuple[str, str], AssetRecord] = field(default_factory=dict)
    # A job some other submitter creates at the moment this one calls create_job (a race it loses).
    created_concurrently: JobRecord | None = None
    create_job_error: Exception | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    sent: list[Any] = field(default_factory=list)  # every SDK entity handed to a create_* call

    def called(self, method: str) -> list[Any]:
        return [argument for name, argument in self.calls if name == method]

    def get_job(self, name: str) -> JobRecord | None:
        self.calls.append(("get_job", name))
        return self.jobs.get(name)

    def create_job(self, job: Any) -> JobRecord:
        self.calls.append(("create_job", job.name))
        if self.created_concurrently is not None:
            self.jobs[job.name] = replace(self.created_concurrently, name=job.name)
            raise RuntimeError(f"(UserError) A job with name '{job.name}' already exists\nCode: UserError")
        if self.create_job_error is not None:
            raise self.create_job_error
        self.sent.append(job)
        record = JobRecord(
            job.name, "NotStarted", tags=job.tags, studio_url=f"https://ml.azure.com/runs/{job.name}"
        )
        self.jobs[job.name] = record
        return record

    def child_jobs(self, parent_name: str) -> list[JobRecord]:
        self.calls.append(("child_jobs", parent_name))
        return list(self.children.get(parent_name, []))

    def output_file(self, job_name: str, output_name: str, file_name: str) -> bytes | None:
        self.calls.append(("output_file", (job_name, output_name, file_name)))
        return self.outputs.get((job_name, output_name, file_name))

    def output_uri(self, job_name: str, output_name: str) -> str | None:
        self.calls.append(("output_uri", (job_name, output_name)))
        return self.output_uris.get((job_name, output_name))

    def get_compute(self, name: str) -> ComputeRecord | None:
        self.calls.append(("get_compute", name))
        return self.computes.get(name)

    def vm_sizes(self, location: str | None) -> list[VmSizeRecord]:
        self.calls.append(("vm_sizes", location))
        return list(self.sizes)

    def usages(self, location: str | None) -> list[UsageRecord]:
        self.calls.append(("usages", location))
        return list(self.usage_rows)

    def get_datastore(self, name: str) -> DatastoreRecord | None:
        self.calls.append(("get_datastore", name))
        return self.datastores.get(name)

    def get_data(self, name: str, version: str) -> AssetRecord | None:
        self.calls.append(("get_data", (name, version)))
        return self.data_assets.get((name, version))

    def create_data(self, data: Any) -> AssetRecord:
        self.calls.append(("create_data", (data.name, data.version)))
        self.sent.append(data)
        record = AssetRecord("data", data.name, data.version, data.path)
        self.data_assets[(data.name, data.version)] = record
        return record

    def create_environment(self, environment: Any) -> AssetRecord:
        self.calls.append(("create_environment", environment.name))
        self.sent.append(environment)
        return AssetRecord("environment", environment.name, environment.version)

    def create_component(self, component: Any) -> AssetRecord:
        self.calls.append(("create_component", component.name))
        self.sent.append(component)
        return AssetRecord("component", component.name, component.version)

    def create_compute(self, compute: Any) -> AssetRecord:
        self.calls.append(("create_compute", compute.name))
        self.sent.append(compute)
        return AssetRecord("compute", compute.name)

    def create_schedule(self, schedule: Any) -> AssetRecord:
        self.calls.append(("create_schedule", schedule.name))
        self.sent.append(schedule)
        return AssetRecord("schedule", schedule.name)
