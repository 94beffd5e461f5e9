"""Microsoft's documented sample events, as published, with only the names changed to the served scope.

Copied from learn.microsoft.com (MicrosoftDocs/azure-docs):
- articles/event-grid/event-schema-blob-storage.md, "Microsoft.Storage.BlobCreated event", both tabs
  (Event Grid event schema, Cloud event schema);
- articles/event-grid/event-schema-machine-learning.md, "Microsoft.MachineLearningServices.RunStatusChanged
  event", Event Grid event schema tab.
Changed: the storage account `my-storage-account` -> the served account, the container (`test-container`
in the subject, `testcontainer` in the url) -> the served container, and the blob `new-file.txt` -> a .csv
name under the served prefix. Nothing else, not even the documents' `{subscription-id}` placeholders.
"""

from __future__ import annotations

from helpers.function_app.corpus import ACCOUNT, CONTAINER, PREFIX

# One blob name per schema (both documents name `new-file.txt`): two uploads, not one upload delivered twice.
EVENT_GRID_BLOB, CLOUD_EVENT_BLOB = f"{PREFIX}/new-file.csv", f"{PREFIX}/new-file-2.csv"

_STORAGE_TOPIC = (
    "/subscriptions/{subscription-id}/resourceGroups/Storage/providers/Microsoft.Storage/"
    f"storageAccounts/{ACCOUNT}"
)


def _blob_created_data(blob: str) -> dict:
    return {
        "api": "PutBlockList",
        "clientRequestId": "6d79dbfb-0e37-4fc4-981f-442c9ca65760",
        "requestId": "831e1650-001e-001b-66ab-eeb76e000000",
        "eTag": '"0x8D4BCC2E4835CD0"',
        "contentType": "text/plain",
        "contentLength": 524288,
        "blobType": "BlockBlob",
        "url": f"https://{ACCOUNT}.blob.core.windows.net/{CONTAINER}/{blob}",
        "sequencer": "00000000000004420000000000028963",
        "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
    }


BLOB_CREATED_EVENT_GRID = {
    "topic": _STORAGE_TOPIC,
    "subject": f"/blobServices/default/containers/{CONTAINER}/blobs/{EVENT_GRID_BLOB}",
    "eventType": "Microsoft.Storage.BlobCreated",
    "eventTime": "2017-06-26T18:41:00.9584103Z",
    "id": "831e1650-001e-001b-66ab-eeb76e069631",
    "data": _blob_created_data(EVENT_GRID_BLOB),
    "dataVersion": "",
    "metadataVersion": "1",
}

BLOB_CREATED_CLOUD_EVENT = {
    "source": _STORAGE_TOPIC,
    "subject": f"/blobServices/default/containers/{CONTAINER}/blobs/{CLOUD_EVENT_BLOB}",
    "type": "Microsoft.Storage.BlobCreated",
    "time": "2017-06-26T18:41:00.9584103Z",
    "id": "831e1650-001e-001b-66ab-eeb76e069631",
    "data": _blob_created_data(CLOUD_EVENT_BLOB),
    "specversion": "1.0",
}

_RUN = "AutoML_ad912b2d-6467-4f32-a616-dbe4af6dd8fc_5"
_RUN_OUTPUTS = f"aml://artifact/ExperimentRun/dcid.{_RUN}/outputs"
_PIPELINE_SPEC = (
    '{"objects": [{"class_name": "StandardScaler", "module": "sklearn.preprocessing", "param_args": [], '
    '"param_kwargs": {"with_mean": true, "with_std": false}, "prepared_kwargs": {}, '
    '"spec_class": "preproc"}, '
    '{"class_name": "LassoLars", "module": "sklearn.linear_model", "param_args": [], '
    '"param_kwargs": {"alpha": 0.001, "normalize": true}, "prepared_kwargs": {}, "spec_class": "sklearn"}], '
    '"pipeline_id": "5adc0a4fe02504a586f09a4fcbb241f9a4012062"}'
)
RUN_STATUS_CHANGED = {
    "topic": (
        "/subscriptions/{subscription-id}/resourceGroups/{resource-group-name}/providers/"
        "Microsoft.MachineLearningServices/workspaces/{workspace-name}"
    ),
    "subject": f"experiments/0fa9dfaa-cba3-4fa7-b590-23e48548f5c1/runs/{_RUN}",
    "eventType": "Microsoft.MachineLearningServices.RunStatusChanged",
    "eventTime": "2017-06-26T18:41:00.9584103Z",
    "id": "831e1650-001e-001b-66ab-eeb76e069631",
    "data": {
        "experimentId": "0fa9dfaa-cba3-4fa7-b590-23e48548f5c1",
        "experimentName": "automl-local-regression",
        "runId": _RUN,
        "runType": None,
        "runTags": {},
        "runProperties": {
            "runTemplate": "automl_child",
            "pipeline_id": "5adc0a4fe02504a586f09a4fcbb241f9a4012062",
            "pipeline_spec": _PIPELINE_SPEC,
            "training_percent": "100",
            "predicted_cost": "0.062226144097381045",
            "iteration": "5",
            "run_template": "automl_child",
            "run_preprocessor": "StandardScalerWrapper",
            "run_algorithm": "LassoLars",
            "conda_env_data_location": f"{_RUN_OUTPUTS}/conda_env_v_1_0_0.yml",
            "model_name": "AutoMLad912b2d65",
            "scoring_data_location": f"{_RUN_OUTPUTS}/scoring_file_v_1_0_0.py",
            "model_data_location": f"{_RUN_OUTPUTS}/model.pkl",
        },
        "runStatus": "failed",
    },
    "dataVersion": "",
    "metadataVersion": "1",
}
