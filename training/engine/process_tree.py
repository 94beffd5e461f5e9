"""End whatever this process started and left behind: every descendant, its process group and session.

torchrun starts each worker in a session of its own, so ending torchrun does not end its workers. The
launcher, a child subreaper while torchrun runs (orphans among its descendants come back to it), calls
`end_descendants` on every way out: each remaining descendant's process group (and every member of a
session a descendant leads) gets SIGTERM, then SIGKILL after a grace period, and the launcher reaps those
that are its children. Linux only (it reads /proc); elsewhere there is nothing to find and it returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_PROC = Path("/proc")
_POLL_SECONDS = 0.05
# After SIGKILL a process may still be finishing a write in the kernel: wait this long, then give up.
_KILL_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class ProcessEntry:
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool


def _read_entry(pid: int) -> ProcessEntry | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:  # gone meanwhile, or not Linux
        return None
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and ")", so split after the last one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessEntry(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0] in ("Z", "X"))


def _all_processes() -> list[ProcessEntry]:
    if not _PROC.is_dir():
        return []
    entries = (_read_entry(int(name)) for name in os.listdir(_PROC) if name.isdigit())
    return [entry for entry in entries if entry is not None]


def children(parent: int) -> set[int]:
    return {entry.pid for entry in _all_processes() if entry.ppid == parent}


def descendants(root: int, spare: Collection[int] = ()) -> list[ProcessEntry]:
    """Every process below `root` but outside the subtrees of `spare`, and every member of a session one of
    them leads (zombies included)."""
    table = [entry for entry in _all_processes() if entry.pid not in spare]
    below: dict[int, list[ProcessEntry]] = {}
    for entry in table:
        below.setdefault(entry.ppid, []).append(entry)
    found: dict[int, ProcessEntry] = {}
    stack = [root]
    while stack:
        for child in below.get(stack.pop(), []):
            if child.pid not in found:
                found[child.pid] = child
                stack.append(child.pid)
    # A session's members that were re-parented out of the tree (to init, where no subreaper caught them).
    sessions = {entry.sid for entry in found.values() if entry.sid == entry.pid}
    for entry in table:
        if entry.sid in sessions and entry.pid != root:
            found.setdefault(entry.pid, entry)
    return list(found.values())


def _reap(entries: list[ProcessEntry], parent: int) -> None:
    for entry in entries:
        if entry.ppid == parent and entry.zombie:
            with contextlib.suppress(ChildProcessError):  # reaped by its Popen meanwhile
                os.waitpid(entry.pid, os.WNOHANG)


def _signal(entries: list[ProcessEntry], signum: int, done: set[tuple[str, int]]) -> None:
    own_group = os.getpgrp()
    for entry in entries:
        # Never a whole group this process belongs to: that would end the launcher, or the shell's job.
        target = ("pid", entry.pid) if entry.pgid == own_group else ("group", entry.pgid)
        if target in done:
            continue
        done.add(target)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if target[0] == "group":
                os.killpg(target[1], signum)
            else:
                os.kill(target[1], signum)


def end_descendants(grace_seconds: float, spare: Collection[int] = ()) -> list[int]:
    """SIGTERM every live descendant's group, SIGKILL after `grace_seconds`, reap; returns the pids found.

    `spare`: children this process had before, which are none of this sweep's business, nor is anything
    below them."""
    root = os.getpid()
    signum, deadline = signal.SIGTERM, time.monotonic() + grace_seconds
    signalled: set[tuple[str, int]] = set()
    ended: set[int] = set()
    while True:
        everyone = descendants(root, spare)
        _reap(everyone, root)
        alive = [entry for entry in everyone if not entry.zombie]
        if not alive:
            return sorted(ended)
        if not ended:
            log.warning(
                "ending %d process(es) left behind: %s", len(alive), " ".join(str(e.pid) for e in alive)
            )
        ended.update(entry.pid for entry in alive)
        if time.monotonic() >= deadline:
            if signum == signal.SIGKILL:
                log.error("still running after SIGKILL: %s", " ".join(str(e.pid) for e in alive))
                return sorted(ended)
            signum, deadline = signal.SIGKILL, time.monotonic() + _KILL_WAIT_SECONDS
            signalled.clear()
        _signal(alive, signum, signalled)
        time.sleep(_POLL_SECONDS)
