"""No worker outlives the process that started it: parent death is an eviction notice, with a deadline.

torchrun starts each worker in its own session, so killing `retrain train` and torchrun outright (kill -9
of the command's process group, an OOM kill, a supervisor's timeout) used to leave the workers training
and writing checkpoints as orphans, beside any restart. Each worker now learns of its parent's death at
once, two ways:

- the kernel sends it `PARENT_DEATH_SIGNAL` when the parent dies (Linux's PR_SET_PDEATHSIG). The kernel
  sends it when the parent *thread* that started this process exits, so the signal alone proves nothing:
  the worker acts only if its parent pid really changed;
- a watchdog thread compares `os.getppid()` with the parent's pid every `POLL_SECONDS` (the fallback where
  there is no PR_SET_PDEATHSIG, and while the main thread is blocked in a collective and cannot run a
  signal handler).

The parent to watch is the pid its starter recorded in `PARENT_PID_VARIABLE` (torchrun records its own,
see torchrun_agent.py), else the parent at start, so that a parent that died while the worker was still
importing torch is not missed.

Parent death is handled like SIGTERM: the ranks agree on a step, rank 0 saves a preempted checkpoint, and
the worker exits with 75. If that cannot finish (a peer is gone too, or a collective waits on the c10d store
that died with torchrun's agent), the worker ends itself with `os._exit(PARENT_LOST_EXIT_CODE)`
`PARENT_LOSS_DEADLINE_SECONDS` after it noticed; a checkpoint still being written then is never committed,
and the next start resumes from the last committed one. A worker whose parent dies before it has joined
its process group has nothing to save, and joining could wait forever on that store: it exits with
`PARENT_LOST_EXIT_CODE` at once.

Run a worker on its own (`python -m training.engine.worker`) under a process that outlives it: started
from a shell that then exits, it stops as if evicted.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType

from training.engine.preemption import PreemptionNotice

log = logging.getLogger(__name__)

# The process that starts a watched one records its own pid here; the child watches that pid.
PARENT_PID_VARIABLE = "RETRAIN_PARENT_PID"
# A worker whose parent died leaves this long after it noticed, whether or not its save completed.
PARENT_LOSS_DEADLINE_SECONDS = 10.0
# Exit code of a worker ended by the deadline: a crash, after which the next start resumes.
PARENT_LOST_EXIT_CODE = 1
POLL_SECONDS = 0.5

# A real-time signal: SIGTERM already means "evicted", and SLURM and others use SIGUSR1/SIGUSR2.
PARENT_DEATH_SIGNAL: int | None = signal.SIGRTMIN + 1 if hasattr(signal, "SIGRTMIN") else None

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send `signum` to this process when its parent dies (Linux only)."""
    return _prctl(_PR_SET_PDEATHSIG, signum)


def set_child_subreaper(enabled: bool) -> bool:
    """While set, orphans among this process's descendants are re-parented to it, not to init (Linux)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1 if enabled else 0)


def expected_parent(environ: Mapping[str, str]) -> int:
    """The pid this process's starter recorded for it, else its parent's pid now."""
    recorded = environ.get(PARENT_PID_VARIABLE, "")
    return int(recorded) if recorded.isdigit() else os.getppid()


def die_with_parent(environ: Mapping[str, str], signum: int = signal.SIGKILL) -> None:
    """Receive `signum` when the parent dies, and now if it already has (before the request could hold)."""
    parent = expected_parent(environ)
    set_parent_death_signal(signum)
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


class ParentWatch:
    """Turns the death of this process's parent into an eviction notice, then a hard deadline.

    Until `allow_save` is called (once the process group is joined) there is nothing to save, and joining
    may wait forever on a c10d store that died with the parent: a parent death then ends the process at once.
    """

    def __init__(
        self,
        notice: PreemptionNotice,
        parent_pid: int,
        deadline_seconds: float = PARENT_LOSS_DEADLINE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        exit_process: Callable[[int], object] = os._exit,
    ) -> None:
        self.parent_pid = parent_pid
        self.lost_at: float | None = None
        self._notice = notice
        self._deadline_seconds = deadline_seconds
        self._poll_seconds = poll_seconds
        self._exit_process = exit_process
        self._may_save = False
        self._lost = threading.Event()
        self._stopped = threading.Event()
        self._previous_handler: object = None
        # Two threads: the deadline waits on nothing but time before it ends the process, so a watchdog
        # blocked (say, logging to a full stderr) cannot hold it back.
        self._watchdog = threading.Thread(target=self._poll, name="parent-watchdog", daemon=True)
        self._deadline = threading.Thread(
            target=self._end_after_deadline, name="parent-deadline", daemon=True
        )

    def start(self) -> ParentWatch:
        on_main_thread = threading.current_thread() is threading.main_thread()
        if PARENT_DEATH_SIGNAL is not None and on_main_thread:
            self._previous_handler = signal.signal(PARENT_DEATH_SIGNAL, self._on_death_signal)
            set_parent_death_signal(PARENT_DEATH_SIGNAL)
        self._deadline.start()
        self._watchdog.start()
        self._check("start")  # after the request: a parent that died before it is caught here
        return self

    def allow_save(self) -> None:
        """From now on a parent death leaves `deadline_seconds` to agree on a step, save and exit."""
        self._may_save = True
        if self.lost_at is not None:  # lost meanwhile: the deadline thread decides whether it is too late
            self._notice.request(f"the parent process (pid {self.parent_pid}) is gone")

    def stop(self) -> None:
        """Stop watching. A deadline already running is kept: the process still ends by then."""
        self._stopped.set()
        if self._previous_handler is not None and PARENT_DEATH_SIGNAL is not None:
            set_parent_death_signal(0)  # first: the signal's default action would end the process
            signal.signal(PARENT_DEATH_SIGNAL, self._previous_handler)  # type: ignore[arg-type]
            self._previous_handler = None

    @property
    def parent_lost(self) -> bool:
        return self.lost_at is not None

    def _on_death_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self._check("the parent-death signal")

    def _check(self, noticed_by: str) -> None:
        if self.lost_at is not None or os.getppid() == self.parent_pid:
            return
        self.lost_at = time.monotonic()
        self._lost.set()
        if self._may_save:
            reason = f"the parent process (pid {self.parent_pid}) is gone (noticed by {noticed_by})"
            self._notice.request(reason)
            log.warning("this process ends within %.0f s, saved or not", self._deadline_seconds)

    def _poll(self) -> None:
        while not self._stopped.wait(self._poll_seconds) and self.lost_at is None:
            self._check("the watchdog")

    def _end_after_deadline(self) -> None:
        self._lost.wait()
        if self._may_save:
            # Nothing may keep this process alive past the deadline, not even a hung collective.
            time.sleep(max(0.0, (self.lost_at or 0.0) + self._deadline_seconds - time.monotonic()))
            why = f"died {self._deadline_seconds:.0f} s ago and this worker has not finished leaving"
        else:
            why = "is gone before this worker joined its process group: there is nothing to save"
        # Said from a thread of its own, waited for briefly: a blocked stderr must not hold the exit back.
        saying = threading.Thread(
            target=log.error,
            args=(
                "the parent process (pid %d) %s; exiting now with code %d, and the next start resumes "
                "from the last committed checkpoint",
                self.parent_pid,
                why,
                PARENT_LOST_EXIT_CODE,
            ),
            daemon=True,
        )
        saying.start()
        saying.join(0.5)
        self._exit_process(PARENT_LOST_EXIT_CODE)
