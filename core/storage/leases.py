"""The lease: the right to be the only writer of something, with a local twin (an flock(2) on a file,
core/storage/local.py) and a Blob twin (a renewed blob lease, core/storage/blob.py).

    take(holder)   take it without waiting; False when another holder has it. `holder` (bytes: who takes it)
                   is stored with it while it is held, for a refused taker to name
    lost           true once a held lease could not be kept (a renewal failed, the lock file was replaced):
                   its holder must stop writing
    release()      let it go (a released lease names nobody)
    holder()       who holds it now, as its holder wrote it (HeldBy); None when nobody does

A holder that dies loses its lease: the kernel drops a dead process's flock at once, and a blob lease that
is no longer renewed expires. `take_within` waits for a lease up to a bound; `holder_stamp` is the common
way a holder names itself, `read_holder_stamp` reads it back as a `Holder`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldBy:
    """A held lease as its storage reports it: the holder's bytes, and what kind of lease it is: `endless`
    for one that never expires (taken by a person or another tool: no lease here is), `dies_with_holder`
    where it cannot outlive its process (a file lock)."""

    stamp: bytes
    endless: bool = False
    dies_with_holder: bool = False


class Lease(Protocol):
    @property
    def location(self) -> str:
        """Where the lease is, for messages; never contains a secret."""
        ...

    @property
    def lost(self) -> bool: ...

    def take(self, holder: bytes) -> bool: ...

    def release(self) -> None: ...

    def holder(self) -> HeldBy | None: ...


def take_within(
    lease: Lease,
    holder: Callable[[], bytes],
    wait_seconds: float,
    next_interval: Callable[[], float],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[], None] | None = None,
) -> bool:
    """Take `lease`, trying again after `next_interval()` seconds while another holder has it, for up to
    `wait_seconds`; False when it was still held then. `on_wait` is called once, before the first wait."""
    deadline = clock() + wait_seconds
    waiting = False
    while not lease.take(holder()):
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        if not waiting and on_wait is not None:
            on_wait()
        waiting = True
        sleep(min(next_interval(), remaining))
    return True


# -- who holds it ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its holder wrote it with `holder_stamp` (`who`, `since`: None where it wrote
    nothing readable, e.g. a lease someone took by hand), and its kind (see HeldBy): holding a lease that
    dies with its holder long means a live, slow holder, never a dead one."""

    who: str | None
    since: datetime | None
    endless: bool = False
    dies_with_holder: bool = False

    def age_seconds(self, now: datetime) -> float | None:
        """How long it has been held by `now`; never negative (the holder's clock may run ahead)."""
        return None if self.since is None else max(0.0, (now - self.since).total_seconds())


def holder_stamp(now: datetime | None = None) -> bytes:
    """What a holder writes of itself on taking a lease: this process and host, and the time."""
    taken = now or datetime.now(UTC)
    return json.dumps(
        {"who": f"pid {os.getpid()} on {socket.gethostname()}", "since": taken.isoformat()}
    ).encode()


def read_holder_stamp(held: HeldBy) -> Holder:
    """A Holder from what `holder_stamp` wrote; fields that cannot be read are None (a report, not a
    record: it must never stop its reader). An endless lease's stamp is not its holder's (see HeldBy)."""
    try:
        fields = {} if held.endless else json.loads(held.stamp.decode())
    except (UnicodeDecodeError, ValueError):
        fields = {}
    fields = fields if isinstance(fields, dict) else {}
    who = fields.get("who") if isinstance(fields.get("who"), str) else None
    try:
        since = datetime.fromisoformat(fields["since"])
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
    except (KeyError, TypeError, ValueError):
        since = None
    return Holder(
        who[:200] if who else None, since, endless=held.endless, dies_with_holder=held.dies_with_holder
    )


# -- keeping a blob lease ----------------------------------------------------------------------------------


class LeaseRenewal:
    """Keeps a held lease alive: calls `renew` every `every_seconds` on a daemon thread until `stop()`.

    `lost` turns true at the first renewal that fails (logged once, naming `what`; the thread then ends),
    and also once no renewal has succeeded for `valid_seconds - every_seconds`, the lease's duration less
    one period: a renewal call that hangs cannot be interrupted, and its holder must stop writing before
    the lease may have expired and another holder may have taken it. `describe` turns a failure into a
    secret-free reason for the log.
    """

    def __init__(
        self,
        renew: Callable[[], object],
        every_seconds: float,
        valid_seconds: float,
        what: str,
        describe: Callable[[BaseException], str] = lambda error: type(error).__name__,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < every_seconds < valid_seconds:
            raise ValueError(f"renewing every {every_seconds} s cannot keep a {valid_seconds} s lease")
        self._renew_call = renew
        self._every_seconds = every_seconds
        self._stale_after = valid_seconds - every_seconds
        self._what = what
        self._describe = describe
        self._clock = clock
        self._renewed_at = clock()  # the lease was just acquired (or renewed) by the caller
        self._failed = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"renew {what}"[:60], daemon=True)
        self.thread.start()

    @property
    def lost(self) -> bool:
        return self._failed or self._clock() - self._renewed_at >= self._stale_after

    def stop(self) -> None:
        """Stop renewing (waits for a renewal in progress); the caller then releases the lease itself."""
        self._stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every_seconds):
            started = self._clock()  # the service counts the new period from no earlier than this
            try:
                self._renew_call()
            except Exception as error:  # whatever stops the renewal loses the lease: the holder must know
                self._failed = True
                log.warning("lost %s: %s", self._what, self._describe(error))
                return
            self._renewed_at = started
