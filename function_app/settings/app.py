"""The front door's settings: the Function App's environment variables in, one validated frozen value out.

Functions passes app settings as environment variables, so `AppSettings.from_environ` is the only place
that reads them; nothing deeper reads the environment. An invalid setting raises `SettingsError`, whose
one-line message names the variable and the expected form: it stops start-up instead of rejecting every
event later. An empty variable counts as unset (an app setting cleared in the portal stays, empty).

The storage connection string is for the Azurite emulator only (in Azure the managed identity is used): it
is kept out of `repr`, and every text that could quote it goes through `mask_secrets`. The storage
settings' own rules (endpoints, containers, prefixes, the ledger) are in function_app/settings/storage.py,
and the cost settings' (RETRAIN_GPU_HOUR_PRICE and the rest) in components/cost.py, which `retrain submit`
and `retrain run` read too: each name and its validation exist once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from components.azureml.builder import (
    DATASTORE_SETTING,
    DEFAULT_DATASTORE,
    check_datastore_name,
    check_pipeline_task_options,
)
from components.azureml.data_assets import DATA_DATASTORE_SETTING
from components.cost import CostSettings, CostSettingsError
from components.errors import SubmissionError, SubmitterUnavailable
from components.parameters import REGISTRY_LOCK_INPUT, check_registry_lock
from components.submitters import AZUREML, LOCAL, SUBMITTER_SETTING, check_submitter
from core.names import check_model_name
from core.secrets import mask_secrets
from core.text import quoted
from function_app.settings.gates import check_gate_policies
from function_app.settings.models import ModelRoute, check_served_models
from function_app.settings.served import MODEL_NAME, MODELS, served_models
from function_app.settings.storage import (
    BLOB_ACCOUNT,
    BLOB_CONTAINER,
    BLOB_ENDPOINT,
    BLOB_PREFIX,
    BLOB_SUFFIXES,
    EXPECTED_CONNECTION_STRING,
    LEDGER,
    STORAGE_CONNECTION_STRING,
    BlobScope,
    EmulatorConnection,
    LedgerLocation,
    SettingsError,
    blob_scope_from,
)

__all__ = [
    "BLOB_ACCOUNT",
    "BLOB_CONTAINER",
    "BLOB_ENDPOINT",
    "BLOB_PREFIX",
    "BLOB_SUFFIXES",
    "LEDGER",
    "STORAGE_CONNECTION_STRING",
    "AppSettings",
    "BlobScope",
    "CostSettings",
    "LedgerLocation",
    "SettingsError",
    "mask_secrets",
]

HOME = "RETRAIN_HOME"
DEBOUNCE_QUIET, DEBOUNCE_MAX_WAIT = "RETRAIN_DEBOUNCE_QUIET_SECONDS", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS"
COOLDOWN, MAX_RUNS_PER_DAY = "RETRAIN_COOLDOWN_SECONDS", "RETRAIN_MAX_RUNS_PER_DAY"
HTTP_MAX_BODY_BYTES = "RETRAIN_HTTP_MAX_BODY_BYTES"
LANDING_FOLDER = "RETRAIN_LANDING_FOLDER"
PIPELINE_PARAMETERS = "RETRAIN_PIPELINE_PARAMETERS"
PROCESSES_PER_NODE, NODES = "RETRAIN_TRAIN_PROCESSES_PER_NODE", "RETRAIN_TRAIN_NODES"


DEFAULT_HOME = Path(".retrain")
DEFAULT_MODEL_NAME = "digits"
DEFAULT_QUIET_SECONDS, DEFAULT_MAX_WAIT_SECONDS, DEFAULT_COOLDOWN_SECONDS = 120, 900, 3600
DEFAULT_MAX_RUNS_PER_DAY = 6
DEFAULT_HTTP_MAX_BODY_BYTES = 64 * 1024
MAX_HTTP_BODY_BYTES = 100 * 1024 * 1024  # the Functions host refuses larger requests itself
WEEK_SECONDS = 7 * 24 * 3600
MAX_RUNS_PER_DAY_LIMIT = 24 * 60  # a run a minute; more is a typo, not a budget
MAX_PROCESSES_PER_NODE, MAX_NODES = 16, 64  # beyond any Azure GPU SKU / a sane data-parallel job

# The same rule as components/request.py's RunRequest (a test keeps the two in agreement).
_WHOLE_NUMBER = re.compile(r"[0-9]{1,12}")
_PARAMETER_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class AppSettings:
    """Everything the front door reads from its environment, validated."""

    submitter: str = LOCAL
    home: Path = DEFAULT_HOME
    model_name: str = DEFAULT_MODEL_NAME
    blob: BlobScope | None = None
    ledger: LedgerLocation | None = None  # None: `<home>/ledger`
    debounce_quiet_seconds: int = DEFAULT_QUIET_SECONDS
    debounce_max_wait_seconds: int = DEFAULT_MAX_WAIT_SECONDS
    cooldown_seconds: int = DEFAULT_COOLDOWN_SECONDS
    max_runs_per_day: int = DEFAULT_MAX_RUNS_PER_DAY
    http_max_body_bytes: int = DEFAULT_HTTP_MAX_BODY_BYTES
    storage_connection_string: str | None = field(default=None, repr=False)  # emulator only; has a key
    cost: CostSettings = field(default_factory=CostSettings)
    # What each submission asks of the pipeline: input values, and the train step's shape (GPUs per node,
    # nodes). Both also decide the cost estimate.
    pipeline_parameters: Mapping[str, str] = field(default_factory=dict)
    processes_per_node: int = 1
    nodes: int = 1
    # The embedded default's landing "container": a local folder whose files `retrain watch --folder`
    # announces as blobs of the configured container; the local submitter pins from it.
    landing_folder: Path | None = None
    # Every model this front door serves (RETRAIN_MODELS, function_app/settings/served.py); empty: the one
    # model of RETRAIN_MODEL_NAME and RETRAIN_BLOB_* (`model_name` and `blob`). Served from files,
    # `model_name` is the first served model's and `blob` None: each model's scope is its route's.
    # (`dataclasses.replace` of `model_name` or `blob` needs `models=()` too, to build the one model again.)
    models: tuple[ModelRoute, ...] = ()
    # The Azure ML datastore (a blob datastore) of the pipeline's checkpoints and registry lock.
    azureml_datastore: str = DEFAULT_DATASTORE
    # The blob datastore on the landing container, where pinned snapshots are registered as data assets
    # (components/azureml/data_assets.py); None: `azureml_datastore` (one container for everything). Read it
    # as `data_datastore`. (`dataclasses.replace` of `azureml_datastore` keeps the data datastore resolved
    # at construction: pass both.)
    azureml_data_datastore: str | None = None

    def __post_init__(self) -> None:
        try:
            check_submitter(self.submitter)
        except SubmitterUnavailable as error:
            raise SettingsError(str(error)) from None
        check_model_name(self.model_name, MODEL_NAME, SettingsError)
        if "\x00" in str(self.home):
            raise SettingsError(
                f"{HOME}: a folder path cannot contain NUL; expected a folder such as .retrain"
            )
        self._check_numbers()
        if self.azureml_data_datastore is None:
            object.__setattr__(self, "azureml_data_datastore", self.azureml_datastore)
        try:
            check_datastore_name(self.azureml_datastore, DATASTORE_SETTING)
            check_datastore_name(self.data_datastore, DATA_DATASTORE_SETTING)
        except SubmissionError as error:
            raise SettingsError(str(error)) from None
        if not isinstance(self.cost, CostSettings):
            raise SettingsError(f"cost settings {quoted(self.cost)}: expected a components.cost.CostSettings")
        if self.ledger is None:
            object.__setattr__(self, "ledger", LedgerLocation(folder=self.home / "ledger"))
        if not self.models:
            object.__setattr__(self, "models", (ModelRoute(self.model_name, self.blob),))
        object.__setattr__(self, "models", tuple(self.models))
        check_served_models(self.models)
        check_gate_policies(self.models, self.pipeline_parameters, PIPELINE_PARAMETERS)
        self._check_registry_lock()
        if self.submitter == AZUREML:
            self._check_every_model_has_a_scope()
        if self.submitter != LOCAL:  # an Azure ML job, or its dry run: refused at every flush otherwise
            for route in self.models:
                try:
                    check_pipeline_task_options(route.task_options, f"{route.source} [task.options]")
                except SubmissionError as error:
                    raise SettingsError(str(error)) from None
        self._check_emulator_connection()
        if self.landing_folder is not None and self.submitter != LOCAL:
            raise SettingsError(
                f"{LANDING_FOLDER} is set, but {SUBMITTER_SETTING}={self.submitter} pins data from the "
                f"landing container; expected {LANDING_FOLDER} unset, or {SUBMITTER_SETTING}={LOCAL}"
            )
        if self.landing_folder is not None and len(self.models) > 1:
            # The folder plays one prefix's blobs: several models' files would be one model's data.
            raise SettingsError(
                f"{LANDING_FOLDER} is set, but {len(self.models)} models are served "
                f"({', '.join(route.name for route in self.models)}); expected one model ({MODELS}=NAME), "
                "or the landing container"
            )

    def _check_every_model_has_a_scope(self) -> None:
        """Azure ML pins each batch from the model's landing container: a model without one has no data."""
        for route in self.models:
            if route.scope is not None:
                continue
            if route.config is None:
                raise SettingsError(
                    f"{BLOB_ACCOUNT} and {BLOB_CONTAINER} are unset; expected the landing account and "
                    f"container when {SUBMITTER_SETTING}={AZUREML}"
                )
            raise SettingsError(
                f"{route.config}: [trigger] account and container are unset, and so are {BLOB_ACCOUNT} and "
                f"{BLOB_CONTAINER}; expected the model's landing account and container when "
                f"{SUBMITTER_SETTING}={AZUREML}"
            )

    def _check_registry_lock(self) -> None:
        """A lock the register step cannot open fails every run at its end, after a whole training, each
        run counted in the day's budget: refused here, its secret masked. Each model's lock is its file's
        [pipeline] one with the app setting over it; the local submitter's register step takes a folder
        too."""
        for route in self.models:
            if REGISTRY_LOCK_INPUT in self.pipeline_parameters:
                lock, where = self.pipeline_parameters[REGISTRY_LOCK_INPUT], PIPELINE_PARAMETERS
            elif REGISTRY_LOCK_INPUT in route.parameters:
                lock, where = str(route.parameters[REGISTRY_LOCK_INPUT]), f"{route.source} [pipeline]"
            else:
                continue
            try:
                check_registry_lock(lock, f"{where} {REGISTRY_LOCK_INPUT}", folder=self.submitter == LOCAL)
            except SubmissionError as error:
                raise SettingsError(str(error)) from None

    def _check_numbers(self) -> None:
        _check_range(DEBOUNCE_QUIET, self.debounce_quiet_seconds, 0, WEEK_SECONDS, "seconds")
        _check_range(DEBOUNCE_MAX_WAIT, self.debounce_max_wait_seconds, 0, WEEK_SECONDS, "seconds")
        _check_range(COOLDOWN, self.cooldown_seconds, 0, WEEK_SECONDS, "seconds")
        _check_range(MAX_RUNS_PER_DAY, self.max_runs_per_day, 1, MAX_RUNS_PER_DAY_LIMIT, "runs")
        _check_range(HTTP_MAX_BODY_BYTES, self.http_max_body_bytes, 1, MAX_HTTP_BODY_BYTES, "bytes")
        _check_range(PROCESSES_PER_NODE, self.processes_per_node, 1, MAX_PROCESSES_PER_NODE, "processes")
        _check_range(NODES, self.nodes, 1, MAX_NODES, "nodes")
        if self.debounce_max_wait_seconds < self.debounce_quiet_seconds:
            raise SettingsError(
                f"{DEBOUNCE_MAX_WAIT} {self.debounce_max_wait_seconds}: shorter than {DEBOUNCE_QUIET} "
                f"{self.debounce_quiet_seconds}; expected a maximum wait at least as long as the quiet period"
            )

    def _check_emulator_connection(self) -> None:
        """An emulator endpoint needs the emulator's connection string, for the same account and endpoint."""
        connection = (
            EmulatorConnection.parse(self.storage_connection_string)
            if self.storage_connection_string
            else None
        )
        ledger_endpoint = self.ledger_location.endpoint
        if connection and ledger_endpoint and not ledger_endpoint.is_emulator:
            # function_app/ledger/ refuses a key for a real account too: in Azure the identity is used.
            raise SettingsError(
                f"{LEDGER} is in Azure ({ledger_endpoint.url}), where the managed identity is used; expected "
                f"{STORAGE_CONNECTION_STRING} unset, or an emulator ledger"
            )
        # A model's emulator endpoint can only come from RETRAIN_BLOB_ENDPOINT (a file names no endpoint).
        blob_endpoints = [(BLOB_ENDPOINT, route.scope.endpoint) for route in self.models if route.scope]
        for setting, endpoint in (*blob_endpoints, (LEDGER, ledger_endpoint)):
            if endpoint is None or not endpoint.is_emulator:
                continue
            if connection is None:
                raise SettingsError(
                    f"{setting} points at the emulator ({endpoint.url}), which needs "
                    f"{STORAGE_CONNECTION_STRING}; expected {EXPECTED_CONNECTION_STRING}"
                )
            if (connection.account, connection.blob_endpoint) != (endpoint.account, endpoint.url):
                raise SettingsError(
                    f"{STORAGE_CONNECTION_STRING} is for account {connection.account!r} at "
                    f"{connection.blob_endpoint}, but {setting} is account {endpoint.account!r} at "
                    f"{endpoint.url}; expected a connection string for that account and endpoint"
                )

    @property
    def ledger_location(self) -> LedgerLocation:
        """The ledger, never None: `<home>/ledger` unless RETRAIN_LEDGER says otherwise."""
        return self.ledger if self.ledger is not None else LedgerLocation(folder=self.home / "ledger")

    @property
    def data_datastore(self) -> str:
        """The datastore pinned snapshots are registered in, never None: the pipeline's unless
        RETRAIN_AZUREML_DATA_DATASTORE says otherwise."""
        return self.azureml_data_datastore or self.azureml_datastore

    def model(self, name: str) -> ModelRoute | None:
        """The served model called `name`, or None."""
        return next((route for route in self.models if route.name == name), None)

    @property
    def debounce_quiet(self) -> timedelta:
        return timedelta(seconds=self.debounce_quiet_seconds)

    @property
    def debounce_max_wait(self) -> timedelta:
        return timedelta(seconds=self.debounce_max_wait_seconds)

    @property
    def cooldown(self) -> timedelta:
        return timedelta(seconds=self.cooldown_seconds)

    def describe(self) -> str:
        """One line for the start-up log; the connection string appears only as 'set'."""
        models = ",".join(
            f"{route.name}({route.task}:{_scope_text(route.scope) if route.scope else 'no blobs'})"
            for route in self.models
        )
        ledger = self.ledger_location.spec
        return (
            f"submitter={self.submitter} models={models} home={self.home} "
            f"ledger={ledger} debounce={self.debounce_quiet_seconds}s/{self.debounce_max_wait_seconds}s "
            f"cooldown={self.cooldown_seconds}s max_runs_per_day={self.max_runs_per_day} "
            f"http_max_body_bytes={self.http_max_body_bytes} "
            f"connection_string={'set' if self.storage_connection_string else 'unset'} "
            f"train={self.nodes}x{self.processes_per_node} parameters={dict(self.pipeline_parameters)} "
            f"landing_folder={self.landing_folder or 'none'} datastore={self.azureml_datastore} "
            f"data_datastore={self.data_datastore} "
            f"cost=({self.cost.describe()})"
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], cwd: Path | None = None) -> AppSettings:
        """The settings named by the RETRAIN_* variables of `environ`; raises `SettingsError`. `cwd` is the
        app root, where RETRAIN_MODELS finds the models' files (default: the working folder)."""
        values = {key: value.strip() for key, value in environ.items() if key.startswith("RETRAIN_")}
        values = {key: value for key, value in values.items() if value}
        home = Path(values.get(HOME, str(DEFAULT_HOME)))
        routes = served_models(values, Path.cwd() if cwd is None else Path(cwd))
        return cls(
            submitter=values.get(SUBMITTER_SETTING, LOCAL),
            home=home,
            model_name=routes[0].name if routes else values.get(MODEL_NAME, DEFAULT_MODEL_NAME),
            blob=None if routes else blob_scope_from(values),
            models=routes or (),
            ledger=LedgerLocation.parse(values[LEDGER]) if LEDGER in values else None,
            debounce_quiet_seconds=_whole(values, DEBOUNCE_QUIET, DEFAULT_QUIET_SECONDS),
            debounce_max_wait_seconds=_whole(values, DEBOUNCE_MAX_WAIT, DEFAULT_MAX_WAIT_SECONDS),
            cooldown_seconds=_whole(values, COOLDOWN, DEFAULT_COOLDOWN_SECONDS),
            max_runs_per_day=_whole(values, MAX_RUNS_PER_DAY, DEFAULT_MAX_RUNS_PER_DAY),
            http_max_body_bytes=_whole(values, HTTP_MAX_BODY_BYTES, DEFAULT_HTTP_MAX_BODY_BYTES),
            storage_connection_string=values.get(STORAGE_CONNECTION_STRING),
            cost=_cost_settings(values),
            pipeline_parameters=_pipeline_parameters(values.get(PIPELINE_PARAMETERS, "")),
            processes_per_node=_whole(values, PROCESSES_PER_NODE, 1),
            nodes=_whole(values, NODES, 1),
            landing_folder=Path(values[LANDING_FOLDER]) if LANDING_FOLDER in values else None,
            azureml_datastore=values.get(DATASTORE_SETTING, DEFAULT_DATASTORE),
            azureml_data_datastore=values.get(DATA_DATASTORE_SETTING),
        )


