"""`Microsoft.Storage.BlobCreated` events, in the Event Grid or the CloudEvents 1.0 schema, into a trigger.

Only a committed, non-empty block blob in the configured account, container and prefix, with an allowed
suffix, becomes a `TriggerRequest`; anything else becomes a `Rejection` with its reason. The event itself
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

from function_app.events.blob_paths import (
    blob_url,
    check_blob_in_scope,
    displayable_url,
    subject_blob,
    url_blob,
)
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
from function_app.events.triggers import KIND_BLOB, BlobRef, Rejection, TriggerRequest
from function_app.settings.app import BLOB_ACCOUNT, BLOB_CONTAINER, AppSettings, BlobScope

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
    scope = settings.blob
    if scope is None:
        raise Invalid(
            f"blob events are not configured; set {BLOB_ACCOUNT} and {BLOB_CONTAINER} to accept them"
        )
    _check_source(envelope.source, scope)
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
    blob = _blob(envelope, data, scope, api, size)
    return TriggerRequest(
        kind=KIND_BLOB,
        event_id=envelope.event_id,
        dedupe_key=f"{KIND_BLOB}:{blob.identity}",
        model_name=settings.model_name,
        received_at=now,
        blob=blob,
    )


def _check_source(source: str | None, scope: BlobScope) -> None:
    """The topic (source) Event Grid sets names the storage account; when present it must be ours."""
    if source is None:
        return
    match = _STORAGE_ACCOUNT_SOURCE.fullmatch(source)
    if match is None:
        raise Invalid(
            f"the event's topic {shown(source, 200)} is not a storage account; expected "
            f"/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Storage/storageAccounts/{scope.account}"
        )
    if match["account"].lower() != scope.account:
        raise Invalid(
            f"the event's topic names storage account {shown(match['account'])}, which is not storage "
            f"account {scope.account!r} ({BLOB_ACCOUNT})"
        )


def _blob(envelope: Envelope, data: Mapping[str, Any], scope: BlobScope, api: str, size: int) -> BlobRef:
    if envelope.subject is None:
        raise Invalid(f"the event has no subject; expected {scope.container_url} blob's subject")
    subject_container, subject_name = subject_blob(envelope.subject)
    url = text(data, "url", WHERE, max_chars=4096)
    url_container, url_name = url_blob(url, scope, "the event's url", data_lake=api == "FlushWithClose")
    if (url_container, url_name) != (subject_container, subject_name):
        raise Invalid(
            f"the event's url {displayable_url(url)} and subject {shown(envelope.subject)} name different "
            "blobs; expected the same blob in both"
        )
    check_blob_in_scope(subject_container, subject_name, scope)
    etag = pattern_text(data, "eTag", WHERE, _ETAG, "an eTag such as 0x8D4BCC2E4835CD0")
    sequencer = pattern_text(data, "sequencer", WHERE, _SEQUENCER, "a hexadecimal sequencer")
    return BlobRef(
        url=blob_url(scope, subject_name),
        account=scope.account,
        container=subject_container,
        name=subject_name,
        etag=etag.strip('"'),  # the listing strips them too (components/blob_snapshot.py)
        sequencer=sequencer,
        size=size,
    )
