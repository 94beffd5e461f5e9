"""`retrain event | watch | trigger | flush | ledger`: the front door on one machine, with no Functions host.

    retrain event FILE... [--trigger blob|drift]
    retrain watch [--folder PATH | --container] [--model NAME] [--once] [--interval SECONDS] [--flush]
    retrain trigger [--model-name NAME] [--data URI] [--reason TEXT] [--force] [--idempotency-key KEY]
    retrain flush [--now]
    retrain ledger [--json] [--event ID]

These play Event Grid and the host. `event` delivers Event Grid payloads (a JSON object or array, either
schema) to the very handler functions the Event Grid triggers call, each event as the worker's own converter
builds it, and prints the handler's decision line once, after the file it came from; `watch` polls the
landing folder or container, delivers a Blob-created event per new blob version (function_app/local/watch.py)
and prints each decision line, which names the blob; `trigger` sends the handler of `POST /api/retrain`
what the HTTP request would carry and, once a forced request submitted, what its status URL tells; `flush`
runs the timer's flush (`--now` ignores the quiet period). A submission is printed with its run's status
and the gate's decision beside it (components/outcome.py). `ledger` prints every event's decision and every
submission, with its estimated cost, every duplicate delivery with the claim it duplicates, and the records
moved aside to `quarantine/` as unreadable; `--event ID` tells what became of one event (its Event Grid or
request id, or its record id), or fails in one line when the ledger has no record of it.

Settings come from the environment (`args.environ`), as app settings reach a Function App. Exit codes: 0
done (rejections are decisions too); 1 a delivery or flush failed (transient: run it again, the ledger
dedupes); 2 bad input or settings, with a one-line message; 75 (EX_TEMPFAIL) `trigger` held back by the
cooldown or the daily budget, with the seconds to wait.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from azure.core.exceptions import AzureError

from components.errors import PipelineError
from components.outcome import describe_outcome
from components.submitters import LOCAL, SUBMITTER_SETTING
from core.errors import RetrainError
from core.text import quoted
from function_app import runtime
from function_app.events.parsing import PayloadError, load_event_grid_payload
from function_app.events.triggers import KIND_BLOB, KIND_DRIFT
from function_app.ledger.ledger import Ledger, open_ledger
from function_app.ledger.records import LedgerError, duplicate_id_for_event
from function_app.local.watch import ContainerSource, FolderSource, Watcher, WatchError, watched_scopes
from function_app.local.worker import deliver, event_family
from function_app.service import FrontDoor, utc_now
from function_app.settings.app import (
    DEFAULT_HOME,
    HOME,
    LANDING_FOLDER,
    LEDGER,
    STORAGE_CONNECTION_STRING,
    AppSettings,
    EmulatorConnection,
    LedgerLocation,
    mask_secrets,
)

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LATER = 0, 1, 2, 75
# Where `func start` would serve POST /api/retrain; the status URLs in the answers are built on it.
LOCAL_RETRAIN_URL = "http://localhost:7071/api/retrain"
DEFAULT_WATCH_INTERVAL_S = 30.0  # the timer trigger's period: an upload is seen within one flush period
LANDING_DIR = "landing"


class CliError(RetrainError):
    """A command cannot go on; `exit_code` says why (bad input, or a failure worth retrying)."""

    one_line = False  # kept as written

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return mask_secrets(first)


def _reports_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A failure becomes one line on stderr and an exit code, never a traceback."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (CliError, WatchError) as error:
            print(f"retrain {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return error.exit_code if isinstance(error, CliError) else EXIT_USAGE
        except (LedgerError, PipelineError, AzureError, OSError) as error:
            print(f"retrain {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return EXIT_FAILED

    return run


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add `event`, `watch`, `trigger`, `flush` and `ledger` to a `retrain` parser's subcommands."""
    event = commands.add_parser("event", help="deliver Event Grid payloads to the Event Grid triggers")
    event.add_argument("files", nargs="+", type=Path, metavar="FILE", help="a JSON event or array of events")
    event.add_argument(
        "--trigger",
        choices=(KIND_BLOB, KIND_DRIFT),
        help="deliver every event to this trigger (default: by event type, as the subscriptions filter)",
    )
    event.set_defaults(handler=_reports_errors(event_command))

    watch = commands.add_parser("watch", help="deliver a Blob-created event per new landing blob version")
    where = watch.add_mutually_exclusive_group()
    where.add_argument("--folder", type=Path, help=f"a local landing folder (default <state>/{LANDING_DIR})")
    where.add_argument(
        "--container", action="store_true", help="every served model's landing container instead"
    )
    watch.add_argument(
        "--model", help="watch only this served model's blobs (--folder: whose prefix it plays)"
    )
    watch.add_argument("--once", action="store_true", help="poll once and exit")
    watch.add_argument(
        "--interval", type=_seconds, default=DEFAULT_WATCH_INTERVAL_S, help="seconds between polls (30)"
    )
    watch.add_argument("--flush", action="store_true", help="after each poll, run the timer's flush too")
    watch.set_defaults(handler=_reports_errors(watch_command))

    trigger = commands.add_parser("trigger", help="ask for a retraining, as POST /api/retrain does")
    trigger.add_argument(
        "--model-name", help="the served model to retrain (required when several are served)"
    )
    trigger.add_argument("--data", help="a landing blob folder URL, or azureml:<asset>:rd-<16 hex>")
    trigger.add_argument("--reason", help="why (one line, at most 500 characters)")
    trigger.add_argument("--force", action="store_true", help="skip the cooldown and the debounce wait")
    trigger.add_argument("--idempotency-key", help="repeat a request safely: one key, one decision")
    trigger.set_defaults(handler=_reports_errors(trigger_command))

    flush = commands.add_parser("flush", help="submit the pending batch if its time has come (the timer)")
    flush.add_argument("--now", action="store_true", help="ignore the quiet period (not the cooldown)")
    flush.set_defaults(handler=_reports_errors(flush_command))

    ledger = commands.add_parser("ledger", help="every event's decision and every submission")
    ledger.add_argument("--json", action="store_true", help="the ledger as JSON")
    ledger.add_argument(
        "--event", metavar="ID", help="only what became of this event (its event id, or its record id)"
    )
    ledger.set_defaults(handler=_reports_errors(ledger_command))


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 (exclusive) to 86400, got {text!r}")
    return value


