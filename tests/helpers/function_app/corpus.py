"""Events and requests for the front door, as data: builders of well-formed ones from the documented schemas,
and the bad-input corpus, each case with the reason (a substring) its rejection must give.

The builders follow Azure's documented examples: Event Grid schema fields id, topic, subject, eventType,
eventTime, data, dataVersion, metadataVersion; CloudEvents 1.0 fields specversion, type, source, id, time,
subject, data; BlobCreated data api, clientRequestId, requestId, eTag, contentType, contentLength, blobType,
url, sequencer, storageDiagnostics. Azure ML's documents spell data keys in PascalCase ('RunId'); its
CloudEvents builder here uses camelCase, as other deliveries do, so both spellings are exercised.

The settings carry a fake account key (generated per test session, never written down) in the emulator
connection string of an emulator-hosted ledger, and one corpus payload carries it too, so a test can prove
the key never reaches a reason or a log line.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EVENT_GRID, CLOUD_EVENTS = "eventgrid", "cloudevents"
BLOB, DRIFT = "blob", "drift"

ACCOUNT, CONTAINER, PREFIX = "retraindata", "landing", "digits"
ENDPOINT = f"https://{ACCOUNT}.blob.core.windows.net"
MODEL = "digits"
EVENT_TIME = "2026-11-29T10:41:00.9584103Z"
ETAG, SEQUENCER = "0x8DE2F4C1A2B3C4D", "00000000000004420000000000028963"
STORAGE_TOPIC = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/retrain/providers/"
    f"Microsoft.Storage/storageAccounts/{ACCOUNT}"
)
WORKSPACE_TOPIC = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/retrain/providers/"
    "Microsoft.MachineLearningServices/workspaces/retrain-ws"
)
DRIFT_CHECK_SOURCE = "/retrain/drift-check"
BREACH_MESSAGE = "has failed due to one or more features violating metric thresholds"
MONITOR_RUN_ID = "digits_monitor_signal_20261129T1000"

# A fake key for this session only: it must never show up in a reason or a log line.
FAKE_ACCOUNT_KEY = secrets.token_urlsafe(48)  # url-safe: it also goes into a blob name and a URL
LEDGER_ACCOUNT = "devstoreaccount1"
LEDGER_ENDPOINT = f"http://127.0.0.1:10000/{LEDGER_ACCOUNT}"
FAKE_CONNECTION_STRING = (
    f"DefaultEndpointsProtocol=http;AccountName={LEDGER_ACCOUNT};AccountKey={FAKE_ACCOUNT_KEY};"
    f"BlobEndpoint={LEDGER_ENDPOINT};"
)
ENVIRON: Mapping[str, str] = {
    "RETRAIN_SUBMITTER": "dry-run",
    "RETRAIN_MODEL_NAME": MODEL,
    "RETRAIN_BLOB_ACCOUNT": ACCOUNT,
    "RETRAIN_BLOB_CONTAINER": CONTAINER,
    "RETRAIN_BLOB_PREFIX": f"{PREFIX}/",
    "RETRAIN_LEDGER": f"{LEDGER_ENDPOINT}/retrain-ledger/front-door",
    "RETRAIN_STORAGE_CONNECTION_STRING": FAKE_CONNECTION_STRING,
    "RETRAIN_HTTP_MAX_BODY_BYTES": "4096",
}
MAX_BODY_BYTES = 4096

DROP = object()  # an override that removes the key


def _apply(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**base, **overrides}
    return {key: value for key, value in merged.items() if value is not DROP}


def _event(
    schema: str, event_type: str, source: str, subject: str | None, data: Any, envelope: Mapping[str, Any]
) -> dict:
    if schema == EVENT_GRID:
        base = {
            "topic": source,
            "subject": subject,
            "eventType": event_type,
            "eventTime": EVENT_TIME,
            "id": "831e1650-001e-001b-66ab-eeb76e069631",
            "data": data,
            "dataVersion": "",
            "metadataVersion": "1",
        }
    else:
        base = {
            "source": source,
            "subject": subject,
            "type": event_type,
            "time": EVENT_TIME,
            "id": "831e1650-001e-001b-66ab-eeb76e069631",
            "data": data,
            "specversion": "1.0",
        }
    return _apply(base, envelope)


def blob_url(name: str, container: str = CONTAINER, endpoint: str = ENDPOINT) -> str:
    return f"{endpoint}/{container}/{name}"


def blob_created(
    schema: str = EVENT_GRID,
    name: str = f"{PREFIX}/batch-0001.csv",
    *,
    container: str = CONTAINER,
    url: str | None = None,
    envelope: Mapping[str, Any] | None = None,
    **data: Any,
) -> dict:
    """A BlobCreated event for `name`; `data` overrides fields of its data (DROP removes one)."""
    body = _apply(
        {
            "api": "PutBlockList",
            "clientRequestId": "6d79dbfb-0e37-4fc4-981f-442c9ca65760",
            "requestId": "831e1650-001e-001b-66ab-eeb76e000000",
            "eTag": ETAG,
            "contentType": "text/csv",
            "contentLength": 524288,
            "blobType": "BlockBlob",
            "url": url if url is not None else blob_url(name, container),
            "sequencer": SEQUENCER,
            "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
        },
        data,
    )
    subject = f"/blobServices/default/containers/{container}/blobs/{name}"
    return _event(schema, "Microsoft.Storage.BlobCreated", STORAGE_TOPIC, subject, body, envelope or {})


def run_status_changed(
    schema: str = EVENT_GRID, *, tags: Any = None, envelope: Mapping[str, Any] | None = None, **data: Any
) -> dict:
    """Azure ML's RunStatusChanged for a model-monitor signal run that breached its threshold."""
    run_tags = {"azureml_modelmonitor_threshold_breached": BREACH_MESSAGE} if tags is None else tags
    pascal = schema == EVENT_GRID  # the documents' spelling; the CloudEvents builder uses camelCase
    keys = ("ExperimentId", "ExperimentName", "RunId", "RunType", "RunTags", "RunProperties", "RunStatus")
    names = dict(zip(keys, keys if pascal else [key[0].lower() + key[1:] for key in keys], strict=True))
    body = _apply(
        {
            names["ExperimentId"]: "0fa9dfaa-cba3-4fa7-b590-23e48548f5c1",
            names["ExperimentName"]: "digits-monitor",
            names["RunId"]: MONITOR_RUN_ID,
            names["RunType"]: None,
            names["RunTags"]: run_tags,
            names["RunProperties"]: {"runTemplate": "monitor_signal"},
            names["RunStatus"]: "Failed",
        },
        data,
    )
    subject = f"experiments/0fa9dfaa-cba3-4fa7-b590-23e48548f5c1/runs/{MONITOR_RUN_ID}"
    return _event(
        schema,
        "Microsoft.MachineLearningServices.RunStatusChanged",
        WORKSPACE_TOPIC,
        subject,
        body,
        envelope or {},
    )


