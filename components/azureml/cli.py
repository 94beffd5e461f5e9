"""`retrain submit`, `retrain publish` and `retrain schedule`: the Azure ML side of the command line.

The root CLI calls `register_commands(commands)`; each handler gets `args.state_root` and `args.environ`
from it. The workspace comes from --subscription/--resource-group/--workspace or the settings
AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP and AZUREML_WORKSPACE; credentials from DefaultAzureCredential.
`submit` prints the run's estimated cost (components/cost.py, from the RETRAIN_* cost settings) before it
submits, and the job carries it in its tags. The pipeline's datastore is --datastore, else the setting
RETRAIN_AZUREML_DATASTORE, else workspaceblobstore: it holds the checkpoints, and a submitted job and a
created schedule pass the register step the registry lock in its container
(components/azureml/registry_lock.py). A dry run reads no workspace, so its job carries a lock only when the
run's parameters name one (--param registry_lock=URL). Blob data (`submit --azure --data https://...`) is
snapshotted inside its own container and registered through the data datastore, which must be on that
container: --data-datastore, else RETRAIN_AZUREML_DATA_DATASTORE, else the pipeline's datastore
(components/azureml/data_assets.py checks it before anything is copied).

`publish --dry-run` plans the release as `publish` does (every YAML validated, the code staged beside the
dry runs' snapshots), writes what it would send under <state root>/dry-runs/publish/ and prints one line per
registration. A real publish that cannot reach the workspace (no credential, no role, no network) stops in
one line that names the workspace, what failed and the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from components.azureml.blob_snapshot import manifest_of_blob_prefix, snapshot_blob_prefix, split_folder_url
from components.azureml.builder import (
    DATASTORE_SETTING,
    DEFAULT_DATASTORE,
    PipelineBuild,
    check_datastore_name,
)
from components.azureml.code_snapshot import SNAPSHOTS_FOLDER, with_code_snapshot
from components.azureml.data_assets import (
    DATA_DATASTORE_SETTING,
    build_data_asset,
    check_data_datastore,
    data_asset_reference,
    register_data_asset,
)
from components.azureml.dry_run import DRY_RUN_DIR, DryRunSubmitter
from components.azureml.fallback import FallbackPolicy
from components.azureml.publish import plan_publish, publish, write_publish_documents
from components.azureml.registry_lock import LOCKS_PREFIX, resolve_registry_lock
from components.azureml.schedule import (
    build_schedule,
    check_cron,
    check_time_zone,
    create_schedule,
    scheduled_checkpoints_path,
    write_schedule_files,
)
from components.azureml.submitter import AzureMLSubmitter, AzureSettings
from components.azureml.workspace import AzureMLWorkspace, MLClientWorkspace, WorkspaceRef
from components.cost import CostSettings, with_estimate
from components.errors import AzureAccessError, SubmissionError
from components.parameters import REGISTRY_LOCK_INPUT
from components.preflight import PreflightResult, SubprocessPreflight
from components.request import DataRef, Submission
from components.run_inputs import trigger_argument
from components.run_settings import RunSettings, add_task_options, settings_from_arguments
from components.task_ref import parse_task_reference, raw_depth, snapshot_text
from core.secrets import displayable_url, mask_secrets
from core.text import quoted

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

log = logging.getLogger(__name__)

SCHEDULES_FOLDER = "schedules"  # a dry run's schedules, under <state root>/dry-runs/
PUBLISH_FOLDER = "publish"  # a publish dry run's documents, under <state root>/dry-runs/
WorkspaceFactory = Callable[[WorkspaceRef], AzureMLWorkspace]
ContainerFactory = Callable[[str], "ContainerClient"]

_PINNED_DATA = re.compile(r"azureml:(?P<asset>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?P<version>[^:]+)")
_DATA_FORMS = (
    "expected azureml:<asset>:<data version> or a blob folder URL to snapshot "
    "(https://<account>.blob.core.windows.net/<container>/<prefix>/)"
)


def _default_container(container_url: str) -> ContainerClient:
    from azure.identity import DefaultAzureCredential
    from azure.storage.blob import ContainerClient

    if not container_url.startswith("https://"):
        raise ValueError(
            "`retrain submit` reads blob data as your Azure identity, which Azure Storage accepts over https "
            "only (so not the Azurite emulator)"
        )
    return ContainerClient.from_container_url(container_url, credential=DefaultAzureCredential())


@dataclass(frozen=True)
class Connectors:
    """How handlers reach Azure: the workspace seam and Blob Storage containers."""

    workspace: WorkspaceFactory = MLClientWorkspace
    container: ContainerFactory = _default_container


def register_commands(commands: Any, connectors: Connectors | None = None) -> None:
    connectors = connectors or Connectors()
    _submit_parser(commands).set_defaults(handler=functools.partial(_submit, connectors=connectors))
    _publish_parser(commands).set_defaults(handler=functools.partial(_publish, connectors=connectors))
    _schedule_parser(commands).set_defaults(handler=functools.partial(_schedule, connectors=connectors))


# -- parsers ----------------------------------------------------------------------------------------------


def _workspace_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "workspace (default: AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP, AZUREML_WORKSPACE)"
    )
    group.add_argument("--subscription", help="Azure subscription id")
    group.add_argument("--resource-group", help="resource group of the workspace")
    group.add_argument("--workspace", help="Azure ML workspace name")


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-name",
        required=True,
        help="the model to retrain, e.g. digits (reads models/NAME.toml if any)",
    )
    add_task_options(parser)
    parser.add_argument("--gpus", type=int, default=1, help="processes (GPUs) per node for the train step")
    parser.add_argument("--nodes", type=int, default=1, help="nodes for the train step")
    parser.add_argument(
        "--compute", action="append", default=[], metavar="STEP=NAME", help="compute for a step"
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="K=V", help="a pipeline input, e.g. epochs=10"
    )
    parser.add_argument(
        "--component-version", action="append", default=[], metavar="STEP=VERSION",
        help="run a step's registered component version instead of the YAML's",
    )  # fmt: skip
    parser.add_argument(
        "--datastore",
        help="the pipeline's blob datastore, for checkpoints and the registry lock "
        f"(default: ${DATASTORE_SETTING}, else {DEFAULT_DATASTORE})",
    )
    parser.add_argument(
        "--registered-components", action="store_true",
        help="reference the published components (retrain publish) instead of uploading the YAMLs",
    )  # fmt: skip


def _submit_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "submit", help="submit one retraining run to Azure ML, or record it (--dry-run)"
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--azure", action="store_true", help="submit to the Azure ML workspace")
    where.add_argument(
        "--dry-run", action="store_true", help="build, validate and record the job; run nothing"
    )
    parser.add_argument("--data", required=True, help="azureml:<asset>:<data version>, or a blob folder URL")
    parser.add_argument("--trigger", action="append", default=[], metavar="K=V", help="what started the run")
    parser.add_argument(
        "--snapshots-prefix", help="where blob data is pinned (default retrain/snapshots/<model>)"
    )
    parser.add_argument(
        "--data-datastore",
        help="the blob datastore on --data's container, where its snapshot is registered "
        f"(default: ${DATA_DATASTORE_SETTING}, else the --datastore value)",
    )
    parser.add_argument("--max-preemptions", type=int, default=2, help="spot preemptions before dedicated")
    parser.add_argument("--dedicated-compute", default="gpu-dedicated", help="the train fallback compute")
    parser.add_argument("--skip-quota-check", action="store_true", help="submit without checking vCPU quota")
    _run_options(parser)
    _workspace_options(parser)
    return parser


def _publish_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("publish", help="register the environment and components in a workspace")
    parser.add_argument("--computes", action="store_true", help="also create or update the three computes")
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and record what would be registered; send nothing"
    )
    _workspace_options(parser)
    return parser


def _schedule_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("schedule", help="create an Azure ML cron schedule for the pipeline")
    parser.add_argument("--cron", required=True, help="5-field cron expression, e.g. '0 3 * * *'")
    parser.add_argument("--time-zone", default="UTC", help="Windows time zone name (default UTC)")
    parser.add_argument("--name", help="schedule name (default retrain-<model>)")
    parser.add_argument("--data", help="what each firing reads (default azureml:<model>-raw@latest)")
    parser.add_argument("--dry-run", action="store_true", help="print the validated schedule; create nothing")
    _run_options(parser)
    _workspace_options(parser)
    return parser


# -- helpers ---------------------------------------------------------------------------------------------


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, equals, item = value.partition("=")
        if not equals or not key.strip():
            raise SubmissionError(f"{flag} {value!r}: expected KEY=VALUE")
        pairs[key.strip()] = item.strip()
    return pairs


def _named(flag: str, value: str | None, setting: str, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """A datastore's name from its flag's `value`, else from `setting`, with where it came from; None if
    neither names one."""
    where = flag if value else setting
    value = value or environ.get(setting)
    return (check_datastore_name(value, where), where) if value else None


def _datastore_named(args: argparse.Namespace) -> tuple[str, str]:
    named = _named("--datastore", args.datastore, DATASTORE_SETTING, args.environ)
    return named or (DEFAULT_DATASTORE, "the default datastore")


def _datastore(args: argparse.Namespace) -> str:
    return _datastore_named(args)[0]


def _data_datastore(args: argparse.Namespace) -> tuple[str, str]:
    """The data datastore's name and where it came from: --data-datastore, its setting, else the pipeline's
    datastore (one container for data and checkpoints)."""
    named = _named("--data-datastore", args.data_datastore, DATA_DATASTORE_SETTING, args.environ)
    return named or _datastore_named(args)


def _note_unresolved_lock(datastore: str, parameters: Any) -> None:
    if not parameters.get(REGISTRY_LOCK_INPUT):
        log.info(
            "dry run: the register step's lock, %s in datastore %s's container, is resolved when submitted "
            "(this job has none; --param %s=URL sets one)",
            LOCKS_PREFIX,
            datastore,
            REGISTRY_LOCK_INPUT,
        )


def _workspace_ref(args: argparse.Namespace) -> WorkspaceRef:
    return WorkspaceRef.from_settings(args.environ, args.subscription, args.resource_group, args.workspace)


def _workspace(args: argparse.Namespace, connectors: Connectors) -> AzureMLWorkspace:
    return connectors.workspace(_workspace_ref(args))


def _shown(ref: WorkspaceRef) -> str:
    return (
        f"Azure ML workspace {ref.workspace} (resource group {ref.resource_group}, "
        f"subscription {ref.subscription_id})"
    )


_SIGN_IN = (
    "run `az login`, or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (a service principal), "
    "or run where a managed identity is assigned"
)
_SETTINGS = (
    "check --subscription, --resource-group and --workspace (or AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP "
    "and AZUREML_WORKSPACE)"
)


def _reason(error: BaseException) -> str:
    """The failure in a few secret-free words: Azure's own wording, else the first line of the error."""
    from core.storage.azure_errors import describe

    if not isinstance(error, ConnectionError):
        return describe(error)
    lines = str(error).strip().splitlines()
    return mask_secrets(f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__)[:300]


