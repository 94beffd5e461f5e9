"""`retrain watch`: stand in for Event Grid on one machine. Poll the landing blobs and deliver one
`Microsoft.Storage.BlobCreated` event (Event Grid schema, as documented) for each new version of each blob.
It watches every served model's scope (`--model` picks one); a landing folder plays one model's prefix.

Two sources: a local landing folder, whose files play the blobs `<prefix><file name>` of the configured
container (their URL is `<RETRAIN_BLOB_ENDPOINT or https://<account>.blob.core.windows.net>/<container>/...`
and their eTag a hash of their content), or the configured container itself (Azurite, or Azure with the
managed identity), listed under the prefix. A folder's non-hidden files are blobs, directly in it or, for a
scope of depth 2 (the image task's class folders), in a non-hidden sub-folder (`circle/a.png` is the blob
`<prefix>/circle/a.png`); a deeper file or a dot-file (an editor's or a copy's temporary) is not part of
the landing data, and a symbolic link is refused in one warning line, never followed (it could stand for
any file on the machine).

What was delivered is remembered in `<state>/watch/<source>.json`, written atomically after each poll, so a
restart does not deliver the same versions again; were it lost, the ledger would still dedupe them (its key
is the blob's URL and eTag, and the event id here derives from the same two).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mimetypes
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from core.errors import RetrainError
from core.files import write_atomically
from core.text import escaped
from function_app.events.blob_created import BLOB_CREATED, BLOCK_BLOB
from function_app.events.blob_paths import blob_url
from function_app.pinning import content_etag
from function_app.settings.app import AppSettings, BlobScope

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

log = logging.getLogger(__name__)

WATCH_DIR = "watch"
STATE_SCHEMA = 1
# Event Grid names the storage account's resource in each event's topic; no subscription stands behind a
# watcher, so its events carry this all-zero one (the parser checks only the account at the end).
WATCH_SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
WATCH_RESOURCE_GROUP = "retrain-watch"
_EVENT_NAMESPACE = uuid.UUID("5d1c8c3e-6f55-4c1e-9a7e-3f1f3c2b9a10")  # event ids: uuid5 of url + eTag
LINK = "symbolic link"  # a folder source's memo of a link it refused (and said so)
TOO_DEEP = "too deep"  # its memo of a sub-folder whose files lie below the scope's depth (said so)


class WatchError(RetrainError):
    """The watch cannot run as asked (no such folder, unreadable state); the message is one line."""

    one_line = False  # kept as written


def watched_scopes(settings: AppSettings, model: str | None, *, container: bool) -> list[BlobScope]:
    """The scopes to watch: `model`'s, else every served model's; a folder (not `container`) plays one
    prefix, so it needs a single one."""
    routes = [route for route in settings.models if route.scope is not None]
    if model is not None:
        route = settings.model(model)
        if route is None:
            served = ", ".join(route.name for route in settings.models)
            raise WatchError(f"retrain watch --model {model}: not a served model; expected one of {served}")
        routes = [route] if route.scope is not None else []
    if not routes:
        raise WatchError(
            "retrain watch delivers events for the landing container's blobs; set RETRAIN_BLOB_ACCOUNT and "
            "RETRAIN_BLOB_CONTAINER (and RETRAIN_BLOB_ENDPOINT for Azurite), or a model's [trigger] account "
            "and container"
        )
    if len(routes) > 1 and not container:
        names = ", ".join(route.name for route in routes)
        raise WatchError(
            f"retrain watch --folder: a folder plays one model's prefix, and {names} are served; expected "
            "--model NAME, or --container"
        )
    return [route.scope for route in routes if route.scope is not None]


@dataclass(frozen=True)
class LandedBlob:
    """One version of one blob, as a poll found it."""

    name: str  # the blob's name in the container, prefix included
    etag: str
    size: int
    modified_ns: int
    content_type: str = "application/octet-stream"
    blob_type: str = BLOCK_BLOB


class BlobSource(Protocol):
    """Where the landing blobs are listed. `cache` is the source's own memo from the previous poll (the
    folder keeps each file's hash there); `scan` returns the blobs and the memo to keep."""

    description: str

    def scan(self, cache: Mapping[str, Any]) -> tuple[list[LandedBlob], dict[str, Any]]: ...


