"""The storage seam in Blob Storage (and Azurite): records as small blobs written with conditions, leases
as renewed blob leases, and the one way a container client is built.

Records: create-if-absent is a Put Blob with `If-None-Match: *`; a replace is a Put Blob with `If-Match:
<eTag>`, a delete a Delete Blob with it; a record's version is its eTag and its tag is blob metadata, which a
listing returns with the names. A Put Blob replaces a blob's content atomically, so readers never see half a
record. Leases: a blob lease of 15 to 60 s, renewed every third of that by a thread while held; the blob's
content names the holder. A holder that dies stops renewing and its lease expires.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import (
    BlobClient,
    BlobLeaseClient,
    BlobServiceClient,
    ContainerClient,
    ContentSettings,
)

from core.blob_urls import BlobLocation, check_prefix, parse_blob_url
from core.secrets import mask_secrets
from core.storage.azure_errors import AzureErrors, describe, is_container_missing
from core.storage.leases import HeldBy, LeaseRenewal
from core.storage.records import (
    CONNECTION_STRING_VARIABLE,
    ErrorType,
    Listed,
    Stored,
    check_name,
    check_tag,
    lease_file_name,
)

log = logging.getLogger(__name__)

LEASES = "leases"  # where a record store keeps its leases, under its prefix
RECORD_LEASE_SECONDS = 15  # Azure's shortest lease: a dead holder's lease frees soonest
_TAG_KEY = "retrain_tag"
_OCTETS = ContentSettings(content_type="application/octet-stream")


def container_url(container: ContainerClient, prefix: str = "") -> str:
    """Where a container (and a prefix in it) is, for messages: without a query, secrets masked."""
    url = mask_secrets(container.url.split("?", 1)[0])
    return f"{url}/{prefix}" if prefix else url


class BlobRecords:
    """The records under `prefix` in a container that exists (the store never creates containers); errors
    are `error`s naming the `owner` ("ledger")."""

    def __init__(self, container: ContainerClient, owner: str, error: ErrorType, prefix: str = "") -> None:
        self._container = container
        self._owner, self._error = owner, error
        folder = check_prefix(prefix, f"{owner} prefix", error)
        self._folder = f"{folder}/" if folder else ""
        self.location = f"{container_url(container)}/{self._folder}"

    def create(self, name: str, data: bytes, tag: str = "") -> bool:
        full = self._name(name)
        with self._errors(full).translated("create"):
            try:
                # One Put Blob (a record is far below the single-put size) with If-None-Match: *.
                self._container.upload_blob(
                    full, data, overwrite=False, metadata=self._metadata(tag), content_settings=_OCTETS
                )
            except ResourceExistsError:
                return False
        return True

    def read(self, name: str) -> Stored | None:
        full = f"{self._folder}{name}"  # a name as listed, which may be a stray blob's
        with self._errors(full).translated("read"):
            try:
                download = self._container.download_blob(full)
                data = download.readall()
            except ResourceNotFoundError as err:
                if is_container_missing(err):
                    raise
                return None
        properties = download.properties
        return Stored(data, properties.etag, (properties.metadata or {}).get(_TAG_KEY, ""))

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool:
        full = self._name(name)
        with self._errors(full).translated("update"):
            try:
                self._container.upload_blob(
                    full,
                    data,
                    overwrite=True,
                    etag=version,
                    match_condition=MatchConditions.IfNotModified,
                    metadata=self._metadata(tag),
                    content_settings=_OCTETS,
                )
            except (ResourceModifiedError, ResourceNotFoundError) as err:
                if is_container_missing(err):
                    raise
                return False
        return True

    def list(self, prefix: str) -> Iterator[Listed]:
        start = f"{self._folder}{prefix}"
        with self._errors(start).translated("list"):
            blobs = list(self._container.list_blobs(name_starts_with=start, include=["metadata"]))
        for blob in blobs:
            yield Listed(
                blob.name.removeprefix(self._folder),
                _quoted(blob.etag),
                (blob.metadata or {}).get(_TAG_KEY, ""),
            )

    def delete(self, name: str, version: str | None = None) -> bool:
        full = f"{self._folder}{name}"  # a name as listed, which may be a stray blob's
        with self._errors(full).translated("delete"):
            try:
                if version is None:
                    self._container.delete_blob(full)
                else:
                    self._container.delete_blob(
                        full, etag=version, match_condition=MatchConditions.IfNotModified
                    )
            except ResourceNotFoundError as err:
                if is_container_missing(err):
                    raise
            except ResourceModifiedError:
                return False
        return True

    def lease(self, name: str) -> BlobLease:
        full = self._name(f"{LEASES}/{lease_file_name(check_name(name, self._owner, self._error))}")
        return BlobLease(
            self._container.get_blob_client(full),
            RECORD_LEASE_SECONDS,
            f"the {self._owner} lease {full}",
            self._errors(full),
            self._error,
        )

    def _errors(self, name: str) -> AzureErrors:
        return AzureErrors(
            lambda action, reason: self._error(
                f"cannot {action} {self._owner} record {name} in {self.location}: {reason}"
            ),
            lambda: self._error(
                f"the {self._owner}'s container {self.location} does not exist; create it first "
                f"(the {self._owner} never creates containers)"
            ),
        )

    def _name(self, name: str) -> str:
        return f"{self._folder}{check_name(name, self._owner, self._error)}"

    def _metadata(self, tag: str) -> dict[str, str]:
        return {_TAG_KEY: check_tag(tag, self._owner, self._error)} if tag else {}


def _quoted(etag: str) -> str:
    """A listing gives eTags bare (0x8DC...), a read quoted ("0x8DC..."): one form, so a listed version
    equals the read one and is a valid If-Match (which HTTP wants quoted)."""
    return etag if etag.startswith('"') else f'"{etag}"'


class BlobLease:
    """A blob lease of `seconds` on `blob` (created empty if absent), named `what` in logs; `errors` words
    its failures, `error` a duration Azure does not allow. While held, a thread renews it every third of
    its duration (`renewal`, None while not held) and the blob's content names the holder."""

    def __init__(
        self, blob: BlobClient, seconds: int, what: str, errors: AzureErrors, error: ErrorType
    ) -> None:
        if not 15 <= seconds <= 60:
            raise error(f"a blob lease of {seconds} s: Azure leases last 15 to 60 seconds")
        self._blob = blob
        self._client = BlobLeaseClient(blob)
        self._seconds = seconds
        self._what = what
        self._errors = errors
        self._created = False
        self.renewal: LeaseRenewal | None = None
        self.location = mask_secrets(blob.url.split("?", 1)[0])

    @property
    def lost(self) -> bool:
        return self.renewal is not None and self.renewal.lost

    def take(self, holder: bytes) -> bool:
        if self.renewal is not None:
            raise RuntimeError(f"{self._what} is already held by this object")
        with self._errors.translated("take"):
            self._create_blob()
            try:
                self._client.acquire(lease_duration=self._seconds)
            except HttpResponseError as err:
                if err.status_code == 409:  # LeaseAlreadyPresent: another holder has it
                    return False
                raise
        try:
            with self._errors.translated("name the holder of"):
                self._blob.upload_blob(holder, overwrite=True, lease=self._client)
        except BaseException:
            self._release_lease()
            raise
        self.renewal = LeaseRenewal(
            self._client.renew, self._seconds / 3, self._seconds, self._what, describe
        )
        return True

    def release(self) -> None:
        renewal, self.renewal = self.renewal, None
        if renewal is None:
            return
        renewal.stop()
        if not renewal.lost:  # a lost lease has nothing left to release
            self._release_lease()

    def holder(self) -> HeldBy | None:
        with self._errors.translated("read the lease of"):
            try:
                properties = self._blob.get_blob_properties()
            except ResourceNotFoundError as err:
                if is_container_missing(err):
                    raise
                return None
        if properties.lease.state != "leased":
            return None
        if properties.lease.duration == "infinite":  # never one of ours: its content is a past holder's
            return HeldBy(b"", endless=True)
        try:
            return HeldBy(self._blob.download_blob().readall())
        except AzureError:  # a report: who it is may be unknown, but it is held
            return HeldBy(b"")

    def _create_blob(self) -> None:
        if self._created or self._blob.exists():
            self._created = True
            return
        try:
            self._blob.upload_blob(b"", overwrite=False)  # If-None-Match: *, so a racing creator loses
        except ResourceExistsError:
            pass
        except HttpResponseError as err:
            if err.status_code != 412:  # it exists, and is leased already
                raise
        self._created = True

    def _release_lease(self) -> None:
        try:
            self._client.release()
        except AzureError as err:
            log.warning(
                "could not release %s (%s); it expires within %d s", self._what, describe(err), self._seconds
            )