def _what_failed(error: BaseException) -> tuple[str, str]:
    """What went wrong reaching Azure, and the fix: a credential, a role, the settings, or the network."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    reason = _reason(error)
    # azure-identity raises ClientAuthenticationError (CredentialUnavailableError among them) with no
    # status when no credential signs in; ARM answers 401 when it refuses the token it was given.
    if isinstance(error, ClientAuthenticationError) and error.status_code is None:
        return f"no Azure credential signed in ({reason})", _SIGN_IN
    if isinstance(error, HttpResponseError) and error.status_code == 401:
        return f"Azure refused this identity's token ({reason})", f"sign in again: {_SIGN_IN}"
    if isinstance(error, HttpResponseError) and error.status_code == 403:
        return (
            f"this identity may not write to it ({reason})",
            "give it a role on the workspace such as AzureML Data Scientist or Contributor",
        )
    if isinstance(error, HttpResponseError) and error.status_code == 404:
        return f"not found ({reason})", _SETTINGS
    if isinstance(error, HttpResponseError):
        return f"Azure ML refused a request ({reason})", "fix what it names, then run the command again"
    return (
        f"Azure could not be reached ({reason})",
        "check the network connection and any proxy (HTTPS_PROXY), then run the command again",
    )


@contextlib.contextmanager
def _reaching_workspace(ref: WorkspaceRef, action: str, *, verbose: bool = False) -> Iterator[None]:
    """Azure's failures inside the block (authentication, HTTP, network) as one AzureAccessError line.
    azure-identity logs its own account of a failed sign-in (a dozen lines) before raising; outside
    --verbose that is left out, since the one line says what to do."""
    from azure.core.exceptions import AzureError

    identity = logging.getLogger("azure.identity")
    level = identity.level
    if not verbose:
        identity.setLevel(logging.ERROR)
    try:
        yield
    except (AzureError, ConnectionError) as error:
        failed, fix = _what_failed(error)
        raise AzureAccessError(f"{action} to {_shown(ref)}: {failed}; {fix}") from None
    finally:
        identity.setLevel(level)


def _pinned_data(data: str) -> DataRef | None:
    """--data as a pinned asset version; None for a blob folder URL (checked for form, not read)."""
    pinned = _PINNED_DATA.fullmatch(data)
    if pinned:
        return DataRef(pinned["version"], data)
    if not data.startswith(("https://", "http://")):
        raise SubmissionError(f"--data {quoted(data, 120)}: {_DATA_FORMS}")
    if any(mark in data for mark in "@?#"):
        raise SubmissionError(
            f"--data {quoted(displayable_url(data), 120)}: credentials do not belong in the URL (no user "
            "info, SAS query or fragment: they would end up in logs and records); the blobs are read as your "
            f"Azure identity; {_DATA_FORMS}"
        )
    split_folder_url(data)
    return None


def _data_source(data: str, connectors: Connectors) -> DataRef | tuple[ContainerClient, str]:
    """--data as a pinned asset version, or a blob folder URL's container and folder prefix. Opening the
    container reads nothing, so a URL it cannot take is refused before the preflight's process."""
    pinned = _pinned_data(data)
    if pinned is not None:
        return pinned
    container_url, prefix = split_folder_url(data)
    try:
        return connectors.container(container_url), prefix
    except ValueError as error:  # a URL the client cannot take (azure.storage says so by ValueError)
        shown = quoted(displayable_url(data), 120)
        raise SubmissionError(f"--data {shown}: {mask_secrets(str(error))}; {_DATA_FORMS}") from None


