"""The ledger's record store: the storage seam's records (core/storage/records.py, a local folder or a Blob
container, picked by core/storage/locations.py) with what the ledger adds to them:

    quarantine(name, version)  move a record that cannot be read to `quarantine/`, if still `version`
    hold(name)                 the single-writer flush lease: a file lock locally, a blob lease in Azure
    holder(name)               who holds that lease and since when, as its holder wrote it

Transient storage failures raise their own errors, so that Event Grid retries; what the user must fix is a
one-line `LedgerError`. A record that cannot be decoded is read and listed with the tag UNREADABLE, so that
the ledger moves it aside instead of stopping at it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from core.storage import records as seam
from core.storage.leases import Holder, holder_stamp, read_holder_stamp
from core.storage.locations import CONNECTION_STRING_VARIABLE, parse_location
from core.storage.records import Listed, Stored
from function_app.ledger.records import LedgerError

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

OWNER = "ledger"  # how the seam's messages name the ledger
QUARANTINE = "quarantine"  # where records that cannot be read are moved, under their own names


class Hold(Protocol):
    """A held lease. `lost` turns true when it could not be kept (renewal failed): stop writing."""

    @property
    def lost(self) -> bool: ...


class RecordStore:
    """The ledger's records in `records`, a store of the seam."""

    def __init__(self, records: seam.RecordStore) -> None:
        self.records = records
        self.location = records.location

    def create(self, name: str, data: bytes, tag: str = "") -> bool:
        return self.records.create(name, data, tag)

    def read(self, name: str) -> Stored | None:
        return self.records.read(name)

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool:
        return self.records.replace(name, data, version, tag)

    def list(self, prefix: str) -> Iterator[Listed]:
        return self.records.list(prefix)

    def quarantine(self, name: str, version: str) -> str | None:
        """Move the record `name` (as listed: it may be a stray name no record would have) to
        `quarantine_name(name, version)`: copy it there, then delete it if it is still `version`. Two
        readers may move one record at once: the copy is created if absent and the delete is conditional.
        The quarantined name; None when the record changed from `version` (it is left where it is)."""
        target = quarantine_name(name, version)
        stored = self.records.read(name)
        if stored is None:
            return target  # another reader moved it first
        if stored.version != version:
            return None
        self.records.create(target, stored.data)  # False: another reader copied it first
        self.records.delete(name, version)  # False: rewritten meanwhile, and read again next time
        return target

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[Hold | None]:
        """Enter to try to take the lease `name` without waiting: the Hold, or None when another holder
        has it. A holder that dies loses it (the lock with its process; a blob lease when it expires)."""
        lease = self.records.lease(name)
        if not lease.take(holder_stamp()):
            yield None
            return
        try:
            yield lease
        finally:
            lease.release()

    def holder(self, name: str) -> Holder | None:
        """Who holds the lease `name`; None when nobody does."""
        held = self.records.lease(name).holder()
        return None if held is None else read_holder_stamp(held)


class LocalRecordStore(RecordStore):
    """The ledger in a local folder (core/storage/local.py)."""

    def __init__(self, folder: Path) -> None:
        from core.storage.local import LocalRecords

        super().__init__(LocalRecords(folder, OWNER, LedgerError))


class BlobRecordStore(RecordStore):
    """The ledger under `prefix` in a container that exists (core/storage/blob.py)."""

    def __init__(self, container: ContainerClient, prefix: str = "") -> None:
        from core.storage.blob import BlobRecords  # the Blob SDK, only when the ledger is there

        super().__init__(BlobRecords(container, OWNER, LedgerError, prefix))


def open_ledger_store(spec: str, connection_string: str | None = None) -> RecordStore:
    """The store `spec` names: a local folder, or a container (and prefix) URL in Blob Storage, with the
    managed identity in Azure, or `connection_string` on the emulator (refused for a real account: keys stay
    out of Azure app settings)."""
    location = parse_location(
        spec.strip() if isinstance(spec, str) else spec,
        f"{OWNER} location",
        LedgerError,
        expected="a folder or an https blob container URL",
    )
    if location.folder is not None:
        return LocalRecordStore(location.folder)
    environ = {CONNECTION_STRING_VARIABLE: connection_string} if connection_string else {}
    container, prefix = location.container(environ, f"{OWNER} URL", LedgerError, key_in_azure=False)
    return BlobRecordStore(container, prefix)


def check_name(name: str) -> str:
    return seam.check_name(name, OWNER, LedgerError)


def quarantine_name(name: str, version: str) -> str:
    """Where the record `name` at `version` is kept once moved aside: `quarantine/<name>.<version>`, each
    part made a valid name part (a stray file's name may not be one), so two damaged versions of one
    record are both kept."""
    parts = [_name_part(part) for part in name.split("/") if part][-3:] or ["record"]
    stamp = _name_part(version.strip('"'))[:16]
    return check_name("/".join([QUARANTINE, *parts[:-1], f"{parts[-1][:100]}.{stamp}"]))


def _name_part(text: str) -> str:
    part = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:110]
    return part if part[:1].isalnum() else f"x{part}"
