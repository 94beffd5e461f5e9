"""Submit a RunRequest to Azure ML: once per logical run, with a quota check and a dedicated fallback.

The job name is the run key's (`retrain-<model>-<data version>`, then `-r1`, `-r2` for resubmissions), so
submitting the same request again finds the run instead of starting another. What `submit` does:

- no attempt yet: check the train compute's quota, build and validate the pipeline job, create it;
- the latest attempt is queued, running or completed: return it (a duplicate submission);
- every job it creates passes the register step a blob lock in the datastore's container
  (components/azureml/registry_lock.py), so champion changes of jobs on different nodes are serialised;
- it ended unsuccessfully: resubmit only when it was preempted (components/azureml/fallback.py), under
  the next attempt's name, on the dedicated cluster once the policy says so; otherwise report it.

A request's previous prepared data version (the model's last good one, an `azureml://` URI) goes to the prep
step's `previous_prepared` input. Once a job has ended, `status` reports what its prep step said: the raw
files it left out, and where its prepared data version lies (`prepared_data`), read through the workspace.

Every Azure call goes through the `AzureMLWorkspace` seam; azure-ai-ml is imported only when a job is built.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from components.azureml.builder import DEFAULT_DATASTORE, PipelineBuild, build_pipeline_job, is_data_uri
from components.azureml.code_snapshot import with_code_snapshot
from components.azureml.fallback import Attempt, FallbackPolicy, decide_next_attempt, train_child
from components.azureml.quota import check_quota
from components.azureml.registry_lock import resolve_registry_lock
from components.azureml.workspace import AzureMLWorkspace, JobRecord, MLClientWorkspace, WorkspaceRef
from components.errors import JobNotFound, SubmissionError
from components.outcome import PREPARED_KEY, REJECTED_KEY
from components.request import (
    CANCELED,
    COMPLETED,
    FAILED,
    QUEUED,
    RUNNING,
    TERMINAL_STATES,
    RunRequest,
    Submission,
)
from components.specs import PREP_STEP, PREPARED_OUTPUT, TRAIN_STEP
from components.submitters import SubmitterContext
from core.rejected_inputs import REPORT_FILE, REPORT_OUTPUT, parse_report

log = logging.getLogger(__name__)

BACKEND = "azureml"
# A child job's properties when Azure ML reused an earlier job's step: whose outputs are its outputs.
REUSED_FLAG, REUSED_JOB = "azureml.isreused", "azureml.reusedrunid"
_STATUS = {
    "NotStarted": QUEUED,
    "Starting": QUEUED,
    "Provisioning": QUEUED,
    "Preparing": QUEUED,
    "Queued": QUEUED,
    "Paused": QUEUED,
    "Running": RUNNING,
    "Finalizing": RUNNING,
    "CancelRequested": RUNNING,
    "NotResponding": RUNNING,  # the only state Azure ML may leave again for any earlier one
    "Completed": COMPLETED,
    "Failed": FAILED,
    "Canceled": CANCELED,
}


def submission_status(azure_status: str) -> str:
    """Azure ML's job state in the five words of components/request.py (unknown states count as queued)."""
    return _STATUS.get(azure_status, QUEUED)


@dataclass(frozen=True)
class AzureSettings:
    datastore: str = DEFAULT_DATASTORE
    registered_components: bool = False
    check_quota: bool = True
    fallback: FallbackPolicy = field(default_factory=FallbackPolicy)


def _submission(record: JobRecord, run_key: str | None = None, **details: object) -> Submission:
    return Submission(
        job_name=record.name,
        backend=BACKEND,
        status=submission_status(record.status),
        run_key=run_key or record.tags.get("retrain.run_key", ""),
        details={
            "azure_status": record.status,
            "attempt": int(record.tags.get("retrain.attempt", "0")),
            "studio_url": record.studio_url,
            **details,
        },
    )


