"""`Microsoft.Storage.BlobCreated` events, in the Event Grid or the CloudEvents 1.0 schema, into a trigger.

Only a committed, non-empty block blob that one served model's scope holds (account, container, under the
prefix at most the scope's depth down, so an image model's `shapes/circle/a.png` is its own, and an allowed
suffix: function_app/events/routing.py) becomes a `TriggerRequest` for that model; anything else becomes a
`Rejection` with its reason. The event itself
carries what the decision needs (url, eTag, contentLength, api, sequencer): the blob is never read here.
The dedupe key is the blob's URL and eTag (one version of one blob), never the event id alone: Event Grid
may deliver one upload several times, under one id or several.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from function_app.events.blob_paths import blob_url, subject_blob
from function_app.events.envelope import (
    Envelope,
    Invalid,
    event_id_of,
    pattern_text,
    read_envelope,
    shown,
    text,
    whole_number,
)
from function_app.events.routing import blob_routes, route_blob
from function_app.events.triggers import KIND_BLOB, BlobRef, Rejection, TriggerRequest
from function_app.settings.app import BLOB_ACCOUNT, AppSettings, BlobScope
from function_app.settings.models import ModelRoute

log = logging.getLogger(__name__)

BLOB_CREATED = "Microsoft.Storage.BlobCreated"
# The APIs that commit a blob's content. PutBlock stages uncommitted data and raises no event; these do.
COMMIT_APIS = ("PutBlob", "PutBlockList", "CopyBlob", "FlushWithClose")
BLOCK_BLOB = "BlockBlob"
_STORAGE_ACCOUNT_SOURCE = re.compile(
    r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Storage/storageAccounts/(?P<account>[^/]+)",
    re.IGNORECASE,
)
_ETAG = re.compile(r'"?[\x21\x23-\x7e]{1,126}"?')  # visible ASCII, optionally quoted
_SEQUENCER = re.compile(r"[0-9A-Fa-f]{1,64}")  # compared as strings: same width for one blob
WHERE = "the event data"


def parse_blob_created(
    event: Mapping[str, Any], settings: AppSettings, now: datetime
) -> TriggerRequest | Rejection:
    """A Blob-created event as a trigger for its blob, or the reason it does not belong."""
    try:
        return _trigger(read_envelope(event), settings, now)
    except Invalid as err:
        rejection = Rejection(KIND_BLOB, event_id_of(event), err.reason)
        log.debug("rejected blob event %s: %s", rejection.event_id, rejection.reason)
        return rejection


def _trigger(envelope: Envelope, settings: AppSettings, now: datetime) -> TriggerRequest:
    if envelope.event_type != BLOB_CREATED:
        raise Invalid(
            f"event type {shown(envelope.event_type)} is not a blob upload; expected {BLOB_CREATED}"
        )
    scopes = [scope for _, scope in blob_routes(settings.models)]
    _check_source(envelope.source, scopes)
    data = envelope.data
    api = text(data, "api", WHERE, max_chars=64)
    if api not in COMMIT_APIS:
        raise Invalid(f"api {shown(api)} does not commit a blob; expected one of {', '.join(COMMIT_APIS)}")
    blob_type = text(data, "blobType", WHERE, max_chars=64)
    if blob_type != BLOCK_BLOB:
        raise Invalid(f"blobType {shown(blob_type)} is not data; expected {BLOCK_BLOB}")
    size = whole_number(data, "contentLength", WHERE)
    if size <= 0:
        raise Invalid(f"contentLength {size}: an empty blob holds no data; expected more than 0 bytes")
    route, blob = _blob(envelope, data, settings.models, api, size)
    return TriggerRequest(
        kind=KIND_BLOB,
        event_id=envelope.event_id,
        dedupe_key=f"{KIND_BLOB}:{blob.identity}",
        model_name=route.name,
        received_at=now,
        blob=blob,
    )


def _check_source(source: str | None, scopes: list[BlobScope]) -> None:
    """The topic (source) Event Grid sets names the storage account; when present it must be a served
    model's (the blob's own model's: `_blob`)."""
    account = source_account(source, scopes[0].account)
    accounts = list(dict.fromkeys(scope.account for scope in scopes))
    if account is not None and account not in accounts:
        served = " or ".join(repr(name) for name in accounts)
        raise Invalid(
            f"the event's topic names storage account {shown(account)}, which is not storage account "
            f"{served} ({BLOB_ACCOUNT})"
        )


def source_account(source: str | None, example: str) -> str | None:
    """The storage account an event's topic names (lowercase), or None without a topic."""
    if source is None:
        return None
    match = _STORAGE_ACCOUNT_SOURCE.fullmatch(source)
    if match is None:
        raise Invalid(
            f"the event's topic {shown(source, 200)} is not a storage account; expected "
            f"/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Storage/storageAccounts/{example}"
        )
    return match["account"].lower()


def _blob(
    envelope: Envelope, data: Mapping[str, Any], routes: tuple[ModelRoute, ...], api: str, size: int
) -> tuple[ModelRoute, BlobRef]:
    if envelope.subject is None:
        raise Invalid("the event has no subject; expected a blob's subject (/blobServices/default/...)")
    subject_container, subject_name = subject_blob(envelope.subject)
    url = text(data, "url", WHERE, max_chars=4096)
    route, scope = route_blob(
        url, envelope.subject, subject_container, subject_name, routes, data_lake=api == "FlushWithClose"
    )
    account = source_account(envelope.source, scope.account)
    if account is not None and account != scope.account:
        raise Invalid(
            f"the event's topic names storage account {shown(account)}, but the blob is model "
            f"{route.name!r}'s, in storage account {scope.account!r}; expected the blob's own account"
        )
    etag = pattern_text(data, "eTag", WHERE, _ETAG, "an eTag such as 0x8D4BCC2E4835CD0")
    sequencer = pattern_text(data, "sequencer", WHERE, _SEQUENCER, "a hexadecimal sequencer")
    return route, BlobRef(
        url=blob_url(scope, subject_name),
        account=scope.account,
        container=subject_container,
        name=subject_name,
        etag=etag.strip('"'),  # the listing strips them too (components/azureml/blob_snapshot.py)
        sequencer=sequencer,
        size=size,
    )
