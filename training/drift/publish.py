"""Publish a drift alert as the project's `Retrain.DriftDetected` event, with azure-eventgrid.

The event's `data` is the contract function_app/events/drift_alerts.py parses (dataVersion "1"): model_name,
check_id, metric ('psi'), value (the largest PSI), threshold (the PSI threshold), and data_version (the
current raw data version, when known). It also carries what a person looking at the alert wants, which the
parser ignores: each feature's scores, the drifted features, and the reference data's versions.

Where it goes, from the environment:

    RETRAIN_DRIFT_TOPIC_ENDPOINT  the custom topic's endpoint, https://<topic>.<region>-1.eventgrid.azure.net/api/events
                                  (locally: the loopback topic's, function_app/local/topic.py)
    RETRAIN_DRIFT_TOPIC_KEY       the topic's access key (sent as `aeg-sas-key`); without one, the workload's
                                  Azure identity (DefaultAzureCredential), which needs an https endpoint

The key never reaches a log line or an error message. azure-eventgrid is imported only here, and only when
an event is built: it is the Function App's dependency, not one a training step should pay for.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from core.errors import InputError, RetrainError
from core.secrets import displayable_url, mask_secrets
from core.versions import is_raw_version
from training.drift.check import DriftReport

if TYPE_CHECKING:
    from azure.eventgrid import EventGridEvent

log = logging.getLogger(__name__)

TOPIC_ENDPOINT = "RETRAIN_DRIFT_TOPIC_ENDPOINT"
TOPIC_KEY = "RETRAIN_DRIFT_TOPIC_KEY"
EVENT_TYPE = "Retrain.DriftDetected"  # function_app/events/drift_alerts.py's RETRAIN_DRIFT_DETECTED
EVENT_DATA_VERSION = "1"
METRIC = "psi"
_CHECK_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # what the drift trigger accepts as a check id
_ERROR_CHARS = 300


class PublishError(RetrainError):
    """The topic refused the event or could not be reached; the message names the endpoint, never the key."""


def new_check_id(now: datetime) -> str:
    """A unique id for one drift check, readable by its time: drift-20261129T104100Z-1a2b3c4d5e6f."""
    return f"drift-{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class TopicSettings:
    """Where drift events go and how the publisher proves it may send them."""

    endpoint: str
    key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        # Any '@' is user info: a key pasted there may hold '/', which hides it from urlsplit's netloc.
        if parts.scheme not in ("http", "https") or not parts.hostname or "@" in self.endpoint:
            raise InputError(
                f"{TOPIC_ENDPOINT} {self.shown_endpoint!r}: expected the topic's URL, "
                "https://<topic>.<region>-1.eventgrid.azure.net/api/events"
            )
        if self.key is not None and not self.key.strip():
            raise InputError(f"{TOPIC_KEY} is blank; expected the topic's access key, or leave it unset")
        if parts.scheme == "http" and self.key is None:
            raise InputError(
                f"{TOPIC_ENDPOINT} {self.shown_endpoint!r} is http://: an Azure identity token is sent only "
                f"over https; use the https endpoint, or set {TOPIC_KEY} for a local topic"
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TopicSettings | None:
        """The settings in `environ`; None when no endpoint is set (publishing is off)."""
        endpoint = environ.get(TOPIC_ENDPOINT, "").strip()
        if not endpoint:
            return None
        key = environ.get(TOPIC_KEY)
        return cls(endpoint, key if key else None)

    @property
    def shown_endpoint(self) -> str:
        """The endpoint without user info, query or fragment: where a secret could hide."""
        return displayable_url(self.endpoint)

    def mask(self, text: str) -> str:
        """`text` with the key, and any signature, account key or URL user info, replaced by '***'."""
        if self.key:
            text = text.replace(self.key, "***")
        return mask_secrets(text)


def event_data(report: DriftReport, model_name: str, check_id: str) -> dict[str, Any]:
    """The event's `data`: the drift trigger's contract first, then the details it ignores."""
    if not _CHECK_ID.fullmatch(check_id):
        raise InputError(f"check id {check_id!r}: expected 1-128 of letters, digits, '.', '_', ':' or '-'")
    data: dict[str, Any] = {
        "model_name": model_name,
        "check_id": check_id,
        "metric": METRIC,
        "value": report.max_psi,
        "threshold": report.policy.psi_threshold,
    }
    current = report.current_data_version
    if current is not None and is_raw_version(current):
        data["data_version"] = current
    data.update(
        reference_data_version=report.reference_data_version,
        worst_feature=report.worst.name,
        drifted_features=list(report.drifted),
        policy=report.policy.describe(),
        features={
            feature.name: {
                "psi": feature.psi,
                "ks_statistic": feature.ks_statistic,
                "ks_pvalue": feature.ks_pvalue,
                "drifted": feature.drifted,
            }
            for feature in report.features
        },
    )
    return data


def drift_event(
    report: DriftReport, model_name: str, check_id: str, extra: Mapping[str, Any] | None = None
) -> EventGridEvent:
    """The `Retrain.DriftDetected` event of a report; `extra` adds fields to its data (e.g. lineage), never
    replacing one of the contract's."""
    from azure.eventgrid import EventGridEvent

    data = {**dict(extra or {}), **event_data(report, model_name, check_id)}
    return EventGridEvent(
        subject=f"/models/{model_name}/drift",
        event_type=EVENT_TYPE,
        data=data,
        data_version=EVENT_DATA_VERSION,
    )


def publish(event: EventGridEvent, settings: TopicSettings) -> str:
    """Send `event` to the topic; returns its id. Raises PublishError, with the key masked."""
    from azure.core.credentials import AzureKeyCredential
    from azure.core.exceptions import AzureError
    from azure.eventgrid import EventGridPublisherClient

    if settings.key is not None:
        credential: Any = AzureKeyCredential(settings.key)
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    client = EventGridPublisherClient(settings.endpoint, credential)
    try:
        client.send([event])
    except AzureError as error:
        lines = str(error).strip().splitlines()
        reason = settings.mask(lines[0] if lines else type(error).__name__)[:_ERROR_CHARS]
        status = getattr(error, "status_code", None)
        reason = f"HTTP {status}, {reason}" if status else reason
        raise PublishError(
            f"cannot publish drift event {event.id} to {settings.shown_endpoint}: {reason}"
        ) from None
    finally:
        client.close()
    log.info("published %s %s to %s", EVENT_TYPE, event.id, settings.shown_endpoint)
    return str(event.id)
