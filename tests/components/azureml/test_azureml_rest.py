"""The Azure ML side through azure-ai-ml's real MLClient and HTTP pipeline, against a loopback far side.

`MLClientWorkspace` is the production one: it builds `MLClient` on the public cloud, which sends real HTTPS
requests to management.azure.com and the workspace's blob storage; the process's HTTPS proxy is the stand-in
(tests/helpers/components/loopback_arm.py), which answers as Azure ML's REST API documents
(loopback_azureml.py beside it) and relays blob requests to Azurite. Only the AAD token is faked on this side.

Every ARM request a test records must match exactly one row of ROUTES (method, path template, api-version):
the operation as Azure's REST specification (github.com/Azure/azure-rest-api-specs) documents it for the
api-version azure-ai-ml 1.35.2 sends, so a request to an undocumented route or version fails the test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from helpers.components.loopback_arm import ARM_HOST, AzureStandIn, FixedToken
from helpers.components.loopback_azureml import BlobAccount, WorkspaceFarSide

from components.azureml.builder import PipelineBuild
from components.azureml.publish import publish
from components.azureml.schedule import build_schedule, create_schedule, scheduled_checkpoints_path
from components.azureml.submitter import AzureMLSubmitter, AzureSettings
from components.azureml.workspace import MLClientWorkspace, WorkspaceRef
from components.fingerprint import ignore_rules_of, kept_files
from components.request import QUEUED, DataRef, RunRequest
from components.specs import REPO_ROOT

SUB, RG, WS = "6c1b7b0e-3f2a-4d8e-9a51-0f2e4b7c9d13", "rg-retrain", "mlw-retrain"
WORKSPACE = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.MachineLearningServices/workspaces/{WS}"
)
LOCATIONS = f"/subscriptions/{SUB}/providers/Microsoft.MachineLearningServices/locations"
VERSION = "rd-a1b2c3d4e5f60718"
# The api-versions azure-ai-ml 1.35.2 sends, per operation group (all preview but codes'; each exists in the
# specs under preview/<version>/ with the same path as stable/2024-04-01):
JOBS = "2024-01-01-preview"  # Jobs - Get / Create Or Update
COMPUTE = "2023-08-01-preview"  # Compute - Get; Virtual Machine Sizes - List; Usages - List
WORKSPACES = "2024-10-01-preview"  # Workspaces - Get; Datastores - Get
CODES = "2023-04-01"  # Code Versions - List / Create Or Get Start Pending Upload / Create Or Update (stable)
ENVIRONMENTS = "2023-04-01-preview"  # Environment Versions - Create Or Update
COMPONENTS = "2024-01-01-preview"  # Component Versions - Get / Create Or Update
SCHEDULES = "2023-06-01-preview"  # Schedules - Create Or Update (long-running), then Get
DATA = "2023-04-01-preview"  # Data Containers - Get; Data Versions - Get


SPECS = "specification/machinelearningservices/resource-manager/Microsoft.MachineLearningServices"
_WS = "/subscriptions/{subscriptionId}/resourceGroups/{resourceGroupName}/providers/" + (
    "Microsoft.MachineLearningServices/workspaces/{workspaceName}"
)
_LOC = "/subscriptions/{subscriptionId}/providers/Microsoft.MachineLearningServices/locations/{location}"


@dataclass(frozen=True)
class Route:
    """One operation as a spec file documents it (`spec`: its path under SPECS), or None with the evidence
    for a request azure-ai-ml sends that no spec documents."""

    operation: str
    method: str
    template: str
    api_version: str
    spec: str | None

    def matches(self, sent) -> bool:
        pattern = re.escape(self.template).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.sub(r"\{[A-Za-z]+\}", "[^/]+", pattern)
        return (
            sent.method == self.method
            and sent.api_version == self.api_version
            and re.fullmatch(pattern, sent.path) is not None
        )


# Read in the spec files named (paths, methods, success codes): Workspaces_Get 200; Compute_Get,
# Usages_List, VirtualMachineSizes_List 200; Code versions List (with the `hash`/`hashVersion` query), Get
# 200, CreateOrUpdate 200/201, CreateOrGetPendingUpload 200; Jobs_Get 200, Jobs_CreateOrUpdate 200/201;
# Schedules_Get 200, Schedules_CreateOrUpdate 200/201 (201 with Azure-AsyncOperation and
# x-ms-async-operation-timeout, long-running, final state from the original URI). The other rows' files exist
# at those versions with the same path families as stable/2023-04-01/mfe.json.
ROUTES = (
    Route("Workspaces_Get", "GET", _WS, WORKSPACES, "preview/2024-10-01-preview/workspaceRP.json"),
    Route(
        "Datastores_Get",
        "GET",
        f"{_WS}/datastores/{{name}}",
        WORKSPACES,
        "preview/2024-10-01-preview/mfe.json",
    ),
    Route(
        "Compute_Get",
        "GET",
        f"{_WS}/computes/{{computeName}}",
        COMPUTE,
        "preview/2023-08-01-preview/machineLearningServices.json",
    ),
    Route(
        "VirtualMachineSizes_List",
        "GET",
        f"{_LOC}/vmSizes",
        COMPUTE,
        "preview/2023-08-01-preview/machineLearningServices.json",
    ),
    Route(
        "Usages_List",
        "GET",
        f"{_LOC}/usages",
        COMPUTE,
        "preview/2023-08-01-preview/machineLearningServices.json",
    ),
    Route("CodeVersions_List", "GET", f"{_WS}/codes/{{name}}/versions", CODES, "stable/2023-04-01/mfe.json"),
    Route(
        "CodeVersions_Get",
        "GET",
        f"{_WS}/codes/{{name}}/versions/{{version}}",
        CODES,
        "stable/2023-04-01/mfe.json",
    ),
    Route(
        "CodeVersions_CreateOrUpdate",
        "PUT",
        f"{_WS}/codes/{{name}}/versions/{{version}}",
        CODES,
        "stable/2023-04-01/mfe.json",
    ),
    Route(
        "CodeVersions_CreateOrGetPendingUpload",
        "POST",
        f"{_WS}/codes/{{name}}/versions/{{version}}/startPendingUpload",
        CODES,
        "stable/2023-04-01/mfe.json",
    ),
    Route(
        "EnvironmentVersions_CreateOrUpdate",
        "PUT",
        f"{_WS}/environments/{{name}}/versions/{{version}}",
        ENVIRONMENTS,
        "preview/2023-04-01-preview/mfe.json",
    ),
    Route(
        "ComponentVersions_CreateOrUpdate",
        "PUT",
        f"{_WS}/components/{{name}}/versions/{{version}}",
        COMPONENTS,
        "preview/2024-01-01-preview/mfe.json",
    ),
    Route("DataContainers_Get", "GET", f"{_WS}/data/{{name}}", DATA, "preview/2023-04-01-preview/mfe.json"),
    Route(
        "DataVersions_Get",
        "GET",
        f"{_WS}/data/{{name}}/versions/{{version}}",
        DATA,
        "preview/2023-04-01-preview/mfe.json",
    ),
    Route("Jobs_Get", "GET", f"{_WS}/jobs/{{id}}", JOBS, "preview/2024-01-01-preview/mfe.json"),
    Route("Jobs_CreateOrUpdate", "PUT", f"{_WS}/jobs/{{id}}", JOBS, "preview/2024-01-01-preview/mfe.json"),
    Route(
        "Schedules_Get", "GET", f"{_WS}/schedules/{{name}}", SCHEDULES, "preview/2023-06-01-preview/mfe.json"
    ),
    Route(
        "Schedules_CreateOrUpdate",
        "PUT",
        f"{_WS}/schedules/{{name}}",
        SCHEDULES,
        "preview/2023-06-01-preview/mfe.json",
    ),
    # Not in the published spec: the Azure-AsyncOperation URL the service hands back for a schedule's PUT,
    # polled as ARM's async-operation contract says (GET it until `status` is terminal). No spec file has
    # a mfeOperationsStatus path (2023-06-01-preview's location paths are usages, vmSizes, updateQuotas and
    # quotas); azure-ai-ml follows whatever URL the 201 names, so the route is the stand-in's and ARM's.
    Route(
        "mfeOperationsStatus (async operation; not in the published spec)",
        "GET",
        f"{_LOC}/mfeOperationsStatus/{{operationId}}",
        SCHEDULES,
        None,
    ),
)


def documented(sent) -> list[str]:
    """The operation of each ARM request, each matching exactly one row of ROUTES."""
    operations = []
    for request in arm(sent):
        rows = [route.operation for route in ROUTES if route.matches(request)]
        assert len(rows) == 1, f"{request.line}: matches {rows or 'no'} documented route"
        operations.append(rows[0])
    return operations


@pytest.fixture(scope="module")
def far_side(azurite, tmp_path_factory):
    side = WorkspaceFarSide(
        SUB, RG, WS, BlobAccount(azurite.account, azurite.blob_endpoint, azurite.account_key)
    )
    hosts = (ARM_HOST, f"{azurite.account}.blob.core.windows.net")
    server = AzureStandIn(tmp_path_factory.mktemp("tls"), hosts, side).start()
    yield side, server
    server.stop()


@pytest.fixture(scope="module")
def workspace(far_side):
    """The production workspace seam, its process pointed at the stand-in as its HTTPS proxy."""
    _, server = far_side
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", server.proxy_url)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(server.ca_file))
        yield MLClientWorkspace(WorkspaceRef(SUB, RG, WS), credential=FixedToken())


@pytest.fixture(scope="module")
def published(workspace, far_side):
    """`retrain publish` once: what it returned and the requests it sent."""
    _, server = far_side
    server.take()
    records = publish(workspace)  # from the checkout itself, as `azd up`'s hook runs it
    return records, server.take()


def arm(sent):
    return [request for request in sent if request.host == ARM_HOST]


def test_publish_registers_the_environment_then_each_component_on_one_uploaded_snapshot(published, azurite):
    records, sent = published
    lines = [request.line for request in arm(sent)]
    assert set(documented(sent)) == {
        "EnvironmentVersions_CreateOrUpdate", "CodeVersions_List", "CodeVersions_Get",
        "CodeVersions_CreateOrGetPendingUpload", "CodeVersions_CreateOrUpdate",
        "ComponentVersions_CreateOrUpdate",
    }  # fmt: skip

    assert (
        lines[0]
        == f"PUT {ARM_HOST}{WORKSPACE}/environments/retrain-training/versions/3?api-version={ENVIRONMENTS}"
    )
    components = [line for line in lines if "/components/" in line]
    assert components == [
        f"PUT {ARM_HOST}{WORKSPACE}/components/{name}/versions/{version}?api-version={COMPONENTS}"
        for name, version in (
            ("retrain_drift", 2), ("retrain_evaluate", 4), ("retrain_prep", 7), ("retrain_register", 5),
            ("retrain_train", 7),
        )
    ]  # fmt: skip
    environment = arm(sent)[0].body["properties"]
    assert environment["image"] == "mcr.microsoft.com/azureml/curated/acpt-pytorch-2.2-cuda12.1:35"
    assert "torch==2.13.0" in environment["condaFile"]

    # The code snapshot: looked up by content hash, uploaded once through a pending upload, registered.
    uploads = [request for request in arm(sent) if request.path.endswith("/startPendingUpload")]
    assert len(uploads) == 1
    assert uploads[0].method == "POST" and uploads[0].api_version == CODES
    assert uploads[0].body == {"pendingUploadType": "TemporaryBlobReference"}
    lookups = [
        request for request in arm(sent) if request.method == "GET" and request.path.endswith("/versions")
    ]
    assert lookups and all(request.query.get("hash") and request.api_version == CODES for request in lookups)
    code_puts = [request for request in arm(sent) if request.method == "PUT" and "/codes/" in request.path]
    assert len(code_puts) == 1 and code_puts[0].api_version == CODES
    code = code_puts[0]
    assert code.body["properties"]["properties"]["hash_sha256"] == lookups[0].query["hash"]
    blob_puts = [request for request in sent if request.host != ARM_HOST and request.method == "PUT"]
    container = code.body["properties"]["codeUri"].split("/")[3]
    uploaded = {
        blob.name.split("/", 1)[1]
        for blob in azurite.service_client().get_container_client(container).list_blobs()
    }
    assert uploaded == {path.as_posix() for path in kept_files(REPO_ROOT, ignore_rules_of(REPO_ROOT))}
    assert len(blob_puts) >= len(uploaded)

    code_id = f"azureml:{code.path}"
    for request in arm(sent):
        if "/components/" in request.path:
            spec = request.body["properties"]["componentSpec"]
            assert spec["code"] == code_id
            assert spec["environment"] == f"azureml:{WORKSPACE}/environments/retrain-training/versions/3"
            assert spec["name"] == request.path.split("/")[-3]
            assert spec["version"] == request.path.split("/")[-1]
    assert [(record.kind, record.name, record.version) for record in records][:2] == [
        ("environment", "retrain-training", "3"),
        ("component", "retrain_drift", "2"),
    ]


def test_a_submission_sends_the_pinned_pipeline_job_on_the_published_components(
    published, workspace, far_side
):
    _, server = far_side
    server.take()
    request = RunRequest(
        model_name="digits",
        data=DataRef(VERSION, f"azureml:digits-raw:{VERSION}"),
        trigger={"source": "blob", "etag": "0x8DC"},
        instance_count=2,
    )

    submission = AzureMLSubmitter(workspace, AzureSettings(registered_components=True)).submit(request)

    sent = server.take()
    documented(sent)
    job_path = f"{WORKSPACE}/jobs/{request.job_name(0)}"
    lines = [item.line for item in sent]
    assert lines[:5] == [
        f"GET {ARM_HOST}{job_path}?api-version={JOBS}",  # 404: no attempt yet
        # The pipeline's datastore: its container holds the registry lock the register step takes.
        f"GET {ARM_HOST}{WORKSPACE}/datastores/workspaceblobstore?api-version={WORKSPACES}",
        f"GET {ARM_HOST}{WORKSPACE}/computes/gpu-spot?api-version={COMPUTE}",
        f"GET {ARM_HOST}{LOCATIONS}/westeurope/vmSizes?api-version={COMPUTE}",
        f"GET {ARM_HOST}{LOCATIONS}/westeurope/usages?api-version={COMPUTE}",
    ]
    assert lines[-1] == f"PUT {ARM_HOST}{job_path}?api-version={JOBS}"
    # Each step's compute is looked up by its plain name (never `azureml:<name>`), then sent as an ARM id.
    looked_up = {item.path.rsplit("/", 1)[-1] for item in sent[5:-1] if "/computes/" in item.path}
    assert looked_up == {"cpu-cluster", "gpu-spot"}

    job = sent[-1].body["properties"]
    assert job["jobType"] == "Pipeline"
    assert job["experimentName"] == "digits"  # the model's own experiment
    assert job["tags"]["retrain.run_key"] == f"digits-{VERSION}"
    assert job["tags"]["trigger.etag"] == "0x8DC"
    assert job["inputs"]["raw_data"]["uri"] == f"{WORKSPACE}/data/digits-raw/versions/{VERSION}"
    assert job["inputs"]["raw_data_version"]["value"] == VERSION
    steps = job["jobs"]
    assert list(steps) == ["prep", "train", "evaluate", "register"]
    for name, version in (("prep", 7), ("train", 7), ("evaluate", 4), ("register", 5)):
        assert steps[name]["componentId"] == f"{WORKSPACE}/components/retrain_{name}/versions/{version}"
    assert steps["train"]["computeId"] == f"{WORKSPACE}/computes/gpu-spot"
    assert steps["prep"]["computeId"] == f"{WORKSPACE}/computes/cpu-cluster"
    assert steps["train"]["resources"] == {"instance_count": 2}
    assert steps["train"]["distribution"]["distribution_type"] == "PyTorch"
    checkpoints = steps["train"]["outputs"]["checkpoints"]
    assert checkpoints["mode"] == "ReadWriteMount"
    assert checkpoints["uri"].startswith(
        f"azureml://datastores/workspaceblobstore/paths/retrain/checkpoints/digits-{VERSION}-"
    )
    assert job["settings"]["default_compute"] == f"{WORKSPACE}/computes/cpu-cluster"
    # The champion's compare-and-set is locked across nodes by default: a blob in the datastore's container.
    side, _ = far_side
    assert steps["register"]["inputs"]["registry_lock"]["value"] == (
        f"https://{side.storage.account}.blob.core.windows.net/{side.datastore_container}/retrain/locks"
    )

    assert (submission.job_name, submission.status) == (request.job_name(0), QUEUED)
    assert submission.details["azure_status"] == "NotStarted"
    assert submission.details["studio_url"].startswith(
        f"https://ml.azure.com/runs/{request.job_name(0)}?wsid="
    )


def test_a_second_submission_finds_the_job_and_sends_nothing_else(published, workspace, far_side):
    _, server = far_side
    other = "rd-0f0e0d0c0b0a0908"
    request = RunRequest(model_name="digits", data=DataRef(other, f"azureml:digits-raw:{other}"))
    server.take()

    AzureMLSubmitter(workspace, AzureSettings(registered_components=True)).submit(request)
    submission = AzureMLSubmitter(workspace, AzureSettings(registered_components=True)).submit(request)

    assert submission.details["duplicate"] is True
    sent = server.take()
    documented(sent)
    lines = [item.line for item in sent]
    assert [line for line in lines if line.startswith("PUT")] == [
        f"PUT {ARM_HOST}{WORKSPACE}/jobs/{request.job_name(0)}?api-version={JOBS}"
    ]
    assert lines[-2:] == [  # the second finds attempt 0 and no attempt 1
        f"GET {ARM_HOST}{WORKSPACE}/jobs/{request.job_name(attempt)}?api-version={JOBS}" for attempt in (0, 1)
    ]


def test_the_last_good_prepared_version_reaches_the_prep_step_as_a_uri_folder_input(
    published, workspace, far_side
):
    _, server = far_side
    other = "rd-1122334455667788"
    previous = f"azureml://subscriptions/{SUB}/resourcegroups/{RG}/workspaces/{WS}/datastores/" + (
        "workspaceblobstore/paths/azureml/calm_fig_prep_1234/prepared_data/"
    )  # where run history says the last good job's prep output lies
    request = RunRequest(
        model_name="digits", data=DataRef(other, f"azureml:digits-raw:{other}"), previous_prepared=previous
    )
    server.take()

    AzureMLSubmitter(workspace, AzureSettings(registered_components=True)).submit(request)

    sent = server.take()
    documented(sent)
    steps = sent[-1].body["properties"]["jobs"]
    assert steps["prep"]["inputs"]["previous_prepared"] == {"uri": previous, "job_input_type": "uri_folder"}
    assert all("previous_prepared" not in steps[name]["inputs"] for name in ("train", "evaluate", "register"))


def test_a_schedule_is_created_as_a_long_running_operation_with_its_cron_and_job(
    published, workspace, far_side
):
    side, server = far_side
    build = PipelineBuild(
        model_name="digits",
        data_uri="azureml:digits-raw@latest",
        checkpoints_path=scheduled_checkpoints_path("workspaceblobstore", "digits"),
        tags={"trigger.source": "schedule"},
        trigger="source=schedule",
        allow_latest_data=True,
        registered_components=True,
    )
    side.add_version("data", "digits-raw", VERSION, {
        "dataType": "uri_folder", "dataUri": f"azureml://datastores/workspaceblobstore/paths/retrain/raw/{VERSION}/",
    })  # fmt: skip
    server.take()

    record = create_schedule(
        workspace, build_schedule("retrain-digits", "0 3 * * 1-5", "W. Europe Standard Time", build)
    )

    sent = server.take()
    assert documented(sent)[2:4] == [
        "Schedules_CreateOrUpdate", "mfeOperationsStatus (async operation; not in the published spec)",
    ]  # fmt: skip
    schedule = f"{WORKSPACE}/schedules/retrain-digits"
    lines = [item.line for item in sent]
    assert lines[:2] == [  # `digits-raw@latest` resolved to the asset's latest version
        f"GET {ARM_HOST}{WORKSPACE}/data/digits-raw?api-version={DATA}",
        f"GET {ARM_HOST}{WORKSPACE}/data/digits-raw/versions/{VERSION}?api-version={DATA}",
    ]
    assert lines[2] == f"PUT {ARM_HOST}{schedule}?api-version={SCHEDULES}"
    # 201 + Azure-AsyncOperation: polled until Succeeded, then the final state read from the original URI.
    assert "/mfeOperationsStatus/" in lines[3] and lines[3].startswith(
        f"GET {ARM_HOST}{LOCATIONS}/westeurope/"
    )
    assert lines[4:] == [f"GET {ARM_HOST}{schedule}?api-version={SCHEDULES}"]
    body = sent[2].body["properties"]
    assert body["trigger"] == {
        "triggerType": "Cron", "expression": "0 3 * * 1-5", "timeZone": "W. Europe Standard Time",
    }  # fmt: skip
    assert body["tags"] == {"retrain.model_name": "digits", "retrain.schedule": "0 3 * * 1-5"}
    action = body["action"]
    assert action["actionType"] == "CreateJob"
    job = action["jobDefinition"]
    assert job["jobType"] == "Pipeline" and "name" not in job
    assert job["inputs"]["raw_data"]["uri"] == f"{WORKSPACE}/data/digits-raw/versions/{VERSION}"
    assert job["jobs"]["train"]["outputs"]["checkpoints"]["uri"] == (
        "azureml://datastores/workspaceblobstore/paths/retrain/checkpoints/digits-scheduled/${{name}}/"
    )
    assert job["jobs"]["train"]["componentId"] == f"{WORKSPACE}/components/retrain_train/versions/7"
    assert (record.kind, record.name) == ("schedule", "retrain-digits")
    assert side.get(schedule)["properties"]["provisioningState"] == "Succeeded"
