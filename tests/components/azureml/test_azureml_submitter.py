"""The Azure ML submitter, tested up to the SDK call: the job it would send is real and validated; only
the workspace seam is a recording fake."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.components.azure_fakes import WORKSPACE_LOCK, RecordingWorkspace

from components.azureml.fallback import PREEMPTION_TAG, FallbackPolicy
from components.azureml.submitter import AzureMLSubmitter, AzureSettings, submission_status
from components.azureml.workspace import DatastoreRecord, JobRecord, UsageRecord
from components.checkpoint_key import checkpoint_key
from components.errors import SubmissionError
from components.request import CANCELED, COMPLETED, FAILED, QUEUED, RUNNING, DataRef, RunRequest
from components.specs import REPO_ROOT, load_pipeline_spec

VERSION = "rd-a1b2c3d4e5f60718"
RUN_KEY = f"digits-{VERSION}"


def make_request(**changes) -> RunRequest:
    fields = {
        "model_name": "digits",
        "data": DataRef(VERSION, f"azureml:digits-raw:{VERSION}"),
        "trigger": {"source": "blob", "etag": "0x8DC"},
        "instance_count": 2,
    }
    return RunRequest(**{**fields, **changes})


# Every attempt of the run trains into one folder, named by its checkpoint key (the run key + the trajectory).
CHECKPOINT_KEY = checkpoint_key(load_pipeline_spec(), "train", make_request())
CHECKPOINTS = f"azureml://datastores/workspaceblobstore/paths/retrain/checkpoints/{CHECKPOINT_KEY}/"


def name(attempt: int = 0) -> str:
    return make_request().job_name(attempt)


def ended(attempt: int, status: str = "Failed", preempted: bool = True) -> tuple[JobRecord, list[JobRecord]]:
    """A finished attempt, and its child jobs as Azure ML lists them."""
    tags = {PREEMPTION_TAG: "120"} if preempted else {}
    train = JobRecord(f"{name(attempt)}-train-child", status, display_name="train", tags=tags)
    prep = JobRecord(f"{name(attempt)}-prep-child", "Completed", display_name="prep")
    return JobRecord(name(attempt), status, tags={"retrain.attempt": str(attempt)}), [prep, train]


def with_history(*attempts: tuple[JobRecord, list[JobRecord]]) -> RecordingWorkspace:
    workspace = RecordingWorkspace()
    for job, children in attempts:
        workspace.jobs[job.name] = job
        workspace.children[job.name] = children
    return workspace


def test_importing_the_azure_side_does_not_import_azure_ai_ml():
    modules = ", ".join(
        f"components.azureml.{name}" for name in ("submitter", "cli", "dry_run", "blob_snapshot", "builder")
    )
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.startswith('azure.ai.ml')))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_first_submission_checks_quota_then_sends_the_validated_job():
    class ValidatingWorkspace(RecordingWorkspace):
        """Validates the job as MLClient does, while its staged code snapshot exists (it is gone after)."""

        def create_job(self, job):
            self.validation = job._validate()
            return super().create_job(job)

    workspace = ValidatingWorkspace()

    submission = AzureMLSubmitter(workspace).submit(make_request())

    assert [method for method, _ in workspace.calls] == [
        "get_job", "get_datastore", "get_compute", "vm_sizes", "usages", "create_job",
    ]  # fmt: skip
    assert workspace.called("get_datastore") == ["workspaceblobstore"]
    assert workspace.called("get_compute") == ["gpu-spot"]
    assert workspace.called("vm_sizes") == ["westeurope"]
    (job,) = workspace.sent
    assert workspace.validation.passed, workspace.validation.error_messages
    sent = job._to_dict()
    assert sent["name"] == name(0)
    assert sent["tags"]["trigger.etag"] == "0x8DC"
    assert sent["jobs"]["train"]["compute"] == "azureml:gpu-spot"
    assert sent["jobs"]["train"]["resources"] == {"instance_count": 2}
    assert sent["jobs"]["train"]["outputs"]["checkpoints"]["path"] == CHECKPOINTS
    # Champion changes are serialised across nodes by a lease in the datastore's container, by default.
    assert sent["jobs"]["register"]["inputs"]["registry_lock"] == WORKSPACE_LOCK
    assert (submission.job_name, submission.backend, submission.status) == (name(0), "azureml", QUEUED)
    assert submission.run_key == RUN_KEY
    assert submission.details["duplicate"] is False
    assert submission.details["studio_url"] == f"https://ml.azure.com/runs/{name(0)}"


def test_the_registry_lock_is_in_the_chosen_datastores_container_in_its_cloud():
    workspace = RecordingWorkspace()
    workspace.datastores["checkpoints"] = DatastoreRecord(
        "checkpoints",
        "retrainck",
        "checkpoints",
        blob_endpoint="https://retrainck.blob.core.chinacloudapi.cn",
    )

    AzureMLSubmitter(workspace, AzureSettings(datastore="checkpoints")).submit(make_request())

    (job,) = workspace.sent
    register = job._to_dict()["jobs"]["register"]
    assert register["inputs"]["registry_lock"] == (
        "https://retrainck.blob.core.chinacloudapi.cn/checkpoints/retrain/locks"
    )
    assert "--lock ${{inputs.registry_lock}}" in register["component"]["command"]
    assert workspace.called("get_datastore") == ["checkpoints"]


def test_a_registry_lock_parameter_wins_and_the_datastore_is_not_read():
    workspace = RecordingWorkspace()
    lock = "https://locks.blob.core.windows.net/registry/prod"

    AzureMLSubmitter(workspace).submit(make_request(parameters={"registry_lock": lock}))

    (job,) = workspace.sent
    assert job._to_dict()["jobs"]["register"]["inputs"]["registry_lock"] == lock
    assert workspace.called("get_datastore") == []


@pytest.mark.parametrize(
    ("datastore", "message"),
    [
        (
            DatastoreRecord("lake", "lakeacct", "raw", kind="AzureDataLakeGen2"),
            r"datastore lake: a AzureDataLakeGen2 datastore, where the register step's lock \(a blob lease\) "
            r"cannot live; expected an Azure Blob datastore \(type azure_blob\) in --datastore or "
            r"RETRAIN_AZUREML_DATASTORE, or the lock itself as --param registry_lock=https://",
        ),
        (None, r"datastore lake: not in the workspace; expected the name of a blob datastore in --datastore"),
    ],
)
def test_a_datastore_that_cannot_hold_the_lock_sends_nothing(datastore, message):
    workspace = RecordingWorkspace()
    if datastore is not None:
        workspace.datastores["lake"] = datastore
    with pytest.raises(SubmissionError, match=message) as raised:
        AzureMLSubmitter(workspace, AzureSettings(datastore="lake")).submit(make_request())
    assert "\n" not in str(raised.value)
    assert workspace.sent == []


def test_a_registry_lock_parameter_that_is_no_blob_url_is_refused():
    with pytest.raises(SubmissionError, match=r"registry lock registry_lock 'https://example.com/locks': .*"):
        AzureMLSubmitter(RecordingWorkspace()).submit(
            make_request(parameters={"registry_lock": "https://example.com/locks"})
        )


@pytest.mark.parametrize("status", ["Queued", "Running", "Completed"])
def test_a_duplicate_submission_returns_the_existing_job(status):
    workspace = with_history((JobRecord(name(0), status, tags={"retrain.run_key": RUN_KEY}), []))

    submission = AzureMLSubmitter(workspace).submit(make_request())

    assert workspace.called("create_job") == []
    assert (submission.job_name, submission.status) == (name(0), submission_status(status))
    assert submission.details["duplicate"] is True


def test_losing_a_race_to_create_the_job_returns_the_winner():
    workspace = RecordingWorkspace(created_concurrently=JobRecord("x", "Running"))

    submission = AzureMLSubmitter(workspace).submit(make_request())

    assert (submission.job_name, submission.status) == (name(0), RUNNING)
    assert submission.details["duplicate"] is True
    assert workspace.called("get_job") == [name(0), name(0)]


def test_a_failed_create_is_a_one_line_error():
    workspace = RecordingWorkspace(
        create_job_error=RuntimeError("(AuthorizationFailed) no access\nmore detail")
    )
    with pytest.raises(
        SubmissionError, match=rf"submitting job {name(0)} to Azure ML failed: \(Author"
    ) as raised:
        AzureMLSubmitter(workspace).submit(make_request())
    assert "\n" not in str(raised.value)


def test_quota_refusal_sends_nothing():
    low_priority_pool = UsageRecord("Total Cluster LowPriority Regional vCPUs", "lowPriorityCores", 0, 24)
    workspace = RecordingWorkspace(usage_rows=[low_priority_pool])
    with pytest.raises(
        SubmissionError, match=r"quota: the train step needs 48 low-priority vCPUs .* allows 24"
    ):
        AzureMLSubmitter(workspace).submit(make_request())
    assert workspace.called("create_job") == []


def test_a_missing_train_compute_is_named():
    workspace = RecordingWorkspace()
    with pytest.raises(SubmissionError, match=r"compute gpu-big: not in the workspace; create it"):
        AzureMLSubmitter(workspace).submit(make_request(compute={"train": "gpu-big"}))


def test_the_quota_check_can_be_skipped():
    workspace = RecordingWorkspace()
    AzureMLSubmitter(workspace, AzureSettings(check_quota=False)).submit(make_request(instance_count=5))
    assert workspace.called("get_compute") == []
    assert workspace.called("create_job") == [name(0)]


def test_a_preempted_attempt_is_resubmitted_on_the_same_compute_under_the_next_name():
    workspace = with_history(ended(0))

    submission = AzureMLSubmitter(workspace).submit(make_request())

    assert workspace.called("child_jobs") == [name(0)]
    (job,) = workspace.sent
    sent = job._to_dict()
    assert sent["name"] == name(1) == f"retrain-{RUN_KEY}-r1"
    assert sent["tags"]["retrain.attempt"] == "1"
    assert sent["jobs"]["train"]["compute"] == "azureml:gpu-spot"
    assert sent["jobs"]["train"]["outputs"]["checkpoints"]["path"] == CHECKPOINTS  # it resumes
    assert submission.details["reason"] == "preempted 1 times; resuming on the same compute"


def test_after_enough_preemptions_the_run_falls_back_to_dedicated_compute():
    workspace = with_history(ended(0), ended(1))

    submission = AzureMLSubmitter(workspace).submit(make_request())

    (job,) = workspace.sent
    sent = job._to_dict()
    assert sent["name"] == name(2)
    assert sent["jobs"]["train"]["compute"] == "azureml:gpu-dedicated"
    assert sent["jobs"]["train"]["outputs"]["checkpoints"]["path"] == CHECKPOINTS
    assert workspace.called("get_compute") == ["gpu-dedicated"]  # the quota checked is the dedicated one
    assert submission.details["train_compute"] == "gpu-dedicated"


def test_the_fallback_threshold_and_cluster_are_configurable():
    workspace = with_history(ended(0))
    settings = AzureSettings(fallback=FallbackPolicy(max_preemptions=1, dedicated_compute="cpu-cluster"))

    AzureMLSubmitter(workspace, settings).submit(make_request(instance_count=1))

    assert workspace.sent[0]._to_dict()["jobs"]["train"]["compute"] == "azureml:cpu-cluster"


def test_a_failure_that_is_not_a_preemption_is_reported_not_resubmitted():
    workspace = with_history(ended(0, preempted=False))

    submission = AzureMLSubmitter(workspace).submit(make_request())

    assert workspace.called("create_job") == []
    assert (submission.job_name, submission.status) == (name(0), FAILED)
    assert submission.details["reason"] == f"{name(0)} failed, not preempted"


def test_a_run_stops_being_resubmitted_at_the_attempt_limit():
    workspace = with_history(ended(0), ended(1), ended(2))
    settings = AzureSettings(fallback=FallbackPolicy(max_preemptions=2, max_attempts=3))

    submission = AzureMLSubmitter(workspace, settings).submit(make_request())

    assert workspace.called("create_job") == []
    assert submission.job_name == name(2)
    assert "3 attempts made, at most 3 allowed" in submission.details["reason"]


def test_a_running_resubmission_is_found_not_duplicated():
    workspace = with_history(ended(0), (JobRecord(name(1), "Running"), []))

    submission = AzureMLSubmitter(workspace).submit(make_request())

    assert workspace.called("create_job") == []
    assert (submission.job_name, submission.status) == (name(1), RUNNING)


def test_status_maps_azure_states_and_unknown_jobs_are_errors():
    workspace = with_history(
        (JobRecord(name(0), "Finalizing", tags={"retrain.run_key": RUN_KEY, "retrain.attempt": "0"}), [])
    )
    submitter = AzureMLSubmitter(workspace)

    status = submitter.status(name(0))

    assert (status.status, status.run_key, status.details["azure_status"]) == (RUNNING, RUN_KEY, "Finalizing")
    with pytest.raises(SubmissionError, match=r"job 'retrain-other': not found in the workspace"):
        submitter.status("retrain-other")
    assert [submission_status(state) for state in ("Preparing", "Completed", "Failed", "Canceled")] == [
        QUEUED, COMPLETED, FAILED, CANCELED,
    ]  # fmt: skip


# The prep output of the model's last good job, where Azure ML keeps a step's output (run history says so).
PREVIOUS = "azureml://datastores/workspaceblobstore/paths/azureml/quiet_lime_prep_0a1b/prepared_data/"


def test_the_last_good_prepared_version_is_the_prep_steps_previous_prepared_input():
    class ValidatingWorkspace(RecordingWorkspace):
        def create_job(self, job):
            self.validation = job._validate()
            self.rest = job._to_rest_object().as_dict()["properties"]  # the body MLClient sends
            return super().create_job(job)

    workspace = ValidatingWorkspace()

    AzureMLSubmitter(workspace).submit(make_request(previous_prepared=PREVIOUS))

    assert workspace.validation.passed, workspace.validation.error_messages
    steps = workspace.rest["jobs"]
    assert steps["prep"]["inputs"]["previous_prepared"] == {"uri": PREVIOUS, "job_input_type": "uri_folder"}
    assert [name for name, step in steps.items() if "previous_prepared" in step["inputs"]] == ["prep"]


def test_a_local_folder_as_previous_prepared_version_is_dropped_with_a_warning(caplog, tmp_path):
    workspace = RecordingWorkspace()

    AzureMLSubmitter(workspace).submit(make_request(previous_prepared=str(tmp_path)))

    (job,) = workspace.sent
    assert "previous_prepared" not in job._to_dict()["jobs"]["prep"].get("inputs", {})
    [line] = [record.getMessage() for record in caplog.records if "previous prepared" in record.getMessage()]
    assert line == (
        f"run {RUN_KEY}: its previous prepared data version {tmp_path} is not in Azure ML; it is prepared "
        "from the raw data alone, its schema from most of that data"
    )