def start(environ: Mapping[str, str]) -> FrontDoor:
    """The front door the handlers reach through `runtime.front_door()`, started from `environ`."""
    try:
        return runtime.start(environ)
    except (ValueError, LedgerError, PipelineError) as error:  # SettingsError is a ValueError
        raise CliError(f"the front door cannot start: {_one_line(error)}") from None


# -- event ------------------------------------------------------------------------------------------------


def _read_events(path: Path, family: str | None) -> list[tuple[str, dict[str, Any], str]]:
    """(label, payload, family) for each event of one file; raises CliError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else _one_line(error)
        raise CliError(f"{path}: cannot read it ({reason}); expected a readable JSON file") from None
    try:
        events = load_event_grid_payload(text)
    except PayloadError as error:
        raise CliError(f"{path}: {error}") from None
    read = []
    for index, payload in enumerate(events):
        label = f"{path}[{index}]" if len(events) > 1 else str(path)
        read.append((label, payload, family or event_family(payload)))
    return read


def event_command(args: argparse.Namespace) -> int:
    # Every file is read and decoded before anything is delivered: bad input changes nothing.
    events = [event for path in args.files for event in _read_events(path, args.trigger)]
    start(args.environ)
    for done, (label, payload, family) in enumerate(events):
        try:
            lines = deliver(payload, family)
        except (LedgerError, AzureError, PipelineError, OSError) as error:
            raise CliError(
                f"{label}: delivery to the {family} trigger failed ({type(error).__name__}: "
                f"{_one_line(error)}); {done} of {len(events)} delivered, deliver again (the ledger dedupes)",
                EXIT_FAILED,
            ) from None
        for line in lines:
            print(f"{label}: {line}")
    return EXIT_OK


# -- watch ------------------------------------------------------------------------------------------------


def _watched_folder(args: argparse.Namespace, settings: AppSettings) -> Path:
    folder = Path(args.folder or settings.landing_folder or Path(args.state_root) / LANDING_DIR)
    landing = settings.landing_folder
    # The local submitter pins a batch from RETRAIN_LANDING_FOLDER: watching another folder would announce
    # files that no pin can find.
    if settings.submitter == LOCAL and (landing is None or landing.resolve() != folder.resolve()):
        raise CliError(
            f"retrain watch --folder {folder} with {SUBMITTER_SETTING}={LOCAL}: expected "
            f"{LANDING_FOLDER}={folder} too, so that the local submitter pins the batch from the folder it "
            "watches"
        )
    return folder


def watch_command(args: argparse.Namespace) -> int:
    front = start(args.environ)
    scopes = watched_scopes(front.settings, args.model, container=args.container)

    def deliver_blob(payload: dict[str, Any]) -> None:
        for line in deliver(payload, KIND_BLOB):
            print(line, flush=True)

    watchers = []
    for scope in scopes:
        if args.container:
            from function_app.wiring import landing_container

            container = landing_container(front.settings, scope)
            source: ContainerSource | FolderSource = ContainerSource(container, scope)
        else:
            source = FolderSource(_watched_folder(args, front.settings), scope)
        watchers.append(Watcher(source, scope, Path(args.state_root), deliver_blob, utc_now))
        levels = (
            "directly in it" if scope.depth == 1 else f"in it or {scope.depth - 1} level(s) of sub-folders"
        )
        shown_as = "" if args.container else f" as {scope.container_url}/{scope.folder} (the files {levels})"
        print(f"watching {source.description}{shown_as}", flush=True)
    while True:
        try:
            for watcher in watchers:
                watcher.poll()
            if args.flush:
                _print_flush(front, front.flush())
        except (LedgerError, AzureError, PipelineError, OSError) as error:
            if args.once:
                raise CliError(f"poll failed: {_one_line(error)}", EXIT_FAILED) from None
            log.warning("poll failed (%s); trying again in %g s", _one_line(error), args.interval)
        if args.once:
            return EXIT_OK
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return EXIT_OK


# -- trigger, flush, ledger -------------------------------------------------------------------------------


def trigger_command(args: argparse.Namespace) -> int:
    import azure.functions as func

    from function_app.blueprints import http_api

    start(args.environ)
    body: dict[str, Any] = {
        key: getattr(args, key) for key in ("model_name", "data", "reason") if getattr(args, key) is not None
    }
    if args.force:
        body["force"] = True
    headers = {"Content-Type": "application/json"}
    if args.idempotency_key is not None:
        headers["Idempotency-Key"] = args.idempotency_key
    request = func.HttpRequest("POST", LOCAL_RETRAIN_URL, headers=headers, body=json.dumps(body).encode())
    response = http_api.post_retrain(request)
    answer = response.get_body().decode()
    retry_after = response.headers.get("Retry-After")
    suffix = f" (Retry-After: {retry_after} s)" if retry_after else ""
    print(f"{response.status_code} {answer}{suffix}")
    if response.status_code >= 300:
        return EXIT_LATER if response.status_code in (409, 429) else EXIT_USAGE
    request_id = json.loads(answer)["id"]
    # A forced request that submitted: what a client then reads at its status URL, the run's status and the
    # gate's decision (the local submitter has run it by now).
    status_url = func.HttpRequest(
        "GET", f"{LOCAL_RETRAIN_URL}/{request_id}", route_params={"id": request_id}, body=b""
    )
    report = json.loads(http_api.get_retrain(status_url).get_body())
    if report.get("submission_status"):
        outcome = describe_outcome(report["submission_status"], report.get("outcome", {}))
        print(f"submission {report['submission']}: {outcome}, job {report.get('job_name') or '-'}")
    return EXIT_OK


def flush_command(args: argparse.Namespace) -> int:
    front = start(args.environ)
    submitted = front.flush(ignore_quiet=args.now)
    _print_flush(front, submitted, ignore_quiet=args.now)
    return EXIT_OK


def _print_flush(front: FrontDoor, submitted: list[Any], ignore_quiet: bool = False) -> None:
    for record in submitted:
        print(
            f"submitted {record.id} ({record.kind}): data {record.raw_version}, {len(record.inputs)} new "
            f"input(s), job {record.job_name}, status {describe_outcome(record.status, record.details)}",
            flush=True,
        )
    if submitted:
        return
    verdicts = front.verdicts()
    for model, verdict in verdicts.items():
        which = f" for {model}" if len(verdicts) > 1 else ""
        print(f"nothing submitted{which}: {verdict.reason}", flush=True)


def open_configured_ledger(environ: Mapping[str, str]) -> Ledger:
    """The ledger the settings name, and nothing else: a read-only command needs only its location
    (RETRAIN_LEDGER, else RETRAIN_HOME/ledger; RETRAIN_STORAGE_CONNECTION_STRING for Azurite), not the
    front door's blob scope or submitter."""
    values = {
        key: value.strip()
        for key, value in environ.items()
        if key in (LEDGER, HOME, STORAGE_CONNECTION_STRING)
    }
    values = {key: value for key, value in values.items() if value}
    try:
        location = (
            LedgerLocation.parse(values[LEDGER])
            if LEDGER in values
            else LedgerLocation(folder=Path(values.get(HOME, str(DEFAULT_HOME))) / "ledger")
        )
        connection_string = values.get(STORAGE_CONNECTION_STRING)
        if connection_string:
            EmulatorConnection.parse(connection_string)  # the front door's rules: Azurite's, a key, no SAS
        return open_ledger(location.spec, connection_string)
    except (ValueError, LedgerError) as error:  # SettingsError is a ValueError
        raise CliError(f"the ledger cannot be opened: {_one_line(error)}") from None


