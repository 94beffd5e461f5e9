"""Entry points for the flush race and crash tests, run in fresh processes (spawn: importable, not in a
test file), and the Azure ML control plane's stand-in they submit to.

`JobBoard` plays Azure ML's job service at the `Submitter` seam, in a folder every process shares: a job
is created once under its name (Azure ML refuses a duplicate name), and its status can be asked for by name
from any process, as a recovering flush asks for it. Every job ends at once, Completed. A board told to
refuse plays the local submitter whose pre-run check refuses the run before anything runs (`RunRefused`)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.errors import RunRefused, SubmissionError
from components.request import COMPLETED, RunRequest, Submission
from core.files import create_atomically
from function_app.service import FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

BARRIER_TIMEOUT_S = 60.0
BACKEND = "job-board"


class JobBoard:
    def __init__(self, folder: Path, refuse: str | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.refuse = refuse

    def submit(self, request: RunRequest) -> Submission:
        if self.refuse is not None:
            raise RunRefused(self.refuse)
        name = request.job_name()
        job = {"job_name": name, "run_key": request.run_key, "data": request.data.uri, "tags": request.tags()}
        create_atomically(self.folder / f"{name}.json", json.dumps(job).encode())  # False: it exists already
        return self.status(name)

    def status(self, job_name: str) -> Submission:
        path = self.folder / f"{job_name}.json"
        if not path.is_file():
            raise SubmissionError(f"job {job_name!r}: not found on the board")
        job = json.loads(path.read_text())
        return Submission(job_name, BACKEND, COMPLETED, job["run_key"])

    def jobs(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in sorted(self.folder.glob("*.json"))]


def front_door(
    environ: Mapping[str, str],
    board: Path,
    on_step: Callable[[str], None] | None = None,
    refuse: str | None = None,
) -> FrontDoor:
    settings = AppSettings.from_environ(environ)
    return build_front_door(settings, environ, submitter=JobBoard(board, refuse), on_step=on_step)


def flush_in_trials(
    trials: list[tuple[dict[str, str], str]], worker: int, barrier: Any, results: Any
) -> None:
    """Flush `--now` each trial's ledger together with the other workers (one barrier per trial)."""
    doors = [front_door(environ, Path(board)) for environ, board in trials]
    for trial, door in enumerate(doors):
        barrier.wait(BARRIER_TIMEOUT_S)
        try:
            submitted = [record.id for record in door.flush(ignore_quiet=True)]
        except Exception as error:  # reported to the test, which fails on it
            submitted = [f"error: {type(error).__name__}: {error}"]
        results.put((trial, worker, submitted))


def flush_and_die_at(environ: dict[str, str], board: str, step: str, refuse: str | None = None) -> None:
    """Flush, and SIGKILL this very process when the flush reaches `step` (function_app/flush.py STEPS,
    or HELD_STEP with a board that refuses)."""

    def die(reached: str) -> None:
        if reached == step:
            os.kill(os.getpid(), signal.SIGKILL)

    front_door(environ, Path(board), on_step=die, refuse=refuse).flush(ignore_quiet=True)


def run_together(target: Any, arguments: list[tuple[Any, ...]], rounds: int) -> list[Any]:
    """Run `target(*arguments[i], barrier, results)` in fresh processes that meet at a barrier each round;
    returns what they put in `results`."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(arguments)), context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results)) for args in arguments]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in range(rounds * len(processes))]
    for process in processes:
        process.join(timeout=60)
        if process.exitcode != 0:
            raise AssertionError(f"flush process exited with {process.exitcode}")
    return outcomes


def run_to_death(environ: dict[str, str], board: str, step: str, refuse: str | None = None) -> int:
    """Run `flush_and_die_at` in a fresh process; its exit code (-9 when it died at the step)."""
    process = multiprocessing.get_context("spawn").Process(
        target=flush_and_die_at, args=(environ, board, step, refuse)
    )
    process.start()
    process.join(timeout=120)
    return process.exitcode
