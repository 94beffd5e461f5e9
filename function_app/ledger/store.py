"""The record store: the few storage primitives the ledger is built on, with a local and a Blob twin.

    create(name, data, tag)            create if absent; False when the name exists (another writer won)
    read(name)                         the record's bytes, version and tag; None when absent
    replace(name, data, version, tag)  replace if still `version`; False when another writer got there first
    list(prefix)                       every record's name, version and tag under a prefix, without its bytes
    quarantine(name, version)          move a record that cannot be read to `quarantine/`, if still `version`
    hold(name)                         the single-writer lease: a file lock locally, a blob lease in Azure
    holder(name)                       who holds that lease and since when, as its holder wrote it

A record is replaced whole and atomically: a reader sees the old one or the new one. The tag is a short
word stored beside the bytes (blob metadata in Azure) that `list` returns without reading any record: it
is how a flush finds the claims still pending among every claim ever made, at one listing call per 5,000.
Transient storage failures raise their own errors, so that Event Grid retries; what the user must fix is
a one-line `LedgerError`. A record that cannot be decoded at all (a local file without its tag line) is
read and listed with the tag UNREADABLE, which no record can be given, so that the ledger moves it aside
instead of stopping at it.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from function_app.ledger.records import LedgerError

QUARANTINE = "quarantine"  # where records that cannot be read are moved, under their own names
UNREADABLE = "?"  # the tag of a record that cannot be decoded; check_tag refuses it, so none is written
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,3}")
_TAG = re.compile(r"[A-Za-z0-9._-]{0,128}")


@dataclass(frozen=True)
class Stored:
    """One record as read: its bytes, its version (the token `replace` needs) and its tag."""

    data: bytes
    version: str
    tag: str = ""


@dataclass(frozen=True)
class Listed:
    """One record as listed: its name (relative to the store), version and tag, not its bytes."""

    name: str
    version: str
    tag: str = ""


class Hold(Protocol):
    """A held lease. `lost` turns true when it could not be kept (renewal failed): stop writing."""

    @property
    def lost(self) -> bool: ...


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its holder wrote it when it took the lease (`who`, `since`: None where it
    wrote nothing, e.g. a lease someone took by hand), and what kind of lease it is: `endless` for one
    that never expires (no flush takes one: only a person or another tool does), `dies_with_holder` where
    the lease cannot outlive its process (a file lock), so that holding it long means a live, slow
    holder, never a dead one."""

    who: str | None
    since: datetime | None
    endless: bool = False
    dies_with_holder: bool = False

    def age_seconds(self, now: datetime) -> float | None:
        """How long it has been held by `now`; never negative (the holder's clock may run ahead)."""
        return None if self.since is None else max(0.0, (now - self.since).total_seconds())


def holder_stamp(now: datetime | None = None) -> dict[str, str]:
    """What a holder writes of itself on taking a lease: this process and host, and the time."""
    taken = now or datetime.now(UTC)
    return {"who": f"pid {os.getpid()} on {socket.gethostname()}", "since": taken.isoformat()}


def read_holder_stamp(
    stamp: dict[str, str] | bytes | None, *, endless: bool = False, dies_with_holder: bool = False
) -> Holder:
    """A Holder from what `holder_stamp` wrote; fields that cannot be read are None (a report, not a
    record: it must never stop a flush)."""
    if isinstance(stamp, bytes):
        try:
            stamp = json.loads(stamp.decode())
        except (UnicodeDecodeError, ValueError):
            stamp = None
    fields = stamp if isinstance(stamp, dict) else {}
    who = fields.get("who") if isinstance(fields.get("who"), str) else None
    try:
        since = datetime.fromisoformat(fields["since"])
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
    except (KeyError, TypeError, ValueError):
        since = None
    return Holder(who[:200] if who else None, since, endless=endless, dies_with_holder=dies_with_holder)


class RecordStore(Protocol):
    location: str

    def create(self, name: str, data: bytes, tag: str = "") -> bool: ...

    def read(self, name: str) -> Stored | None: ...

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool: ...

    def list(self, prefix: str) -> Iterator[Listed]: ...

    def quarantine(self, name: str, version: str) -> str | None:
        """Move the record `name` (as listed: it may be a stray name no record would have) to
        `quarantine_name(name, version)`: copy it there, then delete it if it is still `version`. Two
        readers may move one record at once: the copy is created if absent and the delete is conditional.
        The quarantined name; None when the record changed from `version` (it is left where it is)."""
        ...

    def hold(self, name: str) -> AbstractContextManager[Hold | None]:
        """Enter to try to take the lease `name` without waiting: the Hold, or None when another holder
        has it. A holder that dies loses it (the lock with its process; a blob lease when it expires)."""
        ...

    def holder(self, name: str) -> Holder | None:
        """Who holds the lease `name` (see Holder); None when nobody does."""
        ...


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LedgerError(
            f"ledger record name {name!r}: expected up to 4 '/'-separated parts of letters, digits, '.', '_' "
            "or '-'"
        )
    return name


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


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise LedgerError(f"ledger record tag {tag!r}: expected up to 128 letters, digits, '.', '_' or '-'")
    return tag
