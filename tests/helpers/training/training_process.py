"""Following a running `retrain train` from a test: which of its events to wait for, and losing its node."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from helpers.training.run_outputs import newest_record
from helpers.training.small_run import NO_TRACKING, train_arguments
from helpers.training.warm_training import WarmStarts
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
    process.process.wait()  # a warm one's end is its starter's to report


def train_to_end(
    starts: WarmStarts, data: Path, root: Path, extra: Sequence[str] = (), nproc: int = 2
) -> TrainingProcess:
    """The small run with `extra` options, uninterrupted, into `root`/out (its checkpoints in
    `root`/checkpoints), forked by `starts`; finished with code 0, or its stderr shown."""
    arguments = train_arguments(data, root / "out", root / "checkpoints", nproc)
    root.mkdir(parents=True, exist_ok=True)
    with (root / "stderr.log").open("w") as log:
        process = starts.training([*arguments, *NO_TRACKING, *extra], stderr=log)
        code = process.finish()
    assert code == 0, (root / "stderr.log").read_text()[-3000:]
    return process


def kill_mid_interval(process: TrainingProcess, checkpoints: str) -> int:
    """Once `process` has checkpointed, SIGKILL it a few steps later (mid-interval, mid-epoch, maybe
    mid-accumulation), as losing the node would; returns the step of the newest durable checkpoint."""
    seen = process.wait_for(lambda event: event["event"] == "checkpoint")
    process.wait_for(is_step(seen["step"] + 5))
    kill_process_tree(process)
    return newest_record(checkpoints).step


def kill_twice_then_finish(
    start: Callable[[], TrainingProcess], checkpoints: str
) -> tuple[list[int], list[dict]]:
    """Start, let it checkpoint, SIGKILL the whole tree a few steps later; twice; then start once more and let
    it finish (code 0). Returns the newest durable checkpoint's step at each kill, and each restart's
    `resumed` event.

    What the trainer guarantees, not when things happen: progress is read behind the trainer, so a later
    checkpoint may become durable between the step seen and the kill. Each restart must resume from the
    newest checkpoint durable at the kill (never an older one), at exactly its sample."""
    durable_at_kill: list[int] = []
    resumes: list[dict] = []
    for _ in range(2):
        process = start()
        after = durable_at_kill[-1] if durable_at_kill else 0
        seen = process.wait_for(
            lambda event, after=after: event["event"] == "checkpoint" and event["step"] > after
        )
        process.wait_for(is_step(seen["step"] + 5))  # mid-interval, mid-epoch
        if durable_at_kill:
            resumes.append(resumed_event(process))
        kill_process_tree(process)
        newest = newest_record(checkpoints)
        assert newest.step >= seen["step"]
        durable_at_kill.append(newest.step)
    final = start()
    assert final.finish() == 0
    resumes.append(resumed_event(final))
    return durable_at_kill, resumes
