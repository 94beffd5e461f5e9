"""Data versions: the raw version a run pins (`rd-<16 hex>`, from the manifest of the raw files) and the
form every version takes (`rd-` raw, `dv-` prepared: two letters, '-', 16 hex digits).

The raw version is the sha256 of the manifest's canonical JSON: its (name, size, fingerprint) entries,
sorted by name, as compact JSON. Where a file was read from is not content, so moving data does not change
its version. components/data_version.py pins data under it, and training/drift/data.py checks a pinned
folder's manifest against it; both compute it here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

RAW_VERSION_PREFIX = "rd-"
# A pinned copy `<root>/<version>/` keeps its manifest beside it, as `<root>/<version>.manifest.json`.
MANIFEST_SUFFIX = ".manifest.json"
VERSION_FORM = "two lowercase letters, '-' and 16 hex digits (rd-... raw, dv-... prepared)"
VERSION_PATTERN = re.compile(r"[a-z]{2}-[0-9a-f]{16}")
RAW_VERSION_PATTERN = re.compile(r"rd-[0-9a-f]{16}")

ManifestEntry = tuple[str, int, str]  # a raw file's name, size in bytes and fingerprint (sha256:/etag:)


def raw_version(entries: Iterable[ManifestEntry]) -> str:
    """The raw data version of a manifest's entries (names are unique: sorting by name sorts them)."""
    canonical = json.dumps(
        [[name, size, fingerprint] for name, size, fingerprint in sorted(entries)], separators=(",", ":")
    )
    return RAW_VERSION_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def is_version(text: object) -> bool:
    """Whether `text` has a data version's form, raw or prepared."""
    return isinstance(text, str) and VERSION_PATTERN.fullmatch(text) is not None


def is_raw_version(text: object) -> bool:
    return isinstance(text, str) and RAW_VERSION_PATTERN.fullmatch(text) is not None
