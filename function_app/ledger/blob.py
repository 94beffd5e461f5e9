"""The ledger in Blob Storage (and Azurite): one small JSON blob per record, written with conditions.

Create-if-absent is a Put Blob with `If-None-Match: *`; an update reads the record's eTag and replaces it
with `If-Match: <eTag>`, retrying from the read when another writer got there first. A model's state token
is its blob's eTag. A Put Blob replaces a blob's content atomically, so readers never see half a record.
Failures the user must fix (no container, no permission) become one-line, secret-free `LedgerError`s;
transient ones (network, throttling, 5xx) keep their Azure type and propagate, so Event Grid retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings

from function_app.ledger.records import (
    EVENTS,
    MODELS,
    SUBMISSIONS,
    EventRecord,
    LedgerBusyError,
    LedgerError,
    SubmissionRecord,
    build_snapshot,
    check_claim,
    check_model,
    check_record_id,
    encode,
    event_replaceable,
    parse_record,
    stored_state,
    submission_replaceable,
)
from function_app.policy.state import ModelState
from training.common import BlobLocation, check_prefix, mask_secrets, parse_blob_url

log = logging.getLogger(__name__)

MAX_UPDATE_ATTEMPTS = 16  # compare-and-set rounds before an update gives up as busy (transient)
LEDGER_URL = "ledger URL"  # how errors name the URL
_JSON = ContentSettings(content_type="application/json")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_Record = TypeVar("_Record")


class BlobLedger:
    """The ledger under `prefix` in a container that exists (the ledger never creates containers)."""

    def __init__(self, container: ContainerClient, prefix: str = "") -> None:
        self._container = container
        folder = check_prefix(prefix, "ledger prefix", LedgerError)
        self._folder = f"{folder}/" if folder else ""
        self.location = mask_secrets(f"{container.url.split('?', 1)[0]}/{self._folder}")

    def claim_event(self, record: EventRecord) -> bool:
        check_claim(record)
        return self._create(self._name(EVENTS, record.id), record.to_dict())

    def record_event(self, record: EventRecord) -> None:
        if not self._create(self._name(EVENTS, record.id), record.to_dict()):
            raise LedgerError(f"event record {record.id} exists; expected a fresh id from new_delivery_id()")

    def event(self, record_id: str) -> EventRecord | None:
        found = self._read(self._name(EVENTS, record_id), EventRecord.from_dict)
        return None if found is None else found[0]

    def update_event(self, record: EventRecord) -> bool:
        return self._update(EVENTS, record, EventRecord.from_dict, event_replaceable)

    def load_state(self, model_name: str) -> tuple[ModelState, str | None]:
        found = self._read(self._name(MODELS, model_name), stored_state)
        if found is None:
            return ModelState.empty(model_name), None
        state, etag = found
        check_model(model_name, state)
        return state, etag

    def save_state(self, model_name: str, state: ModelState, token: str | None) -> bool:
        check_model(model_name, state)
        name, payload = self._name(MODELS, model_name), {"state": state.to_dict()}
        return self._create(name, payload) if token is None else self._replace(name, payload, token)

    def create_submission(self, record: SubmissionRecord) -> bool:
        return self._create(self._name(SUBMISSIONS, record.id), record.to_dict())

    def update_submission(self, record: SubmissionRecord) -> bool:
        return self._update(SUBMISSIONS, record, SubmissionRecord.from_dict, submission_replaceable)

    def submission(self, submission_id: str) -> SubmissionRecord | None:
        found = self._read(self._name(SUBMISSIONS, submission_id), SubmissionRecord.from_dict)
        return None if found is None else found[0]

    def snapshot(self) -> dict[str, Any]:
        events = [record for record, _ in self._read_all(EVENTS, EventRecord.from_dict)]
        submissions = [record for record, _ in self._read_all(SUBMISSIONS, SubmissionRecord.from_dict)]
        return build_snapshot(events, submissions)

    def _name(self, area: str, record_id: str) -> str:
        return f"{self._folder}{area}/{check_record_id(record_id, f'{area} record id')}.json"

    def _create(self, name: str, payload: Mapping[str, Any]) -> bool:
        with self._storage_errors("create", name):
            try:
                # One Put Blob (the record is far below the single-put size) with If-None-Match: *.
                self._container.upload_blob(name, encode(payload), overwrite=False, content_settings=_JSON)
            except ResourceExistsError:
                return False
        return True

    def _replace(self, name: str, payload: Mapping[str, Any], etag: str) -> bool:
        with self._storage_errors("update", name):
            try:
                self._container.upload_blob(
                    name,
                    encode(payload),
                    overwrite=True,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    content_settings=_JSON,
                )
            except (ResourceModifiedError, ResourceNotFoundError) as err:
                if isinstance(err, ResourceNotFoundError) and _is_container_missing(err):
                    raise
                return False
        return True

    def _read(self, name: str, parse: Callable[[Any], _Record]) -> tuple[_Record, str] | None:
        with self._storage_errors("read", name):
            try:
                download = self._container.download_blob(name)
                data = download.readall()
            except ResourceNotFoundError as err:
                if _is_container_missing(err):
                    raise
                return None
        record = parse_record(f"{self.location}{name.removeprefix(self._folder)}", data, parse)
        return record, download.properties.etag

    def _read_all(self, area: str, parse: Callable[[Any], _Record]) -> Iterator[tuple[_Record, str]]:
        with self._storage_errors("list", f"{self._folder}{area}/"):
            names = [
                blob.name for blob in self._container.list_blobs(name_starts_with=f"{self._folder}{area}/")
            ]
        for name in names:
            found = self._read(name, parse)
            if found is not None:  # deleted by someone else since the listing
                yield found

    def _update(
        self,
        area: str,
        record: Any,
        parse: Callable[[Any], _Record],
        replaceable: Callable[[_Record, _Record], bool],
    ) -> bool:
        name = self._name(area, record.id)
        for _ in range(MAX_UPDATE_ATTEMPTS):
            found = self._read(name, parse)
            if found is None:
                raise LedgerError(f"{area} record {record.id} does not exist; expected one created before")
            if not replaceable(found[0], record):
                return False
            if self._replace(name, record.to_dict(), found[1]):
                return True
            log.debug("ledger record %s changed under an update; reading it again", name)
        raise LedgerBusyError(
            f"{area} record {record.id} changed under {MAX_UPDATE_ATTEMPTS} updates in a row; retry later"
        )

    @contextmanager
    def _storage_errors(self, action: str, name: str) -> Iterator[None]:
        try:
            yield
        except ResourceNotFoundError as err:
            if _is_container_missing(err):
                raise LedgerError(
                    f"the ledger's container {self.location} does not exist; create it first "
                    "(the ledger never creates containers)"
                ) from None
            raise self._failure(action, name, err) from None
        except AzureError as err:
            if _is_transient(err):
                raise
            raise self._failure(action, name, err) from None

    def _failure(self, action: str, name: str, err: AzureError) -> LedgerError:
        return LedgerError(f"cannot {action} ledger record {name} in {self.location}: {_describe(err)}")


def open_blob_ledger(url: str, connection_string: str | None = None) -> BlobLedger:
    """The ledger at `url`: in Azure with `DefaultAzureCredential` (the Function App's managed identity);
    on the emulator with `connection_string`, which is refused for a real account (keys stay out of Azure
    app settings)."""
    target = parse_blob_url(url, LEDGER_URL, LedgerError)
    if target.endpoint.is_emulator:
        if not connection_string:
            raise LedgerError(
                f"ledger URL {target.container_url} is the emulator's, which needs a connection string; "
                "expected RETRAIN_STORAGE_CONNECTION_STRING for the emulator's account"
            )
        container = _emulator_container(target, connection_string)
    elif connection_string:
        raise LedgerError(
            f"ledger URL {target.container_url} is in Azure, where the ledger uses the managed identity; "
            "expected no storage connection string (it is for the emulator only)"
        )
    else:
        from azure.identity import DefaultAzureCredential  # only where the ledger is in Azure

        credential = DefaultAzureCredential()
        container = ContainerClient(target.endpoint.url, target.container, credential=credential)
    return BlobLedger(container, target.prefix)


def _emulator_container(target: BlobLocation, connection_string: str) -> ContainerClient:
    try:
        service = BlobServiceClient.from_connection_string(connection_string)
    except ValueError:
        raise LedgerError(  # the SDK's own message may quote the connection string
            "the storage connection string is malformed; expected "
            "'DefaultEndpointsProtocol=...;AccountName=...;AccountKey=...;BlobEndpoint=...'"
        ) from None
    endpoint = service.url.split("?", 1)[0].rstrip("/")
    if service.account_name != target.endpoint.account or endpoint != target.endpoint.url:
        raise LedgerError(
            f"the storage connection string is for account {service.account_name!r} at "
            f"{mask_secrets(endpoint)}, but the ledger URL is in {target.endpoint.account!r} at "
            f"{target.endpoint.url}; expected a connection string for the ledger's account"
        )
    return service.get_container_client(target.container)


def _is_container_missing(err: ResourceNotFoundError) -> bool:
    return getattr(err, "error_code", None) == "ContainerNotFound"


def _is_transient(err: AzureError) -> bool:
    if isinstance(err, ServiceRequestError | ServiceResponseError):
        return True
    return isinstance(err, HttpResponseError) and err.status_code in _TRANSIENT_STATUS


def _describe(err: AzureError) -> str:
    if isinstance(err, HttpResponseError) and err.status_code is not None:
        code = getattr(err, "error_code", None)
        return mask_secrets(f"HTTP {err.status_code} {err.reason or ''} ({code or 'no error code'})")
    lines = str(err).strip().splitlines()
    return mask_secrets(lines[0] if lines else type(err).__name__)[:300]
