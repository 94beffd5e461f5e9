"""torchrun, started so that it cannot outlive `retrain train`.

    python -m training.engine.torchrun_agent <torchrun arguments>

The launcher records its pid in RETRAIN_PARENT_PID. Before any of torchrun's code runs, this process asks
the kernel to SIGKILL it when the launcher dies (and kills itself at once if the launcher is already gone),
then records its own pid there for the workers it starts. When the launcher dies, torchrun dies with it,
and its workers, seeing their parent gone (parent_watch.py), save at the agreed step and leave within 10 s.

SIGKILL rather than SIGTERM: torchrun's own graceful stop gives its workers 30 s before it kills them,
longer than a worker whose parent died is allowed to take.
"""

from __future__ import annotations

import os
import runpy
import signal

from training.engine.parent_watch import PARENT_PID_VARIABLE, die_with_parent


def main() -> None:
    die_with_parent(os.environ, signal.SIGKILL)
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())
    # torchrun reads sys.argv[1:], which are the arguments this module was given.
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
