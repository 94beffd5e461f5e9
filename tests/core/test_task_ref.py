"""core/task_ref.py: the one task-reference parser and the options' canonical text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from components.errors import SubmissionError
from core.errors import InputError
from core.task_ref import TASK_FORMS, options_text, parse_task_ref


def test_each_form_parses_to_its_parts_without_importing_anything(tmp_path):
    builtin = parse_task_ref("tabular")
    assert (builtin.module, builtin.attribute, builtin.path, builtin.is_builtin) == (
        "training.tasks.tabular.task", "TabularTask", None, True,
    )  # fmt: skip
    module = parse_task_ref(" flowers.task:Flowers ")
    assert (module.text, module.module, module.attribute, module.is_file) == (
        "flowers.task:Flowers", "flowers.task", "Flowers", False,
    )  # fmt: skip
    relative = parse_task_ref("tasks/mine.py:Mine", tmp_path)  # need not exist: form only
    assert (relative.path, relative.attribute, relative.text) == (
        tmp_path / "tasks/mine.py",
        "Mine",
        "tasks/mine.py:Mine",
    )
    assert parse_task_ref(f"{tmp_path}/mine.py:Mine").path == tmp_path / "mine.py"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", f"expected {TASK_FORMS}"),
        ("mine.py", f"expected {TASK_FORMS}"),
        ("mine.py:not-an-identifier", f"expected {TASK_FORMS}"),
        ("my-package.task:T", "is neither a .py file nor a module name"),
        ("mine.py:Mine", "expected the task file as an absolute path"),
    ],
)
def test_a_bad_reference_is_one_line_of_the_callers_error_type(text, why):
    with pytest.raises(InputError, match=f"^--task {re.escape(repr(text))}: .*{re.escape(why)}"):
        parse_task_ref(text)
    with pytest.raises(SubmissionError, match=f"^task {re.escape(repr(text))}: "):
        parse_task_ref(text, None, "task", SubmissionError)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"hidden_width": 128, "label_column": "species"},
        {"it's": ["a 'quoted'", {"é": 1.5}]},
        {"b": 1, "a": None},
    ],
)
def test_options_text_round_trips_and_is_safe_between_single_quotes(options):
    text = options_text(options)
    assert json.loads(text) == options
    assert "'" not in text and text.isascii() and ", " not in text and '": ' not in text
    assert options_text(dict(reversed(list(options.items())))) == text  # canonical: key order is not content


def test_the_loader_and_the_pipeline_parse_with_it(tmp_path):
    from components.task_ref import parse_task_reference

    task = tmp_path / "mine.py"
    task.write_text("")
    ours = parse_task_reference("mine.py:Mine", tmp_path)
    assert (ours.path, ours.text) == (task, f"{task}:Mine")  # the pipeline's text: absolute
    with pytest.raises(SubmissionError, match="no file"):
        parse_task_reference("gone.py:Mine", tmp_path)
    assert Path(parse_task_ref(ours.text).path or "") == task
