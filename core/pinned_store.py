"""A data version pinned in Blob Storage without copies: a manifest that names objects kept once, and how a
job reads it as the folder of files a task expects.

components/azureml/blob_snapshot.py writes one store per model, in its snapshots area
(`retrain/snapshots/<model>/`):

    store/objects/<key>                each blob's bytes, copied once, named by what identifies them before
                                       they are read: `md5-<Content-MD5 hex>-<size>` when Storage has the
                                       blob's Content-MD5, else `etag-<hash of blob name and eTag>-<size>`
    store/<version>.manifest.json      the version: its manifest (names, sizes, eTags), `objects` (each
                                       file's object key) and `pinned_at`; written last, so its presence
                                       marks it complete
    store/latest                       the version whose manifest was written last (a scheduled job's data
                                       asset `<model>-raw@latest` names no version)

A pinned data asset is the store folder; the prep step gets the version beside it (`--raw-version`), and
`version_folder` lays the version out as a folder of links, each named as its file and pointing at its
object, which is what a task's prepare reads. The Azure ML code snapshot ships core/, so the step reads it
with the standard library alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from core.errors import InputError
from core.text import escaped
from core.versions import MANIFEST_SUFFIX, RAW_VERSION_PATTERN, raw_version

STORE_FOLDER = "store"  # below a model's snapshots area
OBJECTS_FOLDER = "objects"  # below the store
LATEST_NAME = "latest"  # below the store: the text of the version pinned last
LATEST_VERSION = "latest"  # what --raw-version says for a job whose data asset is `<asset>@latest`
OBJECTS_FIELD = "objects"  # the manifest's map of file name -> object key
PINNED_AT_FIELD = "pinned_at"  # the manifest's time of its pin (UTC, ISO 8601)
OBJECT_KEY = re.compile(r"(?:md5-[0-9a-f]{32}|etag-[0-9a-f]{40})-[0-9]+")
OBJECT_KEY_FORM = "md5-<32 hex>-<size> or etag-<40 hex>-<size>"
_QUOTE = '"'  # a listing's eTag may come quoted, an event's not: the same state either way
_EXPECTED_VERSION = f"a raw data version rd-<16 hex>, or {LATEST_VERSION!r}"


def md5_key(content_md5: bytes, size: int) -> str:
    """The key of bytes whose MD5 Storage holds: equal bytes under any name or upload share one object. The
    size rides along, so a wrong Content-MD5 (a block-list upload sets its own) cannot make an object of
    another length stand for these bytes."""
    return f"md5-{bytes(content_md5).hex()}-{size}"


def etag_key(blob_name: str, etag: str, size: int) -> str:
    """The key of a blob without Content-MD5: its name and eTag name one state of one blob, which the
    service assigns and which changes with every write, so they name these bytes though they are not a hash
    of them. Another upload of the same bytes gets another eTag, and another object."""
    state = f"{blob_name}\n{etag.strip(_QUOTE)}"
    digest = hashlib.sha256(state.encode()).hexdigest()[:40]
    return f"etag-{digest}-{size}"


def key_size(key: str) -> int:
    """The size in bytes an object key says its object has."""
    return int(key.rsplit("-", 1)[1])


def version_document(manifest_json: str, objects: Mapping[str, str], pinned_at: datetime) -> str:
    """A manifest's JSON (components/data_version.DataManifest.to_json) with the object key of each file and
    when it was pinned (to the microsecond: a listing's Last-Modified counts whole seconds, too coarse to
    tell which of two quick pins is the newer one)."""
    document = json.loads(manifest_json)
    document[OBJECTS_FIELD] = dict(sorted(objects.items()))
    document[PINNED_AT_FIELD] = pinned_at.astimezone(UTC).isoformat(timespec="microseconds")
    return json.dumps(document, indent=1) + "\n"


def manifest_name(version: str) -> str:
    """The version's manifest, below the store."""
    return f"{version}{MANIFEST_SUFFIX}"


