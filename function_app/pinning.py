"""Pin a batch's data: the blobs it brings plus what earlier runs trained on, as one content-hashed manifest.

A submission trains on every blob that has landed so far (the latest version of each name), not just the
burst that triggered it; the new blobs are its `inputs`. The manifest lists each blob with its eTag, so the
data version changes exactly when some blob does. Where the submitter runs decides what a pin becomes: a
downloaded folder (local), a server-side snapshot registered as a data asset (Azure ML), or only the
snapshot's planned path (dry run). Every copy is conditioned on the listed eTag: a blob replaced meanwhile
fails the pin instead of mixing versions.

Data is cleaned up and replaced after upload as a matter of course, so before a batch is pinned its pinner
says which listed files are no longer there at their listed version (`vanished`): the flush drops those
and pins the rest. A pin that still meets one (it went in the moment between) fails in one line naming it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote, unquote

from components.data_version import (
    DataError,
    DataFile,
    DataManifest,
    data_objects,
    is_raw_name,
    manifest_of_folder,
    pinned_change,
    write_pinned_contents,
)
from components.request import DataRef
from core.blob_urls import require_name_in_container
from core.errors import RetrainError
from core.files import file_sha256, make_read_only, staged_folder
from core.secrets import displayable_url, mask_secrets
from core.versions import MANIFEST_SUFFIX
from function_app.policy.rules import PendingBlob
from function_app.settings.storage import BlobScope

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

SNAPSHOTS_ROOT = "retrain/snapshots"
_ETAG_HEX_DIGITS = 32


def content_etag(path: Path) -> str:
    """The eTag a landing folder's file plays (`retrain watch --folder`): a hash of its content, which
    changes exactly with the bytes."""
    return _etag_of_hex(file_sha256(path))


def etag_of_bytes(data: bytes) -> str:
    """`content_etag` of a file holding `data`."""
    return _etag_of_hex(hashlib.sha256(data).hexdigest())


def _etag_of_hex(sha256_hex: str) -> str:
    return "0x" + sha256_hex[:_ETAG_HEX_DIGITS].upper()


class PinError(RetrainError):
    """The data a batch lists cannot be pinned as listed; the message is one line."""

    one_line = False  # kept as written


@dataclass(frozen=True)
class Vanished:
    """A file a manifest lists that is no longer there at its listed version: `where` names it for people
    (a landing file's path, a blob's URL without secrets), `why` says what became of it."""

    file: DataFile
    where: str
    why: str

    def line(self) -> str:
        return f"{self.where}: {self.why}"


def vanished_blobs(container: ContainerClient, manifest: DataManifest) -> tuple[Vanished, ...]:
    """The files of `manifest` (blobs of `container`) that are gone or carry another eTag now: one listing
    of the narrowest folder holding them all, not a request per file."""
    names = {_blob_name(container, file): file for file in manifest.files}
    common = posixpath.commonpath([posixpath.dirname(name) for name in names])
    folder = f"{common}/" if common else ""
    now = {blob.name: str(blob.etag).strip('"') for blob in container.list_blobs(name_starts_with=folder)}
    found = []
    for name, file in names.items():
        listed, current = file.fingerprint.removeprefix("etag:"), now.get(name)
        if current is None:
            found.append(Vanished(file, f"blob {displayable_url(file.source)}", _gone(listed)))
        elif current != listed:
            found.append(Vanished(file, f"blob {displayable_url(file.source)}", _changed(listed, current)))
    return tuple(found)


def _blob_name(container: ContainerClient, file: DataFile) -> str:
    """The name in the landing container of a manifest's blob (its source is the blob's URL)."""
    expected = "the landing container's blobs, which its events were routed by"
    return require_name_in_container(file.source, container.container_name, PinError, expected)


def _gone(etag: str) -> str:
    return f"gone since its event (expected at eTag {etag})"


def _changed(etag: str, now: str | None = None) -> str:
    current = f", now {now}" if now else ""
    return f"changed since its event (eTag {etag}{current}); its newer event brings it"


def batch_manifest(
    blobs: Iterable[PendingBlob], previous: DataManifest | None, scope: BlobScope | None
) -> DataManifest:
    """`previous`'s files, with the batch's blobs added or replacing the same names. A blob's name is its
    path below the model's prefix (`batch-1.csv`; `circle/a.png` for a class folder), so the pinned folder
    has the layout the task reads and two classes' `a.png` stay two files. `scope` is the model's (None
    for a model without one: it has no blobs, only `previous`)."""
    files = {file.name: file for file in (previous.files if previous else ())}
    for blob in blobs:
        name = _name_below(blob.url, scope)
        files[name] = DataFile(name, blob.size, f"etag:{blob.etag}", blob.url)
    return DataManifest(tuple(files.values()))


def _name_below(url: str, scope: BlobScope | None) -> str:
    """A routed blob's name below its scope's prefix; the router let in only blobs in place (at most the
    scope's depth down), so anything else is a ledger that does not match the settings."""
    base = f"{scope.container_url}/{scope.folder}" if scope is not None else None
    if base is None or not url.startswith(base):
        raise PinError(
            f"blob {url}: not under the model's prefix {base or '(the model has no blob scope)'}; expected "
            "the blobs its events were routed by (were the settings changed since then?)"
        )
    name = unquote(url[len(base) :])
    if len(name.split("/")) > scope.depth:
        raise PinError(
            f"blob {url}: {name!r} lies deeper than {scope.depth} level(s) below the model's prefix; "
            "expected the blobs its events were routed by (were the settings changed since then?)"
        )
    return name


class DataPinner(Protocol):
    def pin(self, manifest: DataManifest, model_name: str) -> DataRef: ...

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        """The files of `manifest` that are gone or changed now, which `pin` would fail on."""
        ...

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        """The manifest of the blobs in the folder `url` with one of `suffixes` (directly in it, or down to
        the model's depth: an image model's class folders), each at the eTag it has now: what
        `POST /api/retrain` with `data` trains on, exactly."""
        ...


ASSET_PREFIX = "azureml:"


def listed_manifest(
    container: ContainerClient, url: str, suffixes: tuple[str, ...], depth: int = 1
) -> DataManifest:
    """`DataPinner.folder_manifest` for a landing container: one listing of the folder, its raw files
    `depth` levels down at most (components/data_version.is_raw_name), each named by its path below it."""
    base = container.url.split("?", 1)[0].rstrip("/")
    if not url.startswith(f"{base}/") and url != base:
        raise PinError(f"data folder {url}: not in the landing container {base}; expected a folder in it")
    folder = unquote(url[len(base) + 1 :]).strip("/") if url != base else ""
    start = f"{folder}/" if folder else ""
    files = []
    for blob in container.list_blobs(name_starts_with=start):
        name = blob.name[len(start) :]
        if not blob.size or not is_raw_name(name, suffixes, depth):
            continue  # a data version pins a folder's visible, non-empty raw files, down to the task's depth
        etag = str(blob.etag).strip('"')
        files.append(DataFile(name, blob.size, f"etag:{etag}", f"{base}/{quote(blob.name, safe='/~')}"))
    if not files:
        raise PinError(f"data folder {url}: no {' or '.join(suffixes)} files in it; expected the raw files")
    return DataManifest(tuple(files))


class PlannedSnapshot:
    """Dry run: where the snapshot would be, without copying anything. A request's own folder is listed in
    the landing container when there is one; its client is made only then (`container` makes it), so that
    the Blob SDK stays out of a dry-run front door's cold start."""

    def __init__(
        self,
        datastore: str = "workspaceblobstore",
        container: Callable[[], ContainerClient] | None = None,
        depth: int = 1,
    ) -> None:
        self._datastore = datastore
        self._container = container
        self._depth = depth

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        if self._container is None:
            raise PinError(
                f"data folder {url}: no landing container is configured to list it; expected RETRAIN_BLOB_*"
            )
        return listed_manifest(self._container(), url, suffixes, self._depth)

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        return ()  # a dry run copies nothing, so nothing it lists can fail a copy

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        from components.azureml.blob_snapshot import store_paths

        path, _ = store_paths(f"{SNAPSHOTS_ROOT}/{model_name}", manifest.version)
        uri = f"azureml://datastores/{self._datastore}/paths/{path}"
        return DataRef(manifest.version, uri, manifest.total_bytes)


def _write_snapshot(
    root: Path, manifest: DataManifest, model_name: str, fetch: Callable[[DataFile], bytes]
) -> DataRef:
    """Each file linked from the object store into a staging folder that becomes the immutable snapshot by
    one rename; the manifest, written last, marks it complete (a pin interrupted earlier is redone, never
    half-used). A file is `fetch`ed only when no earlier pin kept its bytes, or kept them damaged: the store
    knows a file by its source and fingerprint (a blob's URL and eTag name one state of its bytes), so a
    version downloads and stores only what is new. Its files are read-only, and a copy that changed anyway
    is pinned again (components/data_version.py)."""
    target = root / model_name / manifest.version
    manifest_file = root / model_name / f"{manifest.version}{MANIFEST_SUFFIX}"
    objects = data_objects(target.parent)
    with objects.writing():  # what is found here (a version, an object) is not collected before it is used
        if manifest_file.exists() and target.is_dir() and pinned_change(target, manifest) is None:
            os.utime(manifest_file)  # reused: for retention, as new as a pin just made
            return DataRef(manifest.version, str(target))
        hashes: dict[str, str] = {}
        with staged_folder(target) as staging:
            for file in manifest.files:
                known = f"{file.source}#{file.fingerprint}"
                digest = objects.alias(known)
                if digest is None or not objects.verify(digest):  # unknown, or changed in place since
                    digest = objects.put_bytes(fetch(file))
                    objects.set_alias(known, digest)
                objects.link(digest, staging / file.name)  # 'circle/a.png': the class folder is made first
                hashes[file.name] = digest
            make_read_only(staging)
            shutil.rmtree(target, ignore_errors=True)
        write_pinned_contents(target, hashes)  # an eTag says nothing of the bytes here: their own hashes do
        manifest_file.write_text(manifest.to_json())
    return DataRef(manifest.version, str(target))


class DownloadedFolder:
    """Local runs: the pinned blobs downloaded, each only at its listed eTag, into an immutable folder."""

    def __init__(self, container: ContainerClient, state_root: Path, depth: int = 1) -> None:
        self._container = container
        self._root = state_root / "data"
        self._depth = depth

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        return _write_snapshot(self._root, manifest, model_name, self._download)

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        return listed_manifest(self._container, url, suffixes, self._depth)

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        return vanished_blobs(self._container, manifest)

    def _download(self, file: DataFile) -> bytes:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        blob = self._container.get_blob_client(_blob_name(self._container, file))
        etag = file.fingerprint.removeprefix("etag:")
        try:
            return blob.download_blob(etag=etag, match_condition=MatchConditions.IfNotModified).readall()
        except ResourceNotFoundError:
            raise PinError(f"blob {displayable_url(file.source)}: {_gone(etag)}") from None
        except ResourceModifiedError:
            raise PinError(f"blob {displayable_url(file.source)}: {_changed(etag)}") from None


class LandingFolderCopy:
    """Local runs from a landing folder (`retrain watch --folder`, the embedded default): each pinned file
    copied from the folder only if its content still hashes to the listed eTag, as a blob download is
    conditioned on its eTag; a file replaced since its event fails the pin instead of mixing versions."""

    def __init__(self, folder: Path, state_root: Path, folder_url: str | None = None, depth: int = 1) -> None:
        self._folder = Path(folder)
        self._root = state_root / "data"
        self._folder_url = folder_url  # the landing folder plays this blob folder (the scope's prefix)
        self._depth = depth  # and its class folders, for a task whose data has them

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        return _write_snapshot(self._root, manifest, model_name, self._copy)

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        if self._folder_url is None or url.rstrip("/") != self._folder_url.rstrip("/"):
            raise PinError(
                f"data folder {url}: the landing folder {self._folder} plays {self._folder_url}; "
                "expected that folder"
            )
        if not self._folder.is_dir():
            raise PinError(f"landing folder {self._folder}: not a folder; expected the folder to list")
        try:
            listed = manifest_of_folder(self._folder, suffixes, self._depth, links=False).files
        except DataError:
            listed = ()  # no raw files at all: said below, as for a folder of empty ones
        files = [
            DataFile(
                file.name,
                file.size,
                f"etag:{_etag_of_hex(file.fingerprint.removeprefix('sha256:'))}",
                f"{url.rstrip('/')}/{quote(file.name)}",
            )
            for file in listed
            if file.size
        ]
        if not files:
            raise PinError(
                f"data folder {self._folder}: no {' or '.join(suffixes)} files in it; expected the raw files"
            )
        return DataManifest(tuple(files))

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        found = []
        for file in manifest.files:
            path, listed = self._folder / file.name, file.fingerprint.removeprefix("etag:")
            link = _link_below(self._folder, file.name)
            if link is not None:
                found.append(Vanished(file, f"landing file {path}", _a_link(link, path)))
            elif not path.is_file():
                found.append(Vanished(file, f"landing file {path}", _gone(listed)))
            elif content_etag(path) != listed:
                found.append(Vanished(file, f"landing file {path}", _changed(listed)))
        return tuple(found)

    def _copy(self, file: DataFile) -> bytes:
        path = self._folder / file.name
        listed = file.fingerprint.removeprefix("etag:")
        link = _link_below(self._folder, file.name)
        if link is not None:
            raise PinError(f"landing file {path}: {_a_link(link, path)}")
        try:  # O_NOFOLLOW: a link put in its place since the check above is refused, not followed
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise PinError(f"landing file {path}: {_gone(listed)}") from None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise PinError(f"landing file {path}: {_a_link(path)}") from None
        with os.fdopen(descriptor, "rb") as stream:
            try:
                data = stream.read()
            except IsADirectoryError:
                raise PinError(f"landing file {path}: {_gone(listed)}") from None
        if etag_of_bytes(data) != listed:
            raise PinError(f"landing file {path}: {_changed(listed)}")
        return data


def _link_below(folder: Path, name: str) -> Path | None:
    """The first symbolic link on the way from `folder` to its file `name` ('circle/a.png'), if any."""
    path = folder
    for part in name.split("/"):
        path = path / part
        if path.is_symlink():
            return path
    return None


def _a_link(link: Path, path: Path | None = None) -> str:
    """Why a landing file behind a link is refused: a link could stand for any file on this machine."""
    what = "a symbolic link" if path is None or link == path else f"under the symbolic link {link}"
    return f"{what}, which is never followed; expected a regular file in the landing folder"


class RegisteredSnapshot:
    """Azure ML: the pinned blobs kept in the model's object store (each blob's bytes copied once,
    server-side: components/azureml/blob_snapshot.py), the version registered as a data asset version through
    `datastore` (RETRAIN_AZUREML_DATA_DATASTORE), which must be on the landing container: the store is kept
    there, and the asset's path is relative to the datastore. Each pin checks that first, so a mismatch
    copies and registers nothing."""

    def __init__(self, container: ContainerClient, workspace: object, datastore: str, depth: int = 1) -> None:
        self._container = container
        self._workspace = workspace
        self._datastore = datastore
        self._depth = depth

    @property
    def datastore(self) -> str:
        """The datastore its snapshots are registered in."""
        return self._datastore

    def folder_manifest(self, url: str, suffixes: tuple[str, ...], model_name: str) -> DataManifest:
        return listed_manifest(self._container, url, suffixes, self._depth)

    def vanished(self, manifest: DataManifest, model_name: str) -> tuple[Vanished, ...]:
        return vanished_blobs(self._container, manifest)

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        from components.azureml.blob_snapshot import copy_snapshot
        from components.azureml.data_assets import (
            DATA_DATASTORE_SETTING,
            build_data_asset,
            check_data_datastore,
            data_asset_reference,
            register_data_asset,
        )
        from components.errors import SubmissionError

        try:
            check_data_datastore(self._workspace, self._datastore, self._container, DATA_DATASTORE_SETTING)
        except SubmissionError as error:
            raise PinError(str(error)) from None
        try:
            pinned = copy_snapshot(self._container, manifest, f"{SNAPSHOTS_ROOT}/{model_name}")
        except DataError as error:  # a blob gone or replaced since the batch was checked: named in it
            raise PinError(mask_secrets(str(error).splitlines()[0])) from None
        data = build_data_asset(model_name, manifest, self._datastore, pinned.folder, pinned.manifest_name)
        register_data_asset(self._workspace, data)
        reference = data_asset_reference(model_name, manifest.version)
        return DataRef(manifest.version, reference, pinned.folder_bytes)
