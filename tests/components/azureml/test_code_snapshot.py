"""A user's task file travels to Azure ML in the job's code snapshot, under user_tasks/, and the steps name
it there. Checked offline: the job is built, validated and recorded (dry run), or handed to the seam."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest
from helpers.components.azure_fakes import RecordingWorkspace
from helpers.components.task_file import TASK_FILE, write_task_file

from components.azureml.builder import PipelineBuild, build_pipeline_job
from components.azureml.code_snapshot import stage_code_snapshot
from components.azureml.dry_run import DryRunSubmitter
from components.azureml.submitter import AzureMLSubmitter, AzureSettings
from components.errors import SubmissionError
from components.fingerprint import ignore_rules_of, kept_files
from components.request import DataRef, RunRequest
from components.specs import REPO_ROOT

VERSION = "rd-0123456789abcdef"
OPTIONS = {"width": 3, "note": "it's"}


def request(task_file: Path, **changes) -> RunRequest:
    fields = {
        "model_name": "flowers",
        "data": DataRef(VERSION, f"azureml:flowers-raw:{VERSION}"),
        "task": f"{task_file}:Flowers",
        "task_options": OPTIONS,
    }
    return RunRequest(**{**fields, **changes})


def uploaded(folder: Path) -> set[str]:
    """What Azure ML uploads of a code folder: its files, filtered by its .amlignore."""
    return {relative.as_posix() for relative in kept_files(folder, ignore_rules_of(folder))}


@pytest.fixture
def recorded(tmp_path):
    task_file = write_task_file(tmp_path / "models")
    submitter = DryRunSubmitter(tmp_path / "state")
    submission = submitter.submit(request(task_file))
    return task_file, submitter, submission


def test_the_dry_run_shows_every_step_running_the_task_file_from_the_staged_code(recorded):
    task_file, submitter, submission = recorded
    job = submitter.job_document(submission.job_name)
    code = Path(submission.details["code_folder"])

    assert {step["component"]["code"] for step in job["jobs"].values()} == {str(code)}
    assert job["inputs"]["task"] == "user_tasks/flowers_task.py:Flowers"
    assert json.loads(job["inputs"]["task_options"]) == OPTIONS
    assert (code / "user_tasks" / "flowers_task.py").read_bytes() == task_file.read_bytes()
    files = uploaded(code)
    assert "user_tasks/flowers_task.py" in files
    assert {"training/cli.py", "training/tasks/base.py"} <= files
    assert files == uploaded(REPO_ROOT) | {"user_tasks/flowers_task.py"}  # the same code, plus the task
    tags = job["tags"]
    assert tags["retrain.task"] == f"{task_file}:Flowers" and len(tags["retrain.task_sha256"]) == 64
    recorded_request = json.loads((submitter.root / submission.job_name / "request.json").read_text())
    assert recorded_request["task_sha256"] == tags["retrain.task_sha256"]


def test_a_snapshot_is_named_by_its_content(tmp_path):
    task_file = write_task_file(tmp_path / "models")
    first = stage_code_snapshot(task_file, tmp_path / "snapshots")
    assert stage_code_snapshot(task_file, tmp_path / "snapshots") == first
    task_file.write_text(task_file.read_text() + "\n# edited\n")
    edited = stage_code_snapshot(task_file, tmp_path / "snapshots")
    assert edited != first
    assert sorted(path.name for path in (tmp_path / "snapshots").iterdir()) == sorted(
        [first.name, edited.name]
    )


def test_a_built_in_task_needs_no_snapshot_and_keeps_the_yaml_code(tmp_path):
    digits = RunRequest(model_name="digits", data=DataRef(VERSION, f"azureml:digits-raw:{VERSION}"))
    job = build_pipeline_job(PipelineBuild.for_request(digits))._to_dict()
    assert {step["component"]["code"] for step in job["jobs"].values()} == {str(REPO_ROOT)}
    assert (job["inputs"]["task"], job["inputs"]["task_options"]) == ("tabular", "{}")


def test_the_azure_ml_submitter_sends_the_job_while_its_snapshot_holds_the_task_file(tmp_path):
    class SeeingWorkspace(RecordingWorkspace):
        def create_job(self, job):
            self.code = {str(step.component.code) for step in job.jobs.values()}
            self.files = {folder: uploaded(Path(folder)) for folder in self.code}
            return super().create_job(job)

    workspace = SeeingWorkspace()
    task_file = write_task_file(tmp_path / "models")
    AzureMLSubmitter(workspace, AzureSettings(check_quota=False)).submit(request(task_file))

    (folder,) = workspace.code
    assert "user_tasks/flowers_task.py" in workspace.files[folder]
    assert workspace.sent[0]._to_dict()["inputs"]["task"] == "user_tasks/flowers_task.py:Flowers"
    assert not Path(folder).exists()  # a temporary stage, gone once the job (and its code) was sent


def test_a_built_in_task_s_code_is_uploaded_from_a_stage_of_exactly_the_kept_files(tmp_path):
    """azure-ai-ml walks a code folder whole before .amlignore: the checkout's .venv costs ~10 s a walk."""

    class SeeingWorkspace(RecordingWorkspace):
        def create_job(self, job):
            self.code = {str(step.component.code) for step in job.jobs.values()}
            self.files = {
                folder: {
                    path.relative_to(folder).as_posix() for path in Path(folder).rglob("*") if path.is_file()
                }
                for folder in self.code
            }
            self.kept = {folder: uploaded(Path(folder)) for folder in self.code}
            return super().create_job(job)

    workspace = SeeingWorkspace()
    digits = RunRequest(model_name="digits", data=DataRef(VERSION, f"azureml:digits-raw:{VERSION}"))
    AzureMLSubmitter(workspace, AzureSettings(check_quota=False)).submit(digits)

    (folder,) = workspace.code
    assert folder != str(REPO_ROOT)
    assert workspace.files[folder] == uploaded(REPO_ROOT) | {".amlignore"}  # the kept files and the rules
    assert workspace.kept[folder] == uploaded(REPO_ROOT)
    assert not Path(folder).exists()  # a temporary stage, gone once the job (and its code) was sent