def dataset_drift_detected(schema: str = EVENT_GRID, **data: Any) -> dict:
    """Azure ML's v1 DatasetDriftDetected, as documented."""
    body = _apply(
        {
            "DataDriftId": "01d29aa4-e6a4-470a-9ef3-66660d21f8ef",
            "DataDriftName": "digitsDriftMonitor",
            "RunId": "01d29aa4-e6a4-470a-9ef3-66660d21f8ef_1571590300380",
            "BaseDatasetId": "3c56d136-0f64-4657-a0e8-5162089a88a3",
            "TargetDatasetId": "d7e74d2e-c972-4266-b5fb-6c9c182d2a74",
            "DriftCoefficient": 0.83503490684792081,
            "StartTime": "2026-11-28T00:00:00+00:00",
            "EndTime": "2026-11-29T00:00:00+00:00",
        },
        data,
    )
    subject = "datadrifts/01d29aa4-e6a4-470a-9ef3-66660d21f8ef/runs/01d29aa4_1571590300380"
    return _event(
        schema, "Microsoft.MachineLearningServices.DatasetDriftDetected", WORKSPACE_TOPIC, subject, body, {}
    )


def retrain_drift_detected(schema: str = EVENT_GRID, **data: Any) -> dict:
    """The project's own drift event."""
    body = _apply(
        {
            "model_name": MODEL,
            "check_id": "drift-check-20261129-1000",
            "metric": "psi",
            "value": 0.31,
            "threshold": 0.2,
            "data_version": "rd-0123456789abcdef",
        },
        data,
    )
    envelope = {"dataVersion": "1"} if schema == EVENT_GRID else {}
    return _event(schema, "Retrain.DriftDetected", DRIFT_CHECK_SOURCE, f"models/{MODEL}", body, envelope)