def open_container(
    url: str, connection_string: str | None, what: str, error: ErrorType, *, key_in_azure: bool = True
) -> tuple[ContainerClient, str]:
    """The container `url` names and the prefix inside it. Authenticated by `connection_string` when given
    (Azurite, development; in Azure only where `key_in_azure`: the Function App keeps keys out of its app
    settings), else by `DefaultAzureCredential` (the managed identity). Errors are `error`s naming the URL
    as `what`."""
    target = parse_blob_url(url, what, error)
    if connection_string and (target.endpoint.is_emulator or key_in_azure):
        container = _container_from_connection_string(target, connection_string, what, error)
    elif connection_string:
        raise error(
            f"{what} {target.url} is in Azure, where the managed identity is used; expected no storage "
            "connection string (it is for the emulator only)"
        )
    elif target.endpoint.is_emulator:
        raise error(
            f"{what} {target.url} points at the emulator, which needs a connection string; expected "
            f"{CONNECTION_STRING_VARIABLE} for the emulator's account"
        )
    else:
        from azure.identity import DefaultAzureCredential  # heavy, and only needed in Azure

        container = ContainerClient(
            target.endpoint.url, target.container, credential=DefaultAzureCredential()
        )
    return container, target.prefix


def _container_from_connection_string(
    target: BlobLocation, connection_string: str, what: str, error: ErrorType
) -> ContainerClient:
    try:
        service = BlobServiceClient.from_connection_string(connection_string)
    except ValueError:
        raise error(  # the SDK's own message may quote the connection string; ours must not
            "the storage connection string is malformed; expected "
            "'DefaultEndpointsProtocol=...;AccountName=...;AccountKey=...;BlobEndpoint=...'"
        ) from None
    endpoint = mask_secrets(service.url.split("?", 1)[0].rstrip("/"))
    if service.account_name != target.endpoint.account or endpoint != target.endpoint.url:
        raise error(
            f"the storage connection string is for account {service.account_name!r} at {endpoint}, but the "
            f"{what} {target.url} is in account {target.endpoint.account!r} at {target.endpoint.url}; "
            "expected a connection string for the URL's account"
        )
    return service.get_container_client(target.container)
