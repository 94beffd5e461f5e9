"""No worker outlives its launcher: real torchrun, gloo, 2 processes, killed outright.

torchrun starts each worker in a session of its own, so a kill of `retrain train`'s process group reaches
the launcher and torchrun but not the workers. They must learn of it, save at the agreed step and leave.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil
from helpers.training.run_outputs import newest_record, read_metadata
from helpers.training.training_process import is_step, resumed_event

from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import RECORD_SUFFIX, CheckpointRecord, committed_checkpoints
from training.engine.parent_watch import PARENT_LOST_EXIT_CODE
from training.engine.preemption import PREEMPTED_EXIT_CODE
from training.engine.supervise import TrainingProcess

# The bound: 15 s after the kill nothing of the run is running.
GONE_WITHIN_SECONDS = 15.0


def run_members(process: TrainingProcess) -> tuple[psutil.Process, list[psutil.Process]]:
    """torchrun, the launcher's child, and its two workers, each in a session of its own."""
    (agent,) = psutil.Process(process.pid).children()
    workers = agent.children()
    # A forked agent's command line is its title, one string (training/warm/forked.py).
    assert "training.engine.torchrun_agent" in " ".join(agent.cmdline()) and len(workers) == 2
    assert all(os.getsid(worker.pid) == worker.pid != os.getsid(process.pid) for worker in workers)
    return agent, workers


def exit_watchers(pids: Iterable[int]) -> list[int]:
    """A pidfd per process, opened while it runs, so a later pid reuse cannot fool the wait."""
    return [os.pidfd_open(pid) for pid in pids]


def still_running_after(pidfds: list[int], seconds: float) -> int:
    """Wait until every process has exited (a pidfd turns readable then) or `seconds` pass; the count left."""
    deadline = time.monotonic() + seconds
    waiting = list(pidfds)
    while waiting:
        ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
        if not ready:  # the time is up
            break
        waiting = [fd for fd in waiting if fd not in ready]
    for fd in pidfds:
        os.close(fd)
    return len(waiting)


def records(checkpoints: str) -> dict[str, CheckpointRecord]:
    store = LocalCheckpointStore(Path(checkpoints))
    return {
        name: CheckpointRecord.from_bytes(store.read(name + RECORD_SUFFIX), name)
        for name in committed_checkpoints(store.names())
    }


def train_until_durable(
    start_fresh_training, after: int = 0
) -> tuple[TrainingProcess, psutil.Process, list[int]]:
    """A 2-process run past a checkpoint it made after step `after`, with exit watchers on torchrun and
    the workers."""
    process = start_fresh_training()
    made = process.wait_for(lambda event: event["event"] == "checkpoint" and event["step"] > after)
    process.wait_for(is_step(made["step"] + 3))  # mid-interval
    agent, workers = run_members(process)
    return process, agent, exit_watchers([agent.pid, *(worker.pid for worker in workers)])


def test_killing_the_launchers_group_then_the_launcher_alone_leaves_no_worker_and_loses_nothing(
    uninterrupted_run, start_fresh_training, folders
):
    killed_launches, durable = [], 0
    for kill in (
        lambda pid: os.killpg(pid, signal.SIGKILL),  # launcher and torchrun; workers: own sessions
        lambda pid: os.kill(pid, signal.SIGKILL),  # `retrain train` alone: torchrun is its child
    ):
        process, agent, watchers = train_until_durable(start_fresh_training, after=durable)
        # The workers are held still while their launcher dies: left running, a loaded machine could let
        # them reach the last step (a "final" save) before the news of their parent's death does.
        _, workers = run_members(process)
        for worker in workers:
            worker.suspend()
        kill(process.pid)
        process.process.wait()
        agent.wait(timeout=GONE_WITHIN_SECONDS)  # torchrun: killed with the group, or by its parent's death
        for worker in workers:
            worker.resume()  # the parent-death signal, pending while they were stopped, comes first
        assert still_running_after(watchers, GONE_WITHIN_SECONDS) == 0
        process.finish()  # the workers' last events, up to their closing the output
        newest = newest_record(folders.checkpoints)
        # The workers honoured their parent's death as an eviction: the agreed step, saved by that launch.
        assert newest.reason == "preempted" and newest.step > durable
        killed_launches.append(newest.launch_id)
        durable = newest.step
        left = records(folders.checkpoints)

    restart = start_fresh_training()
    assert restart.finish() == 0
    assert resumed_event(restart)["checkpoint"] == newest.name
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == uninterrupted_run["weights_sha256"]
    attempts = metadata["attempts"]
    assert [attempt["launch_id"] for attempt in attempts[:2]] == killed_launches
    assert [attempt["ended"] for attempt in attempts] == ["preempted", "preempted", "completed"]
    # Once the workers were gone, only the restart wrote into the folder.
    for name, record in records(folders.checkpoints).items():
        assert name in left or record.launch_id == attempts[-1]["launch_id"]


