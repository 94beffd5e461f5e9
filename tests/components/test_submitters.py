"""The submitter registry: RETRAIN_SUBMITTER's name builds its twin from one context, importing only that
twin, and a name no submitter has is one line naming the setting and the known names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.azureml.dry_run import DryRunSubmitter
from components.azureml.submitter import AzureMLSubmitter
from components.errors import JobNotFound, SubmissionError, SubmitterUnavailable
from components.local.submitter import LocalSubmitter
from components.submitters import SUBMITTERS, SubmitterContext, open_submitter

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKSPACE = {"AZURE_SUBSCRIPTION_ID": "sub-1", "AZURE_RESOURCE_GROUP": "rg-1", "AZUREML_WORKSPACE": "ws-1"}
IMPORT_TIMEOUT_S = 60


def test_the_names_are_the_settings_values_local_first():
    assert SUBMITTERS == ("local", "azureml", "dry-run")


def test_an_unknown_name_is_one_line_naming_the_setting_and_the_known_names(tmp_path):
    with pytest.raises(SubmitterUnavailable) as refused:
        open_submitter("cloud", SubmitterContext(home=tmp_path))
    assert str(refused.value) == "RETRAIN_SUBMITTER 'cloud': expected one of local, azureml, dry-run"


def test_local_runs_under_the_contexts_home(tmp_path):
    submitter = open_submitter("local", SubmitterContext(home=tmp_path))

    assert isinstance(submitter, LocalSubmitter)
    with pytest.raises(JobNotFound, match=r"^job name 'retrain-x': no local run has it"):
        submitter.status("retrain-x")


def test_the_dry_run_records_under_the_home_for_the_contexts_datastore(tmp_path):
    context = SubmitterContext(home=tmp_path, datastore="retrain_checkpoints", registered_components=False)

    submitter = open_submitter("dry-run", context)

    assert isinstance(submitter, DryRunSubmitter)
    assert (submitter.root, submitter.datastore) == (tmp_path / "dry-runs", "retrain_checkpoints")
    assert submitter.registered_components is False
    assert open_submitter("dry-run", SubmitterContext(home=tmp_path)).datastore == "workspaceblobstore"


def test_azure_ml_opens_the_workspace_its_settings_name_unless_the_context_shares_one(tmp_path):
    opened = open_submitter("azureml", SubmitterContext(home=tmp_path, environ=WORKSPACE, datastore="ckpt"))
    shared = object()
    given = open_submitter("azureml", SubmitterContext(home=tmp_path, workspace=shared))

    assert isinstance(opened, AzureMLSubmitter)
    assert opened.workspace.ref.workspace == "ws-1"  # connected at first use, not here
    assert (opened.settings.datastore, opened.settings.registered_components) == ("ckpt", True)
    assert given.workspace is shared
    assert given.settings.datastore == "workspaceblobstore"


def test_azure_ml_without_a_workspace_says_which_settings_are_missing(tmp_path):
    with pytest.raises(SubmissionError, match=r"^Azure ML workspace: missing .*AZUREML_WORKSPACE"):
        open_submitter("azureml", SubmitterContext(home=tmp_path, environ={}))


@pytest.mark.parametrize(
    ("name", "not_imported"),
    [("dry-run", "components.local"), ("azureml", "components.local"), ("local", "components.azureml")],
)
def test_choosing_a_submitter_imports_its_twin_only(tmp_path, name, not_imported):
    probe = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from components.submitters import SubmitterContext, open_submitter\n"
        f"before = sorted(m for m in sys.modules if m.startswith({not_imported!r}))\n"
        f"open_submitter({name!r}, SubmitterContext(home=Path({str(tmp_path)!r}), environ={WORKSPACE!r}))\n"
        f"after = sorted(m for m in sys.modules if m.startswith({not_imported!r}))\n"
        "print(json.dumps([before, after]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [[], []]


def test_a_context_home_must_be_a_path(tmp_path):
    with pytest.raises(TypeError, match=r"expected a pathlib\.Path; pass Path"):
        SubmitterContext(home=str(tmp_path))  # type: ignore[arg-type]
