"""The deployment docs, run as a reader would: every command that needs no Azure account runs as written.

The README's "Deploying to Azure", docs/deploying.md and docs/deploying-by-hand.md mark each command block
with what it needs, as its title: ```sh title="offline"``` (runs here, exactly as written, from the
repository root) or ```sh title="azure"``` (needs a subscription: azd, az, func, curl, or a retrain command
that reaches a workspace). A title is what the docs site shows above the block (GitHub reads only the
language), so the reader sees the mark. An unmarked block, or an "azure" block that hides a command needing
no Azure, fails: a reader must be able to trust the mark.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from components.specs import REPO_ROOT

# A fence may be indented (a block inside a list item): its body is then indented as much.
_FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```$", re.MULTILINE | re.DOTALL
)
_TITLE = re.compile(r'^title="([^"]*)"$')
_NEEDS_AZURE = ("az", "azd", "func", "curl")


def deploy_section() -> str:
    readme = (REPO_ROOT / "README.md").read_text()
    start = readme.index("\n## Deploying to Azure")
    return readme[start : readme.index("\n## ", start + 1)]


def documents() -> dict[str, str]:
    return {
        "README.md#deploying-to-azure": deploy_section(),
        "docs/deploying.md": (REPO_ROOT / "docs/deploying.md").read_text(),
        "docs/deploying-by-hand.md": (REPO_ROOT / "docs/deploying-by-hand.md").read_text(),
    }


def blocks(text: str) -> list[tuple[str, str]]:
    """(mark, body) of each fenced block; the mark is the language and the block's title, if any:
    `sh title="azure"` is marked "sh azure"."""
    found = []
    for match in _FENCE.finditer(text):
        words = [_TITLE.sub(r"\1", word) for word in match["info"].split()]
        found.append((" ".join(words), textwrap.dedent(match["body"])))
    return found


def commands(body: str) -> list[list[str]]:
    """Each command of a block as words: continuation lines joined, comments dropped, one per `;`, `&&`,
    `||` or `|`."""
    joined = re.sub(r"\\\n\s*", " ", body)
    found = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        command: list[str] = []
        for word in [*lexer, ";"]:
            if word in ("&&", ";", "||", "|"):
                if command:
                    found.append(command)
                command = []
            else:
                command.append(word)
    return found


def _program(command: list[str]) -> list[str]:
    """The command without its VAR=value prefixes, or shell keywords before it."""
    words = list(command)
    while words and (
        words[0] in ("do", "then", "else") or ("=" in words[0] and not words[0].startswith("-"))
    ):
        words.pop(0)
    return words


def needs_azure(command: list[str]) -> bool:
    """az, azd, func, curl to an app; a retrain command that reaches a workspace; or one given a value that
    azd or az looks up (`$(azd env get-value ...)`)."""
    if any("$(az" in word for word in command):
        return True
    words = _program(command)
    if not words:
        return False
    program = Path(words[0]).name
    if program in _NEEDS_AZURE:
        return True
    if program == "retrain" and len(words) > 1:
        verb = words[1]
        return verb == "publish" or (verb in ("submit", "schedule") and "--dry-run" not in words)
    return False


def is_retrain(command: list[str]) -> bool:
    words = _program(command)
    return bool(words) and Path(words[0]).name == "retrain"


def test_every_block_is_marked_and_every_azure_block_needs_azure():
    for name, text in documents().items():
        found = blocks(text)
        assert found, f"{name} has no command blocks"
        for mark, body in found:
            expected = '```sh title="offline", ```sh title="azure" (or json/yaml/text)'
            assert mark in ("sh offline", "sh azure", "json", "yaml", "text"), (
                f"{name}: a block marked {mark!r}; expected {expected}:\n{body}"
            )
            if mark == "sh azure":
                found_commands = commands(body)
                assert any(map(needs_azure, found_commands)), f"{name}: marked azure, needs none:\n{body}"
                offline = [" ".join(c) for c in found_commands if is_retrain(c) and not needs_azure(c)]
                assert not offline, f"{name}: marked azure, but these run offline (mark them so): {offline}"


def offline_blocks() -> list[tuple[str, str]]:
    return [
        (f"{name}[{number}]", body)
        for name, text in documents().items()
        for number, (mark, body) in enumerate(blocks(text))
        if mark == "sh offline"
    ]


@pytest.fixture(scope="module")
def reader_checkout(tmp_path_factory) -> Path:
    """The repository as a reader has it, where the commands may write: its entries linked, a fresh state."""
    root = tmp_path_factory.mktemp("checkout")
    for entry in REPO_ROOT.iterdir():
        if entry.name == "infra":  # `python -m infra.event_routing` rewrites a file in it
            shutil.copytree(entry, root / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name not in (".retrain", ".git"):
            (root / entry.name).symlink_to(entry)
    return root


def test_the_docs_have_offline_commands_to_run():
    assert len(offline_blocks()) >= 2


def test_the_marks_are_read_as_a_reader_would():
    assert blocks('```sh title="azure"\naz login\n```\n') == [("sh azure", "az login\n")]
    assert needs_azure(["az", "storage", "blob", "upload"]) and needs_azure([".venv/bin/retrain", "publish"])
    assert needs_azure(["RETRAIN_LEDGER=$(azd env get-value X)", ".venv/bin/retrain", "ledger"])
    assert needs_azure(["do", "az", "ml", "compute", "create"])
    assert not needs_azure([".venv/bin/retrain", "submit", "--dry-run", "--model-name", "digits"])
    assert not needs_azure(["export", "A=b"]) and is_retrain(["X=1", "retrain", "ledger"])
    assert commands("a \\\n  b && c # note\nd") == [["a", "b"], ["c"], ["d"]]
    assert commands("for c in x/*.yml; do az ml create -f $c; done")[1] == [
        "do",
        "az",
        "ml",
        "create",
        "-f",
        "$c",
    ]


@pytest.mark.parametrize("name, body", offline_blocks(), ids=[name for name, _ in offline_blocks()])
def test_an_offline_block_runs_as_written(name, body, reader_checkout):
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("RETRAIN_", "AZURE"))}
    environ.pop("AZUREML_WORKSPACE", None)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        cwd=reader_checkout,
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"{name} failed ({result.returncode}):\n{body}\n{output}"
