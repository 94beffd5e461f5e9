"""`retrain publish`: the environment first, then the components at their YAML versions; all or nothing."""

from __future__ import annotations

import shutil

import pytest
from helpers.components.azure_fakes import RecordingWorkspace

from components.azureml.publish import component_files, environment_reference, publish
from components.errors import SpecError
from components.specs import COMPONENTS_DIR, ENVIRONMENT_FILE, load_component_spec


def test_the_environment_is_registered_before_the_components_that_name_it():
    workspace = RecordingWorkspace()

    records = publish(workspace)

    assert [method for method, _ in workspace.calls] == ["create_environment"] + ["create_component"] * 5
    assert workspace.called("create_component") == [
        "retrain_drift", "retrain_evaluate", "retrain_prep", "retrain_register", "retrain_train",
    ]  # fmt: skip
    environment, *components = workspace.sent
    assert (environment.name, environment.version) == ("retrain-training", "3")
    for component, path in zip(components, component_files(), strict=True):
        assert component.version == load_component_spec(path).version
        assert f"azureml:{component.environment}" == environment_reference() == "azureml:retrain-training:3"
    assert [(record.kind, record.name) for record in records][:2] == [
        ("environment", "retrain-training"),
        ("component", "retrain_drift"),
    ]


def test_computes_are_created_only_when_asked():
    workspace = RecordingWorkspace()

    publish(workspace, computes=True)

    assert workspace.called("create_compute") == ["cpu-cluster", "gpu-spot", "gpu-dedicated"]
    tiers = {compute.name: compute.tier for compute in workspace.sent[-3:]}
    assert tiers == {"cpu-cluster": "dedicated", "gpu-spot": "low_priority", "gpu-dedicated": "dedicated"}


def test_a_component_on_another_environment_version_publishes_nothing(tmp_path):
    components = tmp_path / "components"
    shutil.copytree(
        COMPONENTS_DIR, components, ignore=shutil.ignore_patterns("*.py", "__pycache__", "azureml")
    )
    train = components / "train.yml"
    train.write_text(train.read_text().replace("azureml:retrain-training:3", "azureml:retrain-training:4"))
    workspace = RecordingWorkspace()

    with pytest.raises(SpecError) as raised:
        publish(
            workspace,
            components_dir=components,
            environment_file=components / ENVIRONMENT_FILE.relative_to(COMPONENTS_DIR),
        )

    assert str(raised.value) == (
        f"{train}: environment azureml:retrain-training:4; expected azureml:retrain-training:3 "
        "(environment.yml's version): bump the component's environment when the environment changes"
    )
    assert workspace.calls == []
