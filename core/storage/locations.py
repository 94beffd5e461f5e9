"""The one registry of storage backends: a location's scheme picks its twin, as MLflow picks an artifact
store by scheme.

    /a/folder, a/folder, file:///a/folder                   -> the local twin (core/storage/local.py)
    https://<account>.blob.core.windows.net/<container>/... -> the Blob twin (core/storage/blob.py)
    http(s)://127.0.0.1:<port>/<account>/<container>/...    -> the Blob twin, on Azurite

Any other scheme is refused in one line. The Blob twin (and the Azure SDK) is imported only when a location
is in Blob Storage, so a local-only run never pays for it. A Blob location is authenticated by the connection
string in RETRAIN_STORAGE_CONNECTION_STRING where given (Azurite, development), else by the managed identity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.secrets import displayable_url
from core.storage.records import CONNECTION_STRING_VARIABLE
from core.text import quoted

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

    from core.storage.records import ErrorType, RecordStore

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_BLOB_SCHEMES = ("http", "https")
EXPECTED_LOCATION = "a local folder path or https://<account>.blob.core.windows.net/<container>/<prefix>"


@dataclass(frozen=True)
class Location:
    """A parsed location: a local `folder`, or a Blob `url` (still to be opened with `container`)."""

    folder: Path | None = None
    url: str | None = None

    def container(
        self, environ: Mapping[str, str], what: str, error: ErrorType, *, key_in_azure: bool = True
    ) -> tuple[ContainerClient, str]:
        """The Blob container and the prefix in it, authenticated as the module says."""
        from core.storage.blob import open_container

        assert self.url is not None, "a local location has no container"
        return open_container(
            self.url, environ.get(CONNECTION_STRING_VARIABLE) or None, what, error, key_in_azure=key_in_azure
        )


def parse_location(spec: str, what: str, error: ErrorType, expected: str = EXPECTED_LOCATION) -> Location:
    """The twin `spec` names, by its scheme; an empty spec or another scheme is an `error` naming `what`."""
    if not isinstance(spec, str) or not spec.strip():
        raise error(f"{what} is empty; expected {expected}")
    scheme = _SCHEME.match(spec)
    if scheme is None:
        return Location(folder=Path(spec).expanduser())
    if scheme.group(1).lower() == "file":
        return Location(folder=Path(spec[len(scheme.group(0)) :] or "/"))
    if scheme.group(1).lower() in _BLOB_SCHEMES:
        return Location(url=spec)
    raise error(
        f"{what} {quoted(displayable_url(spec), 120)}: scheme {quoted(scheme.group(1))} is not supported; "
        f"expected {expected}"
    )


def open_record_store(
    spec: str,
    owner: str,
    error: ErrorType,
    environ: Mapping[str, str],
    *,
    key_in_azure: bool = True,
    expected: str = EXPECTED_LOCATION,
) -> RecordStore:
    """The record store at `spec` (see the module), whose messages name its `owner` ("ledger")."""
    location = parse_location(spec, f"{owner} location", error, expected)
    if location.folder is not None:
        from core.storage.local import LocalRecords

        return LocalRecords(location.folder, owner, error)
    from core.storage.blob import BlobRecords

    container, prefix = location.container(environ, f"{owner} URL", error, key_in_azure=key_in_azure)
    return BlobRecords(container, owner, error, prefix)
