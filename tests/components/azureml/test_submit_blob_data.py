"""`retrain submit --data <blob folder URL>` with the real connector (your Azure identity): a URL it
cannot read is one line naming --data and the expected form, never a traceback (issue 20, item 12)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from azure.storage.blob import ContainerClient

from components.azureml.blob_snapshot import manifest_of_blob_prefix
from components.azureml.cli import _reading_blobs
from components.errors import SubmissionError
from components.model_config import MODELS_DIR_VARIABLE
from components.specs import REPO_ROOT
from training.local_state import STATE_DIR_VARIABLE


def test_an_emulator_url_is_refused_in_one_line_before_the_preflight(tmp_path):
    environ = {
        **os.environ,
        STATE_DIR_VARIABLE: str(tmp_path / "home"),
        MODELS_DIR_VARIABLE: str(tmp_path / "no-model-configs"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    url = "http://127.0.0.1:9/devstoreaccount1/landing/"
    result = subprocess.run(
        [sys.executable, "-m", "retrain_cli", "submit", "--dry-run", "--model-name", "digits",
         "--task", "tabular", "--data", url],
        cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "retrain: error: --data 'http://127.0.0.1:9/devstoreaccount1/landing/': `retrain submit` reads blob "
        "data as your Azure identity, which Azure Storage accepts over https only"
    )
    assert line.endswith("(https://<account>.blob.core.windows.net/<container>/<prefix>/)")
    assert not (tmp_path / "home").exists()  # refused before anything was pinned or recorded


def test_an_account_that_cannot_be_reached_is_one_line_naming_the_data():
    url = "https://127.0.0.1:1/devstoreaccount1/landing/"  # nothing listens on port 1
    container = ContainerClient.from_container_url(url.rsplit("/", 2)[0], retry_total=0)
    with pytest.raises(SubmissionError) as raised, _reading_blobs(url):
        manifest_of_blob_prefix(container, "landing/")
    message = str(raised.value)
    assert message.startswith(
        "--data 'https://127.0.0.1:1/devstoreaccount1/landing/': its blobs cannot be read ("
    )
    assert message.endswith(
        "expected a blob folder your Azure identity (az login, or a managed identity) may list and read"
    )
    assert "\n" not in message