class AzureMLSubmitter:
    backend = BACKEND

    def __init__(self, workspace: AzureMLWorkspace, settings: AzureSettings | None = None) -> None:
        self.workspace = workspace
        self.settings = settings or AzureSettings()

    def submit(self, request: RunRequest) -> Submission:
        previous = request.previous_prepared
        if previous is not None and not is_data_uri(previous):
            # A local run's folder (the model was trained here before): no job can read it.
            log.warning(
                "run %s: its previous prepared data version %s is not in Azure ML; it is prepared from the "
                "raw data alone, its schema from most of that data",
                request.run_key, previous,
            )  # fmt: skip
            request = replace(request, previous_prepared=None)
        attempts = self._attempts(request)
        if not attempts:
            return self._create(request, 0, None, reason="first attempt")
        latest = attempts[-1]
        if not latest.ended_unsuccessfully:
            log.info(
                "run %s already submitted as %s (%s)", request.run_key, latest.job.name, latest.job.status
            )
            return _submission(latest.job, request.run_key, duplicate=True)
        decision = decide_next_attempt(attempts, self.settings.fallback)
        if not decision.resubmit:
            log.info("run %s not resubmitted: %s", request.run_key, decision.reason)
            return _submission(latest.job, request.run_key, duplicate=True, reason=decision.reason)
        log.warning("run %s: %s", request.run_key, decision.reason)
        return self._create(request, decision.attempt, decision.train_compute, reason=decision.reason)

    def status(self, job_name: str) -> Submission:
        record = self.workspace.get_job(job_name)
        if record is None:
            raise JobNotFound(
                f"job {job_name!r}: not found in the workspace; expected a name printed by `retrain submit`"
            )
        return _submission(record, **self._prep_outcome(record))

    def _prep_outcome(self, record: JobRecord) -> dict[str, Any]:
        """Once a job has ended, what its prepare step says: the raw files it left out (its
        `rejected_inputs` output), which the front door never pins again, and where its prepared data
        version lies, which the model's next run builds on. Empty while it runs, or when prep did not
        complete; what cannot be read is said in one warning and costs nothing else."""
        if submission_status(record.status) not in TERMINAL_STATES:
            return {}
        prep = next(
            (child for child in self.workspace.child_jobs(record.name) if child.display_name == PREP_STEP),
            None,
        )
        if prep is None or submission_status(prep.status) != COMPLETED:
            return {}
        return {**self._rejected_inputs(record.name, prep), **self._prepared(record.name, prep)}

    def _rejected_inputs(self, job_name: str, prep: JobRecord) -> dict[str, Any]:
        try:
            data = self.workspace.output_file(prep.name, REPORT_OUTPUT, REPORT_FILE)
            files = None if data is None else parse_report(data)
        except (SubmissionError, ValueError) as error:
            log.warning("job %s: the raw files its prep left out are not known: %s", job_name, error)
            return {}
        return {} if files is None else {REJECTED_KEY: [file.to_dict() for file in files]}

    def _prepared(self, job_name: str, prep: JobRecord) -> dict[str, Any]:
        # A step Azure ML reused from an earlier job ran nothing: its outputs are that job's.
        reused = prep.properties.get(REUSED_FLAG) == "true" and prep.properties.get(REUSED_JOB)
        try:
            uri = self.workspace.output_uri(reused or prep.name, PREPARED_OUTPUT)
        except SubmissionError as error:
            log.warning("job %s: where its prepared data lies is not known: %s", job_name, error)
            return {}
        return {} if uri is None else {PREPARED_KEY: uri}

    # -- attempts -------------------------------------------------------------------------------------

    def _attempts(self, request: RunRequest) -> list[Attempt]:
        """The attempts made so far for the run, oldest first; train children only where they decide."""
        attempts: list[Attempt] = []
        for number in range(self.settings.fallback.max_attempts):
            record = self.workspace.get_job(request.job_name(number))
            if record is None:
                break
            attempt = Attempt(number, record)
            if attempt.ended_unsuccessfully:
                attempt = Attempt(number, record, train_child(self.workspace.child_jobs(record.name)))
            attempts.append(attempt)
        return attempts

    def _create(
        self, request: RunRequest, attempt: int, train_compute: str | None, reason: str
    ) -> Submission:
        build = PipelineBuild.for_request(
            request,
            attempt,
            datastore=self.settings.datastore,
            compute={TRAIN_STEP: train_compute} if train_compute else None,
            registered_components=self.settings.registered_components,
            registry_lock=resolve_registry_lock(self.workspace, self.settings.datastore, request.parameters),
        )
        # The code (and a task file) travels in a staged snapshot, which exists until the job and its code
        # are sent: an upload from the checkout would walk all of it, .venv and node_modules included.
        with tempfile.TemporaryDirectory(prefix="retrain-code-") as scratch:
            build = with_code_snapshot(build, Path(scratch), upload=True)
            job = build_pipeline_job(build)
            compute_name = str(job.jobs[TRAIN_STEP].compute).removeprefix("azureml:")
            if self.settings.check_quota:
                self._check_quota(compute_name, request)
            return self._send(job, build, request, compute_name, reason)

    def _send(
        self, job: Any, build: PipelineBuild, request: RunRequest, compute_name: str, reason: str
    ) -> Submission:
        name = str(build.job_name)
        try:
            record = self.workspace.create_job(job)
        except Exception as error:
            # Two submitters racing for the same run: whoever lost finds the winner's job under the name.
            existing = self.workspace.get_job(name)
            if existing is not None:
                log.info("job %s was created concurrently; returning it", name)
                return _submission(existing, request.run_key, duplicate=True)
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise SubmissionError(f"submitting job {name} to Azure ML failed: {first_line}") from error
        log.info("submitted %s (%s) on %s: %s", name, record.status, compute_name, reason)
        return _submission(
            record, request.run_key, duplicate=False, train_compute=compute_name, reason=reason
        )

    def _check_quota(self, compute_name: str, request: RunRequest) -> None:
        compute = self.workspace.get_compute(compute_name)
        if compute is None:
            raise SubmissionError(
                f"compute {compute_name}: not in the workspace; create it (`retrain publish --computes`) "
                "or pass --compute train=<name>"
            )
        check_quota(
            compute,
            self.workspace.vm_sizes(compute.location),
            self.workspace.usages(compute.location),
            instance_count=request.instance_count,
            processes_per_instance=request.processes_per_instance,
        )


def build_submitter(context: SubmitterContext) -> AzureMLSubmitter:
    """RETRAIN_SUBMITTER=azureml (components/submitters.py): jobs in the workspace the context shares,
    else the one AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP and AZUREML_WORKSPACE name (connected at first
    use)."""
    workspace = context.workspace or MLClientWorkspace(WorkspaceRef.from_settings(context.environ))
    settings = AzureSettings(
        datastore=context.datastore or DEFAULT_DATASTORE, registered_components=context.registered_components
    )
    return AzureMLSubmitter(workspace, settings)
