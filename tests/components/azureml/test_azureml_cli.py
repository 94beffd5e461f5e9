"""`retrain submit|publish|schedule` end to end: real parsing, real Azurite for blob data, the seam faked."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
import yaml
from azure.ai.ml.entities._load_functions import load_schedule  # azure.ai.ml does not re-export it
from azure.storage.blob import ContainerClient
from helpers.components.azure_fakes import WORKSPACE_LOCK, RecordingWorkspace

from components.azureml.cli import Connectors, register_commands
from components.azureml.workspace import DatastoreRecord, WorkspaceRef
from components.data_version import DataError
from components.errors import SubmissionError

SETTINGS = {"AZURE_SUBSCRIPTION_ID": "sub-1", "AZURE_RESOURCE_GROUP": "rg-1", "AZUREML_WORKSPACE": "ws-1"}
VERSION = "rd-0f1e2d3c4b5a6978"
CSV = b"id,x,label\n1,0.5,a\n2,0.25,b\n"


class Harness:
    """The root CLI's part: a parser with our commands, and the namespace it hands to handlers."""

    def __init__(self, azurite, workspace: RecordingWorkspace, state_root) -> None:
        self.workspace = workspace
        self.state_root = state_root
        self.refs: list[WorkspaceRef] = []

        def open_workspace(ref: WorkspaceRef) -> RecordingWorkspace:
            self.refs.append(ref)
            return workspace

        def open_container(url: str) -> ContainerClient:
            return ContainerClient.from_connection_string(azurite.connection_string, url.rsplit("/", 1)[1])

        self.parser = argparse.ArgumentParser(prog="retrain")
        register_commands(
            self.parser.add_subparsers(dest="command", required=True),
            Connectors(open_workspace, open_container),
        )

    def run(self, *argv: str, environ: dict[str, str] | None = None) -> int:
        args = self.parser.parse_args(argv)
        args.state_root = self.state_root
        args.environ = dict(SETTINGS if environ is None else environ)
        return args.handler(args)


@pytest.fixture
def harness(azurite, tmp_path):
    return Harness(azurite, RecordingWorkspace(), tmp_path / "state")


@pytest.fixture
def landing(azurite, blob_container, harness):
    for name in ("a.csv", "b.csv"):
        blob_container.get_blob_client(f"landing/{name}").upload_blob(CSV)
    harness.workspace.datastores["workspaceblobstore"] = DatastoreRecord(
        "workspaceblobstore",
        blob_container.account_name,
        blob_container.container_name,
        blob_endpoint=azurite.blob_endpoint,
    )
    return blob_container


def test_a_dry_run_records_the_job_with_every_option_applied(harness, capsys):
    code = harness.run(
        "submit", "--dry-run", "--data", f"azureml:digits-raw:{VERSION}", "--model-name", "digits",
        "--gpus", "1", "--nodes", "2", "--compute", "train=gpu-dedicated", "--param", "epochs=3",
        "--trigger", "source=manual", "--trigger", "who=ops",
    )  # fmt: skip

    assert code == 0
    name = f"retrain-digits-{VERSION}"
    estimate, recorded = capsys.readouterr().out.splitlines()[:2]
    assert recorded == f"recorded {name} on dry-run: Completed"
    # train=gpu-dedicated: 2 GPUs (1 per node, 2 nodes) for the default hour, at the full price.
    assert estimate.startswith(
        "estimated cost unpriced: 2 GPU(s) x 1.00 h on dedicated compute gpu-dedicated"
    )
    job = yaml.safe_load((harness.state_root / "dry-runs" / name / "job.yml").read_text())
    assert job["jobs"]["train"]["compute"] == "azureml:gpu-dedicated"
    assert job["jobs"]["train"]["resources"] == {"instance_count": 2}
    assert job["inputs"]["epochs"] == 3
    assert job["inputs"]["trigger"] == "source=manual,who=ops"
    assert harness.refs == []  # a dry run never opens the workspace


def test_a_dry_run_of_blob_data_pins_its_version_without_copying(harness, landing, capsys):
    harness.run("submit", "--dry-run", "--data", f"{landing.url}/landing/", "--model-name", "digits")

    job_file = capsys.readouterr().out.splitlines()[2].strip()
    raw_data = yaml.safe_load(Path(job_file).read_text())["inputs"]["raw_data"]["path"]
    assert raw_data.startswith("azureml:digits-raw:rd-")
    assert sorted(blob.name for blob in landing.list_blobs()) == ["landing/a.csv", "landing/b.csv"]


