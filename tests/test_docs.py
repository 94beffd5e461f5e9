"""The README and docs/ are true of the code: the versions, the model flavour and the files they name.

A clone has only what is committed, so a document may point at nothing outside it; and a version or a path
written by hand drifts the moment the YAML or the tree changes. These read every Markdown file a user gets
and hold each such claim against the thing it names.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from components.specs import REPO_ROOT


def _tracked() -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout
    return [name for name in listing.split("\0") if name]


TRACKED = _tracked()
DOCS = sorted(name for name in TRACKED if name.endswith(".md"))


def _text(name: str) -> str:
    return (REPO_ROOT / name).read_text(encoding="utf-8")


def _versions() -> dict[str, str]:
    """Each published asset's name -> the version its YAML declares."""
    found = {}
    for path in [
        *(REPO_ROOT / "components").glob("*.yml"),
        REPO_ROOT / "components/environment/environment.yml",
    ]:
        document = yaml.safe_load(path.read_text())
        if document.get("type") == "pipeline" or "version" not in document:
            continue
        found[document["name"]] = str(document["version"])
    return found


_ASSET_VERSION = re.compile(r"\b(retrain[-_][a-z]+(?:-[a-z]+)?):(\d+|\*)\b")


@pytest.mark.parametrize("doc", DOCS)
def test_every_asset_version_a_document_names_is_the_yaml_s(doc):
    versions = _versions()
    assert {"retrain-training", "retrain_train", "retrain_register"} <= versions.keys()
    wrong = [
        f"{name}:{version} (the YAML says {versions.get(name, 'no such asset')})"
        for name, version in _ASSET_VERSION.findall(_text(doc))
        if versions.get(name) != version
    ]
    assert not wrong, f"{doc} names versions that are not the published ones: {wrong}"


_FLAVOUR_CALL = re.compile(r"mlflow\.(\w+)\.(?:load_model|log_model)")


@pytest.mark.parametrize("doc", DOCS)
def test_the_model_flavour_a_document_names_is_the_one_registration_logs(doc):
    logged = set(_FLAVOUR_CALL.findall((REPO_ROOT / "training/gate/pyfunc_model.py").read_text()))
    assert logged == {"pyfunc"}
    named = set(_FLAVOUR_CALL.findall(_text(doc)))
    assert named <= logged, f"{doc} loads or logs models with {sorted(named - logged)}; they are {logged}"


def test_nothing_a_clone_has_points_at_a_design_page_it_does_not_have():
    citing = [
        name
        for name in TRACKED
        if not name.endswith((".json", ".lock"))
        and name != "tests/test_docs.py"  # this test names what it looks for
        and "DESIGN.md" in (REPO_ROOT / name).read_text(errors="replace")
    ]
    assert citing == [], f"these cite DESIGN.md, which a clone has not (use docs/architecture.md): {citing}"


_TOP_LEVEL = sorted({name.split("/", 1)[0] for name in TRACKED if "/" in name})
# A path in backticks, under one of the repository's own top-level folders.
_PATH = re.compile(r"`((?:" + "|".join(map(re.escape, _TOP_LEVEL)) + r")/[^`\s]*)`")


# The files the README's "Bring your own model" has the reader write (tests/components/test_readme_task.py).
_WRITTEN_BY_THE_READER = {
    f"models/{name}" for name in re.findall(r"<!-- readme-task: (\S+) -->", _text("README.md"))
}


def _exists(path: str) -> bool:
    # A pattern or a placeholder (<name>, NAME) names a family of files, not one.
    if any(mark in path for mark in "<{*$") or re.search(r"(?<![a-z])[A-Z]{3,}(?![a-z])", path):
        return True
    if path in _WRITTEN_BY_THE_READER:
        return True
    path = path.split(":", 1)[0].rstrip("/")  # file.py:Attr, a folder/
    return path in TRACKED or any(name.startswith(path + "/") for name in TRACKED)


@pytest.mark.parametrize("doc", DOCS)
def test_every_repository_file_a_document_names_exists(doc):
    missing = sorted({path for path in _PATH.findall(_text(doc)) if not _exists(path)})
    assert not missing, f"{doc} names files the repository does not have: {missing}"


def test_the_checks_see_what_they_check():
    every = "\n".join(map(_text, DOCS))
    assert _ASSET_VERSION.search(every) and _PATH.search(every) and _FLAVOUR_CALL.search(every)
    assert _PATH.search(_text("README.md")) and _FLAVOUR_CALL.search(_text("README.md"))
    assert {"README.md", "docs/architecture.md", "docs/configuration.md"} <= set(DOCS)
    assert not _exists("components/no-such.yml") and _exists("components/train.yml")
    assert _exists("training/tasks/") and _exists("models/<name>.toml")
    assert Path(REPO_ROOT / "docs/architecture.md").is_file()
