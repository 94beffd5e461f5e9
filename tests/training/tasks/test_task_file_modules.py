"""A task file imports the modules of its own folder as a script would; a module of that folder that only
running could find (importlib, __import__) is refused in one line, since no cache key could see it."""

from __future__ import annotations

import sys

import pytest
from helpers.components.task_file import TASK_FILE, write_task_file

from core.errors import InputError
from training.tasks.loader import load_task

# Each test's module names are its own: the modules a test imports stay in this process's sys.modules.


def test_a_task_file_imports_a_module_beside_it_without_any_path_set(tmp_path):
    write_task_file(tmp_path, "widths_beside.py", "WIDTH = 5\n")
    task_file = write_task_file(
        tmp_path, text=TASK_FILE + "\nfrom widths_beside import WIDTH\nFlowers.default_width = WIDTH\n"
    )
    assert str(tmp_path) not in sys.path

    task = load_task(f"{task_file}:Flowers")

    assert type(task).default_width == 5
    assert sys.modules["widths_beside"].__file__ == str(tmp_path / "widths_beside.py")
    assert sys.path[-1] == str(tmp_path)  # after every other entry: it never shadows another's module


def test_a_module_of_the_folder_imported_by_importlib_is_refused_in_one_line(tmp_path):
    write_task_file(tmp_path, "widths_hidden.py", "WIDTH = 5\n")
    dynamic = "\nimport importlib\nWIDTH = importlib.import_module('widths_' + 'hidden').WIDTH\n"
    task_file = write_task_file(tmp_path, text=TASK_FILE + dynamic)

    with pytest.raises(InputError) as refused:
        load_task(f"{task_file}:Flowers")

    assert str(refused.value) == (
        f"--task '{task_file}:Flowers': importing it loaded widths_hidden.py (module 'widths_hidden') from "
        "the task's folder, which no import statement names, so an edit to it would not rerun the steps; "
        "import it with an import statement (`import widths_hidden`) instead of importlib or __import__"
    )
    task_file.write_text(TASK_FILE + "\nimport widths_hidden\n")  # named: now part of the task's code
    assert type(load_task(f"{task_file}:Flowers")).__name__ == "Flowers"
