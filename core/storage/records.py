"""The record store: small records replaced whole, with a local twin (core/storage/local.py) and a Blob twin
(core/storage/blob.py).

    create(name, data, tag)            create if absent; False when the name exists (another writer won)
    read(name)                         the record's bytes, version and tag; None when absent
    replace(name, data, version, tag)  replace if still `version`; False when another writer got there first
    list(prefix)                       every record's name, version and tag under a prefix, without its bytes
    delete(name, version)              delete if still `version` (any version when None); False if it changed
    lease(name)                        the lease of that name beside the records (core/storage/leases.py)

A record is replaced whole and atomically: a reader sees the old one or the new one. The tag is a short
word stored beside the bytes (blob metadata in Azure) that `list` returns without reading any record. A
record that cannot be decoded at all (a local file without its tag line) is read and listed with the tag
UNREADABLE, which no record can be given, so that its owner can move it aside instead of stopping at it.
Each store raises its owner's error type, naming its owner ("ledger record ..."), so that a message names
what the user configured. `read` and `delete` take a name as `list` gave it, which may be a stray one no
record would have (put there by hand); `create` and `replace` take only names that pass `check_name`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from core.storage.leases import Lease

# The Blob emulator's connection string, where a location is opened (locations.py) and refused without it
# (blob.py): here, below both, so that neither imports the other for it.
CONNECTION_STRING_VARIABLE = "RETRAIN_STORAGE_CONNECTION_STRING"

ErrorType = Callable[[str], Exception]

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


class RecordStore(Protocol):
    location: str

    def create(self, name: str, data: bytes, tag: str = "") -> bool: ...

    def read(self, name: str) -> Stored | None: ...

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool: ...

    def list(self, prefix: str) -> Iterator[Listed]: ...

    def delete(self, name: str, version: str | None = None) -> bool: ...

    def lease(self, name: str) -> Lease: ...


def check_name(name: str, owner: str, error: ErrorType) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise error(
            f"{owner} record name {name!r}: expected up to 4 '/'-separated parts of letters, digits, '.', "
            "'_' or '-'"
        )
    return name


def check_tag(tag: str, owner: str, error: ErrorType) -> str:
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise error(f"{owner} record tag {tag!r}: expected up to 128 letters, digits, '.', '_' or '-'")
    return tag


def lease_file_name(name: str) -> str:
    """A lease name as one path part: its '/' become '~' (no record name holds one)."""
    return name.replace("/", "~")
