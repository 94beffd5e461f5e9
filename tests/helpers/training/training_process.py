"""Following a running `retrain train` from a test: which of its events to wait for, and losing its node."""

from __future__ import annotations

import signal
from collections.abc import Callable

import psutil

from training.engine.supervise import TrainingProcess


def is_step(at_least: int) -> Callable[[dict], bool]:
    return lambda event: event["event"] == "step" and event["step"] >= at_least


def is_checkpoint(step: int) -> Callable[[dict], bool]:
    return lambda event: event["event"] == "checkpoint" and event["step"] == step


def resumed_event(process: TrainingProcess) -> dict:
    return next(event for event in process.events_seen if event["event"] == "resumed")


def kill_process_tree(process: TrainingProcess) -> None:
    """SIGKILL the launcher, torchrun and every worker at once, as losing the node would."""
    root = psutil.Process(process.pid)
    everyone = [root, *root.children(recursive=True)]
    for member in everyone:
        member.send_signal(signal.SIGKILL)
    psutil.wait_procs(everyone)
    process.process.wait()
