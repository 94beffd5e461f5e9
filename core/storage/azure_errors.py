"""Azure's failures, translated once: what a user must fix becomes one secret-free line of the caller's own
error type; what is worth a retry (network, throttling, 5xx) keeps its Azure type where the caller retries.

Every Blob adapter (records, leases, checkpoint objects) wraps its calls in its `AzureErrors.translated`,
naming what it was doing in its own words; `describe` is the one wording of an Azure failure for messages
and logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from core.secrets import mask_secrets

# The statuses Azure's own retry policy retries: a timeout, throttling, and the server's failures.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def is_transient(err: BaseException) -> bool:
    """The retry rule: whether `err` may pass if the same call is made again (network, throttling, 5xx)."""
    if isinstance(err, ServiceRequestError | ServiceResponseError):
        return True
    return isinstance(err, HttpResponseError) and err.status_code in TRANSIENT_STATUS


def is_container_missing(err: BaseException) -> bool:
    """Whether a not-found is the container's (the user must create it), not the blob's."""
    return isinstance(err, ResourceNotFoundError) and getattr(err, "error_code", None) == "ContainerNotFound"


def describe(err: BaseException) -> str:
    """An Azure failure in one secret-free line: `HTTP 403 Forbidden (AuthenticationFailed)`, or the first
    line of a failure without a response; anything else by its type."""
    if not isinstance(err, AzureError):
        return type(err).__name__
    if isinstance(err, HttpResponseError) and err.status_code is not None:
        code = getattr(err, "error_code", None)
        return mask_secrets(f"HTTP {err.status_code} {err.reason or ''} ({code or 'no error code'})")
    lines = str(err).strip().splitlines()
    return mask_secrets(lines[0] if lines else type(err).__name__)[:300]


@dataclass(frozen=True)
class AzureErrors:
    """How one adapter words Azure's failures: `failure(action, reason)` for a failure the user must fix,
    `container_missing()` for a container that does not exist (no adapter creates one). Transient failures
    keep their Azure type when `keep_transient` (the caller, or Event Grid, retries them), and are worded as
    failures otherwise."""

    failure: Callable[[str, str], Exception]
    container_missing: Callable[[], Exception]
    keep_transient: bool = True

    @contextmanager
    def translated(self, action: str) -> Iterator[None]:
        try:
            yield
        except AzureError as err:
            if is_container_missing(err):
                raise self.container_missing() from None
            if self.keep_transient and is_transient(err):
                raise
            raise self.failure(action, describe(err)) from None
