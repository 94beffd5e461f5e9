"""`retrain publish` on the command line: `--dry-run` plans and records without reaching Azure, and a publish
that cannot reach the workspace (no credential, no role, no network) stops in one line naming the fix."""

from __future__ import annotations

import argparse
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from azure.ai.ml import load_component
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.identity import CredentialUnavailableError
from helpers.components.azure_fakes import RecordingWorkspace

from components.azureml.cli import Connectors, register_commands
from components.azureml.publish import component_files, environment_reference
from components.azureml.workspace import WorkspaceRef
from components.errors import AzureAccessError, SubmissionError
from components.specs import COMPUTE_FILES, REPO_ROOT, load_component_spec
from training.local_state import STATE_DIR_VARIABLE

SETTINGS = {"AZURE_SUBSCRIPTION_ID": "sub-1", "AZURE_RESOURCE_GROUP": "rg-1", "AZUREML_WORKSPACE": "ws-1"}
WORKSPACE = "Azure ML workspace ws-1 (resource group rg-1, subscription sub-1)"


class Publisher:
    """The root CLI's part for `retrain publish`: our commands' parser, and the workspaces they open."""

    def __init__(self, workspace: RecordingWorkspace, state_root: Path) -> None:
        self.workspace = workspace
        self.state_root = state_root
        self.opened: list[WorkspaceRef] = []

        def open_workspace(ref: WorkspaceRef) -> RecordingWorkspace:
            self.opened.append(ref)
            return workspace

        self.parser = argparse.ArgumentParser(prog="retrain")
        register_commands(
            self.parser.add_subparsers(dest="command", required=True), Connectors(open_workspace)
        )

    def run(self, *argv: str, environ: dict[str, str] | None = None) -> int:
        args = self.parser.parse_args(["publish", *argv])
        args.state_root = self.state_root
        args.environ = dict(SETTINGS if environ is None else environ)
        return args.handler(args)


