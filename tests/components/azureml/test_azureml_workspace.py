"""The seam's real side: which workspace, and how SDK entities become the plain records decisions use."""

from __future__ import annotations

import pytest
from azure.ai.ml import load_compute
from azure.ai.ml._restclient.arm_ml_service.models import Usage as RestUsage
from azure.ai.ml._restclient.arm_ml_service.models import VirtualMachineSize as RestVmSize
from azure.ai.ml.entities import Usage, VmSize
from azure.identity import DefaultAzureCredential

from components.azureml.workspace import (
    JobRecord,
    MLClientWorkspace,
    UsageRecord,
    VmSizeRecord,
    WorkspaceRef,
    compute_record,
    datastore_record,
    job_record,
    usage_record,
    vm_size_record,
)
from components.errors import SubmissionError
from components.specs import COMPUTE_FILES

SETTINGS = {
    "AZURE_SUBSCRIPTION_ID": "sub-from-env",
    "AZURE_RESOURCE_GROUP": "rg-env",
    "AZUREML_WORKSPACE": "ws-env",
}


def test_the_workspace_comes_from_settings_and_flags_win():
    assert WorkspaceRef.from_settings(SETTINGS) == WorkspaceRef("sub-from-env", "rg-env", "ws-env")
    assert WorkspaceRef.from_settings(SETTINGS, workspace="ws-flag").workspace == "ws-flag"


def test_a_missing_workspace_setting_is_a_one_line_error_naming_flag_and_setting():
    with pytest.raises(SubmissionError) as raised:
        WorkspaceRef.from_settings({"AZURE_SUBSCRIPTION_ID": "s"})
    assert str(raised.value) == (
        "Azure ML workspace: missing --resource-group (or AZURE_RESOURCE_GROUP), --workspace (or "
        "AZUREML_WORKSPACE); set them to submit"
    )


def test_the_client_is_created_on_first_use_for_that_workspace():
    workspace = MLClientWorkspace(WorkspaceRef("sub", "rg", "ws"), credential=DefaultAzureCredential())
    client = workspace.client
    assert (client.subscription_id, client.resource_group_name, client.workspace_name) == ("sub", "rg", "ws")
    assert workspace.client is client


def test_usage_rows_are_read_from_the_wire_names_the_sdk_leaves_behind():
    rest = RestUsage(
        {
            "type": "Microsoft.MachineLearningServices/vmFamily/usages",
            "currentValue": 12,
            "limit": 24,
            "name": {"value": "Standard NC Family Cluster Dedicated vCPUs", "localizedValue": "NC"},
            "unit": "Count",
        }
    )
    entity = Usage._from_rest_object(rest)
    assert entity.current_value is None  # azure-ai-ml 1.35 copies camelCase keys; the record must not care
    assert usage_record(entity) == UsageRecord(
        "Standard NC Family Cluster Dedicated vCPUs",
        "Microsoft.MachineLearningServices/vmFamily/usages",
        12,
        24,
    )


def test_vm_sizes_carry_family_vcpus_and_gpus():
    rest = RestVmSize(
        {"name": "Standard_NC24ads_A100_v4", "family": "standardNCADSA100v4Family", "vCPUs": 24, "gpus": 1}
    )
    assert vm_size_record(VmSize._from_rest_object(rest)) == VmSizeRecord(
        "Standard_NC24ads_A100_v4", "standardNCADSA100v4Family", 24, 1
    )


def test_computes_carry_size_tier_and_scale():
    spot = compute_record(load_compute(source=COMPUTE_FILES["gpu_spot"]))
    dedicated = compute_record(load_compute(source=COMPUTE_FILES["gpu_dedicated"]))
    assert (spot.name, spot.size, spot.max_instances, spot.low_priority) == (
        "gpu-spot", "Standard_NC24ads_A100_v4", 4, True,
    )  # fmt: skip
    assert (dedicated.name, dedicated.max_instances, dedicated.low_priority) == ("gpu-dedicated", 2, False)


def test_jobs_become_records_with_frozen_tags():
    from azure.ai.ml.entities import PipelineJob

    record = job_record(PipelineJob(name="retrain-x", tags={"retrain.attempt": 1}, jobs={}))
    assert record == JobRecord("retrain-x", "Unknown", tags={"retrain.attempt": "1"})
    with pytest.raises(TypeError):
        record.tags["retrain.attempt"] = "2"  # type: ignore[index]


def test_a_blob_datastore_becomes_its_container_url_in_its_cloud():
    from azure.ai.ml.entities import AzureBlobDatastore

    default = datastore_record(
        AzureBlobDatastore(name="ck", account_name="retrainck", container_name="ckpts")
    )
    assert default.container_url == "https://retrainck.blob.core.windows.net/ckpts"
    china = AzureBlobDatastore(
        name="ck", account_name="retrainck", container_name="ckpts", endpoint="core.chinacloudapi.cn"
    )
    assert datastore_record(china).container_url == "https://retrainck.blob.core.chinacloudapi.cn/ckpts"


def test_a_data_lake_datastore_has_no_blob_container_url():
    from azure.ai.ml.entities import AzureDataLakeGen2Datastore

    record = datastore_record(
        AzureDataLakeGen2Datastore(name="lake", account_name="lakeacct", filesystem="raw")
    )
    assert (record.kind, record.container_name, record.container_url) == ("AzureDataLakeGen2", "raw", None)


def test_an_outputs_uri_is_what_run_history_says_as_jobs_download_asks_it():
    import inspect
    from types import SimpleNamespace

    from azure.ai.ml.operations import JobOperations
    from azure.core.exceptions import HttpResponseError

    # The data-plane lookup `jobs.download` makes for a named output, which the seam asks too: a private
    # method of azure-ai-ml 1.35, held to its signature here so that an upgrade that moves it fails a test.
    assert list(inspect.signature(JobOperations._get_named_output_uri).parameters) == [
        "self", "job_name", "output_names",
    ]  # fmt: skip
    uri = (
        "azureml://subscriptions/s/resourcegroups/r/workspaces/w/datastores/d/paths/azureml/p/prepared_data/"
    )
    asked: list[tuple[str, str]] = []

    def named_output_uri(job_name, output_names):
        asked.append((job_name, output_names))
        if job_name == "broken":
            raise HttpResponseError(message="(ServiceError) run history is unavailable\nCode: ServiceError")
        return {"prepared_data": uri} if job_name == "prep-1" else {}

    workspace = MLClientWorkspace(WorkspaceRef("sub", "rg", "ws"), credential=DefaultAzureCredential())
    workspace._client = SimpleNamespace(jobs=SimpleNamespace(_get_named_output_uri=named_output_uri))

    assert workspace.output_uri("prep-1", "prepared_data") == uri
    assert workspace.output_uri("prep-2", "prepared_data") is None
    with pytest.raises(SubmissionError) as raised:
        workspace.output_uri("broken", "prepared_data")
    assert str(raised.value) == (
        "job 'broken': where its output 'prepared_data' lies could not be read ((ServiceError) run "
        "history is unavailable)"
    )
    assert asked == [("prep-1", "prepared_data"), ("prep-2", "prepared_data"), ("broken", "prepared_data")]