@contextlib.contextmanager
def _reading_blobs(data: str) -> Iterator[None]:
    """An unreachable account, a missing container or a refused identity, said in one line."""
    from azure.core.exceptions import AzureError

    try:
        yield
    except AzureError as error:
        lines = str(error).strip().splitlines()
        reason = mask_secrets(lines[0] if lines else type(error).__name__)[:300]
        raise SubmissionError(
            f"--data {quoted(displayable_url(data), 120)}: its blobs cannot be read ({reason}); expected a "
            "blob folder your Azure identity (az login, or a managed identity) may list and read"
        ) from None


def _data_ref(
    args: argparse.Namespace,
    workspace: AzureMLWorkspace | None,
    settings: RunSettings,
    found: PreflightResult,
    data_datastore: tuple[str, str],
    source: DataRef | tuple[ContainerClient, str],
) -> DataRef:
    if isinstance(source, DataRef):
        return source
    container, prefix = source
    name, layout = settings.model_name, (found.raw_suffixes, raw_depth(settings.task))
    if workspace is None:  # a dry run reads the data's manifest, and copies nothing
        with _reading_blobs(args.data):
            manifest = manifest_of_blob_prefix(container, prefix, *layout)
        return DataRef(manifest.version, data_asset_reference(name, manifest.version), manifest.total_bytes)
    datastore, where = data_datastore
    check_data_datastore(workspace, datastore, container, where, "--data-datastore")  # before any copy
    snapshots = args.snapshots_prefix or f"retrain/snapshots/{name}"
    with _reading_blobs(args.data):
        manifest, snapshot = snapshot_blob_prefix(container, prefix, snapshots, *layout)
    data = build_data_asset(name, manifest, datastore, snapshot.folder, snapshot.manifest_name)
    register_data_asset(workspace, data)
    return DataRef(manifest.version, data_asset_reference(name, manifest.version), snapshot.folder_bytes)


