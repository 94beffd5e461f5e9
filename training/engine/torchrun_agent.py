"""torchrun, started so that it cannot outlive `retrain train`.

    python -m training.engine.torchrun_agent <torchrun arguments>

The launcher records its pid in RETRAIN_PARENT_PID. Before any of torchrun's code runs, this process asks
the kernel to SIGKILL it when the launcher dies (and kills itself at once if the launcher is already gone),
then records its own pid there for the workers it starts. When the launcher dies, torchrun dies with it,
and its workers, seeing their parent gone (parent_watch.py), save at the agreed step and leave within 10 s.

SIGKILL rather than SIGTERM: torchrun's own graceful stop gives its workers 30 s before it kills them,
longer than a worker whose parent died is allowed to take.

torchrun starts each worker as `python -u -m MODULE ...` in a session of its own. Here it forks them from
this process instead (training/warm/forked.py), when this process has already imported what a worker
imports (its launcher, launch.py, forked it after preloading them): the workers are then still its
children, in sessions of their own, with their own output files, and they skip seconds of start-up each.
Exec'd (RETRAIN_WARM_START=off, core/warm_start.py, or a launcher running threads), it execs them as
torchrun does.

When a worker fails, torchrun raises ChildFailedError after copying the failed worker's report
(failure_report.py) into its own error file. This process then exits with torchrun's code, 1, without
torchrun's traceback: the launcher above prints the worker's reason from that file. A worker that left no
report (killed by a signal) gets one written here, naming its rank and how it ended.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from core.warm_start import warm_start_setting
from training.engine.failure_report import report_to_launcher
from training.engine.parent_watch import PARENT_PID_VARIABLE, die_with_parent
from training.warm.torch_patches import fork_workers, name_rendezvous_events_cheaply

FAILED_EXIT_CODE = 1  # torchrun's code for any failed worker


WORKER_MODULE = "training.engine.worker"


def main() -> int:
    die_with_parent(os.environ, signal.SIGKILL)
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # Preloaded: this process was forked warm, which RETRAIN_WARM_START=off rules out (launch.py); read
    # again all the same, so that no fork of this process's escapes the switch.
    if WORKER_MODULE in sys.modules and warm_start_setting(os.environ):
        # torch's own code, changed to fork the workers (training/warm/torch_patches.py).
        fork_workers()
        name_rendezvous_events_cheaply()

    try:
        # torchrun's `main` reads sys.argv[1:], which are the arguments this module was given. Called, not
        # run as `__main__` with runpy: a warm process has imported the module already, and runpy would warn
        # "'torch.distributed.run' found in sys.modules" at the head of every train log.
        from torch.distributed.run import main as torchrun

        torchrun()
    except ChildFailedError as error:
        # torchrun has copied the first failed worker's report into its own error file; its traceback
        # and table would bury that reason, which the launcher above prints in one line.
        rank, failure = error.get_first_failure()
        if not Path(failure.error_file).is_file():
            report_to_launcher(os.environ, _no_report(rank, failure.exitcode), failure.exitcode or 1)
        return FAILED_EXIT_CODE
    return 0


def _no_report(rank: int, exit_code: int) -> str:
    """The reason of a worker that wrote no report: killed (the OOM killer's SIGKILL), or it died before
    it could (its own output says why)."""
    if exit_code < 0 and -exit_code in signal.valid_signals():
        how = f"was killed by {signal.Signals(-exit_code).name} (out of memory?)"
    else:
        how = f"exited with code {exit_code}"
    return f"training worker rank {rank} {how} without saying why; its output above may"


if __name__ == "__main__":
    sys.exit(main())
