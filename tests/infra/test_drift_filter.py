"""The workspace's drift subscription delivers only model monitoring's threshold breaches: its filter, read
from infra/modules/subscriptions.bicep, is run by an Event Grid filter evaluator over Microsoft's sample
RunStatusChanged events. The front door's parser still rejects what the filter would let through."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers.function_app import corpus
from helpers.function_app.microsoft_samples import RUN_STATUS_CHANGED
from helpers.infra.bicep_checks import body, parse, text
from helpers.infra.event_filter import delivers

from function_app.events.drift_alerts import (
    DATASET_DRIFT_DETECTED,
    THRESHOLD_BREACHED_TAG,
    parse_drift_alert,
)
from function_app.events.drift_alerts import RUN_STATUS_CHANGED as RUN_STATUS_CHANGED_TYPE
from function_app.events.triggers import Rejection, TriggerRequest
from function_app.settings.app import AppSettings

INFRA = Path(__file__).resolve().parents[2] / "infra"
ROUTING = json.loads((INFRA / "event-routing.json").read_text())
NOW = datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
# The message Azure ML's monitor signal components tag a breaching run with (azureml-assets,
# model_monitor_evaluate_metrics_threshold: "The signal '<name>' has failed due to one or more features
# violating metric thresholds." and the features).
MONITOR_MESSAGE = (
    "The signal 'data-drift-signal' has failed due to one or more features violating metric thresholds.\n"
    "The feature names and their corresponding computed metric values violating the threshold are \n"
    '[\'{"group":"pixel_3","metric_value":0.41,"metric_name":"jensen_shannon_distance",'
    '"threshold_value":0.2}\']\n'
)


def resolved(node: Any) -> Any:
    """A filter's values as deployed: literals as they are, `routing.<key>` from infra/event-routing.json."""
    if isinstance(node, list):
        return [resolved(item) for item in node]
    if isinstance(node, dict) and "operator" not in node and "function" not in node:
        return {key: resolved(value) for key, value in node.items()}
    if isinstance(node, str):
        return node
    expression = text(node)
    assert expression.startswith("routing."), f"unresolvable filter expression {expression!r}"
    return ROUTING[expression.removeprefix("routing.")]


def subscription_filter(name: str) -> dict[str, Any]:
    resource = parse(INFRA / "modules" / "subscriptions.bicep")["resources"][name]
    return resolved(body(resource)[0]["properties"]["filter"])


def breach_event() -> dict:
    """A monitor signal run that breached its threshold (the corpus's Event Grid event)."""
    return corpus.run_status_changed(tags={THRESHOLD_BREACHED_TAG: MONITOR_MESSAGE})


def documented_event() -> dict:
    """Microsoft's sample RunStatusChanged as published: an AutoML child run, no breach tag."""
    return copy.deepcopy(RUN_STATUS_CHANGED)


def own_step_event() -> dict:
    """Microsoft's sample shape for one of Retrain's own pipeline steps finishing, tagged with its model."""
    event = copy.deepcopy(RUN_STATUS_CHANGED)
    event["subject"] = "experiments/4c1f3a5e-0000-4000-8000-000000000001/runs/retrain_train_7f3c"
    event["data"].update(
        experimentName="retrain-digits",
        runId="retrain_train_7f3c",
        runType="azureml.StepRun",
        runTags={"retrain.model_name": "digits", "retrain.step": "train"},
        runProperties={"azureml.nodeid": "train"},
        runStatus="Completed",
    )
    return event


def test_the_drift_subscription_has_microsofts_breach_filter_on_the_parsers_tag():
    drift = subscription_filter("workspaceSubscription")
    assert drift["includedEventTypes"] == [RUN_STATUS_CHANGED_TYPE]
    assert drift["advancedFilters"] == [
        {
            "operatorType": "StringContains",
            "key": f"data.RunTags.{THRESHOLD_BREACHED_TAG}",
            "values": ["has failed due to one or more features violating metric thresholds"],
        }
    ]


@pytest.mark.parametrize(
    "event, delivered",
    [
        pytest.param(breach_event(), True, id="monitor-breach"),
        pytest.param(documented_event(), False, id="microsofts-sample-no-breach"),
        pytest.param(own_step_event(), False, id="retrain-pipeline-step"),
    ],
)
def test_only_the_breach_is_delivered(event, delivered):
    assert delivers(subscription_filter("workspaceSubscription"), event) is delivered


def test_the_filter_ignores_case_as_event_grid_does():
    event = breach_event()
    event["data"]["RunTags"][THRESHOLD_BREACHED_TAG] = MONITOR_MESSAGE.upper()
    assert delivers(subscription_filter("workspaceSubscription"), event)
    event["eventType"] = event["eventType"].lower()
    assert delivers(subscription_filter("workspaceSubscription"), event)


def test_a_breach_tag_without_microsofts_message_is_not_delivered():
    event = corpus.run_status_changed(tags={THRESHOLD_BREACHED_TAG: "something else"})
    assert not delivers(subscription_filter("workspaceSubscription"), event)


def test_data_drift_v1_has_its_own_unfiltered_subscription():
    """Its events carry no run tags: under the monitor's filter every one would be dropped."""
    v1 = subscription_filter("datasetDriftSubscription")
    assert v1["includedEventTypes"] == [DATASET_DRIFT_DETECTED]
    assert not v1.get("advancedFilters")
    assert delivers(v1, corpus.dataset_drift_detected())
    assert not delivers(subscription_filter("workspaceSubscription"), corpus.dataset_drift_detected())
    assert not delivers(v1, breach_event())


def test_the_parser_is_the_second_line_of_defence():
    settings = AppSettings.from_environ(corpus.ENVIRON)
    for event in (documented_event(), own_step_event()):
        rejection = parse_drift_alert(event, settings, NOW)
        assert isinstance(rejection, Rejection)
        assert THRESHOLD_BREACHED_TAG in rejection.reason
    assert isinstance(parse_drift_alert(breach_event(), settings, NOW), TriggerRequest)