@dataclass(frozen=True)
class EventCase:
    name: str
    family: str  # BLOB or DRIFT: the trigger (and parser) the event arrives at
    event: Any
    reason: str  # a substring of the rejection's reason


@dataclass(frozen=True)
class HttpCase:
    name: str
    body: bytes
    reason: str
    status: int = 400
    headers: Mapping[str, str] = field(default_factory=dict)


def _json(document: Any) -> bytes:
    return json.dumps(document).encode()


_IN = f"{PREFIX}/batch-0001.csv"
BLOB_CASES = (
    EventCase(
        "blob deleted, not created",
        BLOB,
        blob_created(envelope={"eventType": "Microsoft.Storage.BlobDeleted"}),
        "is not a blob upload",
    ),
    EventCase("a drift event at the blob trigger", BLOB, run_status_changed(), "is not a blob upload"),
    EventCase(
        "cloudevents: wrong type",
        BLOB,
        blob_created(CLOUD_EVENTS, envelope={"type": "Microsoft.Storage.BlobTierChanged"}),
        "is not a blob upload",
    ),
    EventCase("non-commit api PutBlock", BLOB, blob_created(api="PutBlock"), "does not commit a blob"),
    EventCase(
        "non-commit api SetBlobMetadata", BLOB, blob_created(api="SetBlobMetadata"), "does not commit a blob"
    ),
    EventCase("zero-length blob", BLOB, blob_created(contentLength=0), "expected more than 0 bytes"),
    EventCase("negative contentLength", BLOB, blob_created(contentLength=-5), "expected more than 0 bytes"),
    EventCase(
        "contentLength as a string", BLOB, blob_created(contentLength="524288"), "expected a whole number"
    ),
    EventCase(
        "contentLength as a fraction", BLOB, blob_created(contentLength=1.5), "expected a whole number"
    ),
    EventCase("contentLength missing", BLOB, blob_created(contentLength=DROP), "has no 'contentLength'"),
    EventCase("url missing", BLOB, blob_created(url=DROP), "has no 'url'"),
    EventCase("eTag missing", BLOB, blob_created(eTag=DROP), "has no 'eTag'"),
    EventCase("eTag with a space", BLOB, blob_created(eTag="0x8D 4BCC"), "'eTag'"),
    EventCase("sequencer as a number", BLOB, blob_created(sequencer=42), "expected a string"),
    EventCase("sequencer not hexadecimal", BLOB, blob_created(sequencer="zz-top"), "hexadecimal sequencer"),
    EventCase("page blob", BLOB, blob_created(api="PutBlob", blobType="PageBlob"), "is not data"),
    EventCase("data missing", BLOB, blob_created(envelope={"data": DROP}), "has no 'data'"),
    EventCase("data is a string", BLOB, blob_created(envelope={"data": "{}"}), "expected a JSON object"),
    EventCase("id missing", BLOB, blob_created(envelope={"id": DROP}), "has no 'id'"),
    EventCase("id is a number", BLOB, blob_created(envelope={"id": 7}), "expected a string"),
    EventCase(
        "eventTime malformed", BLOB, blob_created(envelope={"eventTime": "yesterday"}), "is not a time"
    ),
    EventCase("subject missing", BLOB, blob_created(envelope={"subject": DROP}), "has no 'subject'"),
    EventCase(
        "subject of a queue",
        BLOB,
        blob_created(envelope={"subject": "/queueServices/default/queues/q"}),
        "is not a blob's",
    ),
    EventCase(
        "foreign account in the url",
        BLOB,
        blob_created(url=blob_url(_IN, endpoint="https://evilstore.blob.core.windows.net")),
        "is not in storage account 'retraindata'",
    ),
    EventCase(
        "foreign account in the topic",
        BLOB,
        blob_created(envelope={"topic": STORAGE_TOPIC.replace(ACCOUNT, "evilstore")}),
        "is not storage account 'retraindata'",
    ),
    EventCase(
        "cloudevents: foreign account in the source",
        BLOB,
        blob_created(CLOUD_EVENTS, envelope={"source": STORAGE_TOPIC.replace(ACCOUNT, "evilstore")}),
        "is not storage account",
    ),
    EventCase(
        "plain http to the cloud account",
        BLOB,
        blob_created(url=blob_url(_IN, endpoint=f"http://{ACCOUNT}.blob.core.windows.net")),
        "is not in storage account",
    ),
    EventCase(
        "emulator url for a cloud account",
        BLOB,
        blob_created(url=blob_url(_IN, endpoint=f"http://127.0.0.1:10000/{ACCOUNT}")),
        "is not in storage account",
    ),
    EventCase(
        "data lake host without FlushWithClose",
        BLOB,
        blob_created(url=blob_url(_IN, endpoint=f"https://{ACCOUNT}.dfs.core.windows.net")),
        "is not in storage account",
    ),
    EventCase(
        "lookalike host",
        BLOB,
        blob_created(url=blob_url(_IN, endpoint=f"https://{ACCOUNT}.blob.core.windows.net.evil.example")),
        "is not in storage account",
    ),
    EventCase(
        "user info in the url",
        BLOB,
        blob_created(url=blob_url(_IN, endpoint=f"https://me@{ACCOUNT}.blob.core.windows.net")),
        "carries user info",
    ),
    EventCase(
        "foreign container",
        BLOB,
        blob_created(container="other"),
        "is not the configured container 'landing'",
    ),
    EventCase(
        "subject and url disagree",
        BLOB,
        blob_created(url=blob_url(f"{PREFIX}/batch-0002.csv")),
        "name different blobs",
    ),
    EventCase(
        "subject in another container than the url",
        BLOB,
        blob_created(envelope={"subject": f"/blobServices/default/containers/other/blobs/{_IN}"}),
        "name different blobs",
    ),
    EventCase(
        "dot-dot in the subject and url",
        BLOB,
        blob_created(name=f"{PREFIX}/../secrets/x.csv"),
        "'..' segment",
    ),
    EventCase("dot segment", BLOB, blob_created(name=f"{PREFIX}/./x.csv"), "'..' segment"),
    EventCase("empty segment", BLOB, blob_created(name=f"{PREFIX}//x.csv"), "empty"),
    EventCase(
        "encoded dot-dot in the url",
        BLOB,
        blob_created(url=blob_url(f"{PREFIX}/%2e%2e/x.csv")),
        "percent-encoded",
    ),
    EventCase(
        "encoded slash in the url", BLOB, blob_created(url=blob_url(f"{PREFIX}%2Fx.csv")), "percent-encoded"
    ),
    EventCase(
        "encoded backslash in the url",
        BLOB,
        blob_created(url=blob_url(f"{PREFIX}/..%5Cx.csv")),
        "percent-encoded",
    ),
    EventCase(
        "double-encoded dot-dot",
        BLOB,
        blob_created(name=f"{PREFIX}/%2e%2e/x.csv", url=blob_url(f"{PREFIX}/%252e%252e/x.csv")),
        "percent-encoded",
    ),
    EventCase("encoded NUL", BLOB, blob_created(url=blob_url(f"{PREFIX}/x%00.csv")), "percent-encoded"),
    EventCase("backslash in the subject", BLOB, blob_created(name=f"{PREFIX}\\..\\x.csv"), "backslash"),
    EventCase("NUL in the subject", BLOB, blob_created(name=f"{PREFIX}/x\x00.csv"), "control"),
    EventCase("newline in the name", BLOB, blob_created(name=f"{PREFIX}/x\n.csv"), "control"),
    EventCase(
        "right-to-left override in the name", BLOB, blob_created(name=f"{PREFIX}/x\u202evsc.csv"), "invisible"
    ),
    EventCase(
        "outside the prefix", BLOB, blob_created(name="other/batch.csv"), "outside the prefix 'digits/'"
    ),
    EventCase("prefix lookalike", BLOB, blob_created(name=f"{PREFIX}-evil/batch.csv"), "outside the prefix"),
    EventCase(
        "in a sub-folder of the prefix", BLOB, blob_created(name=f"{PREFIX}/nested/batch.csv"), "sub-folder"
    ),
    EventCase("suffix not allowed", BLOB, blob_created(name=f"{PREFIX}/batch.json"), "none of the suffixes"),
    EventCase(
        "suffix in the wrong case", BLOB, blob_created(name=f"{PREFIX}/batch.CSV"), "none of the suffixes"
    ),
    EventCase(
        "SAS signature in the url",
        BLOB,
        blob_created(url=blob_url(_IN) + f"?sv=2025&sig={FAKE_ACCOUNT_KEY}"),
        "carries a query",
    ),
    EventCase(
        "account key in the blob name",
        BLOB,
        blob_created(name=f"{PREFIX}/AccountKey={FAKE_ACCOUNT_KEY}.txt"),
        "none of the suffixes",
    ),
    EventCase(
        "cloudevents: old specversion",
        BLOB,
        blob_created(CLOUD_EVENTS, envelope={"specversion": "0.3"}),
        "specversion",
    ),
    EventCase(
        "cloudevents: binary data",
        BLOB,
        blob_created(CLOUD_EVENTS, envelope={"data": DROP, "data_base64": "e30="}),
        "data_base64",
    ),
    EventCase(
        "cloudevents: source missing",
        BLOB,
        blob_created(CLOUD_EVENTS, envelope={"source": DROP}),
        "has no 'source'",
    ),
    EventCase("neither schema", BLOB, {"id": "x", "data": {}}, "neither 'eventType'"),
    EventCase("not an object", BLOB, ["Microsoft.Storage.BlobCreated"], "expected a JSON object"),
)