def test_submitting_blob_data_snapshots_registers_and_submits(harness, landing, capsys):
    code = harness.run("submit", "--azure", "--data", f"{landing.url}/landing", "--model-name", "digits")

    assert code == 0
    assert harness.refs == [WorkspaceRef("sub-1", "rg-1", "ws-1")]
    ((name, version),) = harness.workspace.called("create_data")
    store = "retrain/snapshots/digits/store/"
    # a.csv and b.csv hold the same bytes: one object, beside the version's manifest and the latest pointer.
    assert {blob.name for blob in landing.list_blobs(name_starts_with="retrain/")} == {
        f"{store}{version}.manifest.json", f"{store}latest",
        f"{store}objects/md5-{hashlib.md5(CSV).hexdigest()}-{len(CSV)}",
    }  # fmt: skip
    data, job = harness.workspace.sent
    assert (name, data.path) == ("digits-raw", f"azureml://datastores/workspaceblobstore/paths/{store}")
    sent = job._to_dict()
    assert sent["inputs"]["raw_data"]["path"] == f"azureml:digits-raw:{version}"
    # The prep step reads that version of the store, downloaded: two small files fit its node's disk.
    prep = job._to_rest_object().as_dict()["properties"]["jobs"]["prep"]["inputs"]
    assert prep["raw_version"]["value"] == "${{parent.inputs.raw_data_version}}"
    assert prep["raw_data"]["mode"] == "Download"
    assert sent["jobs"]["register"]["inputs"]["registry_lock"] == f"{landing.url}/retrain/locks"
    assert sent["tags"]["trigger.source"] == "cli"
    assert [method for method, _ in harness.workspace.calls] == [
        "get_datastore", "get_data", "create_data",
        "get_job", "get_datastore", "get_compute", "vm_sizes", "usages", "create_job",
    ]  # fmt: skip
    assert (
        capsys.readouterr().out.splitlines()[1]
        == f"submitted retrain-digits-{version} on azureml: Queued (first attempt)"
    )


def test_data_outside_the_datastores_container_is_refused_before_copying(harness, landing):
    harness.workspace.datastores["workspaceblobstore"] = DatastoreRecord(
        "workspaceblobstore", "lakeacct", "raw"
    )
    here = f"{landing.account_name}/{landing.container_name}"
    with pytest.raises(SubmissionError) as raised:
        harness.run("submit", "--azure", "--data", f"{landing.url}/landing/", "--model-name", "digits")
    assert str(raised.value) == (
        f"the default datastore workspaceblobstore is on container lakeacct/raw, not the data's {here}, so a "
        "snapshot registered through it would point at nothing; expected --data-datastore to name a blob "
        f"datastore on {here} (create one with `az ml datastore create`)"
    )
    assert not list(landing.list_blobs(name_starts_with="retrain/"))
    assert harness.workspace.called("create_data") == []
    assert harness.workspace.called("create_job") == []


def _checkpoints_apart(harness: Harness, landing: ContainerClient, azurite) -> dict[str, str]:
    """The deployment's layout: the pipeline's datastore on a checkpoints container, the landing container
    behind a datastore of its own (retrain_landing); returns the settings that name both."""
    harness.workspace.datastores["retrain_checkpoints"] = DatastoreRecord(
        "retrain_checkpoints", landing.account_name, "checkpoints", blob_endpoint=azurite.blob_endpoint
    )
    harness.workspace.datastores["retrain_landing"] = DatastoreRecord(
        "retrain_landing",
        landing.account_name.upper(),
        landing.container_name,
        blob_endpoint=azurite.blob_endpoint,
    )  # an account name as typed, in capitals: account names are DNS labels, equal without case
    return {**SETTINGS, "RETRAIN_AZUREML_DATASTORE": "retrain_checkpoints"}


def test_blob_data_is_registered_through_the_data_datastore_and_checkpoints_stay_apart(
    harness, landing, azurite
):
    environ = {
        **_checkpoints_apart(harness, landing, azurite),
        "RETRAIN_AZUREML_DATA_DATASTORE": "workspaceblobstore",
    }
    harness.run("submit", "--azure", "--data", f"{landing.url}/landing", "--model-name", "digits",
                "--data-datastore", "retrain_landing", environ=environ)  # fmt: skip

    ((_, version),) = harness.workspace.called("create_data")
    data, job = harness.workspace.sent
    store = "retrain/snapshots/digits/store/"
    assert data.path == f"azureml://datastores/retrain_landing/paths/{store}"  # the flag over the setting
    assert landing.get_blob_client(f"{store}{version}.manifest.json").exists()
    sent = job._to_dict()
    assert sent["jobs"]["train"]["outputs"]["checkpoints"]["path"].startswith(
        "azureml://datastores/retrain_checkpoints/"
    )
    assert sent["jobs"]["register"]["inputs"]["registry_lock"] == (
        f"{azurite.blob_endpoint}/checkpoints/retrain/locks"
    )