class FailingWorkspace(RecordingWorkspace):
    """A workspace whose first registration fails as azure-identity or azure-core would raise it."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def create_environment(self, environment):
        self.calls.append(("create_environment", environment.name))
        raise self.error


@pytest.fixture
def publisher(tmp_path):
    return Publisher(RecordingWorkspace(), tmp_path / "state")


@pytest.fixture
def no_network(monkeypatch):
    """Every socket connection refused, and recorded: a test asserts there was none."""
    attempts: list[object] = []

    def refuse(self, address, *_):
        attempts.append(address)
        raise OSError(f"this test allows no network ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def _http_error(kind: type[HttpResponseError], status: int, reason: str, code: str) -> HttpResponseError:
    error = kind(message=f"({code}) the service's own words\nCode: {code}")
    error.status_code, error.reason, error.error_code = status, reason, code
    return error


# -- --dry-run --------------------------------------------------------------------------------------------


def test_a_dry_run_prints_one_line_per_registration_and_sends_nothing(publisher, no_network, capsys):
    assert publisher.run("--dry-run", "--computes") == 0

    header, *lines = capsys.readouterr().out.splitlines()
    assert header == f"dry run: would publish to {WORKSPACE}; nothing is sent"
    components = [load_component_spec(path) for path in component_files()]
    computes = [yaml.safe_load(path.read_text())["name"] for path in COMPUTE_FILES.values()]
    folder = publisher.state_root / "dry-runs" / "publish"
    environment = environment_reference().removeprefix("azureml:")
    environment_file = folder / f"environment-{environment.replace(':', '-')}.yml"
    assert lines == [
        f"would register environment {environment}: {environment_file}",
        *(
            f"would register component {spec.name}:{spec.version}: "
            f"{folder / f'component-{spec.name}-{spec.version}.yml'}"
            for spec in components
        ),
        *(f"would create or update compute {name}: {folder / f'compute-{name}.yml'}" for name in computes),
    ]
    # Nothing reached Azure: the workspace seam was never opened, and no socket was connected.
    assert publisher.opened == [] and publisher.workspace.calls == []
    assert no_network == []
    # Each document is what publish would send: azure-ai-ml loads it back, the code staged beside it.
    train = next(spec for spec in components if spec.name == "retrain_train")
    sent = load_component(source=folder / f"component-retrain_train-{train.version}.yml")
    assert (sent.name, sent.version, f"azureml:{sent.environment}") == (
        "retrain_train", train.version, environment_reference(),
    )  # fmt: skip
    code = Path(sent.code)
    assert code.parent == publisher.state_root / "code-snapshots"
    assert (code / "training" / "engine" / "worker.py").is_file()
    assert not (code / ".venv").exists()


def test_a_dry_run_s_folder_holds_its_own_plan_alone(publisher, capsys):
    publisher.run("--dry-run", "--computes")
    publisher.run("--dry-run")

    folder = publisher.state_root / "dry-runs" / "publish"
    recorded = sorted(path.name for path in folder.glob("*.yml"))
    assert len(recorded) == 1 + len(component_files())
    assert not [name for name in recorded if name.startswith("compute-")]


def test_a_dry_run_validates_the_workspace_settings_before_staging_anything(publisher):
    with pytest.raises(SubmissionError, match=r"missing --resource-group \(or AZURE_RESOURCE_GROUP\)"):
        publisher.run("--dry-run", environ={**SETTINGS, "AZURE_RESOURCE_GROUP": ""})
    assert not publisher.state_root.exists()


# -- failures reaching Azure ------------------------------------------------------------------------------

SIGN_IN = (
    "run `az login`, or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (a service principal), "
    "or run where a managed identity is assigned"
)
CHAIN_FAILED = (
    "DefaultAzureCredential failed to retrieve a token from the included credentials.\nAttempted credentials:"
    "\n\tEnvironmentCredential: EnvironmentCredential authentication unavailable.\nTo mitigate this issue..."
)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            ClientAuthenticationError(message=CHAIN_FAILED),
            "no Azure credential signed in (DefaultAzureCredential failed to retrieve a token from the "
            f"included credentials.); {SIGN_IN}",
        ),
        (
            CredentialUnavailableError(message="Azure CLI not found on path"),
            f"no Azure credential signed in (Azure CLI not found on path); {SIGN_IN}",
        ),
        (
            _http_error(ClientAuthenticationError, 401, "Unauthorized", "InvalidAuthenticationToken"),
            "Azure refused this identity's token (HTTP 401 Unauthorized (InvalidAuthenticationToken)); "
            f"sign in again: {SIGN_IN}",
        ),
        (
            _http_error(HttpResponseError, 403, "Forbidden", "AuthorizationFailed"),
            "this identity may not write to it (HTTP 403 Forbidden (AuthorizationFailed)); give it a role on "
            "the workspace such as AzureML Data Scientist or Contributor",
        ),
        (
            _http_error(ResourceNotFoundError, 404, "Not Found", "ResourceNotFound"),
            "not found (HTTP 404 Not Found (ResourceNotFound)); check --subscription, --resource-group and "
            "--workspace (or AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP and AZUREML_WORKSPACE)",
        ),
        (
            _http_error(HttpResponseError, 400, "Bad Request", "UserError"),
            "Azure ML refused a request (HTTP 400 Bad Request (UserError)); fix what it names, then run the "
            "command again",
        ),
        (
            ServiceRequestError("Unable to connect to proxy\nNewConnectionError(...)"),
            "Azure could not be reached (Unable to connect to proxy); check the network connection and any "
            "proxy (HTTPS_PROXY), then run the command again",
        ),
        (
            ConnectionRefusedError(111, "Connection refused"),
            "Azure could not be reached (ConnectionRefusedError: [Errno 111] Connection refused); check the "
            "network connection and any proxy (HTTPS_PROXY), then run the command again",
        ),
    ],
    ids=["no-credential", "credential-unavailable", "401", "403", "404", "400", "no-network", "refused"],
)
def test_a_failure_reaching_the_workspace_is_one_line_naming_it_and_the_fix(tmp_path, error, expected):
    identity = logging.getLogger("azure.identity")
    level = identity.level
    publisher = Publisher(FailingWorkspace(error), tmp_path / "state")

    with pytest.raises(AzureAccessError) as raised:
        publisher.run("--computes")

    assert str(raised.value) == f"publishing to {WORKSPACE}: {expected}"
    assert raised.value.exit_code != 0
    assert raised.value.__suppress_context__  # the command line prints the line alone, no traceback
    assert publisher.workspace.calls == [("create_environment", "retrain-training")]
    assert identity.level == level  # quieted for the publish only


def test_a_failure_s_line_masks_user_info_signatures_and_account_keys(tmp_path):
    error = ServiceRequestError(
        "Cannot connect to https://bob:hunter2@proxy.example.com:8080 for "
        "https://acct.blob.core.windows.net/c/x?sv=2024-05-04&se=2026-01-01&sig=S1GNATURE%3D "
        "(DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=K3YK3Y==;)"
    )
    publisher = Publisher(FailingWorkspace(error), tmp_path / "state")

    with pytest.raises(AzureAccessError) as raised:
        publisher.run()

    line = str(raised.value)
    assert not any(secret in line for secret in ("hunter2", "S1GNATURE", "K3YK3Y")), line
    assert "https://***@proxy.example.com:8080" in line
    assert "sig=***" in line and "AccountKey=***" in line and "se=2026-01-01" in line


def test_publishing_offline_without_credentials_exits_with_one_line_and_no_traceback(tmp_path):
    """The real command, as a user offline runs it: DefaultAzureCredential finds no credential (no Azure
    settings, no CLIs on PATH, an empty home), and every connection goes to a loopback port nothing accepts
    on, so nothing can leave the machine."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        environ = {
            "PATH": str(tmp_path / "no-tools"),
            "HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(REPO_ROOT),
            STATE_DIR_VARIABLE: str(tmp_path / "state"),
            "HTTPS_PROXY": proxy,
            "HTTP_PROXY": proxy,
            "NO_PROXY": "",
            **SETTINGS,
        }
        done = subprocess.run(
            [sys.executable, "-m", "retrain_cli", "publish"],
            cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (
        f"retrain: error: publishing to {WORKSPACE}: no Azure credential signed in (DefaultAzureCredential "
        f"failed to retrieve a token from the included credentials.); {SIGN_IN}"
    )
