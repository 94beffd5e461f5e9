"""A task secret (an option named as a credential, core/task_ref.py) reaches the task, and nothing the
trainer writes: its checkpoints' trajectory and config hold `***`, a rotated token resumes the same
training, and the loader puts the value back from RETRAIN_TASK_SECRETS wherever a task is rebuilt from
what was written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import InputError
from core.task_ref import TASK_SECRETS_VARIABLE
from training.engine.config import TrainConfig, trajectory_mismatches
from training.tasks.loader import load_task

TOKEN = "Tk5Rw8Nq3Vb6"
TASK_FILE = """
from training.tasks.tabular.task import TabularTask


class TokenTask(TabularTask):
    def __init__(self, api_token, **options):
        super().__init__(**options)
        self.api_token = api_token
"""


def _config(tmp_path: Path, **options) -> TrainConfig:
    return TrainConfig(data=tmp_path, out=tmp_path / "out", checkpoints=str(tmp_path / "ckpt"), **options)


def test_the_loader_gives_a_masked_secret_its_value_from_the_environment(tmp_path):
    task_file = tmp_path / "token_task.py"
    task_file.write_text(TASK_FILE)
    environ = {TASK_SECRETS_VARIABLE: json.dumps({"api_token": TOKEN})}
    task = load_task(f"{task_file}:TokenTask", {"api_token": "***", "hidden_width": 8}, environ=environ)
    assert task.api_token == TOKEN
    with pytest.raises(InputError) as raised:
        load_task(f"{task_file}:TokenTask", {"api_token": "***"}, environ={})
    assert str(raised.value).startswith("task option(s) ['api_token'] are secrets, whose values are never")


def test_checkpoints_record_a_secret_as_the_mask_and_a_rotated_one_resumes(tmp_path):
    config = _config(tmp_path, task_options={"api_token": TOKEN, "hidden_width": 8})
    assert config.trajectory()["task_options"] == {"api_token": "***", "hidden_width": 8}
    assert config.to_dict()["task_options"] == {"api_token": "***", "hidden_width": 8}
    assert TOKEN not in json.dumps(config.to_dict()) + json.dumps(config.trajectory())
    assert config.task_options["api_token"] == TOKEN  # the task still gets it

    rotated = _config(tmp_path, task_options={"api_token": "another", "hidden_width": 8})
    given_by_environment = _config(tmp_path, task_options={"api_token": "***", "hidden_width": 8})
    from_before = {**config.trajectory(), "task_options": {"api_token": TOKEN, "hidden_width": 8}}
    for saved in (config.trajectory(), from_before):  # a checkpoint from before secrets were masked too
        assert trajectory_mismatches(saved, rotated) == []
        assert trajectory_mismatches(saved, given_by_environment) == []
    wider = _config(tmp_path, task_options={"api_token": "another", "hidden_width": 16})
    (mismatch,) = trajectory_mismatches(from_before, wider)
    assert mismatch == (
        '--task-options {"api_token":"***","hidden_width":16} '
        '(checkpoint: {"api_token":"***","hidden_width":8})'
    )
