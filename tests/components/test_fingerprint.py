"""What the step cache hashes: the code snapshot Azure ML would upload, the environment, and data."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

import pytest

from components.errors import SpecError
from components.fingerprint import (
    code_hash,
    content_hash,
    environment_hash,
    ignore_rules_of,
    is_ignored,
    kept_files,
    parse_ignore_rules,
)
from components.specs import ENVIRONMENT_FILE, REPO_ROOT


def append(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(text)


def ignored(rules_text: str, path: str, is_dir: bool = False) -> bool:
    return is_ignored(parse_ignore_rules(rules_text), PurePosixPath(path), is_dir)


@pytest.mark.parametrize(
    ("rules", "path", "is_dir", "expected"),
    [
        ("*.pyc", "pkg/sub/mod.pyc", False, True),  # no slash: any depth
        ("*.pyc", "pkg/mod.py", False, False),
        ("__pycache__/", "pkg/__pycache__", True, True),
        ("__pycache__/", "pkg/__pycache__", False, False),  # a trailing slash: folders only
        ("/build", "build", True, True),  # a leading slash anchors to the root
        ("/build", "pkg/build", True, False),
        ("docs/*.md", "docs/a.md", False, True),  # an inner slash anchors too
        ("docs/*.md", "x/docs/a.md", False, False),
        ("**/tmp", "a/b/tmp", True, True),
        ("logs/**", "logs/a/b.txt", False, True),
        ("a/**/z", "a/z", False, True),
        ("a/**/z", "a/b/c/z", False, True),
        ("file?.txt", "file1.txt", False, True),
        ("file[!0-9].txt", "file1.txt", False, False),
        ("file[!0-9].txt", "fileA.txt", False, True),
        ("# a comment\n\n*.log", "x.log", False, True),
        ("*.log\n!keep.log", "keep.log", False, False),  # the last match wins
        ("!keep.log\n*.log", "keep.log", False, True),
    ],
)
def test_the_gitignore_subset(rules, path, is_dir, expected):
    assert ignored(rules, path, is_dir) is expected


def test_the_amlignore_of_this_repository_keeps_the_training_and_core_packages_only():
    files = kept_files(REPO_ROOT, ignore_rules_of(REPO_ROOT))
    assert files
    assert {path.parts[0] for path in files} == {"training", "core"}
    assert PurePosixPath("training/cli.py") in files
    assert PurePosixPath("core/errors.py") in files
    assert not [path for path in files if "__pycache__" in path.parts or path.suffix == ".pyc"]


def test_a_folder_an_earlier_rule_ignored_is_not_entered_again(tmp_path):
    (tmp_path / "lib" / "keep").mkdir(parents=True)
    (tmp_path / "lib" / "keep" / "a.py").write_text("a")
    (tmp_path / ".amlignore").write_text("/lib/\n!/lib/keep/a.py\n")
    assert kept_files(tmp_path, ignore_rules_of(tmp_path)) == [PurePosixPath(".amlignore")]


def test_without_an_amlignore_the_gitignore_applies_and_without_either_everything_is_kept(tmp_path):
    (tmp_path / "a.py").write_text("a")
    (tmp_path / "b.log").write_text("b")
    assert kept_files(tmp_path, ignore_rules_of(tmp_path)) == [PurePosixPath("a.py"), PurePosixPath("b.log")]
    (tmp_path / ".gitignore").write_text("*.log\n")
    assert PurePosixPath("b.log") not in kept_files(tmp_path, ignore_rules_of(tmp_path))
    (tmp_path / ".amlignore").write_text("*.py\n")
    assert kept_files(tmp_path, ignore_rules_of(tmp_path)) == [
        PurePosixPath(".amlignore"), PurePosixPath(".gitignore"), PurePosixPath("b.log")
    ]  # fmt: skip


@pytest.fixture
def code_copy(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    for package in ("training", "core"):  # what .amlignore keeps
        shutil.copytree(REPO_ROOT / package, root / package)
    shutil.copy(REPO_ROOT / ".amlignore", root / ".amlignore")
    return root


def test_a_copy_of_the_code_hashes_the_same_and_ignored_files_change_nothing(code_copy):
    assert code_hash(code_copy) == code_hash(REPO_ROOT)
    (code_copy / "training" / "__pycache__").mkdir(exist_ok=True)
    (code_copy / "training" / "__pycache__" / "new.cpython-311.pyc").write_bytes(b"\0")
    (code_copy / "README.md").write_text("outside the snapshot")
    assert code_hash(code_copy) == code_hash(REPO_ROOT)


@pytest.mark.parametrize(
    "change",
    [
        lambda root: append(root / "training" / "cli.py", "# a comment\n"),
        lambda root: (root / "training" / "notes.txt").write_text("new file"),
        lambda root: (root / "training" / "cli.py").rename(root / "training" / "cli2.py"),
        lambda root: (root / "training" / "errors.py").unlink(),
    ],
    ids=["edited", "added", "renamed", "removed"],
)
def test_any_change_to_a_kept_file_changes_the_code_hash(code_copy, change):
    before = code_hash(code_copy)
    change(code_copy)
    assert code_hash(code_copy) != before


def test_content_hashes_cover_names_and_bytes_of_every_file(tmp_path):
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.csv").write_text("1")
    (folder / "sub" / "b.csv").write_text("2")
    first = content_hash(folder)
    assert first.startswith("sha256:")
    copy = shutil.copytree(folder, tmp_path / "copy")
    assert content_hash(copy) == first
    (copy / "sub" / "b.csv").write_text("3")
    assert content_hash(copy) != first
    (copy / "sub" / "b.csv").write_text("2")
    (copy / "sub" / "b.csv").rename(copy / "b.csv")
    assert content_hash(copy) != first
    assert content_hash(folder / "a.csv") != content_hash(folder / "sub" / "b.csv")


def test_the_environment_hash_covers_the_environment_yaml_and_its_conda_file(tmp_path):
    environment = tmp_path / "environment.yml"
    shutil.copy(ENVIRONMENT_FILE, environment)
    shutil.copy(ENVIRONMENT_FILE.parent / "conda.yml", tmp_path / "conda.yml")
    assert environment_hash(environment) == environment_hash(ENVIRONMENT_FILE)
    append(tmp_path / "conda.yml", "      - rich==14.0.0\n")
    assert environment_hash(environment) != environment_hash(ENVIRONMENT_FILE)
    (tmp_path / "conda.yml").unlink()
    with pytest.raises(SpecError, match=r"conda_file .*conda.yml does not exist"):
        environment_hash(environment)


def test_a_missing_code_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(SpecError, match=r"code folder .*/nowhere: no such folder"):
        code_hash(tmp_path / "nowhere")
