"""core/files.py staged_folder: a folder appears whole, or not at all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core.files import staged_folder


def test_the_folder_appears_whole_and_nothing_else_is_left(tmp_path):
    final = tmp_path / "parent" / "v1"
    with staged_folder(final) as staging:
        assert staging.parent == final.parent and staging.name.startswith(".") and not final.exists()
        (staging / "a.txt").write_text("a")
    assert [p.name for p in final.iterdir()] == ["a.txt"]
    assert os.listdir(final.parent) == ["v1"]


def test_a_failure_in_the_block_leaves_neither_the_folder_nor_its_staging(tmp_path):
    final = tmp_path / "v1"
    with pytest.raises(RuntimeError, match="boom"), staged_folder(final) as staging:
        (staging / "a.txt").write_text("a")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_an_existing_folder_is_kept_and_the_rename_failure_raised(tmp_path):
    final = tmp_path / "v1"
    final.mkdir()
    (final / "first.txt").write_text("first")
    with pytest.raises(OSError), staged_folder(final) as staging:
        (staging / "second.txt").write_text("second")
    assert os.listdir(tmp_path) == ["v1"] and os.listdir(final) == ["first.txt"]


def test_a_process_killed_while_staging_leaves_only_a_hidden_sibling(tmp_path):
    final = tmp_path / "v1"
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from core.files import staged_folder\n"
        "with staged_folder(Path(sys.argv[1])) as staging:\n"
        "    (staging / 'half.txt').write_text('half')\n"
        "    os._exit(9)  # killed: no cleanup runs\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, str(final)], env=env, check=False)
    assert done.returncode == 9
    assert not final.exists()
    assert all(name.startswith(".v1.staging-") for name in os.listdir(tmp_path))
    with staged_folder(final) as staging:  # the next writer is not disturbed by it
        (staging / "whole.txt").write_text("whole")
    assert os.listdir(final) == ["whole.txt"]
