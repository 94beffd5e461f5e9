"""Every Event Grid subscription dead-letters with its topic's system-assigned identity, in the templates and
in docs/deploying-by-hand.md; and a workspace that already has its (one) system topic keeps it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from helpers.infra.bicep_checks import body, parse, resources, text

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra"
EVENT_GRID = INFRA / "modules" / "eventgrid.bicep"
BY_HAND = REPO_ROOT / "docs" / "deploying-by-hand.md"


def test_every_subscription_dead_letters_to_blob_with_its_topics_identity():
    subscriptions = [
        (f"{file}: {name}", body(resource)[0]["properties"])
        for file, name, resource, _ in resources(INFRA)
        if resource["type"].endswith("/eventSubscriptions")
    ]
    assert len(subscriptions) >= 4  # blob (per scope), monitor, data drift v1, drift check
    for where, properties in subscriptions:
        dead_letter = properties.get("deadLetterWithResourceIdentity")
        assert dead_letter, f"{where}: no deadLetterWithResourceIdentity"
        assert dead_letter["identity"] == {"type": "SystemAssigned"}, where
        destination = dead_letter["deadLetterDestination"]
        assert destination["endpointType"] == "StorageBlob", where
        assert text(destination["properties"]["blobContainerName"]) == "deadLetterContainer", where
        assert "deadLetterDestination" not in properties, (
            f"{where}: dead-letters with Event Grid's own identity"
        )


def test_every_topic_has_a_system_assigned_identity():
    topics = [
        (name, resource)
        for _, name, resource, _ in resources(INFRA)
        if resource["type"] in ("Microsoft.EventGrid/systemTopics", "Microsoft.EventGrid/topics")
        and not resource.get("existing")
    ]
    assert {name for name, _ in topics} >= {"storageTopic", "workspaceTopic", "driftTopic"}
    for name, resource in topics:
        assert body(resource)[0].get("identity") == {"type": "SystemAssigned"}, name
    outputs = parse(EVENT_GRID)["outputs"]
    for topic in ("storageTopic", "workspaceTopic", "driftTopic"):
        assert f"{topic}PrincipalId" in outputs, (
            f"eventgrid.bicep outputs no {topic}PrincipalId for its roles"
        )


def _commands(markdown: str) -> list[str]:
    """The shell commands of the document's fenced blocks, continuation lines joined."""
    blocks = re.findall(r"```sh[^\n]*\n(.*?)```", markdown, re.DOTALL)
    joined = "\n".join(re.sub(r"\\\n\s*", " ", block) for block in blocks)
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip()]


def test_every_subscription_the_docs_create_dead_letters_with_the_topics_identity():
    creates = [
        c for c in _commands(BY_HAND.read_text()) if re.search(r"az eventgrid .*event-subscription create", c)
    ]
    assert len(creates) >= 2
    for command in creates:
        assert "--deadletter-identity systemassigned" in command, command
        assert "--deadletter-identity-endpoint " in command, command
        assert "--deadletter-endpoint" not in command, command


def test_the_docs_drift_subscription_has_the_breach_filter():
    (drift,) = [c for c in _commands(BY_HAND.read_text()) if "create --name retrain-drift " in c]
    assert (
        "--advanced-filter data.RunTags.azureml_modelmonitor_threshold_breached StringContains "
        '"has failed due to one or more features violating metric thresholds"'
    ) in drift


# -- a workspace's one system topic ------------------------------------------------------------------------


def _evaluate(node: Any, names: dict[str, Any]) -> Any:
    """The few Bicep expressions the topics' conditions use: names, `!`, `empty(...)`."""
    if isinstance(node, str):
        return names[node]
    if isinstance(node, bool):
        return node
    if "operator" in node and node["operator"]["type"] == "not":
        return not _evaluate(node["operator"]["operands"]["bool_value"], names)
    if "function" in node and node["function"]["type"] == "empty":
        return not _evaluate(node["function"]["parameters"]["item_to_test"], names)
    raise NotImplementedError(text(node))


def _workspace_topics(existing_topic: str) -> list[tuple[str, bool]]:
    """(symbol, whether it is a reference) of each workspace system topic eventgrid.bicep declares."""
    parsed = parse(EVENT_GRID)
    names: dict[str, Any] = {"existingWorkspaceTopicName": existing_topic, "deployDriftTopic": False}
    for variable, value in parsed.get("variables", {}).items():
        names[variable] = _evaluate(value["value"], names)
    declared = []
    for symbol, resource in parsed["resources"].items():
        if resource["type"] != "Microsoft.EventGrid/systemTopics":
            continue
        condition = resource["config"].get("condition")
        if condition is not None and not _evaluate(condition, names):
            continue
        config = body(resource)[0]
        # eventgrid.bicep references no topic but the workspace's; it creates the workspace's from its id
        is_workspace = bool(resource.get("existing")) or (
            text(config.get("properties", {}).get("source")) == "workspaceId"
        )
        if is_workspace:
            declared.append((symbol, bool(resource.get("existing"))))
    return declared


def test_a_workspace_with_its_own_topic_gets_no_new_one():
    assert _workspace_topics("evgt-mlw-own") == [("existingWorkspaceTopic", True)]
    outputs = parse(EVENT_GRID)["outputs"]
    name = outputs["workspaceTopicName"]["value"]["operator"]["operands"]
    assert text(name["false_value"]) == "existingWorkspaceTopic.name"
    existing = parse(EVENT_GRID)["resources"]["existingWorkspaceTopic"]
    assert body(existing)[0]["name"] == "existingWorkspaceTopicName"


def test_without_one_a_topic_is_created_in_the_workspaces_region():
    assert _workspace_topics("") == [("workspaceTopic", False)]
    resources_ = parse(EVENT_GRID)["resources"]
    assert text(body(resources_["workspaceTopic"])[0]["location"]) == "workspace.location"
    workspace = resources_["workspace"]
    assert workspace["type"] == "Microsoft.MachineLearningServices/workspaces" and workspace["existing"]


def test_main_passes_the_existing_topic_with_a_default_of_none():
    parsed = parse(INFRA / "main.bicep")
    assert parsed["parameters"]["existingWorkspaceTopicName"]["default"] == ""
    params = body(parsed["modules"]["eventGrid"])[0]["params"]
    assert params["existingWorkspaceTopicName"] == "existingWorkspaceTopicName"
    assert "workspaceLocation" not in params


def test_every_topic_s_identity_may_write_the_dead_letter_container():
    # Each topic output's principal reaches roles.bicep's dead-letter assignment: one without it would
    # dead-letter into a 403, and the event would be lost after its retries.
    main = (INFRA / "main.bicep").read_text().split("module roles ", 1)[1].split("\n}\n", 1)[0]
    roles = parse(INFRA / "modules" / "roles.bicep")["variables"]
    for topic in ("storageTopicPrincipalId", "workspaceTopicPrincipalId", "driftTopicPrincipalId"):
        assert f"{topic}: eventGrid.outputs.{topic}" in main, topic
    listed = text(roles["topicPrincipalIds"]) + text(roles["driftTopicPrincipalIds"])
    assert {"storageTopicPrincipalId", "workspaceTopicPrincipalId", "driftTopicPrincipalId"} <= set(
        re.findall(r"\w+TopicPrincipalId", listed)
    )