def ledger_command(args: argparse.Namespace) -> int:
    snapshot = open_configured_ledger(args.environ).snapshot()
    if args.event is not None:
        return _print_event(snapshot, args.event, args.json)
    if args.json:
        print(json.dumps(snapshot, indent=2))
        return EXIT_OK
    events, submissions = snapshot["events"], snapshot["submissions"]
    print(f"events ({len(events)}):")
    for event in events:
        print(f"  {_event_line(event)}")
    duplicates = snapshot["duplicates"]
    if duplicates:  # deliveries whose claim lost: each event's decision is its claim's
        print(f"duplicates ({len(duplicates)}):")
        for duplicate in duplicates:
            print(f"  {_duplicate_line(duplicate)}")
    print(f"submissions ({len(submissions)}):")
    for record in submissions:
        print(
            f"  {record['id']}  {record['kind']:<5}  {record['status']:<10}  {record['raw_version']}  "
            f"{len(record['inputs'])} input(s)"
        )
        if record.get("estimate"):
            print(f"    {record['estimate']['summary']}")
    quarantined = snapshot["quarantined"]
    if quarantined:  # unreadable records moved aside: read them, then delete them when done
        print(f"quarantined ({len(quarantined)}):")
        for name in quarantined:
            print(f"  {name}")
    return EXIT_OK


