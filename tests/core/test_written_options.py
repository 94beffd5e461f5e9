"""Task secrets (core/task_ref.py): a task option named as a credential is written as `***` wherever the
options are written, its value travels in RETRAIN_TASK_SECRETS, and it is put back from there, or refused
in one line that never shows a value."""

from __future__ import annotations

import json

import pytest

from core.errors import InputError
from core.task_ref import (
    TASK_SECRETS_VARIABLE,
    options_text,
    secret_options,
    task_secrets_environment,
    with_task_secrets,
    written_options,
)

TOKEN = "Tk7Qz2Lp9Wm4"
OPTIONS = {"api_token": TOKEN, "client_secret": [1, 2], "hidden_width": 8, "token_count": 3, "note": "it's"}


def test_every_written_form_of_the_options_holds_the_mask_in_a_secrets_place():
    written = written_options(OPTIONS)
    assert written == {
        "api_token": "***",
        "client_secret": "***",  # whatever its type
        "hidden_width": 8,
        "token_count": 3,  # a count of tokens is no credential: the name must end like one
        "note": "it's",
    }
    text = options_text(OPTIONS)  # command lines, pipeline inputs, keys, lineage tags
    assert TOKEN not in text and json.loads(text) == written
    assert "'" not in text  # still safe between a command line's single quotes


def test_the_secrets_go_to_the_environment_over_those_already_there():
    environ = {TASK_SECRETS_VARIABLE: json.dumps({"api_token": "old", "storage_key": "kept"})}
    assert secret_options({**OPTIONS, "db_password": "***"}) == {"api_token": TOKEN, "client_secret": [1, 2]}
    carried = task_secrets_environment(OPTIONS, environ)
    assert json.loads(carried[TASK_SECRETS_VARIABLE]) == {
        "api_token": TOKEN,
        "client_secret": [1, 2],
        "storage_key": "kept",
    }
    assert task_secrets_environment({"hidden_width": 8, "api_token": "***"}, environ) == {}


def test_a_masked_secret_is_given_its_value_back_from_the_environment():
    environ = {TASK_SECRETS_VARIABLE: json.dumps({"api_token": TOKEN})}
    assert with_task_secrets({"api_token": "***", "hidden_width": 8}, environ) == {
        "api_token": TOKEN,
        "hidden_width": 8,
    }
    # A value given outright is the task's, whatever the environment says.
    assert with_task_secrets({"api_token": "given"}, environ) == {"api_token": "given"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "task option(s) ['api_token'] are secrets, whose values are never written down; give them in "),
        (
            {TASK_SECRETS_VARIABLE: json.dumps({"storage_key": TOKEN})},
            "task option(s) ['api_token'] are secrets",
        ),
        (
            {TASK_SECRETS_VARIABLE: f"api_token={TOKEN}"},
            f"${TASK_SECRETS_VARIABLE} is not a JSON object of task secrets (its text is not shown)",
        ),
        (
            {TASK_SECRETS_VARIABLE: json.dumps({"api_token": TOKEN, "width": 8})},
            f"${TASK_SECRETS_VARIABLE} is not a JSON object of task secrets",
        ),
    ],
)
def test_a_secret_with_no_value_to_be_had_is_refused_in_one_line_showing_none(environ, expected):
    with pytest.raises(InputError) as raised:
        with_task_secrets({"api_token": "***"}, environ)
    message = str(raised.value)
    assert message.startswith(expected)
    assert TOKEN not in message and "\n" not in message
