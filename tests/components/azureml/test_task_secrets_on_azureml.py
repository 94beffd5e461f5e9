"""A task secret's value never goes into an Azure ML pipeline: a job shows its inputs (and any environment
variable it sets) to every reader of the workspace. The build refuses it in one line that does not show it,
and a front door that submits to Azure ML refuses it at start-up, before a flush counts a run in the day's
budget. The placeholder `***` passes, masked like every written form of the options."""

from __future__ import annotations

import json

import pytest
from helpers.function_app.served_models import served_environ, write_model

from components.azureml.builder import PipelineBuild
from components.errors import SubmissionError
from components.request import DataRef, RunRequest
from function_app.settings.app import AppSettings, SettingsError

TOKEN = "Az7Tk3Qw9Lm2"
VERSION = "rd-0123456789abcdef"


def _request(**task_options) -> RunRequest:
    return RunRequest(
        model_name="digits", data=DataRef(VERSION, f"azureml:digits-raw:{VERSION}"), task_options=task_options
    )


def test_a_secrets_value_is_refused_by_the_pipeline_build_in_one_line_that_hides_it():
    with pytest.raises(SubmissionError) as raised:
        PipelineBuild.for_request(_request(api_token=TOKEN, hidden_width=8))
    message = str(raised.value)
    assert message.startswith(
        "model 'digits': task options: ['api_token'] hold the value of a secret, which an Azure ML job shows "
        "to every reader of the workspace; read it in the task from the workspace's Key Vault"
    )
    assert TOKEN not in message


def test_the_placeholder_passes_as_written():
    build = PipelineBuild.for_request(_request(api_token="***", hidden_width=8))
    assert json.loads(build.task_options) == {"api_token": "***", "hidden_width": 8}


@pytest.mark.parametrize("submitter", ["azureml", "dry-run"])
def test_a_front_door_submitting_to_azure_ml_refuses_a_secrets_value_at_start_up(tmp_path, submitter):
    task = f'ref = "tabular"\n\n[task.options]\napi_token = "{TOKEN}"'
    config = write_model(tmp_path / "models", "alpha", task, 'prefix = "alpha"')
    environ = served_environ(tmp_path, "alpha", RETRAIN_SUBMITTER=submitter)
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(environ)
    message = str(raised.value)
    assert message.startswith(f"{config} [task.options]: ['api_token'] hold the value of a secret")
    assert TOKEN not in message
    # Trained on this machine, the secret travels in the steps' environment instead.
    AppSettings.from_environ({**environ, "RETRAIN_SUBMITTER": "local"})