_RUN_ID_KEY = "RunId"
DRIFT_CASES = (
    EventCase("blob event at the drift trigger", DRIFT, blob_created(), "is not a drift alert"),
    EventCase(
        "model registered, not drift",
        DRIFT,
        run_status_changed(envelope={"eventType": "Microsoft.MachineLearningServices.ModelRegistered"}),
        "is not a drift alert",
    ),
    EventCase(
        "run status change without the breach tag",
        DRIFT,
        run_status_changed(tags={"azureml.runsource": "job"}),
        "carry no azureml_modelmonitor_threshold_breached",
    ),
    EventCase(
        "breach tag empty",
        DRIFT,
        run_status_changed(tags={"azureml_modelmonitor_threshold_breached": " "}),
        "expected a message",
    ),
    EventCase(
        "breach tag a number",
        DRIFT,
        run_status_changed(tags={"azureml_modelmonitor_threshold_breached": 1}),
        "expected a message",
    ),
    EventCase(
        "run tags not an object",
        DRIFT,
        run_status_changed(tags=["breach"]),
        "expected a JSON object of run tags",
    ),
    EventCase("run id missing", DRIFT, run_status_changed(**{_RUN_ID_KEY: DROP}), "has no 'runid'"),
    EventCase(
        "run id with a path", DRIFT, run_status_changed(**{_RUN_ID_KEY: "../../runs/x"}), "is malformed"
    ),
    EventCase("run id twice in two cases", DRIFT, run_status_changed(runId="other-run"), "twice"),
    EventCase(
        "monitor event from a storage topic",
        DRIFT,
        run_status_changed(envelope={"topic": STORAGE_TOPIC}),
        "is not an Azure ML workspace",
    ),
    EventCase(
        "v1 drift without a monitor id",
        DRIFT,
        dataset_drift_detected(DataDriftId=DROP),
        "has no 'datadriftid'",
    ),
    EventCase(
        "v1 drift coefficient as text",
        DRIFT,
        dataset_drift_detected(DriftCoefficient="0.8"),
        "expected a finite number",
    ),
    EventCase(
        "own drift for another model",
        DRIFT,
        retrain_drift_detected(model_name="fraud"),
        "is not this front door's",
    ),
    EventCase(
        "own drift without a check id", DRIFT, retrain_drift_detected(check_id=DROP), "has no 'check_id'"
    ),
    EventCase(
        "own drift check id with spaces", DRIFT, retrain_drift_detected(check_id="check 1"), "is malformed"
    ),
    EventCase(
        "own drift value not finite",
        DRIFT,
        retrain_drift_detected(value=float("inf")),
        "expected a finite number",
    ),
    EventCase(
        "own drift value a boolean", DRIFT, retrain_drift_detected(threshold=True), "expected a finite number"
    ),
    EventCase(
        "own drift bad data version",
        DRIFT,
        retrain_drift_detected(data_version="latest"),
        "rd-<16 hex digits>",
    ),
    EventCase(
        "cloudevents: own drift without data",
        DRIFT,
        retrain_drift_detected(CLOUD_EVENTS) | {"data": None},
        "expected a JSON object",
    ),
)