class FolderSource:
    """A local landing folder: each non-hidden file at most the scope's depth down is the blob
    `<prefix>/<path in the folder>`."""

    def __init__(self, folder: Path, scope: BlobScope) -> None:
        self.folder = Path(folder)
        self.scope = scope
        self.description = f"folder {self.folder.resolve()}"

    def scan(self, cache: Mapping[str, Any]) -> tuple[list[LandedBlob], dict[str, Any]]:
        if not self.folder.is_dir():
            raise WatchError(f"landing folder {self.folder}: not a folder; expected the folder to watch")
        blobs, memo = [], {}
        files, links, deep = _visible_files(self.folder, self.scope.depth)
        for relative in deep:
            # A file one level too deep is the commonest slip (`landing/<model>/x.csv` where the folder is
            # already the model's prefix): it is never delivered, so say why once, until it is gone.
            if cache.get(relative) != TOO_DEEP:
                below = "" if self.scope.depth == 1 else f" or {self.scope.depth - 1} level(s) below it"
                log.warning(
                    "landing folder %s: %s holds files below the folder's depth, which are not delivered; "
                    "expected them in the landing folder itself%s, which stands for %s/%s",
                    self.folder, escaped(relative), below, self.scope.container_url, self.scope.folder,
                )  # fmt: skip
            memo[relative] = TOO_DEEP
        for relative in links:
            # A link could stand for any file on this machine (`ln -s /etc/passwd x.csv`): it is never
            # followed, nor delivered. Said once, until it is gone or replaced.
            if cache.get(relative) != LINK:
                log.warning(
                    "landing folder %s: %s is a symbolic link; it is not delivered (links are never "
                    "followed); expected a regular file",
                    self.folder, escaped(relative),
                )  # fmt: skip
            memo[relative] = LINK
        for relative, path in files:
            stat = path.stat()
            known = cache.get(relative)
            # The hash is what identifies the version; re-hash only what changed since the last poll.
            if isinstance(known, list) and known[:2] == [stat.st_size, stat.st_mtime_ns]:
                etag = str(known[2])
            else:
                etag = content_etag(path)
            memo[relative] = [stat.st_size, stat.st_mtime_ns, etag]
            content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            name = f"{self.scope.folder}{relative}"
            blobs.append(LandedBlob(name, etag, stat.st_size, stat.st_mtime_ns, content_type))
        return blobs, memo


def _visible_files(folder: Path, depth: int) -> tuple[list[tuple[str, Path]], list[str], list[str]]:
    """(path relative to `folder`, path) of its non-hidden regular files, in non-hidden sub-folders down to
    `depth` levels (1: its direct files), sorted; the relative paths of the symbolic links among them (to
    a file or a folder), which are never followed; and those of the non-hidden sub-folders below `depth`
    that hold something (`x/`), whose files are never delivered. Every suffix is announced: the front door
    rejects what is not data, saying why, as Event Grid would report any blob."""
    found, links, deep = [], [], []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_symlink():
            links.append(path.name)
        elif path.is_file():
            found.append((path.name, path))
        elif path.is_dir() and depth > 1:
            inside, inner_links, inner_deep = _visible_files(path, depth - 1)
            found += [(f"{path.name}/{relative}", inner) for relative, inner in inside]
            links += [f"{path.name}/{relative}" for relative in inner_links]
            deep += [f"{path.name}/{relative}" for relative in inner_deep]
        elif path.is_dir() and any(not entry.name.startswith(".") for entry in path.iterdir()):
            deep.append(f"{path.name}/")
    return found, links, deep


class ContainerSource:
    """The configured landing container, listed under the prefix (every sub-folder included: Event Grid
    would report those too; the front door takes a depth-2 scope's class folders and rejects the rest)."""

    def __init__(self, container: ContainerClient, scope: BlobScope) -> None:
        self.container = container
        self.scope = scope
        self.description = f"container {scope.container_url}/{scope.folder}"

    def scan(self, cache: Mapping[str, Any]) -> tuple[list[LandedBlob], dict[str, Any]]:
        blobs = []
        for item in self.container.list_blobs(name_starts_with=self.scope.folder):
            settings = item.content_settings
            blobs.append(
                LandedBlob(
                    name=item.name,
                    etag=str(item.etag).strip('"'),
                    size=int(item.size or 0),
                    modified_ns=int(item.last_modified.timestamp() * 1_000_000) * 1000,
                    content_type=(settings.content_type if settings else None) or "application/octet-stream",
                    blob_type=str(getattr(item.blob_type, "value", item.blob_type)),
                )
            )
        return blobs, {}


@dataclass(frozen=True)
class WatchState:
    """What a source's watcher has delivered: each blob URL's last delivered eTag, the sequence number of
    the last event, and the source's memo."""

    source: str
    delivered: Mapping[str, str] = field(default_factory=dict)
    sequence: int = 0
    cache: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": STATE_SCHEMA,
            "source": self.source,
            "delivered": dict(self.delivered),
            "sequence": self.sequence,
            "cache": dict(self.cache),
        }


