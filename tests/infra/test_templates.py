"""infra/ agrees with the code (tests/helpers/infra/bicep_checks.py), and each check fails on a planted
defect."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.infra.bicep_checks import (
    REPO_ROOT,
    check_app_settings,
    check_computes,
    check_event_routing,
    check_function_targets,
    check_roles,
)

INFRA = REPO_ROOT / "infra"


@pytest.fixture
def planted(tmp_path: Path):
    """A copy of infra/ with one text replaced in one file (the replaced text must be there)."""

    def plant(relative: str, old: str, new: str) -> Path:
        copy = tmp_path / "infra"
        shutil.copytree(INFRA, copy)
        path = copy / relative
        source = path.read_text()
        assert old in source, f"{relative} no longer holds {old!r}: update the planted defect"
        path.write_text(source.replace(old, new, 1))
        return copy

    return plant


def test_the_indexed_functions_include_the_event_grid_ones(indexed_functions):
    assert indexed_functions["on_blob_created"] == "eventGridTrigger"
    assert indexed_functions["on_drift_alert"] == "eventGridTrigger"


def test_the_subscriptions_target_functions_the_worker_indexes(indexed_functions):
    assert check_function_targets(INFRA, indexed_functions) == []


def test_a_subscription_to_a_function_that_does_not_exist_fails(indexed_functions, planted):
    infra = planted("modules/subscriptions.bicep", "/functions/on_drift_alert'", "/functions/on_drift'")

    [problem] = check_function_targets(infra, indexed_functions)
    assert "workspaceSubscription targets function 'on_drift'" in problem


def test_a_subscription_to_a_function_without_an_event_grid_trigger_fails(indexed_functions, planted):
    infra = planted("modules/subscriptions.bicep", "/functions/on_blob_created'", "/functions/post_retrain'")

    [problem] = check_function_targets(infra, indexed_functions)
    assert "targets function 'post_retrain'" in problem


def test_the_subscriptions_filter_on_the_served_scopes_and_commit_apis():
    assert check_event_routing(INFRA) == []


def test_a_routing_file_behind_the_models_fails(planted):
    infra = planted("event-routing.json", '".parquet"', '".tsv"')

    [problem] = check_event_routing(infra)
    assert "event-routing.json: differs" in problem and "python -m infra.event_routing" in problem


def test_a_subscription_without_the_commit_api_filter_fails(planted):
    infra = planted("modules/subscriptions.bicep", "values: routing.commitApis", "values: ['PutBlob']")

    [problem] = check_event_routing(infra)
    assert "data.api" in problem and "routing.commitApis" in problem


def test_the_app_settings_are_the_ones_the_code_requires():
    assert check_app_settings(INFRA) == []


def test_a_missing_required_setting_fails(planted):
    infra = planted(
        "modules/functionapp.bicep", "name: 'RETRAIN_BLOB_CONTAINER'", "name: 'RETRAIN_BLOB_FOLDER'"
    )

    problems = check_app_settings(infra)
    assert any(
        "RETRAIN_BLOB_FOLDER is set, but the front door's code reads no such setting" in p for p in problems
    )
    assert any("do not start the front door" in p and "RETRAIN_BLOB_CONTAINER" in p for p in problems)


def test_a_setting_that_changes_nothing_fails(planted):
    infra = planted(
        "modules/functionapp.bicep",
        "value: 'azureml'",
        "value: 'azureml'\n        }\n        {\n"
        "          name: 'RETRAIN_COOLDOWN_SECONDS'\n          value: '3600'",
    )

    assert check_app_settings(infra) == [
        "RETRAIN_COOLDOWN_SECONDS is set, but the front door behaves the same without it; expected only "
        "settings it needs"
    ]


def test_one_datastore_for_data_and_checkpoints_fails(planted):
    infra = planted("main.bicep", "landing: 'retrain_landing'", "landing: 'retrain_checkpoints'")

    assert check_app_settings(infra) == [
        "RETRAIN_AZUREML_DATA_DATASTORE is set, but the front door behaves the same without it; expected "
        "only settings it needs"
    ]


def test_the_computes_are_the_yamls():
    assert check_computes(INFRA) == []


def test_a_compute_that_differs_from_its_yaml_fails(planted):
    infra = planted("modules/azureml.bicep", "maxNodeCount: 2", "maxNodeCount: 3")

    assert check_computes(infra) == [
        "infra/modules/azureml.bicep: cluster 'gpu-dedicated' maxNodeCount is 3; expected 2, as "
        "components/compute/gpu-dedicated.yml says"
    ]


def test_the_roles_are_the_built_in_ones_and_assigned():
    assert check_roles(INFRA) == []


def test_a_missing_role_assignment_fails(planted):
    infra = planted("modules/roles.bicep", "  scope: checkpoints\n", "  scope: deadLetter\n")

    assert check_roles(infra) == [
        "infra/modules/roles.bicep: no 'Storage Blob Data Contributor' for computePrincipalId on "
        "checkpoints; expected that role assignment"
    ]


def test_a_role_guid_that_is_not_the_role_it_names_fails(planted):
    infra = planted(
        "roles.json", "d5a91429-5739-47e2-a06b-3470a27159e7", "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
    )

    [problem] = check_roles(infra)
    assert "'EventGrid Data Sender' is ba92f5b4" in problem
