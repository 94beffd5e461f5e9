"""core/sources.py: a task file's code is the file and the modules of its folder it imports, found by
reading import statements (nothing is imported), and hashed once for every key and check."""

from __future__ import annotations

import hashlib
from pathlib import Path

from core.sources import file_task_sources, task_sources_sha256
from core.task_ref import parse_task_ref

TASK = """\
import json                          # the standard library: the environment's
import houses                        # a module beside the file
from shop import prices              # a package's module, named by a from-import
from shop.tills import till as t     # a subpackage's module
import plans.floors                  # a module of a namespace folder (no __init__)


def late():
    from gardens import hedge        # an import inside a function may run: it counts
"""


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_a_task_file_s_code_is_the_file_and_every_module_of_its_folder_it_imports_transitively(tmp_path):
    _write(
        tmp_path,
        {
            "token_task.py": TASK,
            "houses.py": "import streets\n",  # transitively
            "streets.py": "",
            "shop/__init__.py": "from . import stock\n",  # runs on any import of shop
            "shop/prices.py": "from .tills import till\n",
            "shop/stock.py": "",
            "shop/tills/__init__.py": "from .. import prices\n",
            "shop/tills/till.py": "",
            "shop/unused.py": "",  # in an imported package, but never imported
            "plans/floors.py": "",
            "gardens.py": "",
            "notes.py": "",  # beside the file, not imported
            "json.py": "",  # shadowed at run time by the standard library; hashing it as well costs nothing
            "data/table.csv": "a,b\n",
        },
    )
    found = file_task_sources(tmp_path / "token_task.py")
    assert sorted(found) == [
        "gardens.py",
        "houses.py",
        "json.py",
        "plans/floors.py",
        "shop/__init__.py",
        "shop/prices.py",
        "shop/stock.py",
        "shop/tills/__init__.py",
        "shop/tills/till.py",
        "streets.py",
        "token_task.py",
    ]
    assert all(found[name] == tmp_path / name for name in found)


def test_relative_imports_beyond_their_package_and_files_that_do_not_parse_import_nothing(tmp_path):
    _write(
        tmp_path,
        {
            "task.py": "from . import beside\nimport broken, latin\n",  # a top-level file has no package
            "beside.py": "",
            "broken.py": "import streets\nthis is not python(\n",  # still its code, imports unknown
            "streets.py": "",
        },
    )
    (tmp_path / "latin.py").write_bytes(b"import streets\nNAME = 'caf\xe9'  # not UTF-8\n")
    assert sorted(file_task_sources(tmp_path / "task.py")) == ["broken.py", "latin.py", "task.py"]


def test_a_file_alone_hashes_as_itself_and_an_imported_module_joins_the_hash(tmp_path):
    _write(tmp_path, {"task.py": "X = 1\n", "houses.py": "LOSS = 1.0\n"})
    reference = parse_task_ref(f"{tmp_path / 'task.py'}:T")
    alone = task_sources_sha256(reference, [])
    assert alone is not None
    assert alone.sha256 == hashlib.sha256(b"X = 1\n").hexdigest()  # the key it always had

    (tmp_path / "task.py").write_text("import houses\nX = 1\n")
    with_module = task_sources_sha256(reference, [])
    (tmp_path / "houses.py").write_text("LOSS = 0.0\n")  # a zeroed loss, in the module only
    edited = task_sources_sha256(reference, [])

    assert with_module is not None and edited is not None
    assert sorted(with_module.hashes) == ["houses.py", "task.py"]
    assert with_module.hashes["task.py"] == edited.hashes["task.py"]
    assert edited.sha256 != with_module.sha256
    assert task_sources_sha256(parse_task_ref("tabular"), []) is None
