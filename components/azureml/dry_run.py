"""A submitter that runs nothing: it builds and validates the Azure ML pipeline job, and records it.

`retrain submit --dry-run` shows exactly what `--azure` would send (the job as YAML, and the request it
came from) without an Azure account. Each record is a folder `<state root>/dry-runs/<job name>/`, written
complete or not at all; submitting the same request again finds it, like Azure ML finds a job by name. A job
whose task is a user's file has its code snapshot staged under `<state root>/code-snapshots/` (the
components' code plus `user_tasks/<file>`, components/azureml/code_snapshot.py): the job's components point
at it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from components.azureml.builder import DEFAULT_DATASTORE, PipelineBuild, build_pipeline_job
from components.azureml.code_snapshot import SNAPSHOTS_FOLDER, with_code_snapshot
from components.azureml.names import RESOURCE_NAME_FORM, is_resource_name
from components.errors import JobNotFound, SubmissionError
from components.request import COMPLETED, RunRequest, Submission
from components.specs import PIPELINE_FILE
from components.submitters import SubmitterContext
from core.files import staged_folder
from core.secrets import mask_secrets
from core.task_ref import written_options

log = logging.getLogger(__name__)

BACKEND = "dry-run"
DRY_RUN_DIR = "dry-runs"
JOB_FILE = "job.yml"
REQUEST_FILE = "request.json"
SUBMISSION_FILE = "submission.json"


def request_to_dict(request: RunRequest) -> dict[str, Any]:
    return {
        "model_name": request.model_name,
        "data": {"version": request.data.version, "uri": request.data.uri},
        "trigger": dict(request.trigger),
        "parameters": dict(request.parameters),
        "processes_per_instance": request.processes_per_instance,
        "instance_count": request.instance_count,
        "compute": dict(request.compute),
        "component_versions": dict(request.component_versions),
        "task": request.task,
        "task_options": written_options(request.task_options),
        "task_sha256": request.task_sha256,
        "run_key": request.run_key,
    }


class DryRunSubmitter:
    """Records what would be submitted to Azure ML under the state root; runs nothing."""

    backend = BACKEND

    def __init__(
        self,
        state_root: Path,
        *,
        datastore: str = DEFAULT_DATASTORE,
        registered_components: bool = False,
        pipeline_file: Path = PIPELINE_FILE,
    ) -> None:
        self.root = Path(state_root) / DRY_RUN_DIR
        self.snapshots = Path(state_root) / SNAPSHOTS_FOLDER
        self.datastore = datastore
        self.registered_components = registered_components
        self.pipeline_file = pipeline_file

    def submit(self, request: RunRequest) -> Submission:
        build = PipelineBuild.for_request(
            request,
            datastore=self.datastore,
            registered_components=self.registered_components,
            pipeline_file=self.pipeline_file,
        )
        name = str(build.job_name)
        folder = self.root / name
        if (folder / SUBMISSION_FILE).exists():
            log.info("dry run %s already recorded at %s", name, folder)
            return self._read(folder, duplicate=True)
        build = with_code_snapshot(build, self.snapshots)
        job = build_pipeline_job(build, self.pipeline_file)
        details = {"recorded": str(folder), "job_file": str(folder / JOB_FILE)}
        if build.code_folder is not None:
            details["code_folder"] = str(build.code_folder)
        submission = Submission(
            job_name=name,
            backend=BACKEND,
            status=COMPLETED,  # the dry run's work (build, validate, record) is done; nothing was started
            run_key=request.run_key,
            details=details,
        )
        self._write(
            folder,
            {
                JOB_FILE: yaml.safe_dump(job._to_dict(), sort_keys=False),
                REQUEST_FILE: json.dumps(request_to_dict(request), indent=2) + "\n",
                SUBMISSION_FILE: json.dumps(_submission_to_dict(submission), indent=2) + "\n",
            },
        )
        log.info("dry run: recorded %s at %s", name, folder)
        return submission

    def status(self, job_name: str) -> Submission:
        if not is_resource_name(job_name):
            raise SubmissionError(f"job name {job_name!r}: expected {RESOURCE_NAME_FORM}")
        folder = self.root / job_name
        if not (folder / SUBMISSION_FILE).exists():
            raise JobNotFound(
                f"dry run {job_name!r}: not recorded under {self.root}; expected a job name printed by "
                "`retrain submit --dry-run`"
            )
        return self._read(folder, duplicate=False)

    def job_document(self, job_name: str) -> dict[str, Any]:
        """The recorded pipeline job, as the YAML mapping azure-ai-ml serialized."""
        self.status(job_name)
        return yaml.safe_load((self.root / job_name / JOB_FILE).read_text())

    def _read(self, folder: Path, duplicate: bool) -> Submission:
        document = json.loads((folder / SUBMISSION_FILE).read_text())
        details = {**document["details"], "duplicate": duplicate}
        return Submission(
            document["job_name"], document["backend"], document["status"], document["run_key"], details
        )

    def _write(self, folder: Path, files: dict[str, str]) -> None:
        """Stage every file beside the final folder, then rename it into place: complete or absent."""
        try:
            with staged_folder(folder) as staging:
                for name, text in files.items():
                    (staging / name).write_text(mask_secrets(text))  # what would be sent, less secrets
        except OSError:
            if (folder / SUBMISSION_FILE).exists():
                return  # a concurrent dry run of the same request recorded it first
            raise


def _submission_to_dict(submission: Submission) -> dict[str, Any]:
    return {
        "job_name": submission.job_name,
        "backend": submission.backend,
        "status": submission.status,
        "run_key": submission.run_key,
        "details": dict(submission.details),
    }


def build_submitter(context: SubmitterContext) -> DryRunSubmitter:
    """RETRAIN_SUBMITTER=dry-run (components/submitters.py): each job recorded under the context's home."""
    return DryRunSubmitter(
        context.home,
        datastore=context.datastore or DEFAULT_DATASTORE,
        registered_components=context.registered_components,
    )
