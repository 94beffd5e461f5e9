"""torchrun, started so that it cannot outlive `retrain train`.

    python -m training.engine.torchrun_agent <torchrun arguments>

The launcher records its pid in RETRAIN_PARENT_PID. Before any of torchrun's code runs, this process asks
the kernel to SIGKILL it when the launcher dies (and kills itself at once if the launcher is already gone),
then records its own pid there for the workers it starts. When the launcher dies, torchrun dies with it,
and its workers, seeing their parent gone (parent_watch.py), save at the agreed step and leave within 10 s.

SIGKILL rather than SIGTERM: torchrun's own graceful stop gives its workers 30 s before it kills them,
longer than a worker whose parent died is allowed to take.

When a worker fails, torchrun raises ChildFailedError after copying the failed worker's report
(failure_report.py) into its own error file. This process then exits with torchrun's code, 1, without
torchrun's traceback: the launcher above prints the worker's reason from that file. A worker that left no
report (killed by a signal) gets one written here, naming its rank and how it ended.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

from training.engine.failure_report import report_to_launcher
from training.engine.parent_watch import PARENT_PID_VARIABLE, die_with_parent

FAILED_EXIT_CODE = 1  # torchrun's code for any failed worker


def main() -> int:
    die_with_parent(os.environ, signal.SIGKILL)
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        # torchrun reads sys.argv[1:], which are the arguments this module was given.
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
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