def test_a_data_datastore_setting_on_another_container_is_named_and_nothing_is_copied(
    harness, landing, azurite
):
    environ = {
        **_checkpoints_apart(harness, landing, azurite),
        "RETRAIN_AZUREML_DATA_DATASTORE": "retrain_checkpoints",
    }
    with pytest.raises(
        SubmissionError,
        match=rf"^RETRAIN_AZUREML_DATA_DATASTORE retrain_checkpoints is on container {landing.account_name}/"
        rf"checkpoints, not the data's {landing.account_name}/{landing.container_name}, .* expected "
        "--data-datastore to name",
    ):
        harness.run("submit", "--azure", "--data", f"{landing.url}/landing", "--model-name", "digits",
                    environ=environ)  # fmt: skip
    assert not list(landing.list_blobs(name_starts_with="retrain/"))
    assert harness.workspace.called("create_data") == []


def test_a_bad_data_datastore_name_is_refused_before_the_workspace_is_read(harness):
    with pytest.raises(SubmissionError, match=r"^--data-datastore 'raw-data': expected a datastore name"):
        harness.run("submit", "--azure", "--data", f"azureml:digits-raw:{VERSION}", "--model-name", "digits",
                    "--data-datastore", "raw-data")  # fmt: skip
    assert harness.workspace.calls == []


@pytest.mark.parametrize(
    ("argv", "error", "message"),
    [
        (
            ["--data", "digits-raw"],
            SubmissionError,
            r"--data 'digits-raw': expected azureml:<asset>:<data version> or",
        ),
        (
            ["--data", "azureml:digits-raw:7"],
            SubmissionError,
            r"data version '7': expected a content-hashed version",
        ),
        (["--data", "https://acct.blob.core.windows.net/landing"], DataError, r"expected a blob folder URL"),
        (
            ["--data", f"azureml:digits-raw:{VERSION}", "--param", "epochs"],
            SubmissionError,
            r"--param 'epochs': expected KEY=VALUE",
        ),
    ],
)
def test_bad_submit_input_is_a_one_line_error(harness, argv, error, message):
    with pytest.raises(error, match=message) as raised:
        harness.run("submit", "--dry-run", "--model-name", "digits", *argv)
    assert "\n" not in str(raised.value)


def test_an_unknown_datastore_is_named(harness, landing):
    with pytest.raises(SubmissionError, match=r"--datastore lake: not in the workspace"):
        harness.run(
            "submit",
            "--azure",
            "--data",
            f"{landing.url}/landing/",
            "--model-name",
            "digits",
            "--datastore",
            "lake",
        )


def test_submitting_without_a_workspace_names_the_missing_settings(harness):
    with pytest.raises(SubmissionError, match=r"missing --subscription \(or AZURE_SUBSCRIPTION_ID\)"):
        harness.run(
            "submit", "--azure", "--data", f"azureml:digits-raw:{VERSION}", "--model-name", "d", environ={}
        )


def test_submit_needs_azure_or_dry_run(harness, capsys):
    with pytest.raises(SystemExit) as raised:
        harness.run("submit", "--data", f"azureml:digits-raw:{VERSION}", "--model-name", "digits")
    assert raised.value.code == 2
    assert "one of the arguments --azure --dry-run is required" in capsys.readouterr().err


def test_publish_reports_what_it_registered(harness, capsys):
    assert harness.run("publish", "--computes", "--workspace", "ws-flag") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "published environment retrain-training:3"
    assert "published component retrain_train:7" in lines
    assert lines[-3:] == [
        "published compute cpu-cluster",
        "published compute gpu-spot",
        "published compute gpu-dedicated",
    ]
    assert harness.refs == [WorkspaceRef("sub-1", "rg-1", "ws-flag")]


def _steps(job) -> dict[str, dict]:
    """What each step of a pipeline job runs, where, and with which inputs, in comparable form."""
    steps = {}
    for name, node in job.jobs.items():
        component = node.component
        steps[name] = {
            "compute": str(node.compute).removeprefix("azureml:"),
            "inputs": {
                key: getattr(value, "path", value) for key, value in node._to_dict()["inputs"].items()
            },
            "outputs": node._to_dict().get("outputs"),
            "command": component.command,
            "environment": str(component.environment),
            "distribution": node._to_dict().get("distribution"),
            "resources": node._to_dict().get("resources"),
        }
    return steps


