"""Ctrl-C (SIGINT) or SIGTERM sent to the runner reaches the running step, which saves as on eviction;
the run then stops, Canceled, without restarting the step or starting the next one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.components.quick_pipeline import QuickPipeline
from helpers.components.run_requests import pinned_request

from components.local import RunStore
from components.request import CANCELED, COMPLETED
from components.specs import REPO_ROOT

READY_TIMEOUT_S = 30.0

RUNNER_SCRIPT = """
import os, sys
from pathlib import Path
from components.local import LocalRunner, RunnerOptions
from components.request import DataRef, RunRequest

state, pipeline, environment, version, uri = sys.argv[1:]
options = RunnerOptions(Path(state), pipeline_file=Path(pipeline), environment_file=Path(environment))
request = RunRequest(model_name="quick", data=DataRef(version, uri), parameters={"wait_for_signal": 1})
record = LocalRunner(options, os.environ, sys.stdout).run(request)
print("status", record.status, flush=True)
"""


def finish_log_once_ready(runs: Path, process: subprocess.Popen[str]) -> Path:
    """The finish step's log, once the step says it has installed its signal handlers."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        logs = list(runs.glob("*/finish/log.txt"))
        if logs and "ready: waiting for a stop signal" in logs[0].read_text():
            return logs[0]
        assert process.poll() is None, f"the runner exited with {process.returncode} before finish was ready"
        assert time.monotonic() < deadline, f"the finish step was not ready within {READY_TIMEOUT_S:.0f} s"
        time.sleep(0.01)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_to_the_runner_reaches_the_step_and_cancels_the_run(
    quick_pipeline: QuickPipeline, tmp_path: Path, signum: signal.Signals
):
    state = tmp_path / "state"
    request = pinned_request(state, quick_pipeline.raw, model_name="quick")
    arguments = [
        str(state), str(quick_pipeline.pipeline_file), str(quick_pipeline.environment_file),
        request.data.version, request.data.uri,
    ]  # fmt: skip
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER_SCRIPT, *arguments],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log = finish_log_once_ready(state / "runs", runner)
        runner.send_signal(signum)
        output, _ = runner.communicate(timeout=READY_TIMEOUT_S)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()

    assert runner.returncode == 0, output
    assert output.splitlines()[-1] == "status Canceled"
    assert f"run       stopped by {signum.name}; run the same command again to continue" in output
    record = RunStore(state / "runs").list()[0]
    assert record.status == CANCELED
    assert {step.name: step.status for step in record.steps} == {
        "make": COMPLETED, "double": COMPLETED, "finish": CANCELED
    }  # fmt: skip
    assert [attempt.exit_code for attempt in record.step("finish").attempts] == [75]  # not restarted
    assert f"received {signum.name}: state saved" in log.read_text()
    assert not list((state / "cache" / "finish").iterdir())  # no entry, and no staging folder left