def state_path(state_root: Path, source: BlobSource) -> Path:
    """`<state>/watch/<hash of the source>.json`: one file per watched folder or container."""
    key = hashlib.sha256(source.description.encode()).hexdigest()[:16]
    return Path(state_root) / WATCH_DIR / f"{key}.json"


def load_state(path: Path, source: BlobSource) -> WatchState:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return WatchState(source.description)
    except (OSError, ValueError) as err:
        raise WatchError(
            f"watch state {path}: unreadable ({type(err).__name__}); delete it to deliver every blob again "
            "(the ledger dedupes what it has seen)"
        ) from None
    if not isinstance(document, dict) or document.get("schema") != STATE_SCHEMA:
        raise WatchError(f"watch state {path}: not a schema-{STATE_SCHEMA} watch state; delete it")
    return WatchState(
        source=source.description,
        delivered=dict(document.get("delivered") or {}),
        sequence=int(document.get("sequence") or 0),
        cache=dict(document.get("cache") or {}),
    )


def save_state(path: Path, state: WatchState) -> None:
    """Replace the state file whole: a reader (or a crash) sees the old state or the new one."""
    write_atomically(path, json.dumps(state.to_dict(), indent=1, sort_keys=True).encode())


def sequencer(blob: LandedBlob, sequence: int) -> str:
    """Event Grid's `sequencer`: hexadecimal, one width, ordered like the versions of a blob. The last
    modification time comes first (so the order survives a lost state file), then the delivery count."""
    return f"{blob.modified_ns:020x}{sequence:012x}"


def blob_created_event(scope: BlobScope, blob: LandedBlob, sequence: int, now: datetime) -> dict[str, Any]:
    """The Event Grid schema's `Microsoft.Storage.BlobCreated` for `blob` (Azure's documented fields)."""
    url = blob_url(scope, blob.name)
    event_id = str(uuid.uuid5(_EVENT_NAMESPACE, f"{url}#{blob.etag}"))
    return {
        "topic": (
            f"/subscriptions/{WATCH_SUBSCRIPTION}/resourceGroups/{WATCH_RESOURCE_GROUP}/providers/"
            f"Microsoft.Storage/storageAccounts/{scope.account}"
        ),
        "subject": f"/blobServices/default/containers/{scope.container}/blobs/{blob.name}",
        "eventType": BLOB_CREATED,
        "eventTime": now.isoformat(),
        "id": event_id,
        "data": {
            "api": "PutBlob",
            "clientRequestId": event_id,
            "requestId": event_id,
            "eTag": blob.etag,
            "contentType": blob.content_type,
            "contentLength": blob.size,
            "blobType": blob.blob_type,
            "url": url,
            "sequencer": sequencer(blob, sequence),
            "storageDiagnostics": {"batchId": event_id},
        },
        "dataVersion": "",
        "metadataVersion": "1",
    }


class Watcher:
    """Polls one source and hands each new blob version's event to `deliver` (the blob trigger's handler).

    A delivery that raises stops the poll: what was delivered before it is remembered, it and the rest are
    tried again at the next poll, as Event Grid retries a failed delivery.
    """

    def __init__(
        self,
        source: BlobSource,
        scope: BlobScope,
        state_root: Path,
        deliver: Callable[[dict[str, Any]], None],
        clock: Callable[[], datetime],
    ) -> None:
        self.source = source
        self.scope = scope
        self.path = state_path(state_root, source)
        self._deliver = deliver
        self._clock = clock

    def poll(self) -> list[dict[str, Any]]:
        """One poll: the events delivered, oldest blob version first."""
        state = load_state(self.path, self.source)
        blobs, cache = self.source.scan(state.cache)
        present = {blob_url(self.scope, blob.name): blob for blob in blobs}
        # Forget blobs that are gone, so the state stays the size of the landing data.
        delivered = {url: etag for url, etag in state.delivered.items() if url in present}
        fresh = [blob for url, blob in present.items() if delivered.get(url) != blob.etag]
        fresh.sort(key=lambda blob: (blob.modified_ns, blob.name))
        events, sequence = [], state.sequence
        try:
            for blob in fresh:
                event = blob_created_event(self.scope, blob, sequence + 1, self._clock())
                self._deliver(event)
                sequence += 1
                delivered[event["data"]["url"]] = blob.etag
                events.append(event)
        finally:
            save_state(self.path, replace(state, delivered=delivered, sequence=sequence, cache=cache))
        return events