def test_the_schedule_dry_run_prints_yaml_that_azure_ml_loads_as_the_schedule_it_creates(
    harness, capsys, tmp_path
):
    lock = "https://retrainck.blob.core.windows.net/checkpoints/retrain/locks"
    argv = [
        "schedule", "--cron", "0 3 * * 1-5", "--time-zone", "W. Europe Standard Time",
        "--model-name", "digits", "--nodes", "2", "--compute", "train=gpu-dedicated", "--param", "epochs=3",
    ]  # fmt: skip
    assert harness.run(*argv, "--param", f"registry_lock={lock}", "--dry-run") == 0
    printed = tmp_path / "schedule.yml"
    printed.write_text(capsys.readouterr().out)
    assert harness.workspace.calls == []  # a dry run reads no workspace

    loaded = load_schedule(printed)  # what `az ml schedule create -f schedule.yml` does
    assert loaded._validate().passed, loaded._validate().error_messages
    # The same schedule, created: its lock comes from the datastore's container, here the one given above.
    harness.workspace.datastores["workspaceblobstore"] = DatastoreRecord(
        "workspaceblobstore",
        "retrainck",
        "checkpoints",
        blob_endpoint="https://retrainck.blob.core.windows.net",
    )
    assert harness.run(*argv) == 0
    (sent,) = harness.workspace.sent

    assert (loaded.name, loaded.display_name, loaded.tags) == (sent.name, sent.display_name, sent.tags)
    assert loaded.name == "retrain-digits"
    assert (loaded.trigger.expression, loaded.trigger.time_zone) == ("0 3 * * 1-5", "W. Europe Standard Time")
    assert (loaded.trigger.expression, loaded.trigger.time_zone) == (
        sent.trigger.expression,
        sent.trigger.time_zone,
    )
    job, sent_job = loaded.create_job, sent.create_job
    assert job.name is None  # each firing gets its own job name from Azure ML
    assert (job.experiment_name, job.tags) == (sent_job.experiment_name, sent_job.tags)
    inputs = {name: getattr(value, "path", value) for name, value in job._to_dict()["inputs"].items()}
    assert inputs == {
        name: getattr(value, "path", value) for name, value in sent_job._to_dict()["inputs"].items()
    }
    assert inputs["raw_data"]["path"] == "azureml:digits-raw@latest" and inputs["epochs"] == 3
    steps = _steps(job)
    assert steps == _steps(sent_job)
    assert list(steps) == ["prep", "train", "evaluate", "register"]
    assert steps["register"]["inputs"]["registry_lock"] == lock
    assert steps["train"]["compute"] == "gpu-dedicated" and steps["train"]["resources"] == {
        "instance_count": 2
    }
    assert str(job.settings.default_compute).removeprefix("azureml:") == "cpu-cluster"


def test_schedule_creates_it_through_the_workspace(harness, capsys):
    harness.run("schedule", "--cron", "*/30 * * * *", "--model-name", "digits", "--name", "digits-halfhourly")
    assert harness.workspace.calls == [
        ("get_datastore", "workspaceblobstore"),
        ("create_schedule", "digits-halfhourly"),
    ]
    (schedule,) = harness.workspace.sent
    assert schedule.create_job._to_dict()["jobs"]["register"]["inputs"]["registry_lock"] == WORKSPACE_LOCK
    assert capsys.readouterr().out == "scheduled digits-halfhourly: '*/30 * * * *' (UTC)\n"


def test_the_datastore_setting_chooses_where_checkpoints_and_the_lock_live(harness):
    harness.workspace.datastores["retrainck"] = DatastoreRecord(
        "retrainck", "retrainck", "checkpoints", blob_endpoint="https://retrainck.blob.core.windows.net"
    )
    environ = {**SETTINGS, "RETRAIN_AZUREML_DATASTORE": "retrainck"}
    harness.run("schedule", "--cron", "0 3 * * *", "--model-name", "digits", environ=environ)

    (schedule,) = harness.workspace.sent
    job = schedule.create_job._to_dict()
    assert job["jobs"]["register"]["inputs"]["registry_lock"] == (
        "https://retrainck.blob.core.windows.net/checkpoints/retrain/locks"
    )
    assert job["jobs"]["train"]["outputs"]["checkpoints"]["path"].startswith(
        "azureml://datastores/retrainck/"
    )
    with pytest.raises(SubmissionError, match=r"RETRAIN_AZUREML_DATASTORE 'ck-1': expected a datastore name"):
        harness.run("schedule", "--cron", "0 3 * * *", "--model-name", "digits",
                    environ={**SETTINGS, "RETRAIN_AZUREML_DATASTORE": "ck-1"})  # fmt: skip


def test_a_bad_cron_expression_creates_nothing(harness):
    with pytest.raises(SubmissionError, match=r"--cron '0 3 \* \*': 4 fields"):
        harness.run("schedule", "--cron", "0 3 * *", "--model-name", "digits")
    assert harness.workspace.calls == []
