"""Raw files a prepare step left out, and why: a bad input costs that input, never the model.

A task's prepare raises `RawFilesRejected` for the raw files that do not fit its data (another table
schema, bytes that are not the task's format, a value out of range), each named by its path below the raw
folder, which is its name in the pinned data manifest. The prepare step prepares the others and writes what
it left out to its `rejected_inputs` output (`REPORT_FILE`); the front door reads that back into the
submission's details, names each file once, and leaves it out of every later data version.

Spoken by training (which writes the report), components (whose submitters read it from a run's outputs)
and the front door: so it lives here, in the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import write_atomically
from core.secrets import mask_secrets
from core.text import escaped

REPORT_FILE = "rejected.json"  # in the prepare step's `rejected_inputs` output
REPORT_OUTPUT = "rejected_inputs"  # that output's name (components/prep.yml)
FORMAT = "retrain-rejected/1"
_REASON_LIMIT = 400


@dataclass(frozen=True)
class RejectedFile:
    """One raw file left out: `name` is its path below the raw folder ('bad.csv', 'circle/a.png'), `reason`
    one line saying what does not fit and what was expected."""

    name: str
    reason: str

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not self.name
            or any(part in ("", ".", "..") for part in self.name.split("/"))
        ):
            raise InputError(f"rejected file name {self.name!r}: expected a path below the raw folder")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise InputError(f"rejected file {self.name!r}: expected a reason")
        reason = mask_secrets(" ".join(self.reason.split()))
        if len(reason) > _REASON_LIMIT:
            reason = reason[: _REASON_LIMIT - 3] + "..."
        object.__setattr__(self, "reason", reason)

    def line(self) -> str:
        return f"{escaped(self.name)}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


class RawFilesRejected(InputError):
    """Raised by a task's prepare: these raw files do not fit, each with its reason; the other files may.
    The prepare step leaves them out and prepares the rest. Uncaught, its message is the first file's own
    error (naming that file), and how many more there are."""

    def __init__(self, files: Sequence[RejectedFile], first_message: str | None = None) -> None:
        self.files = tuple(files)
        if not self.files:
            raise InputError("RawFilesRejected names no file; expected at least one RejectedFile")
        self.first_message = " ".join((first_message or self.files[0].line()).split())
        more = len(self.files) - 1
        extra = f" (and {more} more raw file(s) that do not fit: {names(self.files[1:])})" if more else ""
        super().__init__(self.first_message + extra)


def rejected_for(path: Path, name: str, error: Exception) -> RejectedFile:
    """`error` (a one-line InputError about the file at `path`) as the rejection of `name`: its message
    without the leading path, which the name replaces."""
    message = " ".join(str(error).split())
    for shown in (f"{escaped(path)}: ", f"{path}: "):
        if message.startswith(shown):
            message = message[len(shown) :]
            break
    return RejectedFile(name, message or type(error).__name__)


def names(files: Iterable[RejectedFile], limit: int = 5) -> str:
    """The files' names for a message: the first `limit`, then how many more."""
    listed = [escaped(file.name) for file in files]
    shown = ", ".join(listed[:limit])
    return shown + (f" and {len(listed) - limit} more" if len(listed) > limit else "")


def report_bytes(files: Iterable[RejectedFile]) -> bytes:
    """The report's JSON: every rejected file, in name order (an empty list: none was)."""
    ordered = sorted(files, key=lambda file: file.name)
    return (
        json.dumps({"format": FORMAT, "files": [file.to_dict() for file in ordered]}, indent=1) + "\n"
    ).encode()


def write_report(folder: Path, files: Iterable[RejectedFile]) -> Path:
    """Write the report into the output `folder` (created if absent), whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / REPORT_FILE
    write_atomically(path, report_bytes(files))
    return path


def parse_report(data: bytes | str) -> tuple[RejectedFile, ...]:
    """The rejected files of a report; ValueError (a one-line reason) when it is not one."""
    try:
        document = json.loads(data)
    except ValueError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(document, Mapping) or document.get("format") != FORMAT:
        raise ValueError(f"expected a {FORMAT!r} document")
    files = document.get("files")
    if not isinstance(files, list):
        raise ValueError("expected a 'files' list")
    return tuple(_file(item) for item in files)


def read_report(folder: Path) -> tuple[RejectedFile, ...] | None:
    """The report in a prepare step's output folder; None when there is none (a prepare step from before
    reports were written). A report that cannot be read raises ValueError."""
    try:
        data = (Path(folder) / REPORT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ValueError(f"cannot be read ({error.strerror or error})") from None
    return parse_report(data)


def _file(item: Any) -> RejectedFile:
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        raise ValueError("expected each file as {'name': ..., 'reason': ...}")
    try:
        return RejectedFile(item["name"], str(item.get("reason") or ""))
    except InputError as error:
        raise ValueError(str(error)) from None