def test_published_components_cannot_carry_a_task_file(tmp_path):
    task_file = write_task_file(tmp_path / "models")
    with pytest.raises(SubmissionError, match=r"registered components run the code they were published"):
        PipelineBuild.for_request(request(task_file), registered_components=True)
    pinned = PipelineBuild.for_request(request(task_file, component_versions={"train": "1"}))
    with pytest.raises(SubmissionError, match=r"step 'train': version 1 of retrain_train is a published one"):
        DryRunSubmitter(tmp_path / "state").submit(request(task_file, component_versions={"train": "1"}))
    assert pinned.task_file == task_file


def test_the_snapshot_s_ignore_file_keeps_the_task_folder(tmp_path):
    task_file = write_task_file(tmp_path / "models")
    code = stage_code_snapshot(task_file, tmp_path / "snapshots")
    rules = (code / ".amlignore").read_text()
    assert rules.startswith((REPO_ROOT / ".amlignore").read_text())
    assert rules.rstrip().endswith("!/user_tasks/")
    assert PurePosixPath("user_tasks/flowers_task.py") in kept_files(code, ignore_rules_of(code))


def test_the_snapshot_holds_the_modules_the_task_file_imports_beside_it_and_each_version_is_its_own(tmp_path):
    models = tmp_path / "models"
    task_file = write_task_file(models, text=TASK_FILE + "\nimport flower_parts\n")
    write_task_file(models, "flower_parts.py", "from flowerlib import shapes\n")
    write_task_file(models / "flowerlib", "__init__.py", "")
    write_task_file(models / "flowerlib", "shapes.py", "ROUND = 1\n")
    write_task_file(models, "notes.py", "")  # beside it, never imported: not uploaded
    code = stage_code_snapshot(task_file, tmp_path / "snapshots")

    kept = {path.as_posix() for path in kept_files(code, ignore_rules_of(code))}
    assert {path for path in kept if path.startswith("user_tasks/")} == {
        "user_tasks/flowers_task.py",
        "user_tasks/flower_parts.py",
        "user_tasks/flowerlib/__init__.py",
        "user_tasks/flowerlib/shapes.py",
    }  # where the step's `import flower_parts` finds it: the task file's folder, in the snapshot
    (models / "flowerlib" / "shapes.py").write_text("ROUND = 0\n")
    assert stage_code_snapshot(task_file, tmp_path / "snapshots") != code