EVENT_CASES = BLOB_CASES + DRIFT_CASES

_FOLDER = f"{ENDPOINT}/{CONTAINER}/{PREFIX}/"
HTTP_CASES = (
    HttpCase("oversized body", b"{" + b" " * MAX_BODY_BYTES + b"}", "expected at most 4096", status=413),
    HttpCase("not JSON", b"retrain please", "not JSON"),
    HttpCase("not UTF-8", b'{"reason": "\xff\xfe"}', "not JSON"),
    HttpCase("truncated JSON", b'{"force": tr', "not JSON"),
    HttpCase("a JSON array", b'[{"force": true}]', "is a JSON array"),
    HttpCase("a JSON string", b'"retrain"', "is a JSON string"),
    HttpCase("unknown field", _json({"forse": True}), "unknown field 'forse'"),
    HttpCase("duplicate keys", b'{"force": false, "force": true}', "duplicate key"),
    HttpCase("NaN", b'{"reason": NaN}', "NaN is not a JSON number"),
    HttpCase("nested too deeply", b"[" * 2000 + b"]" * 2000, "nested too deeply"),
    HttpCase("force as a string", _json({"force": "true"}), "force is 'true'; expected true or false"),
    HttpCase("force as a number", _json({"force": 1}), "expected true or false"),
    HttpCase("force null", _json({"force": None}), "expected true or false"),
    HttpCase("reason too long", _json({"reason": "r" * 501}), "expected at most 500"),
    HttpCase("reason with a line break", _json({"reason": "new data\nINFO forged log line"}), "line breaks"),
    HttpCase("reason not a string", _json({"reason": ["x"]}), "reason is a JSON array"),
    HttpCase("data a number", _json({"data": 5}), "expected a blob folder URL"),
    HttpCase("data a local path", _json({"data": "/etc/passwd"}), "expected a blob folder URL"),
    HttpCase("data a file URL", _json({"data": "file:///etc/passwd"}), "expected a blob folder URL"),
    HttpCase(
        "data asset without a pinned version",
        _json({"data": "azureml:digits-raw:latest"}),
        "not a pinned data asset",
    ),
    HttpCase("data asset label", _json({"data": "azureml:digits-raw@latest"}), "not a pinned data asset"),
    HttpCase(
        "data in a foreign account",
        _json({"data": f"https://evilstore.blob.core.windows.net/{CONTAINER}/{PREFIX}/"}),
        "is not in storage account",
    ),
    HttpCase(
        "data in a foreign container",
        _json({"data": f"{ENDPOINT}/other/{PREFIX}/"}),
        "is not the configured container",
    ),
    HttpCase(
        "data outside the prefix", _json({"data": f"{ENDPOINT}/{CONTAINER}/other/"}), "outside the prefix"
    ),
    HttpCase("data with dot-dot", _json({"data": f"{_FOLDER}../other/"}), "'..' segment"),
    HttpCase("data with encoded dot-dot", _json({"data": f"{_FOLDER}%2E%2E/other/"}), "percent-encoded"),
    HttpCase(
        "data with a SAS token", _json({"data": f"{_FOLDER}?sig={FAKE_ACCOUNT_KEY}"}), "carries a query"
    ),
    HttpCase("model of another front door", _json({"model_name": "fraud"}), "not this front door's model"),
    HttpCase(
        "bad idempotency key", b"{}", "Idempotency-Key header", headers={"Idempotency-Key": "two words"}
    ),
    HttpCase(
        "idempotency key too long", b"{}", "Idempotency-Key header", headers={"Idempotency-Key": "k" * 129}
    ),
    HttpCase("idempotency key empty", b"", "Idempotency-Key header", headers={"idempotency-key": ""}),
    HttpCase(
        "idempotency key twice", b"", "given twice", headers={"Idempotency-Key": "a", "idempotency-key": "b"}
    ),
    HttpCase(
        "account key in the reason", _json({"reason": f"AccountKey={FAKE_ACCOUNT_KEY}\n"}), "line breaks"
    ),
)
