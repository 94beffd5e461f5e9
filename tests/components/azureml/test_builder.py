"""The pipeline job built from the YAMLs: validated locally, pinned, and in agreement with pipeline.yml."""

from __future__ import annotations

import subprocess
import sys

import pytest
from azure.ai.ml import Input, load_job
from azure.ai.ml.entities import Command, PipelineJob

from components.azureml.builder import (
    CHECKPOINTS_ROOT,
    PipelineBuild,
    build_pipeline_job,
    checkpoints_path,
    trigger_argument,
    validate_job,
)
from components.errors import SpecError, SubmissionError
from components.request import DataRef, RunRequest
from components.specs import PIPELINE_FILE, REPO_ROOT, load_component_spec, load_pipeline_spec

VERSION = "rd-0123456789abcdef"
ASSET = f"azureml:digits-raw:{VERSION}"


def make_request(**changes) -> RunRequest:
    fields = {
        "model_name": "digits",
        "data": DataRef(VERSION, ASSET),
        "trigger": {"source": "blob", "event_id": "evt-42"},
        "parameters": {"epochs": "7", "learning_rate": "0.01", "checkpoint_every_steps": "25"},
        "processes_per_instance": 4,
        "instance_count": 2,
        "compute": {"prep": "cpu-big"},
        "component_versions": {"evaluate": "3", "train": "7"},
        "task_options": {"hidden_width": 64},
    }
    return RunRequest(**{**fields, **changes})


@pytest.fixture(scope="module")
def built() -> dict:
    job = build_pipeline_job(PipelineBuild.for_request(make_request(), attempt=0))
    return {"job": job, "dict": job._to_dict()}


@pytest.fixture(scope="module")
def from_yaml() -> dict:
    return load_job(PIPELINE_FILE)._to_dict()


def test_the_built_job_validates_locally(built):
    job = built["job"]
    assert isinstance(job, PipelineJob)
    assert job._validate().passed


def test_the_job_name_derives_from_model_and_data_version(built):
    assert built["dict"]["name"] == f"retrain-digits-{VERSION}"
    again = PipelineBuild.for_request(make_request(trigger={"source": "http"}), attempt=0)
    assert again.job_name == built["dict"]["name"]  # another trigger for the same data: the same job
    assert PipelineBuild.for_request(make_request(), attempt=2).job_name == f"retrain-digits-{VERSION}-r2"


def test_each_step_names_its_compute(built):
    computes = {name: step["compute"] for name, step in built["dict"]["jobs"].items()}
    assert computes == {
        "prep": "azureml:cpu-big",  # the request's override
        "train": "azureml:gpu-spot",  # pipeline.yml's
        "evaluate": "azureml:cpu-cluster",  # the pipeline's default compute
        "register": "azureml:cpu-cluster",
    }


def test_the_train_step_is_distributed_over_the_requested_gpus_and_nodes(built):
    train = built["dict"]["jobs"]["train"]
    assert train["distribution"] == {"type": "pytorch", "process_count_per_instance": 4}
    assert train["resources"] == {"instance_count": 2}


def test_component_versions_are_pinned(built):
    jobs = built["dict"]["jobs"]
    for step in ("prep", "train", "register"):
        declared = load_component_spec(REPO_ROOT / "components" / f"{step}.yml")
        assert (jobs[step]["component"]["name"], jobs[step]["component"]["version"]) == (
            declared.name,
            declared.version,
        )
        assert jobs[step]["component"]["environment"] == "azureml:retrain-training:3"
    # A version other than the YAML's can only be a registered one: the step references it.
    assert jobs["evaluate"]["component"] == "azureml:retrain_evaluate:3"


def test_registered_components_reference_the_published_versions():
    job = build_pipeline_job(PipelineBuild.for_request(make_request(), registered_components=True))
    components = {name: step["component"] for name, step in job._to_dict()["jobs"].items()}
    assert components == {
        "prep": "azureml:retrain_prep:7",
        "train": "azureml:retrain_train:7",
        "evaluate": "azureml:retrain_evaluate:3",  # the request pins it
        "register": "azureml:retrain_register:5",
    }


