"""Raw data versions: a manifest of every input file, content-hashed into the version a run pins.

A submission never trains on "whatever is in the folder now". It pins a manifest: each raw file's name,
size and fingerprint (a sha256 of its bytes locally, its eTag in Blob Storage). The sha256 of the manifest's
canonical JSON is the raw data version (`rd-<16 hex>`), so the same files give the same version, and any
added, removed or changed file gives another. Locally the version is an immutable folder; on Azure it is
a snapshot prefix registered as a data asset version (components/azureml/blob_snapshot.py).

A local copy is `<root>/<version>/` with its manifest beside it, `<root>/<version>.manifest.json`. Its files
are hard links into the object store beside `root` (core/objects.py, `<state>/data/.objects`), so each file
is stored once however many versions hold it. They are read-only once published, and the copy is checked
against its manifest before it is used again (pinning the same data, a run reading it): a copy that changed
anyway (root ignores modes) is pinned again from its source when there is one, its damaged objects
replaced, and otherwise refused in one line naming the file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from components.errors import PipelineError
from core.files import file_sha256, make_read_only, staged_folder, write_atomically
from core.objects import ObjectMismatch, ObjectStore
from core.secrets import mask_secrets
from core.text import escaped
from core.versions import MANIFEST_SUFFIX, raw_version

log = logging.getLogger(__name__)

RAW_SUFFIXES = (".csv", ".parquet")  # the tabular task's; a run pins its own task's (raw_suffixes)
# The most folder levels a task's raw files may span below their data folder or blob prefix (is_raw_name's
# depth): bounds a model's [trigger] depth, and the front door's blob scopes.
MAX_RAW_DEPTH = 8
CONTENTS_SUFFIX = ".contents.json"  # beside a copy pinned by eTags: its files' sha256, taken as written
OBJECTS_FOLDER = ".objects"  # beside the models' version folders: every pinned file's bytes, kept once


class DataError(PipelineError):
    """The raw data to pin is missing, empty or changed while it was read."""


@dataclass(frozen=True)
class DataFile:
    name: str
    size: int
    fingerprint: str
    source: str

    def __post_init__(self) -> None:
        if not self.fingerprint.startswith(("sha256:", "etag:")):
            raise DataError(
                f"{self.name}: fingerprint {self.fingerprint!r}; expected 'sha256:<hex>' or 'etag:<etag>'"
            )


@dataclass(frozen=True)
class DataManifest:
    files: tuple[DataFile, ...]

    def __post_init__(self) -> None:
        if not self.files:
            raise DataError("no raw data files; expected at least one file of the task's raw data")
        names = [file.name for file in self.files]
        if len(set(names)) != len(names):
            raise DataError("duplicate file names in a data manifest; expected each file once")
        object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda file: file.name)))

    @property
    def version(self) -> str:
        """The raw data version (core/versions.py): the source, where a file was read from, is not in it."""
        return raw_version((file.name, file.size, file.fingerprint) for file in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(file.size for file in self.files)

    def to_json(self) -> str:
        files = [vars(file) for file in self.files]
        return json.dumps({"version": self.version, "files": files}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DataManifest:
        try:
            document = json.loads(text)
            manifest = cls(tuple(DataFile(**entry) for entry in document["files"]))
        except (ValueError, KeyError, TypeError) as error:
            raise DataError(
                f"data manifest: {error}; expected the JSON written by DataManifest.to_json"
            ) from None
        if document.get("version") != manifest.version:
            raise DataError(f"data manifest: says {document.get('version')}, content is {manifest.version}")
        return manifest


def require_folder(folder: Path) -> Path:
    if not Path(folder).is_dir():
        raise DataError(
            f"--data {mask_secrets(str(folder))}: no such folder; expected a folder of the task's raw files"
        )
    return Path(folder)


def is_raw_name(name: str, suffixes: tuple[str, ...], depth: int) -> bool:
    """Whether a relative name (`batch-1.csv`, `circle/a.png`) is raw data: one of the task's suffixes
    (any case), at most `depth` levels down (1: directly in the folder; 2: also in class sub-folders), and
    no hidden part (`.DS_Store`, `.staging/`)."""
    parts = name.split("/")
    return (
        len(parts) <= depth
        and not any(part.startswith(".") or not part for part in parts)
        and name.lower().endswith(tuple(suffix.lower() for suffix in suffixes))
    )


def _raw_files(
    folder: Path, suffixes: tuple[str, ...], depth: int, links: bool = True
) -> list[tuple[str, Path]]:
    """The raw files below `folder`; without `links`, a symbolic link (to a file or a folder) is left out
    with one warning line, never followed."""
    require_folder(folder)
    found = []
    for parent, dirnames, filenames in os.walk(folder):
        level = len(Path(parent).relative_to(folder).parts)
        dirnames[:] = (
            [] if level + 1 >= depth else sorted(name for name in dirnames if not name.startswith("."))
        )
        for name in [*dirnames, *filenames]:
            path = Path(parent, name)
            if not links and not name.startswith(".") and path.is_symlink():
                log.warning("%s: a symbolic link, left out (links are never followed); expected a regular "
                            "file", escaped(path))  # fmt: skip
                if name in dirnames:
                    dirnames.remove(name)
        for name in filenames:
            relative = Path(parent, name).relative_to(folder).as_posix()
            if is_raw_name(relative, suffixes, depth) and (links or not Path(parent, name).is_symlink()):
                found.append((relative, Path(parent, name)))
    return sorted(found)


def manifest_of_folder(
    folder: Path, suffixes: tuple[str, ...] = RAW_SUFFIXES, depth: int = 1, *, links: bool = True
) -> DataManifest:
    """The manifest of the raw files in `folder` (is_raw_name; other files are not data), each named by
    its path relative to the folder; without `links`, symbolic links are left out, never followed (a
    landing folder's: anyone who can drop a file there could link any file of the machine)."""
    folder = Path(folder)
    files = _raw_files(folder, suffixes, depth, links)
    if not files:
        where = "" if depth == 1 else f" in it or up to {depth - 1} sub-folder level(s) down"
        raise DataError(
            f"--data {folder}: no {' or '.join(suffixes)} files{where}; expected the task's raw files"
        )
    return DataManifest(
        tuple(
            DataFile(name, path.stat().st_size, f"sha256:{file_sha256(path)}", path.resolve().as_uri())
            for name, path in files
        )
    )


def data_objects(versions_root: Path) -> ObjectStore:
    """The object store of the pinned versions under `versions_root` (`<state>/data/<model>`) and of every
    other model's beside it, `<state>/data/.objects`: a file two versions or two models share is kept once."""
    return ObjectStore(Path(versions_root).parent / OBJECTS_FOLDER)


def _pin_verified(manifest: DataManifest, source: Path, staging: Path, objects: ObjectStore) -> None:
    """Link each listed file into `staging` from the object store, copying into the store only the files it
    lacks or holds damaged (each checked against its listed sha256 as it is copied)."""
    for entry in manifest.files:
        digest = entry.fingerprint.removeprefix("sha256:")
        try:
            objects.put_file(source / entry.name, expected=digest)
        except ObjectMismatch:
            raise DataError(
                f"{source / entry.name}: changed while it was being pinned; try again once it is written"
            ) from None
        objects.link(digest, staging / entry.name)


def snapshot_folder(
    source: Path, root: Path, suffixes: tuple[str, ...] = RAW_SUFFIXES, depth: int = 1
) -> tuple[DataManifest, Path]:
    """Pin the raw files of `source` (manifest_of_folder) as an immutable folder `root/<version>/`;
    idempotent.

    The copy is staged beside its final place and renamed into it, and the manifest is written last, so a
    version folder with a manifest is always complete. A file that changes while it is copied fails the
    snapshot instead of pinning a mixture.
    """
    source, root = Path(source), Path(root)
    manifest = manifest_of_folder(source, suffixes, depth)
    target = root / manifest.version
    manifest_path = root / f"{manifest.version}{MANIFEST_SUFFIX}"
    objects = data_objects(root)
    with objects.writing():  # what is found here (a version, an object) is not collected before it is used
        if manifest_path.exists() and target.is_dir():
            change = pinned_change(target, manifest)
            if change is None:
                os.utime(manifest_path)  # reused: for retention, as new as a pin just made
                return manifest, target
            log.warning("pinned data version %s in %s: %s; pinning it again from %s", manifest.version,
                        target, change, source)  # fmt: skip
        with staged_folder(target) as staging:
            _pin_verified(manifest, source, staging, objects)
            make_read_only(staging)
            if target.exists():
                shutil.rmtree(target)  # incomplete (interrupted before its manifest), or damaged since
        write_atomically(manifest_path, manifest.to_json().encode())
    return manifest, target


def pinned_manifest_file(folder: Path) -> Path:
    """Where the manifest of a pinned copy `<root>/<version>/` is: `<root>/<version>.manifest.json`."""
    return folder.with_name(f"{folder.name}{MANIFEST_SUFFIX}")


def pinned_contents_file(folder: Path) -> Path:
    """Where the sha256 of each file of a copy pinned by eTags (downloaded blobs) is kept:
    `<root>/<version>.contents.json`. An eTag names a blob's state in Storage, not the bytes on this disk,
    so the copy's own hashes are taken as it is written, and re-checked before each reuse."""
    return folder.with_name(f"{folder.name}{CONTENTS_SUFFIX}")


def write_pinned_contents(folder: Path, hashes: Mapping[str, str]) -> None:
    write_atomically(
        pinned_contents_file(folder), json.dumps(dict(sorted(hashes.items())), indent=1).encode()
    )


def _pinned_contents(folder: Path) -> dict[str, str]:
    try:
        contents = json.loads(pinned_contents_file(folder).read_text())
    except (OSError, ValueError):  # none (a copy pinned by sha256), or damaged: sizes are all it has
        return {}
    return {str(name): str(digest) for name, digest in contents.items()} if isinstance(contents, dict) else {}


def pinned_change(folder: Path, manifest: DataManifest) -> str | None:
    """The first way a pinned copy differs from its manifest, in one phrase naming the file ("a.csv
    changed since it was pinned (sha256 A... in its manifest, B... now)"), or None when it is the
    version. Any file counts, hidden ones too: a task reads the whole folder. A file pinned by its eTag
    (a downloaded blob) is checked by the sha256 taken as it was written (pinned_contents_file), or by its
    size where none was."""
    contents = _pinned_contents(folder)
    expected = {entry.name: entry for entry in manifest.files}
    found = {
        Path(parent, name).relative_to(folder).as_posix(): Path(parent, name)
        for parent, _, filenames in os.walk(folder)
        for name in filenames
    }
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            return f"{name} is missing"
        if name not in expected:
            return f"{name} was added since it was pinned"
        entry, path = expected[name], found[name]
        if entry.fingerprint.startswith("sha256:") or name in contents:
            pinned = contents.get(name) or entry.fingerprint.removeprefix("sha256:")
            now = file_sha256(path)
            was, became = f"sha256 {pinned[:12]}...", f"{now[:12]}..."
        else:
            pinned, now = str(entry.size), str(path.stat().st_size)
            was, became = f"{pinned} bytes", now
        if now != pinned:
            return f"{name} changed since it was pinned ({was} in its manifest, {became} now)"
    return None


def check_pinned(folder: Path) -> None:
    """A pinned copy (a folder with its manifest beside it) is still its version, or DataError in one line;
    a folder pinned elsewhere, with no manifest beside it, is not this module's to check."""
    manifest_file = pinned_manifest_file(Path(folder))
    if not manifest_file.is_file():
        return
    manifest = DataManifest.from_json(manifest_file.read_text())
    change = pinned_change(Path(folder), manifest)
    if change is not None:
        raise DataError(
            f"pinned data version {manifest.version} in {folder}: {change}; pin the data again "
            "(`retrain run --data FOLDER` replaces a damaged copy)"
        )
