"""HTTP: `POST /api/retrain` asks for a retraining; `GET /api/retrain/{id}` tells what became of it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import azure.functions as func

from function_app.runtime import front_door

blueprint = func.Blueprint()


def _json(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, sort_keys=True),
        status_code=status,
        headers=dict(headers or {}),
        mimetype="application/json",
    )


@blueprint.function_name("post_retrain")
@blueprint.route(route="retrain", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def post_retrain(req: func.HttpRequest) -> func.HttpResponse:
    outcome = front_door().retrain(req.get_body(), dict(req.headers), req.url)
    return _json(outcome.status, outcome.body, outcome.headers)


@blueprint.function_name("get_retrain")
@blueprint.route(route="retrain/{id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def get_retrain(req: func.HttpRequest) -> func.HttpResponse:
    identifier = req.route_params.get("id", "")
    report = front_door().describe(identifier)
    if report is None:
        return _json(404, {"error": f"no retraining with id {identifier!r}"})
    return _json(200, report)
