"""Every change Retrain makes to torch's own code, in one place: what each replaces, why, and the torch
versions it has been tested on.

Both serve warm starts, and both are made only in a torchrun agent that was forked warm
(training/engine/torchrun_agent.py), never in a worker or a fresh agent:

- `fork_workers` makes torchrun fork its workers from the agent instead of exec'ing them (forked.py);
- `name_rendezvous_events_cheaply` keeps torchrun's rendezvous from walking every imported module's source
  on each event it records, which a warm process, having imported everything, makes slow.

Each replaces a private part of torch.distributed.elastic, which torch may change in any release without
notice. tests/training/warm/test_torch_patches.py holds each to what it assumes of its target (its
signature, how torch calls it, what torch does with its result) and to the versions listed here: a torch
other than these fails that test, which is when to read the targets again and add the new version.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

# The torch every patch has been tested on: the pinned one (components/environment/requirements.txt).
TESTED_TORCH = ("2.13.0",)


@dataclass(frozen=True)
class TorchPatch:
    """One replaced part of torch: `target` is `module:attribute` (a dotted attribute path)."""

    target: str
    why: str
    tested_on: tuple[str, ...] = TESTED_TORCH


SUBPROCESS_POPEN = TorchPatch(
    "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler:SubprocessHandler._popen",
    "torchrun execs each worker as `python -u -m MODULE`; a warm agent forks it instead, already holding "
    "torch and the worker's imports, so each worker skips seconds of start-up",
)
RENDEZVOUS_METHOD_NAME = TorchPatch(
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous:get_method_name",
    "it names each rendezvous event by its caller through `inspect.stack()`, which reads every frame's "
    "source and looks each up among all imported modules: 4 s of a 1-node rendezvous in a warm process that "
    "otherwise takes 0.2 s; the same name is read from the frame directly",
)
PATCHES = (SUBPROCESS_POPEN, RENDEZVOUS_METHOD_NAME)


def fork_workers() -> None:
    """Make torchrun fork the workers it would exec as `python -u -m MODULE`; anything else it execs.

    Relies on `SubprocessHandler.__init__` opening the worker's output files as `_stdout` and `_stderr`
    before it calls `self._popen(args, env)`, and on torchrun using only the result's pid, poll, wait and
    send_signal, which ForkedProcess has."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    from training.warm.forked import ForkedProcess, module_command

    handler_class = subprocess_handler.SubprocessHandler
    exec_it = handler_class._popen

    def popen(handler: Any, args: tuple, env: dict[str, str]) -> Any:
        command = module_command([str(part) for part in args])
        if command is None:
            return exec_it(handler, args, env)
        module, arguments, unbuffered = command
        stdout, stderr = handler._stdout, handler._stderr
        return ForkedProcess(
            module, arguments, env=env, cwd=os.getcwd(), stdout=stdout, stderr=stderr, unbuffered=unbuffered
        )

    handler_class._popen = popen  # type: ignore[method-assign,assignment]


def method_name(depth: int = 2) -> str:
    """`dynamic_rendezvous.get_method_name`'s answer, `inspect.stack()[depth].function`, read from the
    frame alone."""
    try:
        return sys._getframe(depth).f_code.co_name  # frame 0 is this function, as stack()[0] was
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def name_rendezvous_events_cheaply() -> None:
    """Relies on the rendezvous calling `get_method_name()` through its module's global name."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.get_method_name = method_name
