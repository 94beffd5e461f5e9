"""The record store in Blob Storage (and Azurite): one small blob per record, written with conditions.

Create-if-absent is a Put Blob with `If-None-Match: *`; a replace is a Put Blob with `If-Match: <eTag>`;
a record's version is its eTag and its tag is blob metadata, which a listing returns with the names. A Put
Blob replaces a blob's content atomically, so readers never see half a record. The lease is a blob lease of
LEASE_SECONDS on `leases/<name>`, renewed every RENEW_SECONDS by a thread while held: a holder that dies
stops renewing and its lease expires, so the next flush takes over within LEASE_SECONDS.
Failures the user must fix (no container, no permission) become one-line, secret-free `LedgerError`s;
transient ones (network, throttling, 5xx) keep their Azure type and propagate, so Event Grid retries.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

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
from azure.storage.blob import BlobLeaseClient, BlobServiceClient, ContainerClient, ContentSettings

from core.blob_urls import BlobLocation, check_prefix, parse_blob_url
from core.locks import LeaseRenewal
from core.secrets import mask_secrets
from function_app.ledger.records import LedgerError
from function_app.ledger.store import (
    Holder,
    Listed,
    Stored,
    check_name,
    check_tag,
    holder_stamp,
    quarantine_name,
    read_holder_stamp,
)

log = logging.getLogger(__name__)

LEDGER_URL = "ledger URL"  # how errors name the URL
LEASE_SECONDS = 15  # Azure's shortest lease: a dead holder's lease frees soonest
RENEW_SECONDS = 5.0
LEASES = "leases"
_TAG_KEY = "retrain_tag"
_OCTETS = ContentSettings(content_type="application/octet-stream")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class _BlobLease:
    """A held blob lease, renewed by a daemon thread until released; `lost` once a renewal failed."""

    def __init__(self, client: BlobLeaseClient) -> None:
        self._client = client
        self._renewal = LeaseRenewal(
            client.renew, RENEW_SECONDS, LEASE_SECONDS, f"the ledger lease {client.id}", _reason
        )
        self._thread = self._renewal.thread  # what the record-store tests wait on

    @property
    def lost(self) -> bool:
        return self._renewal.lost

    def release(self) -> None:
        self._renewal.stop()
        if not self.lost:
            with contextlib.suppress(AzureError):  # it expires on its own if this fails
                self._client.release()


class BlobRecordStore:
    """The records under `prefix` in a container that exists (the ledger never creates containers)."""

    def __init__(self, container: ContainerClient, prefix: str = "") -> None:
        self._container = container
        folder = check_prefix(prefix, "ledger prefix", LedgerError)
        self._folder = f"{folder}/" if folder else ""
        self.location = mask_secrets(f"{container.url.split('?', 1)[0]}/{self._folder}")

    def create(self, name: str, data: bytes, tag: str = "") -> bool:
        full = self._name(name)
        with self._storage_errors("create", full):
            try:
                # One Put Blob (a record is far below the single-put size) with If-None-Match: *.
                self._container.upload_blob(
                    full, data, overwrite=False, metadata=_metadata(tag), content_settings=_OCTETS
                )
            except ResourceExistsError:
                return False
        return True

    def read(self, name: str) -> Stored | None:
        full = self._name(name)
        with self._storage_errors("read", full):
            try:
                download = self._container.download_blob(full)
                data = download.readall()
            except ResourceNotFoundError as err:
                if _is_container_missing(err):
                    raise
                return None
        properties = download.properties
        return Stored(data, properties.etag, (properties.metadata or {}).get(_TAG_KEY, ""))

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool:
        full = self._name(name)
        with self._storage_errors("update", full):
            try:
                self._container.upload_blob(
                    full,
                    data,
                    overwrite=True,
                    etag=version,
                    match_condition=MatchConditions.IfNotModified,
                    metadata=_metadata(tag),
                    content_settings=_OCTETS,
                )
            except (ResourceModifiedError, ResourceNotFoundError) as err:
                if isinstance(err, ResourceNotFoundError) and _is_container_missing(err):
                    raise
                return False
        return True

    def list(self, prefix: str) -> Iterator[Listed]:
        start = f"{self._folder}{prefix}"
        with self._storage_errors("list", start):
            blobs = list(self._container.list_blobs(name_starts_with=start, include=["metadata"]))
        for blob in blobs:
            yield Listed(
                blob.name.removeprefix(self._folder),
                _quoted(blob.etag),
                (blob.metadata or {}).get(_TAG_KEY, ""),
            )

    def quarantine(self, name: str, version: str) -> str | None:
        # A listed name as it is (a stray blob's name need not be a record's); the copy is a read and a
        # create-if-absent (records are small), the delete is conditioned on the version read.
        source, target = f"{self._folder}{name}", quarantine_name(name, version)
        with self._storage_errors("quarantine", source):
            try:
                data = self._container.download_blob(
                    source, etag=version, match_condition=MatchConditions.IfNotModified
                ).readall()
            except ResourceNotFoundError as err:
                if _is_container_missing(err):
                    raise
                return target  # another reader moved it first
            except ResourceModifiedError:
                return None
            with contextlib.suppress(ResourceExistsError):  # another reader copied it first
                self._container.upload_blob(
                    self._name(target), data, overwrite=False, content_settings=_OCTETS
                )
            try:
                self._container.delete_blob(
                    source, etag=version, match_condition=MatchConditions.IfNotModified
                )
            except ResourceNotFoundError as err:
                if _is_container_missing(err):
                    raise
            except ResourceModifiedError:
                pass  # rewritten meanwhile: what is there now is read again next time
        return target

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[_BlobLease | None]:
        full = self._lease_name(name)
        client = self._container.get_blob_client(full)
        with self._storage_errors("lease", full):
            with contextlib.suppress(ResourceExistsError):
                client.upload_blob(b"", overwrite=False)
            lease_client = BlobLeaseClient(client)
            try:
                lease_client.acquire(lease_duration=LEASE_SECONDS)
            except HttpResponseError as err:
                if err.status_code != 409:  # 409: LeaseAlreadyPresent, another flush holds it
                    raise
                lease = None
            else:
                lease = _BlobLease(lease_client)
                try:  # who holds it, for a refused flush to say; a report, so its failure stops nothing
                    client.set_blob_metadata(holder_stamp(), lease=lease_client)
                except AzureError as err:
                    log.warning("could not record this flush as the holder of %s: %s", full, _describe(err))
        try:
            yield lease
        finally:
            if lease is not None:
                lease.release()

    def holder(self, name: str) -> Holder | None:
        full = self._lease_name(name)
        with self._storage_errors("read the lease of", full):
            try:
                properties = self._container.get_blob_client(full).get_blob_properties()
            except ResourceNotFoundError as err:
                if _is_container_missing(err):
                    raise
                return None
        if properties.lease.state != "leased":
            return None
        # An infinite lease is never a flush's (they take LEASE_SECONDS); what it carries is then the
        # last flush's stamp, not its holder's.
        endless = properties.lease.duration == "infinite"
        return read_holder_stamp(None if endless else dict(properties.metadata or {}), endless=endless)

    def _lease_name(self, name: str) -> str:
        return self._name(f"{LEASES}/{check_name(name).replace('/', '~')}")

    def _name(self, name: str) -> str:
        return f"{self._folder}{check_name(name)}"

    @contextlib.contextmanager
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


def _quoted(etag: str) -> str:
    """A listing gives eTags bare (0x8DC...), a read quoted ("0x8DC..."): one form, so a listed version
    equals the read one and is a valid If-Match (which HTTP wants quoted)."""
    return etag if etag.startswith('"') else f'"{etag}"'


def _metadata(tag: str) -> dict[str, str]:
    return {_TAG_KEY: check_tag(tag)} if tag else {}


def open_blob_store(url: str, connection_string: str | None = None) -> BlobRecordStore:
    """The store at `url`: in Azure with `DefaultAzureCredential` (the Function App's managed identity);
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
    return BlobRecordStore(container, target.prefix)


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


def _reason(err: BaseException) -> str:
    return _describe(err) if isinstance(err, AzureError) else type(err).__name__


def _describe(err: AzureError) -> str:
    if isinstance(err, HttpResponseError) and err.status_code is not None:
        code = getattr(err, "error_code", None)
        return mask_secrets(f"HTTP {err.status_code} {err.reason or ''} ({code or 'no error code'})")
    lines = str(err).strip().splitlines()
    return mask_secrets(lines[0] if lines else type(err).__name__)[:300]