def test_checkpoints_go_to_a_read_write_path_stable_for_the_run(built):
    checkpoints = built["dict"]["jobs"]["train"]["outputs"]["checkpoints"]
    assert checkpoints["type"] == "uri_folder" and checkpoints["mode"] == "rw_mount"
    prefix = f"azureml://datastores/workspaceblobstore/paths/{CHECKPOINTS_ROOT}/digits-{VERSION}-"
    assert checkpoints["path"].startswith(prefix) and checkpoints["path"].endswith("/")
    resubmitted = PipelineBuild.for_request(make_request(), attempt=3, compute={"train": "gpu-dedicated"})
    assert resubmitted.checkpoints_path == checkpoints["path"]
    assert checkpoints_path("lake", "m-rd-1") == "azureml://datastores/lake/paths/retrain/checkpoints/m-rd-1/"


def test_inputs_carry_the_data_model_trigger_and_parameters(built):
    inputs = built["dict"]["inputs"]
    assert inputs["raw_data"] == {"type": "uri_folder", "path": ASSET}
    assert inputs["model_name"] == "digits"
    assert inputs["trigger"] == "event_id=evt-42,source=blob"
    assert inputs["epochs"] == 7  # coerced to the train step's integer input
    assert inputs["checkpoint_every_seconds"] == "auto"  # pipeline.yml's default
    assert inputs["learning_rate"] == 0.01  # coerced to the train step's number input
    assert (inputs["task"], inputs["task_options"]) == ("tabular", '{"hidden_width":64}')


def test_an_optional_component_input_is_set_on_its_step(built):
    # Pipeline YAML has no optional pipeline inputs; the train step's own input carries it.
    assert built["dict"]["jobs"]["train"]["inputs"]["checkpoint_every_steps"] == 25
    assert "checkpoint_every_steps" not in built["dict"]["inputs"]


def test_trigger_metadata_goes_into_tags(built):
    assert built["dict"]["tags"] == {
        "trigger.source": "blob",
        "trigger.event_id": "evt-42",
        "retrain.model_name": "digits",
        "retrain.raw_version": VERSION,
        "retrain.run_key": f"digits-{VERSION}",
        "retrain.task": "tabular",
        "retrain.attempt": "0",
    }


def test_job_tags_join_the_lineage_tags_without_touching_the_trigger_argument():
    plain = PipelineBuild.for_request(make_request())
    estimated = PipelineBuild.for_request(make_request(job_tags={"retrain.estimated_gpu_hours": "8.00"}))

    assert dict(estimated.tags) == {**plain.tags, "retrain.estimated_gpu_hours": "8.00"}
    assert estimated.trigger == plain.trigger == "event_id=evt-42,source=blob"


def test_each_node_is_named_after_its_step(built):
    assert {name: node.display_name for name, node in built["job"].jobs.items()} == {
        name: name for name in ("prep", "train", "evaluate", "register")
    }


def test_the_built_job_agrees_with_pipeline_yml(built, from_yaml):
    """Same steps, bindings, components, distribution and computes as `az ml job create -f pipeline.yml`."""
    default = PipelineBuild.for_request(
        make_request(
            processes_per_instance=1, instance_count=1, compute={}, component_versions={}, parameters={}
        )
    )
    ours = build_pipeline_job(default)._to_dict()
    default_compute = from_yaml["settings"]["default_compute"]
    assert ours["settings"] == from_yaml["settings"]
    assert set(ours["jobs"]) == set(from_yaml["jobs"])
    for name, theirs in from_yaml["jobs"].items():
        mine = ours["jobs"][name]
        assert mine["inputs"] == theirs["inputs"], name
        assert mine.get("distribution") == theirs.get("distribution"), name
        assert mine.get("resources") == theirs.get("resources"), name
        assert mine["compute"] == theirs.get("compute", default_compute), name
        # Not the version: load_job() reads a pipeline YAML's components as anonymous ones, version "1"
        # whatever their file says; the builder pins the file's (test_component_versions_are_pinned).
        for key in ("command", "environment", "inputs", "outputs", "code"):
            assert mine["component"][key] == theirs["component"][key], (name, key)
        for output, setting in theirs.get("outputs", {}).items():
            if isinstance(setting, str):
                assert mine["outputs"][output] == setting
            else:
                assert mine["outputs"][output]["mode"] == setting["mode"]
    assert set(ours["inputs"]) == set(from_yaml["inputs"])
    assert ours["outputs"] == from_yaml["outputs"]


def test_the_same_component_version_as_the_yaml_uses_the_yaml():
    job = build_pipeline_job(PipelineBuild.for_request(make_request(component_versions={"prep": "7"})))
    assert job._to_dict()["jobs"]["prep"]["component"]["command"].startswith("python -m training.cli prepare")


