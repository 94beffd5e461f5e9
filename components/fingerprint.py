"""Content hashes for the step cache: the code snapshot, the environment spec, and input/output folders.

The code hash covers exactly the files Azure ML would upload as the component's code snapshot. Azure ML
filters the `code` folder through its `.amlignore` (or, without one, its `.gitignore`); this module
implements the gitignore subset such files use: comments, blank lines, `!` negation, a trailing `/` for
folders only, a leading or inner `/` anchoring a pattern to the root, and the globs `*`, `?`, `[...]` and
`**`. As in git, the last matching pattern wins, and the contents of an ignored folder are never
re-included. Only the root's ignore file is read: nested ignore files are not supported.

Hashes name each file by its relative path and its bytes, so a copy of the same files elsewhere hashes the
same, and any added, removed, renamed or edited file changes the hash.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from components.errors import SpecError
from components.specs import load_yaml
from core.files import file_sha256

IGNORE_FILES = (".amlignore", ".gitignore")


@dataclass(frozen=True)
class IgnoreRule:
    """One line of an ignore file, compiled."""

    pattern: str
    regex: re.Pattern[str]
    negated: bool
    directory_only: bool
    anchored: bool

    def matches(self, relative: PurePosixPath, is_dir: bool) -> bool:
        if self.directory_only and not is_dir:
            return False
        target = relative.as_posix() if self.anchored else relative.name
        return self.regex.fullmatch(target) is not None


def _glob_to_regex(glob: str) -> str:
    parts: list[str] = []
    index = 0
    while index < len(glob):
        char = glob[index]
        if glob.startswith("**/", index):
            parts.append("(?:.*/)?")
            index += 3
            continue
        if glob.startswith("**", index):
            parts.append(".*")
            index += 2
            continue
        if char == "*":
            parts.append("[^/]*")
        elif char == "?":
            parts.append("[^/]")
        elif char == "[" and (end := glob.find("]", index + 2)) != -1:
            body = glob[index + 1 : end]
            parts.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            index = end + 1
            continue
        else:
            parts.append(re.escape(char))
        index += 1
    return "".join(parts)


def parse_ignore_rules(text: str) -> tuple[IgnoreRule, ...]:
    rules = []
    for line in text.splitlines():
        pattern = line.rstrip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        directory_only = body.endswith("/")
        body = body.rstrip("/")
        anchored = "/" in body
        body = body.lstrip("/")
        if not body:
            continue
        rules.append(IgnoreRule(pattern, re.compile(_glob_to_regex(body)), negated, directory_only, anchored))
    return tuple(rules)


def is_ignored(rules: Iterable[IgnoreRule], relative: PurePosixPath, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:
        if rule.matches(relative, is_dir):
            ignored = not rule.negated
    return ignored


def ignore_rules_of(code_root: Path) -> tuple[IgnoreRule, ...]:
    """The rules of the code folder's `.amlignore`, else its `.gitignore`, else none (keep everything)."""
    for name in IGNORE_FILES:
        path = code_root / name
        if path.is_file():
            return parse_ignore_rules(path.read_text())
    return ()


def kept_files(code_root: Path, rules: tuple[IgnoreRule, ...]) -> list[PurePosixPath]:
    """The files of the snapshot, relative to `code_root`, sorted."""
    kept: list[PurePosixPath] = []
    for folder, dirnames, filenames in os.walk(code_root):
        base = PurePosixPath(Path(folder).relative_to(code_root).as_posix())
        dirnames[:] = sorted(name for name in dirnames if not is_ignored(rules, base / name, is_dir=True))
        kept += [base / name for name in filenames if not is_ignored(rules, base / name, is_dir=False)]
    return sorted(kept)


def listing_hash(listing: Mapping[str, str]) -> str:
    """The hash of files named by relative path, each with its sha256 (code_listing, content_listing)."""
    digest = hashlib.sha256()
    for relative in sorted(listing):
        digest.update(f"{relative}\0{listing[relative]}\n".encode())
    return "sha256:" + digest.hexdigest()


def code_listing(code_root: Path) -> dict[str, str]:
    """Each file of the code snapshot Azure ML would upload from `code_root`, with its sha256."""
    if not code_root.is_dir():
        raise SpecError(f"code folder {code_root}: no such folder; expected the component's `code` folder")
    files = kept_files(code_root, ignore_rules_of(code_root))
    return {relative.as_posix(): file_sha256(code_root / relative) for relative in files}


def code_hash(code_root: Path) -> str:
    """The hash of the code snapshot Azure ML would upload from `code_root`."""
    return listing_hash(code_listing(code_root))


def content_listing(path: Path) -> dict[str, str]:
    """A file by its name, or every file under a folder by its path relative to it, with its sha256."""
    if path.is_file():
        return {path.name: file_sha256(path)}
    files = sorted(
        PurePosixPath(Path(folder, name).relative_to(path).as_posix())
        for folder, _, filenames in os.walk(path)
        for name in filenames
    )
    return {relative.as_posix(): file_sha256(path / relative) for relative in files}


def content_hash(path: Path) -> str:
    """The hash of a file, or of every file under a folder (names relative to it, and bytes)."""
    return listing_hash(content_listing(path))


def first_difference(before: Mapping[str, str], after: Mapping[str, str]) -> str | None:
    """'NAME (sha256 A... before, B... now)' for the first file whose hash differs (absent on one side
    counts), in name order; None if the listings are equal."""
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            was, became = (_prefix(listing.get(name)) for listing in (before, after))
            return f"{name} (sha256 {was} before, {became} now)"
    return None


def _prefix(digest: str | None) -> str:
    return f"{digest[:12]}..." if digest else "absent"


def environment_hash(environment_file: Path) -> str:
    """The hash of the environment spec: its YAML and the conda file it names."""
    spec = load_yaml(environment_file)
    digest = hashlib.sha256(environment_file.read_bytes())
    conda_file = spec.get("conda_file")
    if conda_file:
        conda_path = environment_file.parent / str(conda_file)
        if not conda_path.is_file():
            raise SpecError(f"{environment_file}: conda_file {conda_path} does not exist")
        digest.update(b"\0" + conda_path.read_bytes())
    return "sha256:" + digest.hexdigest()
