"""Which served model an event or request is for. Pure: the served models (`AppSettings.models`) in, one
`ModelRoute` out, or `Invalid` with the reason there is none.

- A blob belongs to the one model whose scope holds it: the scope's account and container, the blob under
  the scope's prefix at most `depth` levels down (1: directly under it; 2: also in a class folder, as the
  image task's data lies), in no hidden folder, with one of the scope's suffixes. Start-up refuses
  overlapping scopes (function_app/settings/models.py), so at most one model holds a blob.
- A drift alert names its model; an alert that cannot (Azure ML's data drift v1) goes to the only served
  model, and is refused when there are several.
- An HTTP request names its model in `model_name`; with one served model it may leave it out.
"""

from __future__ import annotations

from collections.abc import Sequence

from function_app.events.blob_paths import check_blob_in_scope, displayable_url, misplacement, url_blob_in
from function_app.events.envelope import Invalid, shown
from function_app.settings.models import ModelRoute
from function_app.settings.storage import BLOB_ACCOUNT, BLOB_CONTAINER, BlobScope


def blob_routes(routes: Sequence[ModelRoute]) -> list[tuple[ModelRoute, BlobScope]]:
    """The served models that take blob events, each with its scope; raises `Invalid` when none does."""
    scoped = [(route, route.scope) for route in routes if route.scope is not None]
    if not scoped:
        raise Invalid(
            f"blob events are not configured; set {BLOB_ACCOUNT} and {BLOB_CONTAINER} (or a model's "
            "[trigger] account and container) to accept them"
        )
    return scoped


def route_blob(
    url: str,
    subject: str,
    container: str,
    name: str,
    routes: Sequence[ModelRoute],
    *,
    data_lake: bool = False,
) -> tuple[ModelRoute, BlobScope]:
    """The model (and its scope) that holds the blob `container`/`name`, which the event's `subject` names
    and its `url` must name too; raises `Invalid` with the reason no model does."""
    scoped = blob_routes(routes)
    scopes = [scope for _, scope in scoped]
    held, url_container, url_name = url_blob_in(url, scopes, "the event's url", data_lake=data_lake)
    if (url_container, url_name) != (container, name):
        raise Invalid(
            f"the event's url {displayable_url(url)} and subject {shown(subject)} name different blobs; "
            "expected the same blob in both"
        )
    if len(scoped) == 1 and scoped[0][0].config is None:
        # The single model of the RETRAIN_BLOB_* settings: the reasons name those settings.
        check_blob_in_scope(container, name, scopes[0])
        return scoped[0]
    candidates = [scoped[position] for position in held]
    holders = [(route, scope) for route, scope in candidates if holds(scope, container, name)]
    if len(holders) == 1:
        return holders[0]
    if holders:  # start-up refuses overlapping scopes; a route list built otherwise may still have them
        names = ", ".join(repr(route.name) for route, _ in holders)
        raise Invalid(f"blob {shown(name)} is held by models {names}; expected exactly one")
    raise Invalid(_why_no_model(candidates, container, name))


def holds(scope: BlobScope, container: str, name: str) -> bool:
    """Whether a blob of the scope's account is the scope's: its container, in place under its prefix
    (blob_paths.misplacement), with one of its suffixes."""
    return (
        container == scope.container and misplacement(name, scope) is None and name.endswith(scope.suffixes)
    )


def _why_no_model(candidates: Sequence[tuple[ModelRoute, BlobScope]], container: str, name: str) -> str:
    """The reason the models of the blob's account do not hold it, nearest miss first."""
    in_container = [(route, scope) for route, scope in candidates if scope.container == container]
    if not in_container:
        expected = ", ".join(f"{scope.container!r} ({route.name})" for route, scope in candidates)
        return f"container {shown(container)} is not a served model's; expected one of {expected}"
    under = [(route, scope) for route, scope in in_container if name.startswith(scope.folder)]
    if not under:
        expected = ", ".join(f"{scope.folder or '/'!r} ({route.name})" for route, scope in in_container)
        return (
            f"blob {shown(name)} is not under a served model's prefix; expected a file under one of "
            f"{expected} (a data version pins only those)"
        )
    at_prefix = [(route, scope) for route, scope in under if misplacement(name, scope) is None]
    if not at_prefix:
        route, scope = max(under, key=lambda held: len(held[1].folder))  # the nearest prefix above it
        return f"blob {shown(name)} {misplacement(name, scope, f' of model {route.name!r}')}"
    suffixes = "; ".join(
        f"{', '.join(scope.suffixes)} for model {route.name!r} ({route.source})" for route, scope in at_prefix
    )
    return f"blob {shown(name)} has none of the suffixes {suffixes}"


def route_named(name: str, routes: Sequence[ModelRoute], what: str) -> ModelRoute:
    """The served model called `name`; raises `Invalid` naming the served ones. `what` says what named it."""
    for route in routes:
        if route.name == name:
            return route
    served = ", ".join(repr(route.name) for route in routes)
    raise Invalid(f"{what} {shown(name, 40)} is not this front door's model; expected one of: {served}")


def only_route(routes: Sequence[ModelRoute], what: str) -> ModelRoute:
    """The one served model, for what names none; raises `Invalid` when several are served."""
    if len(routes) == 1:
        return routes[0]
    served = ", ".join(repr(route.name) for route in routes)
    raise Invalid(f"{what} names no model, and this front door serves several ({served}); expected one")