def test_trigger_arguments_are_safe_on_a_command_line():
    assert trigger_argument({}) == "manual"
    assert trigger_argument({"note": "it's new; rm -rf"}) == "note=it_s_new__rm_-rf"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"parameters": {"epochz": "3"}},
            r"parameter epochz: not an input of the pipeline; expected one of \[",
        ),
        ({"parameters": {"model_name": "x"}}, r"parameter model_name: set by the run itself"),
        # The model's last good prepared version is the request's to set (the front door's), not a parameter.
        (
            {"parameters": {"previous_prepared": "azureml://x"}},
            r"parameter previous_prepared: set by the run",
        ),
        (
            {"previous_prepared": "/tmp/prepared"},
            r"previous prepared data \(previous_prepared\) '/tmp/prepared': expected azureml:<asset>:",
        ),
        (
            {"parameters": {"epochs": "many"}},
            r"parameter epochs='many': expected an integer \(it sets train\.epochs\)",
        ),
        ({"compute": {"train": "gpu spot"}}, r"compute 'gpu spot': expected a compute name"),
        ({"component_versions": {"train": "v 2"}}, r"component version train='v 2': expected a version"),
        ({"data": DataRef(VERSION, "/tmp/raw")}, r"data '/tmp/raw': expected azureml:<asset>:<version> or"),
        ({"data": DataRef(VERSION, "azureml:digits-raw@latest")}, r"expected azureml:<asset>:<version> or"),
        (
            {"data": DataRef(VERSION, "azureml:digits-raw:rd-ffffffffffffffff")},
            r"pins version rd-ffffffffffffffff, but the request's data version is rd-0123456789abcdef",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(changes, message):
    with pytest.raises(SubmissionError, match=message) as raised:
        build_pipeline_job(PipelineBuild.for_request(make_request(**changes)))
    assert "\n" not in str(raised.value)


def test_a_compute_for_an_unknown_step_is_refused():
    build = PipelineBuild.for_request(make_request(compute={}), compute={"deploy": "cpu-cluster"})
    with pytest.raises(SubmissionError, match=r"compute for \['deploy'\]: expected steps among \['prep'"):
        build_pipeline_job(build)


def test_a_job_that_does_not_validate_is_a_one_line_spec_error():
    spec = load_pipeline_spec()
    from azure.ai.ml import load_component

    node = Command(
        component=load_component(source=spec.steps["prep"].component.path),
        inputs={},
        compute="azureml:cpu-cluster",
    )
    job = PipelineJob(
        name="broken", jobs={"prep": node}, inputs={"raw_data": Input(type="uri_folder", path=ASSET)}
    )
    with pytest.raises(
        SpecError, match=r"does not validate: jobs.prep.inputs.raw_data: Required input"
    ) as raised:
        validate_job(job)
    assert "\n" not in str(raised.value)


def test_importing_the_builder_does_not_import_azure_ai_ml():
    code = "import sys, components.azureml.builder; print('azure.ai.ml' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_the_first_step_gets_the_gate_policy_and_checks_it_before_preparing_data():
    # On Azure ML no preflight runs before the job: prep, the first step, checks the policy the register
    # step will apply, so a metric the task does not report fails on the CPU cluster, not after training.
    gate = {
        "primary_metric": "accuracy",
        "min_improvement": "0.01",
        "floors": "loss=1.5",
        "max_regression": "recall_*=0.1",
        "first_model_floors": "accuracy=0.9",
    }
    jobs = build_pipeline_job(PipelineBuild.for_request(make_request(parameters=gate)))._to_dict()["jobs"]

    assert load_pipeline_spec().order[0] == "prep"
    expected = {**gate, "min_improvement": 0.01}
    for step in ("prep", "register"):
        assert {name: jobs[step]["inputs"][name] for name in gate} == expected, step
    command = jobs["prep"]["component"]["command"]
    assert command.startswith("python -m training.cli prepare ")
    for flag, name in (
        ("--primary-metric", "primary_metric"),
        ("--min-improvement", "min_improvement"),
        ("--floors", "floors"),
        ("--max-regression", "max_regression"),
        ("--first-model-floors", "first_model_floors"),
    ):
        assert f"{flag} " in command and f"${{{{inputs.{name}}}}}" in command
