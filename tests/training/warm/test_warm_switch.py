"""RETRAIN_WARM_START=0 switches off every fork of a warm start, torchrun's agent and its workers included:
each is then an interpreter exec'd with the command line and environment torchrun gives it. On (the
default), `retrain train`'s launcher forks the agent, and the agent forks the workers, so the same check
sees the forks. Real torchrun, gloo, 2 processes, the launcher started fresh as an operator's shell
starts it.

What tells an exec'd process from a fork is what the kernel was given at its last exec, which a fork only
copies from its parent: its argument vector (/proc/PID/cmdline) and its environment (/proc/PID/environ, which
no later change of os.environ reaches).
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest
from helpers.training.training_process import is_step, kill_process_tree

from core.warm_start import WARM_START_VARIABLE
from training.engine.parent_watch import PARENT_PID_VARIABLE

AGENT = [sys.executable, "-m", "training.engine.torchrun_agent"]
WORKER = [sys.executable, "-u", "-m", "training.engine.worker"]


def _exec_time(process: psutil.Process) -> tuple[list[str], dict[str, str]]:
    """The argument vector and environment `process` was exec'd with, as the kernel keeps them (a fork's:
    its parent's, unless a process title has since been written over them). Read raw: psutil splits a
    title at its spaces, which would make it look like an argument vector."""
    argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    return [word.decode() for word in argv], process.environ()


@pytest.mark.parametrize(("setting", "forked"), [("0", False), ("1", True)])
def test_the_warm_start_switch_decides_whether_torchruns_agent_and_workers_are_forked(
    start_fresh_training, setting, forked
):
    process = start_fresh_training(env={WARM_START_VARIABLE: setting})
    process.wait_for(is_step(1))  # rank 0 trains: torchrun's agent and both workers are running
    try:
        launcher = psutil.Process(process.pid)
        (agent,) = launcher.children()
        workers = agent.children()
        assert len(workers) == 2
        agent_argv, agent_environ = _exec_time(agent)
        worker_views = [_exec_time(worker) for worker in workers]
    finally:
        kill_process_tree(process)

    # Exec'd: the agent's own command line, and the environment the launcher gave it (its own pid as the
    # agent's parent); each worker's, with the rank torchrun gave it. Forked: none of that reached exec.
    agent_execd = agent_argv[: len(AGENT)] == AGENT and agent_environ.get(PARENT_PID_VARIABLE) == str(
        launcher.pid
    )
    assert agent_execd is not forked, (agent_argv, sorted(agent_environ))
    ranks = sorted(environ.get("RANK", "none") for _, environ in worker_views)
    workers_execd = [argv[: len(WORKER)] == WORKER for argv, _ in worker_views]
    if forked:
        assert workers_execd == [False, False] and ranks == ["none", "none"], worker_views
        # A forked agent still shows what it runs: its title (training/warm/forked.py).
        assert "training.engine.torchrun_agent" in " ".join(agent_argv)
    else:
        assert workers_execd == [True, True] and ranks == ["0", "1"], worker_views


def test_a_setting_it_does_not_know_is_refused_in_one_line_before_anything_starts(start_training, folders):
    process = start_training(env={WARM_START_VARIABLE: "sometimes"})
    assert process.finish() == 2
    said = (folders.logs / "attempt-1.log").read_text()
    assert "RETRAIN_WARM_START='sometimes': expected on or off" in said, said
    assert not process.events_seen and not folders.out.exists()  # no worker ever ran
