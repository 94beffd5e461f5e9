"""The champion's compare-and-set across nodes, with the lock an Azure ML pipeline passes by default.

Two long-lived processes play two nodes of Azure ML: each has its own working folder, state folder
(RETRAIN_HOME) and copies of the model and data, so no lock folder is shared. They share what two pipeline
jobs of one model share: one MLflow tracking and registry store (SQLite, artifacts beside it) and Blob
Storage (Azurite), where the lock is the one in the register step of a pipeline built as the Azure ML
submitter builds it. Each trial, both nodes evaluate the same good candidate for a fresh model name (each
alone would become the champion), then are released together to register it: exactly one may move the
`champion` alias; the other, re-reading under the lock, finds that champion and cannot beat it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.components.azure_fakes import RecordingWorkspace
from helpers.training.registry_harness import RAW_VERSION, Harness

from components.azureml.submitter import AzureMLSubmitter
from components.azureml.workspace import DatastoreRecord
from components.request import DataRef, RunRequest
from training.gate.register import REGISTRATION_FILE
from training.gate.registry import CHAMPION

REPO_ROOT = Path(__file__).resolve().parents[3]
NODE = REPO_ROOT / "tests" / "helpers" / "training" / "registry_node.py"
TRIALS = 10


def pipeline_lock(azurite, container: str) -> str:
    """The register step's lock in the job the Azure ML submitter sends, its datastore on `container`."""
    datastore = DatastoreRecord(
        "workspaceblobstore", azurite.account, container, blob_endpoint=azurite.blob_endpoint
    )
    workspace = RecordingWorkspace(datastores={"workspaceblobstore": datastore})
    request = RunRequest(model_name="race", data=DataRef(RAW_VERSION, f"azureml:race-raw:{RAW_VERSION}"))
    AzureMLSubmitter(workspace).submit(request)
    (job,) = workspace.sent
    return job._to_dict()["jobs"]["register"]["inputs"]["registry_lock"]


class Node:
    """A node: registry_node.py in its own folder and environment, driven one trial at a time."""

    def __init__(self, folder: Path, harness: Harness, environ: dict[str, str]) -> None:
        self.folder = folder
        self.model = Path(shutil.copytree(harness.models["mid"], folder / "model"))
        self.data = Path(shutil.copytree(harness.data, folder / "data"))
        self.log = (folder / "node.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(NODE)],
            cwd=folder,
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, (self.folder / "node.log").read_text()[-3000:]
        return json.loads(line)

    def evaluate(self, model_name: str, trial: int, tracking_uri: str, lock: str) -> Path:
        """Start the trial: evaluate (the reply is awaited by `evaluated`), register when released."""
        outputs = self.folder / f"trial-{trial}"
        registration = outputs / "registration"
        evaluate = [
            "evaluate", "--model", str(self.model), "--data", str(self.data),
            "--out", str(outputs / "evaluation"), "--model-name", model_name,
            "--mlflow-tracking-uri", tracking_uri,
        ]  # fmt: skip
        register = [
            "register", "--model", str(self.model), "--evaluation", str(outputs / "evaluation"),
            "--data", str(self.data), "--model-name", model_name, "--trigger", f"kind=http,event_id=t{trial}",
            "--raw-data-version", RAW_VERSION, "--environment-version", "3", "--out", str(registration),
            "--mlflow-tracking-uri", tracking_uri, "--lock", lock,
        ]  # fmt: skip
        self.send(json.dumps({"evaluate": evaluate, "register": register}))
        return registration / REGISTRATION_FILE

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        finally:
            self.process.kill()
            self.process.wait()
            self.log.close()


@pytest.fixture
def harness(prepared_data: Path, tmp_path: Path, trained_models: Path) -> Harness:
    harness = Harness(tmp_path / "shared", prepared_data, trained_models)
    harness.train(
        "mid", tracked=False
    )  # above every first-model floor: each node's candidate would win alone
    return harness


def test_two_nodes_racing_with_the_pipelines_lock_change_the_champion_once(
    harness, azurite, blob_container, tmp_path
):
    lock = pipeline_lock(azurite, blob_container.container_name)
    assert lock == f"{azurite.container_url(blob_container.container_name)}/retrain/locks"
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("MLFLOW_", "RETRAIN_"))}
    nodes = []
    try:
        for name in ("node-a", "node-b"):
            folder = tmp_path / name
            folder.mkdir()
            nodes.append(
                Node(
                    folder,
                    harness,
                    {
                        **environ,
                        "PYTHONPATH": str(REPO_ROOT),
                        "RETRAIN_HOME": str(folder / "state"),
                        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
                    },
                )
            )
        for trial in range(TRIALS):
            model_name = f"race-{trial}"
            records = [node.evaluate(model_name, trial, harness.tracking_uri, lock) for node in nodes]
            assert [node.receive() for node in nodes] == [{"evaluated": 0}] * 2
            for node in nodes:  # both evaluated against no champion; released together
                node.send("go")
            assert [node.receive() for node in nodes] == [{"registered": 0}] * 2

            decisions = [json.loads(record.read_text()) for record in records]
            winners = [record for record in decisions if record["registered_version"] is not None]
            losers = [record for record in decisions if record["registered_version"] is None]
            assert (len(winners), len(losers)) == (1, 1), (trial, decisions)
            assert winners[0]["registered_version"] == "1" and winners[0]["decision"]["accepted"] is True
            loser = losers[0]
            assert loser["decision"]["accepted"] is False and loser["decision"]["champion_version"] == "1"
            assert loser["champion_compared"]["scores_from"] == "re-read under the lock"
            versions = harness.registry.versions(model_name)
            assert [info.version for info in versions] == ["1"], (trial, versions)
            assert harness.registry.aliases(model_name) == {CHAMPION: "1"}
            assert harness.champion_weights(model_name) == winners[0]["candidate"]["weights_sha256"]
            lock_blob = blob_container.get_blob_client(f"retrain/locks/{model_name}.lock")
            assert lock_blob.get_blob_properties().lease.state == "available"  # held, then released
    finally:
        for node in nodes:
            node.close()
    assert not any((node.folder / "state" / "locks").exists() for node in nodes)  # no local lock was used
