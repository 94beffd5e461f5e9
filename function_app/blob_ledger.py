"""The ledger in Blob Storage (and Azurite): one small JSON blob per record, written with conditions.

Create-if-absent is a Put Blob with `If-None-Match: *`; an update reads the record's eTag and replaces it
with `If-Match: <eTag>`, retrying from the read when another writer got there first. A model's state token
is its blob's eTag. A Put Blob replaces a blob's content atomically, so readers never see half a record.
Failures the user must fix (no container, no permission) become one-line, secret-free `LedgerError`s;
transient ones (network, throttling, 5xx) keep their Azure type and propagate, so Event Grid retries.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

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

from function_app.ledger_records import (
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
from function_app.policy_state import ModelState
from function_app.storage_settings import mask_secrets

log = logging.getLogger(__name__)

MAX_UPDATE_ATTEMPTS = 16  # compare-and-set rounds before an update gives up as busy (transient)
EXPECTED_URL_FORM = (
    "https://<account>.blob.core.windows.net/<container>[/<prefix>] "
    "(or http://127.0.0.1:<port>/<account>/<container>[/<prefix>] for the Azurite emulator)"
)
_JSON = ContentSettings(content_type="application/json")
_CLOUD_HOST = re.compile(
    r"(?P<account>[a-z0-9]{3,24})\.blob\.core\.(?:windows\.net|chinacloudapi\.cn|usgovcloudapi\.net)"
)
_EMULATOR_HOSTS = frozenset({"127.0.0.1", "localhost"})
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,254}")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_Record = TypeVar("_Record")


def check_prefix(prefix: str) -> str:
    """The ledger's folder inside its container, without a trailing '/'; '' is the container's root."""
    trimmed = prefix.removesuffix("/")
    segments = trimmed.split("/") if trimmed else []
    if len(trimmed) > 700 or not all(_PREFIX_SEGMENT.fullmatch(segment) for segment in segments):
        raise LedgerError(
            f"ledger prefix {mask_secrets(prefix)!r}: expected folder names of letters, digits, '.', '_', "
            "'=' or '-' separated by single '/' (no leading '/', no '..'), at most 700 characters"
        )
    return trimmed


class BlobLedger:
    """The ledger under `prefix` in a container that exists (the ledger never creates containers)."""

    def __init__(self, container: ContainerClient, prefix: str = "") -> None:
        self._container = container
        folder = check_prefix(prefix)
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


@dataclass(frozen=True)
class LedgerUrl:
    """The parts of a ledger URL: the account's endpoint, the container and the prefix inside it."""

    account: str
    account_url: str
    container: str
    prefix: str
    is_emulator: bool


def parse_ledger_url(url: str) -> LedgerUrl:
    """Split a ledger URL (see `EXPECTED_URL_FORM`); secrets in the URL are refused, never echoed."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _bad_url(url, "it cannot be parsed") from None
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise _bad_url(
            url,
            "credentials do not belong in the URL; use the managed identity (or, for the emulator, "
            "RETRAIN_STORAGE_CONNECTION_STRING)",
        )
    host = parts.hostname or ""
    segments = parts.path.removeprefix("/").removesuffix("/").split("/")
    cloud = _CLOUD_HOST.fullmatch(host)
    if cloud and parts.scheme == "https":
        account, account_url = cloud["account"], f"https://{host}"
    elif host in _EMULATOR_HOSTS and parts.scheme in ("http", "https"):
        account = segments.pop(0)
        account_url = f"{parts.scheme}://{host}{f':{port}' if port else ''}/{account}"
    else:
        raise _bad_url(url, "the host is neither an Azure Blob Storage account over https nor the emulator")
    if not _ACCOUNT.fullmatch(account):
        raise _bad_url(url, f"{account!r} is not a storage account name (3-24 lowercase letters or digits)")
    container = segments[0] if segments else ""
    if not _CONTAINER.fullmatch(container):
        raise _bad_url(url, f"{container!r} is not a container name (3-63 lowercase letters, digits or '-')")
    try:
        prefix = check_prefix("/".join(segments[1:]))
    except LedgerError as err:
        raise _bad_url(url, str(err)) from None
    return LedgerUrl(account, account_url, container, prefix, host in _EMULATOR_HOSTS)


def open_blob_ledger(url: str, connection_string: str | None = None) -> BlobLedger:
    """The ledger at `url`: in Azure with `DefaultAzureCredential` (the Function App's managed identity);
    on the emulator with `connection_string`, which is refused for a real account (keys stay out of Azure
    app settings)."""
    target = parse_ledger_url(url)
    if target.is_emulator:
        if not connection_string:
            raise LedgerError(
                f"ledger URL {target.account_url}/{target.container} is the emulator's, which needs a "
                "connection string; expected RETRAIN_STORAGE_CONNECTION_STRING for the emulator's account"
            )
        container = _emulator_container(target, connection_string)
    elif connection_string:
        raise LedgerError(
            f"ledger URL {target.account_url}/{target.container} is in Azure, where the ledger uses the "
            "managed identity; expected no storage connection string (it is for the emulator only)"
        )
    else:
        from azure.identity import DefaultAzureCredential  # only where the ledger is in Azure

        container = ContainerClient(target.account_url, target.container, credential=DefaultAzureCredential())
    return BlobLedger(container, target.prefix)


def _emulator_container(target: LedgerUrl, connection_string: str) -> ContainerClient:
    try:
        service = BlobServiceClient.from_connection_string(connection_string)
    except ValueError:
        raise LedgerError(  # the SDK's own message may quote the connection string
            "the storage connection string is malformed; expected "
            "'DefaultEndpointsProtocol=...;AccountName=...;AccountKey=...;BlobEndpoint=...'"
        ) from None
    endpoint = service.url.split("?", 1)[0].rstrip("/")
    if service.account_name != target.account or endpoint != target.account_url:
        raise LedgerError(
            f"the storage connection string is for account {service.account_name!r} at "
            f"{mask_secrets(endpoint)}, but the ledger URL is in {target.account!r} at {target.account_url}; "
            "expected a connection string for the ledger's account"
        )
    return service.get_container_client(target.container)


def _bad_url(url: str, reason: str) -> LedgerError:
    shown = url.split("?", 1)[0].split("#", 1)[0]
    scheme, separator, rest = shown.partition("://")
    if separator and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]  # user info may be a credential
    return LedgerError(
        f"ledger URL {mask_secrets(scheme + separator + rest)!r} is not usable: {reason}; "
        f"expected {EXPECTED_URL_FORM}"
    )


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
