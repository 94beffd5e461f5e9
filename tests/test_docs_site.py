"""The documentation as a reader meets it: a short README that starts with what to run, topic pages under
docs/ that build into a site with no broken link, and each explanation written once.

The site is built with `mkdocs build --strict`, so a link to a page or anchor that does not exist, or a page
left out of the nav, fails here rather than on a reader. Prose said twice drifts apart (one copy is fixed,
the other is not), so no paragraph of three or more sentences may appear in two places.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from components.specs import REPO_ROOT

README = REPO_ROOT / "README.md"
README_MAX_LINES = 320
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


def _documents() -> dict[str, str]:
    pages = sorted((REPO_ROOT / "docs").glob("*.md"))
    return {"README.md": README.read_text(encoding="utf-8")} | {
        f"docs/{page.name}": page.read_text(encoding="utf-8") for page in pages
    }


_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE_END = re.compile(r"[.!?] ")


def paragraphs(text: str) -> list[str]:
    """The blocks of text between blank lines, outside fenced code, each with its whitespace normalised."""
    found, block, fenced = [], [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            block = []
            continue
        if fenced:
            continue
        if line.strip():
            block.append(line)
        elif block:
            found.append(" ".join(" ".join(block).split()))
            block = []
    if block and not fenced:
        found.append(" ".join(" ".join(block).split()))
    return found


def sentences(paragraph: str) -> int:
    """A sentence ends at . ! or ? followed by a space; the paragraph's last one ends with it."""
    return len(_SENTENCE_END.findall(paragraph)) + 1


def repeated_paragraphs(documents: dict[str, str], min_sentences: int = 3) -> dict[str, list[str]]:
    """Each paragraph of at least `min_sentences` sentences found in more than one place -> those places."""
    places: dict[str, list[str]] = {}
    for name, text in documents.items():
        for paragraph in paragraphs(text):
            if sentences(paragraph) >= min_sentences:
                places.setdefault(paragraph, []).append(name)
    return {paragraph: where for paragraph, where in places.items() if len(where) > 1}


def test_no_paragraph_is_said_twice():
    repeated = repeated_paragraphs(_documents())

    assert not repeated, "say it once and link to it; repeated: " + "; ".join(
        f"{where}: {paragraph[:120]}..." for paragraph, where in repeated.items()
    )


def test_a_planted_repetition_is_found():
    said = "The gate compares. It never guesses. A tie is refused."
    documents = {
        "README.md": f"# Title\n\n{said}\n\nOther words. Here.\n",
        "docs/gate.md": f"# Gate\n\nSome text.\n\n{said.replace(' ', chr(10), 3)}\n\n```\n{said}\n```\n",
    }

    assert repeated_paragraphs(documents) == {said: ["README.md", "docs/gate.md"]}
    assert repeated_paragraphs({"README.md": f"```\n{said}\n```\n", "docs/a.md": said}) == {}
    assert repeated_paragraphs({"README.md": "One. Two.", "docs/a.md": "One. Two."}) == {}


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()

    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    assert lines[0].startswith("# "), "the README starts with its title"
    opening = "\n".join(lines[1:8])
    assert "make demo" in opening and "make test" in opening, "the title is followed at once by the commands"


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    text = unicodedata.normalize("NFKD", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    outside_code = [
        line for line, fenced in zip(text.splitlines(), _fenced_lines(text), strict=True) if not fenced
    ]
    return {github_anchor(line.lstrip("#")) for line in outside_code if re.match(r"#{1,6} ", line)}


def _fenced_lines(text: str) -> list[bool]:
    marks, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            marks.append(True)
        else:
            marks.append(fenced)
    return marks


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_link_in_the_readme_reaches_a_file_and_heading():
    """The README is read on GitHub, not in the site: its links are checked here, by GitHub's anchors."""
    readme = README.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(readme):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (REPO_ROOT / path) if path else README
        has_anchor = file.is_file() and anchor in _anchors(file.read_text(encoding="utf-8"))
        if not file.exists() or (anchor and not has_anchor):
            broken.append(target)

    assert broken == []
    assert "the-loop-by-hand" in _anchors((REPO_ROOT / "docs/front-door.md").read_text())
    assert github_anchor("Starting a new model: `retrain init`") == "starting-a-new-model-retrain-init"
