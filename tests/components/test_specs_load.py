"""The YAMLs are the single source of truth: Azure ML's loader accepts them, and our plain reading agrees."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from azure.ai.ml import load_component, load_compute, load_environment, load_job

from components.errors import SpecError
from components.specs import (
    COMPONENTS_DIR,
    COMPUTE_FILES,
    ENVIRONMENT_FILE,
    PIPELINE_FILE,
    REPO_ROOT,
    ParentInput,
    StepOutput,
    load_component_spec,
    load_pipeline_spec,
)

COMPONENT_FILES = sorted(COMPONENTS_DIR.glob("*.yml"))
# Every component: the pipeline's steps, and the drift check, which runs on its own.
STEP_COMPONENTS = [path for path in COMPONENT_FILES if path != PIPELINE_FILE]
STANDALONE = {"drift"}


def test_there_is_one_component_per_step_plus_the_standalone_drift_check():
    assert {path.stem for path in STEP_COMPONENTS} == {"prep", "train", "evaluate", "register", *STANDALONE}
    used = {step.component.path for step in load_pipeline_spec().steps.values()}
    assert {path.stem for path in STEP_COMPONENTS if path.resolve() not in used} == STANDALONE


@pytest.mark.parametrize("path", STEP_COMPONENTS, ids=lambda path: path.stem)
def test_every_component_loads_with_azure_ml_and_reads_the_same_here(path: Path):
    loaded = load_component(path)
    ours = load_component_spec(path)
    assert (loaded.name, loaded.version) == (ours.name, ours.version)
    assert " ".join(loaded.command.split()) == ours.command
    assert set(loaded.inputs) == set(ours.inputs)
    # An input's choices (`enum`): Azure ML refuses a value outside them; the local rooms refuse by ours.
    assert {name: port.choices for name, port in ours.inputs.items()} == {
        name: None if port.enum is None else tuple(port.enum) for name, port in loaded.inputs.items()
    }
    assert set(loaded.outputs) == set(ours.outputs)
    assert ours.environment == "azureml:retrain-training:" + str(load_environment(ENVIRONMENT_FILE).version)
    assert (path.parent / loaded.code).resolve() == REPO_ROOT == ours.code


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (
            "type: integer\n    enum: [1, 2]",
            r"port 'mode' enum \[1, 2\]; expected a list of texts, on a string input",
        ),
        ("type: string\n    enum: [1, 2]", r"port 'mode' enum \[1, 2\]; expected a list of texts"),
        ("type: string\n    enum: []", r"port 'mode' enum \[\]; expected a list of texts"),
        ("type: string\n    enum: fast", r"port 'mode' enum 'fast'; expected a list of texts"),
        (
            "type: string\n    default: slow\n    enum: [fast]",
            r"port 'mode' defaults to 'slow', which its enum",
        ),
    ],
)
def test_an_input_s_choices_are_texts_on_a_string_input_and_hold_its_default(tmp_path, declared, message):
    path = tmp_path / "step.yml"
    path.write_text(
        "name: step\nversion: '1'\ncode: .\nenvironment: azureml:env:1\ncommand: python -m step\n"
        f"inputs:\n  mode:\n    {declared}\n"
    )
    with pytest.raises(SpecError, match=message):
        load_component_spec(path)


def test_every_step_command_calls_into_the_training_package():
    for path in STEP_COMPONENTS:
        assert load_component_spec(path).command.startswith(
            ("python -m training.cli", "python -m training.engine.worker")
        )


def test_train_declares_a_pytorch_distribution_and_a_read_write_checkpoint_output():
    train = load_component(COMPONENTS_DIR / "train.yml")
    assert train.distribution.type == "pytorch"
    assert train.distribution.process_count_per_instance >= 1
    assert train.resources.instance_count >= 1
    assert train.outputs["checkpoints"].mode == "rw_mount"
    assert train.outputs["checkpoints"].type == "uri_folder"


def test_the_environment_is_a_pinned_curated_image_with_the_pinned_requirements():
    environment = load_environment(ENVIRONMENT_FILE)
    assert environment.image.startswith("mcr.microsoft.com/azureml/curated/")
    assert not environment.image.endswith(":latest")
    conda = yaml.safe_load((ENVIRONMENT_FILE.parent / "conda.yml").read_text())
    pip_section = next(item["pip"] for item in conda["dependencies"] if isinstance(item, dict))
    requirements = [
        line
        for line in (ENVIRONMENT_FILE.parent / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pip_section == requirements
    assert all("==" in pin for pin in pip_section)


def test_compute_specs_scale_to_zero_and_train_on_low_priority_with_a_dedicated_fallback():
    computes = {role: load_compute(path) for role, path in COMPUTE_FILES.items()}
    assert all(compute.min_instances == 0 for compute in computes.values())
    assert all(compute.max_instances >= 1 for compute in computes.values())
    assert computes["cpu"].idle_time_before_scale_down > 0
    assert computes["gpu_spot"].tier == "low_priority"
    assert computes["gpu_dedicated"].tier == "dedicated"
    assert computes["gpu_spot"].size == computes["gpu_dedicated"].size


def test_the_drift_check_reads_its_current_data_and_writes_a_report_folder():
    drift = load_component_spec(COMPONENTS_DIR / "drift.yml")
    assert drift.inputs["current_data"].type == "uri_folder"
    assert drift.inputs["reference_data"].optional
    assert drift.outputs["report"].type == "uri_folder"
    assert drift.command.startswith("python -m training.cli drift ")


def test_the_pipeline_yaml_loads_and_validates_with_azure_ml():
    job = load_job(PIPELINE_FILE)
    assert job._validate().passed
    serialized = job._to_dict()
    assert serialized["jobs"]["train"]["compute"] == "azureml:gpu-spot"
    assert serialized["settings"]["default_compute"] == "azureml:cpu-cluster"
    assert serialized["jobs"]["train"]["outputs"]["checkpoints"]["mode"] == "rw_mount"


def test_our_reading_of_the_pipeline_matches_its_data_flow():
    pipeline = load_pipeline_spec()
    assert pipeline.order == ("prep", "train", "evaluate", "register")
    train = pipeline.steps["train"]
    assert train.inputs["prepared_data"] == StepOutput("prep", "prepared_data")
    assert train.inputs["epochs"] == ParentInput("epochs")
    assert train.compute == "azureml:gpu-spot"
    assert train.distribution is not None and train.distribution.type == "pytorch"
    assert pipeline.downstream_of("prep") == {"train", "evaluate", "register"}
    assert pipeline.downstream_of("evaluate") == {"register"}


def _write_pipeline(folder: Path, jobs: dict) -> Path:
    for name in ("prep", "train"):
        (folder / f"{name}.yml").write_text(
            (COMPONENTS_DIR / f"{name}.yml").read_text().replace("code: ..", "code: .")
        )
    path = folder / "pipeline.yml"
    path.write_text(yaml.safe_dump({"type": "pipeline", "jobs": jobs}))
    return path


def test_a_step_reading_an_unknown_step_is_refused_in_one_line(tmp_path):
    path = _write_pipeline(
        tmp_path,
        {
            "train": {
                "component": "./train.yml",
                "inputs": {"prepared_data": "${{parent.jobs.nope.outputs.x}}"},
            }
        },
    )
    with pytest.raises(SpecError, match=r"step 'train' reads outputs of unknown steps \['nope'\]"):
        load_pipeline_spec(path)


def test_a_cycle_is_refused(tmp_path):
    path = _write_pipeline(
        tmp_path,
        {
            "prep": {
                "component": "./prep.yml",
                "inputs": {"raw_data": "${{parent.jobs.train.outputs.model}}"},
            },
            "train": {
                "component": "./train.yml",
                "inputs": {"prepared_data": "${{parent.jobs.prep.outputs.prepared_data}}"},
            },
        },
    )
    with pytest.raises(SpecError, match="cycle"):
        load_pipeline_spec(path)


def test_binding_an_undeclared_input_is_refused(tmp_path):
    path = _write_pipeline(tmp_path, {"prep": {"component": "./prep.yml", "inputs": {"rows": 3}}})
    with pytest.raises(SpecError, match=r"binds \['rows'\]"):
        load_pipeline_spec(path)


def test_a_missing_or_malformed_spec_names_the_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_component_spec(tmp_path / "absent.yml")
    (tmp_path / "bad.yml").write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_component_spec(tmp_path / "bad.yml")
