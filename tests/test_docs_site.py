"""The documentation as a reader meets it: topic pages under docs/ that build into a site with no broken link.

The site is built with `mkdocs build --strict`, so a link to a page or anchor that does not exist, or a page
left out of the nav, fails here rather than on a reader.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.specs import REPO_ROOT

# The Material theme prints a notice about MkDocs 2.0 on every build unless told not to.
MKDOCS_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config)]
    return subprocess.run(
        [*command, "--site-dir", str(site)],
        env=MKDOCS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_site_builds_in_strict_mode(tmp_path):
    built = _build(REPO_ROOT / "mkdocs.yml", tmp_path / "site")

    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda docs: _append(docs / "gate.md", "[gone](no-such-page.md)"), id="no such page"),
        pytest.param(
            lambda docs: _append(docs / "gate.md", "[gone](trainer.md#no-such)"), id="no such anchor"
        ),
        pytest.param(lambda docs: (docs / "orphan.md").write_text("# Orphan\n"), id="a page not in the nav"),
    ],
)
def test_a_strict_build_fails_on_what_a_reader_would_trip_over(tmp_path, plant):
    """The checks above see what they check: mkdocs.yml's validation turns each of these into a warning."""
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copyfile(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    plant(tmp_path / "docs")

    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert built.returncode != 0, f"a strict build passed with a planted fault:\n{built.stderr}"


def _append(page: Path, text: str) -> None:
    page.write_text(page.read_text() + f"\n{text}\n")