def read_objects(text: str, where: str) -> dict[str, tuple[int, str]]:
    """Each file of a version manifest: name -> (size, object key); InputError in one line naming `where`
    when the text is not a whole version (its `version` must be the hash of its files, as pinned)."""
    writer = "components/azureml/blob_snapshot.py"
    expected = f"expected a version manifest with '{OBJECTS_FIELD}' written by {writer}"
    try:
        document = json.loads(text)
        files = [
            (str(entry["name"]), int(entry["size"]), str(entry["fingerprint"])) for entry in document["files"]
        ]
        objects = {str(name): str(key) for name, key in document[OBJECTS_FIELD].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise InputError(f"{where}: {escaped(error)}; {expected}") from None
    if raw_version(files) != document.get("version"):
        raise InputError(
            f"{where}: its files hash to {raw_version(files)}, not {document.get('version')}; {expected}"
        )
    found: dict[str, tuple[int, str]] = {}
    for name, size, _ in files:
        key = objects.get(name)
        if key is None or not OBJECT_KEY.fullmatch(key) or key_size(key) != size:
            raise InputError(
                f"{where}: file {escaped(name)} has object {key!r}; expected {OBJECT_KEY_FORM}, of its size"
            )
        if any(part in ("", ".", "..") for part in name.split("/")):
            raise InputError(f"{where}: file name {escaped(name)}; expected a path below the data folder")
        found[name] = (size, key)
    return found


def _chosen(store: Path, version: str) -> str:
    if version == LATEST_VERSION:
        try:
            version = (store / LATEST_NAME).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            raise InputError(
                f"--raw {escaped(store)}: no readable '{LATEST_NAME}' in this data store; expected "
                f"--raw-version to name the version (rd-<16 hex>)"
            ) from None
    if not RAW_VERSION_PATTERN.fullmatch(version):
        raise InputError(f"--raw-version {escaped(version)}: expected {_EXPECTED_VERSION}")
    return version


def is_store(folder: Path) -> bool:
    """Whether `folder` is a blob store (its objects, and the `latest` every pin writes) rather than a
    folder of the data's own files."""
    return (Path(folder) / LATEST_NAME).is_file() and (Path(folder) / OBJECTS_FOLDER).is_dir()


@contextmanager
def version_folder(raw: Path, version: str | None) -> Iterator[Path]:
    """`raw` itself when it is a folder of the data's files (a local pin, an older blob pin's own copy, a
    datastore folder); when it is a blob store (`is_store`), a temporary folder laid out as the version's
    files, each a link to its object, for as long as the block runs (`version` says which: a raw data
    version, or `latest`). Each object is checked against the size its manifest lists, so a missing or cut
    object fails here, in one line naming the file."""
    raw = Path(raw)
    if not is_store(raw):
        yield raw
        return
    if version is None:
        raise InputError(
            f"--raw {escaped(raw)}: a blob data store; expected --raw-version to say which version"
        )
    chosen = _chosen(raw, version)
    where = f"--raw {escaped(raw / manifest_name(chosen))}"
    if not (raw / manifest_name(chosen)).is_file():
        raise InputError(
            f"{where}: no such file; expected --raw-version to name a version pinned in this store"
        )
    try:
        text = (raw / manifest_name(chosen)).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(
            f"{where}: {escaped(error)}; expected a version pinned in this store (pin the data again)"
        ) from None
    files = read_objects(text, where)
    with tempfile.TemporaryDirectory(prefix="retrain-version-") as scratch:
        view = Path(scratch) / chosen
        for name, (size, key) in sorted(files.items()):
            target = raw / OBJECTS_FOLDER / key
            try:
                found = target.stat().st_size
            except OSError:
                found = None
            if found != size:
                state = "missing" if found is None else f"{found} bytes"
                raise InputError(
                    f"{where}: {escaped(name)}'s object {key} is {state} in the store; expected {size} bytes "
                    "(pin the data again)"
                )
            link = view / name
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.abspath(target), link)
        yield view