def _scope_text(scope: BlobScope) -> str:
    return f"{scope.container_url}/{scope.folder}*{{{','.join(scope.suffixes)}}}"


def _pipeline_parameters(text: str) -> dict[str, str]:
    """`name=value,name=value` (pipeline or component inputs; values may not hold a comma) as a mapping.
    Whether each name is an input of the pipeline is checked when a submission is built from the specs."""
    parameters: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, separator, value = (piece.strip() for piece in item.partition("="))
        if not separator or not _PARAMETER_NAME.fullmatch(name) or not value:
            raise SettingsError(
                f"{PIPELINE_PARAMETERS} {quoted(item, 60)}: expected name=value pairs separated by commas, "
                "such as epochs=10,hidden_width=512"
            )
        if name in parameters:
            raise SettingsError(f"{PIPELINE_PARAMETERS}: {name} given twice; expected each input once")
        parameters[name] = value
    return parameters


def _cost_settings(values: Mapping[str, str]) -> CostSettings:
    try:
        return CostSettings.from_environ(values)
    except CostSettingsError as error:
        raise SettingsError(str(error)) from None


def _whole(values: Mapping[str, str], name: str, default: int) -> int:
    text = values.get(name)
    if text is None:
        return default
    if not _WHOLE_NUMBER.fullmatch(text):
        raise SettingsError(f"{name} {quoted(text, 40)}: expected a whole number such as {default}")
    return int(text)


def _check_range(name: str, value: int, low: int, high: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingsError(f"{name} {quoted(value)}: expected whole {unit} from {low} to {high}")