def _settings(args: argparse.Namespace) -> tuple[RunSettings, PreflightResult]:
    """The run's model, task and parameters (its configuration file with the command line over it), and
    the preflight's verdict on them: a task that does not load or a gate metric it lacks stops here,
    before any data is pinned or anything submitted."""
    settings = settings_from_arguments(args, _pairs(args.param, "--param"))
    return settings, SubprocessPreflight(environ=args.environ).check(settings, settings.where)


def _report(submission: Submission, out: IO[str]) -> None:
    verb = "found" if submission.details.get("duplicate") else "submitted"
    if submission.backend == "dry-run" and not submission.details.get("duplicate"):
        verb = "recorded"
    line = f"{verb} {submission.job_name} on {submission.backend}: {submission.status}"
    if submission.details.get("reason"):
        line += f" ({submission.details['reason']})"
    where = submission.details.get("studio_url") or submission.details.get("job_file")
    print(line + (f"\n  {where}" if where else ""), file=out)


# -- handlers --------------------------------------------------------------------------------------------


def _submit(args: argparse.Namespace, connectors: Connectors, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    cost = CostSettings.from_environ(args.environ)  # a bad setting stops before any data is pinned
    datastore = _datastore(args)
    data_datastore = _data_datastore(args)
    source = _data_source(args.data, connectors)  # what is cheap to check goes before the preflight
    ref = None if args.dry_run else _workspace_ref(args)
    settings, found = _settings(args)
    request_fields = {
        "trigger": _pairs(args.trigger, "--trigger") or {"source": "cli"},
        "processes_per_instance": args.gpus,
        "instance_count": args.nodes,
        "compute": _pairs(args.compute, "--compute"),
        "component_versions": _pairs(args.component_version, "--component-version"),
    }
    if args.dry_run:
        request = settings.request(
            _data_ref(args, None, settings, found, data_datastore, source), **request_fields
        )
        _note_unresolved_lock(datastore, request.parameters)
        submitter: DryRunSubmitter | AzureMLSubmitter = DryRunSubmitter(
            args.state_root, datastore=datastore, registered_components=args.registered_components
        )
    else:
        workspace = connectors.workspace(ref) if ref is not None else _workspace(args, connectors)
        request = settings.request(
            _data_ref(args, workspace, settings, found, data_datastore, source), **request_fields
        )
        azure = AzureSettings(
            datastore=datastore,
            registered_components=args.registered_components,
            check_quota=not args.skip_quota_check,
            fallback=FallbackPolicy(
                max_preemptions=args.max_preemptions, dedicated_compute=args.dedicated_compute
            ),
        )
        submitter = AzureMLSubmitter(workspace, azure)
    request, estimate = with_estimate(request, cost)
    print(f"{estimate.summary()}; {estimate.basis}", file=out, flush=True)
    _report(submitter.submit(request), out)
    return 0


def _publish(args: argparse.Namespace, connectors: Connectors, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    ref = _workspace_ref(args)  # a missing setting is named before anything is loaded or staged
    if args.dry_run:
        return _publish_dry_run(args, ref, out)
    verbose = getattr(args, "verbose", False)  # the root parser's -v; absent where a test builds the args
    with _reaching_workspace(ref, "publishing", verbose=verbose):
        records = publish(connectors.workspace(ref), computes=args.computes)
    for record in records:
        version = f":{record.version}" if record.version else ""
        print(f"published {record.kind} {record.name}{version}", file=out)
    return 0


def _publish_dry_run(args: argparse.Namespace, ref: WorkspaceRef, out: IO[str]) -> int:
    """Publish's plan, sent nowhere: the code snapshot is kept with the dry runs' (a document names it),
    and each document is written where a reader can check what would be sent."""
    steps = plan_publish(args.state_root / SNAPSHOTS_FOLDER, computes=args.computes)
    documents = write_publish_documents(steps, args.state_root / DRY_RUN_DIR / PUBLISH_FOLDER)
    print(f"dry run: would publish to {_shown(ref)}; nothing is sent", file=out)
    for step, document in zip(steps, documents, strict=True):
        print(f"would {step.verb} {step.kind} {step.reference}: {document}", file=out)
    return 0


def _schedule(args: argparse.Namespace, connectors: Connectors, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    check_cron(args.cron)  # what is cheap to check goes before the preflight's process
    check_time_zone(args.time_zone)
    datastore = _datastore(args)
    settings, _ = _settings(args)
    name = settings.model_name
    task = parse_task_reference(settings.task, None, "task")
    tags = {"retrain.model_name": name, "trigger.source": "schedule", "retrain.task": settings.task}
    if settings.task_sha256 is not None:
        tags["retrain.task_sha256"] = settings.task_sha256
    build = PipelineBuild(
        model_name=name,
        data_uri=args.data or f"azureml:{name}-raw@latest",
        checkpoints_path=scheduled_checkpoints_path(datastore, name),
        tags=tags,
        trigger=trigger_argument({"source": "schedule"}),
        parameters=settings.parameters,
        compute=_pairs(args.compute, "--compute"),
        processes_per_instance=args.gpus,
        instance_count=args.nodes,
        component_versions=_pairs(args.component_version, "--component-version"),
        registered_components=args.registered_components,
        allow_latest_data=True,
        task=snapshot_text(task),
        task_options=settings.task_options_text,
        task_file=task.path,
    )
    schedule_name = args.name or f"retrain-{name}"
    # A dry run keeps a task file's code snapshot with the state (its job names it), and prints the schedule
    # as `az ml schedule create -f` reads it, its pipeline job in a file beside the dry runs' records; a real
    # schedule's snapshot is uploaded when the schedule is created, so a temporary folder serves.
    if args.dry_run:
        _note_unresolved_lock(datastore, settings.parameters)
        build = with_code_snapshot(build, args.state_root / SNAPSHOTS_FOLDER)
        schedule = build_schedule(schedule_name, args.cron, args.time_zone, build)
        folder = args.state_root / DRY_RUN_DIR / SCHEDULES_FOLDER / schedule.name
        print(yaml.safe_dump(write_schedule_files(schedule, folder), sort_keys=False), file=out, end="")
        return 0
    workspace = _workspace(args, connectors)
    build = replace(build, registry_lock=resolve_registry_lock(workspace, datastore, settings.parameters))
    with tempfile.TemporaryDirectory(prefix="retrain-code-") as scratch:
        build = with_code_snapshot(build, Path(scratch), upload=True)
        schedule = build_schedule(schedule_name, args.cron, args.time_zone, build)
        record = create_schedule(workspace, schedule)
    print(f"scheduled {record.name}: {schedule.trigger.expression!r} ({args.time_zone})", file=out)
    return 0