def test_killing_torchrun_alone_brings_its_workers_back_to_the_launcher(start_fresh_training, folders):
    process, agent, watchers = train_until_durable(start_fresh_training)

    agent.kill()  # as the OOM killer would: the launcher lives on, the workers lose their parent
    assert process.finish() == PREEMPTED_EXIT_CODE  # the workers saved at the agreed step, then it ended
    assert still_running_after(watchers, 0) == 0
    newest = newest_record(folders.checkpoints)
    assert newest.reason == "preempted" and newest.step >= 13


# A process that watches its parent as a worker does, under a middle process that the test kills, under a
# harness that is a child subreaper, so that the orphan comes back to it and it can read the exit code.
WATCHED = """
import logging, os, sys, threading
from training.engine.parent_watch import ParentWatch, expected_parent
from training.engine.preemption import PreemptionNotice
logging.basicConfig(level=logging.INFO, format="%(message)s")
notice = PreemptionNotice()
watch = ParentWatch(notice, expected_parent(os.environ), deadline_seconds=1.0).start()
if sys.argv[1] == "joined":
    watch.allow_save()
print("watching", flush=True)
threading.Event().wait()  # like a worker stuck in a collective whose peer is gone: it never leaves by itself
"""
MIDDLE = """
import os, subprocess, sys
watched = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], start_new_session=True,
                           env={**os.environ, "RETRAIN_PARENT_PID": str(os.getpid())})
print(watched.pid, flush=True)
watched.wait()
"""
HARNESS = """
import os, subprocess, sys
from training.engine.parent_watch import set_child_subreaper
assert set_child_subreaper(True)
middle = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], stdout=subprocess.PIPE, text=True)
lines = {middle.stdout.readline().strip(), middle.stdout.readline().strip()}  # the pid, and "watching"
(watched,) = (int(line) for line in lines if line.isdigit())
middle.kill()
middle.wait()
print(os.waitstatus_to_exitcode(os.waitpid(watched, 0)[1]))
"""


def orphan_exit(stage: str) -> tuple[int, str]:
    """Kill the watched process's parent; the watched one's exit code and its log."""
    harness = subprocess.run(
        [sys.executable, "-c", HARNESS, MIDDLE, WATCHED, stage],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert harness.returncode == 0, harness.stderr
    return int(harness.stdout), harness.stderr


def test_a_worker_that_cannot_finish_leaving_is_ended_by_the_deadline():
    code, log = orphan_exit("joined")
    assert code == PARENT_LOST_EXIT_CODE
    assert re.search(
        r"is gone \(noticed by the (parent-death signal|watchdog)\): saving after the current", log
    )
    assert "died 1 s ago and this worker has not finished leaving; exiting now with code 1" in log


def test_a_worker_whose_parent_dies_before_it_joins_its_group_leaves_at_once():
    code, log = orphan_exit("starting")
    assert code == PARENT_LOST_EXIT_CODE
    assert "saving" not in log
    assert "is gone before this worker joined its process group: there is nothing to save" in log


LEAVES_TWO_BEHIND = """
import subprocess, sys
# Each in a session of its own, as torchrun starts its workers; the second one ignores SIGTERM.
quiet = {"stdin": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
polite = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL, **quiet
)
stubborn = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
     "print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True, **quiet,
)
stubborn.stdout.readline()
print(polite.pid, stubborn.pid)
"""
LAUNCHER = """
import os, subprocess, sys
from training.engine.parent_watch import set_child_subreaper
from training.engine.process_tree import children, end_descendants
assert set_child_subreaper(True)
unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not the run's
spare = children(os.getpid())
left = [int(pid) for pid in subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True,
                                           text=True, check=True).stdout.split()]
ended = end_descendants(0.5, spare)
print(sorted(left) == ended, [os.path.exists(f"/proc/{pid}") for pid in left], unrelated.poll() is None)
unrelated.kill()
"""


def test_the_launcher_ends_and_reaps_what_its_children_left_behind():
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCHER, LEAVES_TWO_BEHIND],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launcher.returncode == 0, launcher.stderr
    # Both orphans came back to the subreaper, were ended (SIGTERM, then SIGKILL for the stubborn one) and
    # reaped: no zombie is left under /proc. The child it had before was spared.
    assert launcher.stdout.split() == ["True", "[False,", "False]", "True"]
