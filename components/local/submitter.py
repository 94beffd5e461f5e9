"""The embedded default Submitter: run the request's pipeline here and now, and report how it ended.

`submit` returns once the run has ended: Completed, Failed (a step exited non-zero; the details name it
and carry its log tail) or Canceled (the runner was told to stop). Bad requests and bad specs still raise,
as with any submitter. `status` reads the newest local run record of a job name; a run whose runner died
(an `Abandoned` run, components/local/runs.py) is a Failed job, its reason in the details.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from components.errors import JobNotFound
from components.local import LocalRunner, LocalStepFailed, RunnerOptions, RunRecord, RunStore
from components.local.launch import ProcessStarted
from components.local.runs import ABANDONED
from components.outcome import PREPARED_KEY, gate_details, rejected_details
from components.preflight import Preflight
from components.request import COMPLETED, FAILED, RunRequest, Submission
from components.specs import PREP_STEP, PREPARED_OUTPUT
from components.submitters import SubmitterContext
from core.rejected_inputs import REPORT_OUTPUT

log = logging.getLogger(__name__)

BACKEND = "local"


class _LoggingStream(io.TextIOBase):
    """Progress lines, for a caller with no terminal (the Function App): one log record per line."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                log.info("%s", line)
        return len(text)


def _details(record: RunRecord) -> dict[str, Any]:
    prepared = [
        step.outputs[PREPARED_OUTPUT]
        for step in record.steps
        if step.name == PREP_STEP and step.status == COMPLETED and PREPARED_OUTPUT in step.outputs
    ]
    return {
        "run_id": record.run_id,
        "outputs": dict(record.outputs),
        "steps": {step.name: {"status": step.status, "reused": step.reused} for step in record.steps},
        "failed_step": record.failed_step,
        "error": record.error,
        # The gate's decision, so that a caller of the submitter learns what the run changed.
        **gate_details(record.outputs),
        # The raw files prep left out, which the front door never pins again: known once prep completed,
        # whatever a later step did.
        **rejected_details(
            step.outputs[REPORT_OUTPUT] for step in record.steps if REPORT_OUTPUT in step.outputs
        ),
        # Where the prepared data version lies, which the model's next run builds on (a cache entry,
        # never written again).
        **({PREPARED_KEY: prepared[0]} if prepared else {}),
    }


def _submission(record: RunRecord) -> Submission:
    details = _details(record)
    if record.status == ABANDONED:  # its runner died: for whoever submitted it, a failed job
        details["reason"] = record.error
    return Submission(
        job_name=record.job_name,
        backend=BACKEND,
        status=FAILED if record.status == ABANDONED else record.status,
        run_key=record.run_key,
        details=details,
    )


class LocalSubmitter:
    """Runs each request with the local pipeline runner; implements components.request.Submitter."""

    def __init__(
        self,
        options: RunnerOptions,
        environ: Mapping[str, str],
        progress: TextIO | None = None,
        force_rerun: bool = False,
        on_process_started: ProcessStarted | None = None,
        preflight: Preflight | None = None,
    ) -> None:
        # `preflight`: the caller's, when it has checked the task already (the front door's flush).
        self._runner = LocalRunner(
            options,
            environ,
            progress or _LoggingStream(),
            on_process_started=on_process_started,
            preflight=preflight,
        )
        self._runs = RunStore(Path(options.state_root) / "runs")
        self._force_rerun = force_rerun

    def submit(self, request: RunRequest) -> Submission:
        previous = request.previous_prepared
        if previous is not None and not Path(previous).is_dir():
            # A cache entry deleted since (the cache may be cleared): prepared from the raw data alone.
            log.warning(
                "run %s: its previous prepared data version %s is gone; it is prepared from the raw data "
                "alone, its schema from most of that data",
                request.run_key, previous,
            )  # fmt: skip
            request = replace(request, previous_prepared=None)
        try:
            record = self._runner.run(request, force_rerun=self._force_rerun)
        except LocalStepFailed as failure:
            log.warning("local run %s failed: %s", failure.run_id, failure.headline)
            failed = _submission(self._runs.load(failure.run_id))
            details = {**failed.details, "log": str(failure.log_file), "log_tail": list(failure.log_tail)}
            return replace(failed, details=details)
        return _submission(record)

    def status(self, job_name: str) -> Submission:
        for record in self._runs.list():
            if record.job_name == job_name:
                return _submission(record)
        raise JobNotFound(f"job name {job_name!r}: no local run has it; `retrain runs` lists the local runs")


def build_submitter(context: SubmitterContext) -> LocalSubmitter:
    """RETRAIN_SUBMITTER=local (components/submitters.py): runs under the context's home, each step with the
    context's environment, its progress logged."""
    return LocalSubmitter(
        RunnerOptions(state_root=context.home), dict(context.environ), preflight=context.preflight
    )