def _event_line(event: Mapping[str, Any]) -> str:
    into = f" -> {event['submission']}" if event.get("submission") else ""
    return f"{event['id']}  {event['kind']:<5}  {event['decision']:<9}{into}  {event['reason']}"


def _duplicate_line(duplicate: Mapping[str, Any]) -> str:
    return (
        f"{duplicate['id']}  {duplicate['kind']:<5}  duplicate of {duplicate['duplicate_of']}  "
        f"event {duplicate['event_id']}"
    )


def _print_event(snapshot: Mapping[str, Any], wanted: str, as_json: bool) -> int:
    """What became of the event `wanted`, by its event id or its record id: its own records (a claim, or
    each rejected delivery of it), and for a duplicate the claim it duplicates, whose decision is its."""
    events = [e for e in snapshot["events"] if wanted in (e["id"], e["event_id"])]
    wanted_id = duplicate_id_for_event(wanted)
    duplicates = [d for d in snapshot["duplicates"] if d["id"] in (wanted, wanted_id)]
    if not events and not duplicates:
        raise CliError(
            f"no event {quoted(wanted, 130)} in the ledger; expected an event id or a record id that "
            "`retrain ledger` lists"
        )
    claims = {event["id"]: event for event in snapshot["events"]}
    if as_json:
        found = [{**d, "claim": claims.get(d["duplicate_of"])} for d in duplicates]
        print(json.dumps({"events": events, "duplicates": found}, indent=2))
        return EXIT_OK
    for event in events:
        print(_event_line(event))
    for duplicate in duplicates:
        claim = claims.get(duplicate["duplicate_of"])
        print(_duplicate_line(duplicate))
        # The claim's decision is the duplicate's: printed beside it, or why it is not.
        print(f"  {_event_line(claim)}" if claim else "  (that claim is not in the ledger: quarantined?)")
    return EXIT_OK
