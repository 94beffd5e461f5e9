"""What every task's prepared data version shares: the manifest that names it, the check that a manifest's
stated version is the one its content gives, and the rule for the output folder of a preparation.

A data version is `dv-` + a hash of the content-defining fields of its manifest. The manifest is written
last (training/data/publish.py), so a folder with a manifest holds a complete version; an edited manifest,
whose stated version no longer matches its content, is refused rather than trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from core.errors import InputError
from training.data.splits import SPLIT_METHOD, SPLIT_NAMES, SPLIT_SALT

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"


class Versioned(Protocol):
    @property
    def data_version(self) -> str: ...


M = TypeVar("M", bound=Versioned)
E = TypeVar("E")


def content_version(content: Mapping[str, Any]) -> str:
    """`dv-` + 16 hex digits of the sha256 of `content` (the content-defining fields only, never provenance
    or time) as canonical JSON: the same content always names the same version."""
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return "dv-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def split_entry(entries: Iterable[E], name: str) -> E:
    """The entry of split `name` among a manifest's split entries (each has a `name`)."""
    for entry in entries:
        if entry.name == name:
            return entry
    raise InputError(f"no split named {name!r}; expected one of {', '.join(SPLIT_NAMES)}")


def parse_manifest(
    text: str, source: str, from_document: Callable[[dict[str, Any]], M], what: str, rerun_hint: str
) -> M:
    """A manifest from its JSON, refused in one line when unreadable or when the version it states is not
    the one its content gives (it was edited). `from_document` raises KeyError, ValueError, TypeError or
    AttributeError for a field that is missing or of the wrong form."""
    try:
        document = json.loads(text)
        manifest = from_document(document)
        stored_version = document["data_version"]
    except (ValueError, KeyError, TypeError, AttributeError, InputError) as error:
        raise InputError(f"{source}: not a readable {what} ({error}); {rerun_hint}") from error
    if stored_version != manifest.data_version:
        raise InputError(
            f"{source}: says data version {stored_version} but its content gives "
            f"{manifest.data_version}; the manifest was edited. {rerun_hint}"
        )
    return manifest


def check_split_document(split: Mapping[str, Any], splits: Mapping[str, Any]) -> None:
    """A manifest's split configuration and split names are this code's, or ValueError: another salt or
    method would put items in other splits than the ones recorded."""
    if split["method"] != SPLIT_METHOD or split["salt"] != SPLIT_SALT:
        raise ValueError("unknown split method or salt")
    if list(splits) != list(SPLIT_NAMES):
        raise ValueError(f"splits are {list(splits)}, expected {list(SPLIT_NAMES)}")


def without_name(entry: Any) -> dict[str, Any]:
    """A dataclass entry's fields but its `name`, which the manifest uses as the key instead."""
    return {key: value for key, value in vars(entry).items() if key != "name"}


def existing_manifest(out: Path, read: Callable[[Path], M]) -> M | None:
    """None when `out` is absent or empty; its manifest when it holds a data version; else an error."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; expected a new or empty output folder")
    if not any(out.iterdir()):
        return None
    if (out / MANIFEST_NAME).is_file():
        return read(out)
    raise InputError(f"{out}: the output folder is not empty; expected a new or empty output folder")


def same_version_or_refuse(out: Path, existing: M, manifest: Versioned) -> M:
    """Preparing into a folder that already holds this very version is a no-op; any other is refused."""
    if existing.data_version != manifest.data_version:
        raise InputError(
            f"{out}: already holds data version {existing.data_version}, not {manifest.data_version}; "
            "expected a new or empty output folder"
        )
    log.info("%s already holds data version %s; nothing to do", out, existing.data_version)
    return existing
