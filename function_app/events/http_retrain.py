"""`POST /api/retrain` into a trigger: a JSON body and an `Idempotency-Key` header, validated.

The body is a JSON object with these optional fields (an empty body asks for a run on the current data):

    data        a blob folder URL in the model's container, at or below its prefix, or a pinned data
                asset 'azureml:<asset>:rd-<16 hex>'
    reason      why, at most 500 characters on one line
    force       true to ask for a run even when policy would hold it back (a JSON boolean, nothing else)
    model_name  the served model to retrain; required when several are served, optional with one

A bad body is a 400 with the reason; a body over RETRAIN_HTTP_MAX_BODY_BYTES a 413. A request with an
`Idempotency-Key` (1-128 of [A-Za-z0-9._:-]) is deduplicated on it; one without is never deduplicated:
it gets a unique key of its own.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from components.submitters import LOCAL, SUBMITTER_SETTING
from function_app.events.blob_paths import blob_url, check_folder_in_scope, check_name, url_blob
from function_app.events.envelope import Invalid, has_unsafe_characters, json_type, load_json, shown
from function_app.events.routing import route_named
from function_app.events.triggers import KIND_HTTP, TriggerRequest
from function_app.settings.app import BLOB_ACCOUNT, HTTP_MAX_BODY_BYTES, AppSettings, BlobScope
from function_app.settings.models import ModelRoute

log = logging.getLogger(__name__)

IDEMPOTENCY_KEY = "Idempotency-Key"
FIELDS = ("data", "force", "model_name", "reason")
MAX_REASON_CHARS = 500
BAD_REQUEST, CONTENT_TOO_LARGE = 400, 413
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_PINNED_ASSET = re.compile(
    r"azureml:(?P<asset>[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}):(?P<version>[a-z]{2}-[0-9a-f]{16})"
)
_DATA_FORMS = "a blob folder URL in the configured container, or azureml:<asset>:rd-<16 hex digits>"


@dataclass(frozen=True)
class HttpRejection:
    """A refused HTTP request: the status to answer and a one-line reason for the caller."""

    status: int
    reason: str

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 499:
            raise ValueError(f"HTTP rejection status {self.status}: expected a 4xx client error status")


def new_request_id() -> str:
    return f"http-{uuid.uuid4().hex}"


def parse_http_retrain(
    body: bytes,
    headers: Mapping[str, str],
    settings: AppSettings,
    now: datetime,
    *,
    new_id: Callable[[], str] = new_request_id,
) -> TriggerRequest | HttpRejection:
    """A retrain request as a trigger, or the 400/413 that refuses it. `new_id` names the request."""
    if len(body) > settings.http_max_body_bytes:
        return _refuse(
            CONTENT_TOO_LARGE,
            f"the request body has {len(body)} bytes; expected at most {settings.http_max_body_bytes} "
            f"({HTTP_MAX_BODY_BYTES})",
        )
    try:
        key = _idempotency_key(headers)
        fields = _body_fields(body)
        route = _check_model(fields, settings)
        # An absent field takes its default; a present one, null included, must have the right type.
        data_uri = _data_uri(fields["data"], route.scope, settings.submitter) if "data" in fields else None
        reason = _reason(fields["reason"]) if "reason" in fields else None
        force = _force(fields["force"]) if "force" in fields else False
    except Invalid as err:
        return _refuse(BAD_REQUEST, err.reason)
    request_id = new_id()
    return TriggerRequest(
        kind=KIND_HTTP,
        event_id=request_id,
        dedupe_key=f"{KIND_HTTP}:{key if key is not None else request_id}",
        model_name=route.name,
        received_at=now,
        reason=reason,
        force=force,
        data_uri=data_uri,
    )


def has_idempotency_key(request: TriggerRequest) -> bool:
    """Whether the request came with an Idempotency-Key: without one, its dedupe key is its own fresh id."""
    return request.dedupe_key != f"{KIND_HTTP}:{request.event_id}"


def _refuse(status: int, reason: str) -> HttpRejection:
    log.debug("refused retrain request (%d): %s", status, reason)
    return HttpRejection(status, reason)


def _idempotency_key(headers: Mapping[str, str]) -> str | None:
    values = {value for name, value in headers.items() if name.lower() == IDEMPOTENCY_KEY.lower()}
    if not values:
        return None
    if len(values) > 1:
        raise Invalid(f"the {IDEMPOTENCY_KEY} header is given twice with different values; expected one")
    key = values.pop()
    if not isinstance(key, str) or not _IDEMPOTENCY_KEY.fullmatch(key):
        raise Invalid(
            f"the {IDEMPOTENCY_KEY} header {shown(key, 40)} is malformed; expected 1-128 letters, digits, "
            "'.', '_', ':' or '-'"
        )
    return key


def _body_fields(body: bytes) -> Mapping[str, Any]:
    if not body.strip():
        return {}
    document = load_json(bytes(body), "the request body")
    if not isinstance(document, Mapping):
        raise Invalid(f"the request body is a JSON {json_type(document)}; expected a JSON object")
    unknown = sorted(set(document) - set(FIELDS))
    if unknown:
        raise Invalid(
            f"the request body has the unknown field {shown(unknown[0], 40)}; expected only "
            f"{', '.join(FIELDS)}"
        )
    return document


def _check_model(fields: Mapping[str, Any], settings: AppSettings) -> ModelRoute:
    """The model the request is for: `model_name`, required when several models are served."""
    served = ", ".join(repr(route.name) for route in settings.models)
    if "model_name" not in fields:
        if len(settings.models) == 1:
            return settings.models[0]
        raise Invalid(f"model_name is missing; expected one of this front door's models: {served}")
    name = fields["model_name"]
    if not isinstance(name, str):
        raise Invalid(f"model_name is {shown(name, 40)}; expected one of this front door's models: {served}")
    return route_named(name, settings.models, "model_name")


def _data_uri(value: Any, scope: BlobScope | None, submitter: str) -> str:
    if not isinstance(value, str):
        raise Invalid(f"data is {shown(value)}; expected {_DATA_FORMS}")
    if value.startswith("azureml:"):
        if not _PINNED_ASSET.fullmatch(value):
            raise Invalid(
                f"data {shown(value)} is not a pinned data asset; expected azureml:<asset>:rd-<16 hex>"
            )
        if submitter == LOCAL:
            raise Invalid(
                f"data {shown(value)} is an Azure ML data asset, which runs on this machine cannot read; "
                f"expected a blob folder URL ({SUBMITTER_SETTING}={LOCAL})"
            )
        return value
    if not value.startswith(("https://", "http://")):
        raise Invalid(f"data {shown(value)}: expected {_DATA_FORMS}")
    if scope is None:
        raise Invalid(
            f"data is a blob URL, but the model has no blob account ({BLOB_ACCOUNT}); expected "
            "azureml:<asset>:rd-<16 hex>"
        )
    container, name = url_blob(value, scope, "data")
    folder = name.removesuffix("/")
    if folder:
        check_name(folder, "data's folder")
    check_folder_in_scope(container, folder, scope)
    return blob_url(scope, folder)


def _reason(value: Any) -> str:
    if not isinstance(value, str):
        raise Invalid(f"reason is {shown(value)}; expected a string")
    if len(value) > MAX_REASON_CHARS:
        raise Invalid(f"reason has {len(value)} characters; expected at most {MAX_REASON_CHARS}")
    if has_unsafe_characters(value):
        raise Invalid("reason has control characters or line breaks; expected one line of text")
    return value


def _force(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"force is {shown(value)}; expected true or false")
    return value
