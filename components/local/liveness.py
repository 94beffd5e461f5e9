"""Whether the process that owns something local (a run, a lock, a staging folder) is still alive.

A process id alone is not an identity: ids are recycled, so a record naming pid 4242 may meet another
process that got 4242 since. A process is named by its host, its pid and its start: on Linux the boot's id
and the start time in clock ticks since boot from `/proc/<pid>/stat` (neither moves when the wall clock is
set); elsewhere `ps -o lstart=`, the start to the second. The process named is alive only if a process with
that pid exists now and started at that very moment. On another host nothing can be told (`None`).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROC = Path("/proc")
_BOOT_ID = _PROC / "sys/kernel/random/boot_id"


def start_token(pid: int) -> str | None:
    """What names the start of process `pid` (None: no such process now)."""
    if pid <= 0:
        return None
    stat = _PROC / str(pid) / "stat"
    if _BOOT_ID.is_file():
        try:
            text = stat.read_text()
        except (FileNotFoundError, ProcessLookupError):
            return None
        # Fields after the command name (which may hold spaces and parentheses): state is field 3, the start
        # time (ticks since boot) field 22.
        fields = text[text.rindex(")") + 2 :].split()
        return f"{_BOOT_ID.read_text().strip()}:{fields[19]}"
    found = subprocess.run(
        ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    started = found.stdout.strip()
    return started or None


@dataclass(frozen=True)
class ProcessIdentity:
    """One process, as a record names its owner: host, pid and start (`start_token`)."""

    host: str
    pid: int
    start: str

    @classmethod
    def current(cls) -> ProcessIdentity:
        return cls.of(os.getpid())

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        token = start_token(pid)
        if token is None:
            raise ProcessLookupError(f"process {pid}: not running")
        return cls(socket.gethostname(), pid, token)

    def alive(self, probe: Callable[[int], str | None] = start_token) -> bool | None:
        """True while this very process runs; False once it has ended; None on another host."""
        if self.host != socket.gethostname():
            return None
        return probe(self.pid) == self.start

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "start": self.start}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ProcessIdentity | None:
        """The identity a record holds; None for a record written before identities were kept."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(str(data["host"]), int(data["pid"]), str(data["start"]))
        except (KeyError, TypeError, ValueError):
            return None


def processes_with_environment(name: str, value: str) -> list[int]:
    """The pids of this user's processes whose environment has `name=value` (Linux; elsewhere []).

    A step's processes, and every process they start, carry their pipeline run's id in
    RETRAIN_PIPELINE_RUN: this finds them even when the runner that started them is gone."""
    if not _BOOT_ID.is_file():
        return []
    wanted = f"{name}={value}".encode()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if wanted in environment.split(b"\0"):
            found.append(int(entry.name))
    return found
