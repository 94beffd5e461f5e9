"""A user's task's raw_suffixes, read from its code without running it: as Python finds the class attribute
(the class, its bases in its file or its folder, an instance of it, a module constant), and one line
naming the task and why where only running the code could tell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from components.errors import ConfigError
from components.task_declarations import declared_raw_suffixes
from core.task_ref import parse_task_ref

# Never imported: a task file that ran would fail loudly here.
HEADER = "import torch\nraise SystemExit('the task file ran')\n"


def suffixes(folder: Path, text: str, attribute: str = "Task", name: str = "task.py") -> tuple[str, ...]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(HEADER + text)
    return declared_raw_suffixes(parse_task_ref(f"{folder / name}:{attribute}"))


@pytest.mark.parametrize(
    ("text", "attribute", "expected"),
    [
        ('class Task:\n    raw_suffixes = (".csv",)\n', "Task", (".csv",)),
        (
            'class Task:\n    raw_suffixes: tuple[str, ...] = [".json", ".jsonl"]\n',
            "Task",
            (".json", ".jsonl"),
        ),
        ('RAW = (".tsv",)\nclass Task:\n    raw_suffixes = RAW\n', "Task", (".tsv",)),
        ('class Base:\n    raw_suffixes = (".csv",)\nclass Task(Base):\n    name = "t"\n', "Task", (".csv",)),
        (  # as Python's lookup: the first base that assigns it, the class's own last assignment
            'class A:\n    pass\nclass B:\n    raw_suffixes = (".b",)\n'
            'class Task(A, B):\n    raw_suffixes = (".x",)\n    raw_suffixes = (".y",)\n',
            "Task",
            (".y",),
        ),
        (
            'class A:\n    pass\nclass B:\n    raw_suffixes = (".b",)\nclass Task(A, B):\n    pass\n',
            "Task",
            (".b",),
        ),
        ('class Task:\n    raw_suffixes = (".csv",)\nTASK = Task(width=3)\n', "TASK", (".csv",)),
        ('class Task:\n    raw_suffixes = (".csv",)\nAlias = Task\n', "Alias", (".csv",)),
    ],
)
def test_the_declaration_is_found_as_python_would_find_the_class_attribute(
    tmp_path, text, attribute, expected
):
    assert suffixes(tmp_path, text, attribute) == expected


def test_a_base_class_from_a_module_of_the_task_s_folder_is_followed(tmp_path):
    (tmp_path / "houses_task.py").write_text(HEADER + 'class HousesTask:\n    raw_suffixes = (".csv",)\n')
    text = "from houses_task import HousesTask as Houses\n\nclass Task(Houses):\n    name = 'tokens'\n"
    assert suffixes(tmp_path, text) == (".csv",)


def test_a_module_task_is_read_from_the_path_it_would_be_imported_from(tmp_path):
    package = tmp_path / "site" / "audio"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(HEADER + 'class Clips:\n    raw_suffixes = (".wav",)\n')
    reference = parse_task_ref("audio.tasks:Clips")
    assert declared_raw_suffixes(reference, [str(tmp_path / "site")]) == (".wav",)
    assert "audio" not in sys.modules
    with pytest.raises(ConfigError, match=r"no source of module audio.tasks on this interpreter's path"):
        declared_raw_suffixes(reference, [str(tmp_path)])


@pytest.mark.parametrize(
    ("text", "attribute", "why"),
    [
        ('class Task:\n    raw_suffixes = tuple([".csv"])\n', "Task", "Task.raw_suffixes is computed"),
        ("def Task(**options):\n    return object()\n", "Task", "Task in task.py is a function"),
        ("class Task:\n    name = 't'\n", "Task", "class Task in task.py declares no raw_suffixes"),
        ("import base\nclass Task(base.Tabular):\n    pass\n", "Task", "base base.Tabular is not a class"),
        (
            "from training.tasks.tabular.task import TabularTask\nclass Task(TabularTask):\n    pass\n",
            "Task",
            "imports from training.tasks.tabular.task, which is not a module of the task's folder",
        ),
        ("class Task:\n    raw_suffixes = ('csv',)\n", "Task", "holds 'csv'; expected file suffixes"),
        ("class Task:\n    raw_suffixes = ()\n", "Task", "is empty; expected file suffixes"),
        ("class Task:\n    raw_suffixes = '.csv'\n", "Task", "is '.csv', not a tuple of suffixes"),
        ("class Task(Task):\n    pass\n", "Task", "more than 16 names, instances or bases followed"),
        ("class Task(:\n", "Task", "task.py does not parse: SyntaxError"),
        ("x = 1\n", "Task", "task.py defines no Task at its top level"),
    ],
)
def test_what_only_running_the_code_could_tell_is_one_line_naming_the_task(tmp_path, text, attribute, why):
    with pytest.raises(ConfigError) as raised:
        suffixes(tmp_path, text, attribute)
    message = str(raised.value)
    assert message.startswith(f"the raw_suffixes of task '{tmp_path / 'task.py'}:{attribute}' ")
    assert why in message and "\n" not in message


def test_a_task_file_that_is_not_utf8_or_holds_nul_is_one_line(tmp_path):
    (tmp_path / "task.py").write_bytes(b"class Task:\n    raw_suffixes = ('\xff',)\x00\n")
    with pytest.raises(ConfigError, match=r"does not parse") as raised:
        declared_raw_suffixes(parse_task_ref(f"{tmp_path / 'task.py'}:Task"))
    assert "\n" not in str(raised.value)
