"""Parsing the front door's events and requests: good ones in both schemas become one typed trigger; the
bad-input corpus (corpus.py) becomes rejections with their reasons, never exceptions, and never leaks the
account key into a reason or a log line."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from helpers.function_app import corpus
from helpers.function_app.corpus import CLOUD_EVENTS, DROP, EVENT_GRID

from components.azureml.blob_snapshot import manifest_of_blob_prefix
from function_app.events.http_retrain import HttpRejection
from function_app.events.parsing import (
    PayloadError,
    load_event_grid_payload,
    parse_blob_created,
    parse_drift_alert,
    parse_event,
    parse_http_retrain,
)
from function_app.events.triggers import KIND_BLOB, KIND_DRIFT, KIND_HTTP, Rejection, TriggerRequest
from function_app.settings.app import AppSettings

NOW = datetime(2026, 11, 29, 10, 42, tzinfo=UTC)
SCHEMAS = (EVENT_GRID, CLOUD_EVENTS)
PARSERS = {corpus.BLOB: parse_blob_created, corpus.DRIFT: parse_drift_alert}
BLOB_NAME = f"{corpus.PREFIX}/batch-0001.csv"


@pytest.fixture(scope="module")
def settings() -> AppSettings:
    return AppSettings.from_environ(corpus.ENVIRON)


def _accepted(result: Any) -> TriggerRequest:
    assert isinstance(result, TriggerRequest), result
    return result


# --- Blob-created: good events -------------------------------------------------------------------------


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_committed_blob_in_scope_becomes_a_blob_trigger(settings, schema):
    request = _accepted(parse_blob_created(corpus.blob_created(schema), settings, NOW))

    assert request.kind == KIND_BLOB
    assert request.event_id == "831e1650-001e-001b-66ab-eeb76e069631"
    assert request.model_name == corpus.MODEL
    assert request.received_at == NOW
    blob = request.blob
    assert (blob.account, blob.container, blob.name) == (corpus.ACCOUNT, corpus.CONTAINER, BLOB_NAME)
    assert blob.url == f"{corpus.ENDPOINT}/{corpus.CONTAINER}/{BLOB_NAME}"
    assert (blob.etag, blob.sequencer, blob.size) == (corpus.ETAG, corpus.SEQUENCER, 524288)
    assert request.dedupe_key == f"blob:{blob.url}#{corpus.ETAG}"


def test_both_schemas_give_the_same_trigger(settings):
    assert parse_event(corpus.blob_created(EVENT_GRID), settings, NOW) == parse_event(
        corpus.blob_created(CLOUD_EVENTS), settings, NOW
    )


@pytest.mark.parametrize("api", ["PutBlob", "PutBlockList", "CopyBlob"])
def test_every_commit_api_is_accepted(settings, api):
    assert _accepted(parse_blob_created(corpus.blob_created(api=api), settings, NOW)).blob.name == BLOB_NAME


def test_flush_with_close_names_the_data_lake_host_and_keys_on_the_blob_url(settings):
    dfs_url = corpus.blob_url(BLOB_NAME, endpoint=f"https://{corpus.ACCOUNT}.dfs.core.windows.net")
    event = corpus.blob_created(api="FlushWithClose", url=dfs_url)

    blob = _accepted(parse_blob_created(event, settings, NOW)).blob

    # The same blob under one identity, whichever endpoint the event named.
    assert blob.url == f"{corpus.ENDPOINT}/{corpus.CONTAINER}/{BLOB_NAME}"


def test_a_redelivery_keeps_its_key_and_a_new_upload_of_the_blob_gets_another(settings):
    first = _accepted(parse_event(corpus.blob_created(), settings, NOW))
    redelivered = corpus.blob_created(envelope={"id": "another-delivery"})
    overwritten = corpus.blob_created(eTag="0x8DE2F4C1FFFFFFF", sequencer="00000000000004420000000000028999")

    assert _accepted(parse_event(redelivered, settings, NOW)).dedupe_key == first.dedupe_key
    assert _accepted(parse_event(overwritten, settings, NOW)).dedupe_key != first.dedupe_key


def test_names_are_decoded_from_the_url_and_encoded_canonically(settings):
    name = f"{corpus.PREFIX}/batch 2026=11.parquet"
    event = corpus.blob_created(name=name, url=corpus.blob_url(f"{corpus.PREFIX}/batch%202026%3D11.parquet"))

    blob = _accepted(parse_blob_created(event, settings, NOW)).blob

    assert blob.name == name
    assert blob.url.endswith("/digits/batch%202026%3D11.parquet")


def test_a_quoted_etag_is_kept_without_its_quotes(settings):
    event = corpus.blob_created(eTag=f'"{corpus.ETAG}"')
    assert _accepted(parse_blob_created(event, settings, NOW)).blob.etag == corpus.ETAG


def test_an_event_without_a_topic_is_judged_by_its_url(settings):
    event = corpus.blob_created(envelope={"topic": None})
    assert _accepted(parse_blob_created(event, settings, NOW)).blob.name == BLOB_NAME


def test_the_container_root_is_the_scope_when_no_prefix_is_set(settings):
    # models=(): the one model is built again from the new scope (AppSettings.models).
    root = replace(settings, blob=replace(settings.blob, prefix=""), models=())
    assert _accepted(parse_blob_created(corpus.blob_created(name="x.csv"), root, NOW)).blob.name == "x.csv"
    nested = parse_blob_created(corpus.blob_created(name="digits/x.csv"), root, NOW)
    assert isinstance(nested, Rejection)
    assert "sub-folder" in nested.reason


def test_blob_events_are_rejected_when_no_landing_container_is_configured():
    result = parse_blob_created(corpus.blob_created(), AppSettings(), NOW)
    assert isinstance(result, Rejection)
    assert "RETRAIN_BLOB_ACCOUNT" in result.reason


def _emulator_settings(account: str, endpoint: str, connection_string: str, container: str) -> AppSettings:
    return AppSettings.from_environ(
        {
            "RETRAIN_BLOB_ACCOUNT": account,
            "RETRAIN_BLOB_CONTAINER": container,
            "RETRAIN_BLOB_PREFIX": corpus.PREFIX,
            "RETRAIN_BLOB_ENDPOINT": endpoint,
            "RETRAIN_STORAGE_CONNECTION_STRING": connection_string,
        }
    )


def test_emulator_urls_are_accepted_only_for_the_emulator_endpoint(settings):
    endpoint = f"http://127.0.0.1:10000/{corpus.LEDGER_ACCOUNT}"
    emulator = _emulator_settings(
        corpus.LEDGER_ACCOUNT, endpoint, corpus.FAKE_CONNECTION_STRING, corpus.CONTAINER
    )
    # No topic: these events are judged by their URLs alone.
    emulator_event = corpus.blob_created(
        url=corpus.blob_url(BLOB_NAME, endpoint=endpoint), envelope={"topic": None}
    )

    assert _accepted(parse_blob_created(emulator_event, emulator, NOW)).blob.url == (
        f"{endpoint}/{corpus.CONTAINER}/{BLOB_NAME}"
    )
    other_port = corpus.blob_created(
        url=corpus.blob_url(BLOB_NAME, endpoint=endpoint.replace("10000", "10001")), envelope={"topic": None}
    )
    for event, where in ((emulator_event, settings), (other_port, emulator)):
        result = parse_blob_created(event, where, NOW)
        assert isinstance(result, Rejection)
        assert "is not in storage account" in result.reason


def test_a_real_upload_on_azurite_is_keyed_as_the_data_version_lists_it(azurite):
    """The event carries what the blob service reports; the trigger's URL and eTag must be the ones the data
    version later pins (components/azureml/blob_snapshot.py), or dedupe and pinning would disagree."""
    container = azurite.new_container()
    try:
        name = f"{corpus.PREFIX}/batch 0001.csv"
        blob = container.get_blob_client(name)
        blob.upload_blob(b"label,pixel0\n3,0.5\n")
        properties = blob.get_blob_properties()
        settings = _emulator_settings(
            azurite.account, azurite.blob_endpoint, azurite.connection_string, container.container_name
        )
        event = corpus.blob_created(
            name=name,
            container=container.container_name,
            url=blob.url,
            eTag=properties.etag,
            contentLength=properties.size,
            envelope={"topic": corpus.STORAGE_TOPIC.replace(corpus.ACCOUNT, azurite.account)},
        )

        ref = _accepted(parse_blob_created(event, settings, NOW)).blob

        listed = manifest_of_blob_prefix(container, corpus.PREFIX).files[0]
        assert (ref.url, ref.size) == (listed.source, listed.size)
        assert f"etag:{ref.etag}" == listed.fingerprint
    finally:
        container.delete_container()


# --- Drift alerts: good events -------------------------------------------------------------------------


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_model_monitor_breach_is_a_drift_trigger_keyed_by_its_run(settings, schema):
    request = _accepted(parse_drift_alert(corpus.run_status_changed(schema), settings, NOW))

    assert (request.kind, request.model_name, request.received_at) == (KIND_DRIFT, corpus.MODEL, NOW)
    assert request.dedupe_key == f"drift:run:{corpus.MONITOR_RUN_ID}"
    assert corpus.BREACH_MESSAGE in request.reason


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_v1_dataset_drift_is_keyed_by_its_monitor_and_run(settings, schema):
    request = _accepted(parse_drift_alert(corpus.dataset_drift_detected(schema), settings, NOW))

    assert request.dedupe_key == (
        "drift:v1:01d29aa4-e6a4-470a-9ef3-66660d21f8ef/01d29aa4-e6a4-470a-9ef3-66660d21f8ef_1571590300380"
    )
    assert "digitsDriftMonitor" in request.reason
    assert "0.835035" in request.reason


@pytest.mark.parametrize("schema", SCHEMAS)
def test_our_own_drift_event_is_keyed_by_its_check(settings, schema):
    request = _accepted(parse_drift_alert(corpus.retrain_drift_detected(schema), settings, NOW))

    assert request.dedupe_key == "drift:check:drift-check-20261129-1000"
    assert request.reason == (
        "drift check drift-check-20261129-1000: psi 0.31 against threshold 0.2 on rd-0123456789abcdef"
    )


def test_our_drift_event_needs_no_data_version_and_ignores_fields_it_does_not_know(settings):
    event = corpus.retrain_drift_detected(data_version=DROP, window="24h")
    assert _accepted(parse_drift_alert(event, settings, NOW)).reason.endswith("threshold 0.2")


def test_parse_event_dispatches_on_the_type(settings):
    assert _accepted(parse_event(corpus.blob_created(CLOUD_EVENTS), settings, NOW)).kind == KIND_BLOB
    assert _accepted(parse_event(corpus.run_status_changed(), settings, NOW)).kind == KIND_DRIFT
    unknown = parse_event(
        corpus.blob_created(envelope={"eventType": "Contoso.Orders.Created"}), settings, NOW
    )
    assert isinstance(unknown, Rejection)
    assert (unknown.kind, unknown.event_id) == (KIND_DRIFT, "831e1650-001e-001b-66ab-eeb76e069631")
    assert "is not a drift alert" in unknown.reason


# --- HTTP: good requests -------------------------------------------------------------------------------


def test_an_empty_body_asks_for_a_run_on_the_current_data(settings):
    request = _accepted(parse_http_retrain(b"", {}, settings, NOW, new_id=lambda: "http-1"))

    assert (request.kind, request.event_id, request.model_name) == (KIND_HTTP, "http-1", corpus.MODEL)
    assert (request.data_uri, request.reason, request.force) == (None, None, False)
    assert request.dedupe_key == "http:http-1"


def test_requests_without_an_idempotency_key_are_never_deduplicated(settings):
    first = _accepted(parse_http_retrain(b"{}", {}, settings, NOW))
    second = _accepted(parse_http_retrain(b"{}", {}, settings, NOW))
    assert first.dedupe_key != second.dedupe_key
    assert first.event_id != second.event_id


def test_the_idempotency_key_is_the_dedupe_key_whatever_the_header_case(settings):
    keys = {
        _accepted(parse_http_retrain(b"{}", {name: "nightly:2026-11-29"}, settings, NOW)).dedupe_key
        for name in ("Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY")
    }
    assert keys == {"http:nightly:2026-11-29"}


def test_every_field_of_a_full_body_is_carried(settings):
    body = (
        b'{"data": "https://retraindata.blob.core.windows.net/landing/digits/2026-11/", '
        b'"reason": "labels fixed", "force": true, "model_name": "digits"}'
    )
    request = _accepted(parse_http_retrain(body, {}, settings, NOW))

    assert request.data_uri == "https://retraindata.blob.core.windows.net/landing/digits/2026-11"
    assert (request.reason, request.force) == ("labels fixed", True)


def test_a_pinned_data_asset_is_accepted(settings):
    body = b'{"data": "azureml:digits-raw:rd-0123456789abcdef"}'
    assert (
        _accepted(parse_http_retrain(body, {}, settings, NOW)).data_uri
        == "azureml:digits-raw:rd-0123456789abcdef"
    )


def test_a_body_exactly_at_the_limit_is_read_and_one_byte_more_is_413(settings):
    at_limit = b"{}" + b" " * (corpus.MAX_BODY_BYTES - 2)
    assert _accepted(parse_http_retrain(at_limit, {}, settings, NOW)).kind == KIND_HTTP
    refused = parse_http_retrain(at_limit + b" ", {}, settings, NOW)
    assert refused == HttpRejection(413, refused.reason)


def test_an_http_rejection_is_a_client_error():
    with pytest.raises(ValueError, match="expected a 4xx"):
        HttpRejection(500, "server trouble")


# --- The bad-input corpus ------------------------------------------------------------------------------


def test_the_corpus_is_large_and_covers_every_family():
    assert len(corpus.EVENT_CASES) + len(corpus.HTTP_CASES) >= 30
    assert {case.family for case in corpus.EVENT_CASES} == {corpus.BLOB, corpus.DRIFT}
    names = [case.name for case in (*corpus.EVENT_CASES, *corpus.HTTP_CASES)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", corpus.EVENT_CASES, ids=lambda case: case.name)
def test_every_bad_event_is_rejected_with_its_reason(settings, case):
    result = PARSERS[case.family](case.event, settings, NOW)

    assert isinstance(result, Rejection)
    assert result.kind == case.family
    assert case.reason in result.reason
    assert "\n" not in result.reason and len(result.reason) < 600


@pytest.mark.parametrize("case", corpus.EVENT_CASES, ids=lambda case: case.name)
def test_parse_event_rejects_every_bad_event_as_its_trigger_does(settings, case):
    result = parse_event(case.event, settings, NOW)

    if isinstance(result, TriggerRequest):  # a good event sent to the wrong trigger: parse_event routes it
        assert case.name in ("a drift event at the blob trigger", "blob event at the drift trigger")
        assert result.kind != case.family
    else:
        assert isinstance(result, Rejection)
        if result.kind == case.family:  # typeless events go to the drift parser, which rejects them too
            assert result == PARSERS[case.family](case.event, settings, NOW)


@pytest.mark.parametrize("case", corpus.HTTP_CASES, ids=lambda case: case.name)
def test_every_bad_request_is_refused_with_its_status_and_reason(settings, case):
    result = parse_http_retrain(case.body, case.headers, settings, NOW)

    assert isinstance(result, HttpRejection)
    assert result.status == case.status
    assert case.reason in result.reason
    assert "\n" not in result.reason and len(result.reason) < 600


def test_no_secret_reaches_a_reason_or_a_log_line(settings, caplog):
    caplog.set_level(logging.DEBUG)
    reasons = [PARSERS[case.family](case.event, settings, NOW).reason for case in corpus.EVENT_CASES]
    reasons += [
        parse_http_retrain(case.body, case.headers, settings, NOW).reason for case in corpus.HTTP_CASES
    ]
    logging.getLogger("test").info("settings: %r; %s", settings, settings.describe())

    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) > len(reasons)  # every rejection was logged, and the settings too
    assert any("AccountKey=***" in reason for reason in reasons)  # the one the name carried, masked
    for text in (*reasons, *lines):
        assert corpus.FAKE_ACCOUNT_KEY not in text


# --- Anything at all: a rejection, never an exception ---------------------------------------------------

ODD_VALUES = (None, True, 0, -1, 1e308, "", " ", "x" * 5000, "\x00", "%2e%2e", [], [1], {}, {"a": {}})
GOOD_EVENTS = {
    "blob/eventgrid": (corpus.blob_created(EVENT_GRID), parse_blob_created),
    "blob/cloudevents": (corpus.blob_created(CLOUD_EVENTS), parse_blob_created),
    "monitor": (corpus.run_status_changed(), parse_drift_alert),
    "monitor/cloudevents": (corpus.run_status_changed(CLOUD_EVENTS), parse_drift_alert),
    "v1 drift": (corpus.dataset_drift_detected(), parse_drift_alert),
    "own drift": (corpus.retrain_drift_detected(CLOUD_EVENTS), parse_drift_alert),
}


@pytest.mark.parametrize("name", GOOD_EVENTS)
def test_any_field_of_any_type_gives_a_trigger_or_a_rejection(settings, name):
    event, parser = GOOD_EVENTS[name]
    variants = []
    for key in event:
        variants += [{**event, key: value} for value in ODD_VALUES]
    for key in event["data"]:
        variants += [{**event, "data": {**event["data"], key: value}} for value in ODD_VALUES]

    results = [parser(variant, settings, NOW) for variant in variants]

    assert all(isinstance(result, TriggerRequest | Rejection) for result in results)
    assert sum(isinstance(result, Rejection) for result in results) > len(results) // 2


def test_any_body_field_of_any_type_gives_a_trigger_or_a_refusal(settings):
    bodies = [
        json.dumps({key: value}).encode()
        for key in ("data", "reason", "force", "model_name")
        for value in ODD_VALUES
    ]
    results = [parse_http_retrain(body, {}, settings, NOW) for body in bodies]
    assert all(isinstance(result, TriggerRequest | HttpRejection) for result in results)


# --- Deliveries ------------------------------------------------------------------------------------------


def test_a_delivery_is_an_object_or_an_array_of_events():
    event = corpus.blob_created()
    assert load_event_grid_payload(json.dumps(event)) == [event]
    assert load_event_grid_payload(json.dumps([event, corpus.run_status_changed()]))[1]["eventType"] == (
        "Microsoft.MachineLearningServices.RunStatusChanged"
    )
    assert load_event_grid_payload("[]") == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<xml/>", "not JSON"),
        ("", "not JSON"),
        ("42", "is a JSON number; expected an event object"),
        ('["event"]', "element 0 of the array is a JSON string"),
        ('{"id": "a", "id": "b"}', "duplicate key"),
    ],
)
def test_a_delivery_that_is_not_events_raises_a_one_line_payload_error(text, reason):
    with pytest.raises(PayloadError, match=reason) as raised:
        load_event_grid_payload(text)
    assert "\n" not in str(raised.value)
