"""App settings: RETRAIN_* variables into one validated frozen value; a bad one stops start-up with a
one-line message naming it, and the emulator's connection string never shows."""

from __future__ import annotations

import dataclasses
import json
import secrets
from datetime import timedelta
from pathlib import Path

import pytest

from components.cost import CostSettings
from components.data_version import DataError
from components.errors import SubmissionError
from components.request import DataRef, RunRequest
from function_app.settings.app import AppSettings, SettingsError, mask_secrets

ACCOUNT_KEY = secrets.token_urlsafe(48)  # fake, for this session only
EMULATOR = "http://127.0.0.1:10000/devstoreaccount1"
CONNECTION_STRING = (
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
    f"BlobEndpoint={EMULATOR};"
)
LANDING = {"RETRAIN_BLOB_ACCOUNT": "retraindata", "RETRAIN_BLOB_CONTAINER": "landing"}
ON_EMULATOR = {
    "RETRAIN_BLOB_ACCOUNT": "devstoreaccount1",
    "RETRAIN_BLOB_CONTAINER": "landing",
    "RETRAIN_BLOB_ENDPOINT": EMULATOR,
    "RETRAIN_STORAGE_CONNECTION_STRING": CONNECTION_STRING,
}


def test_an_empty_environment_gives_the_embedded_defaults():
    settings = AppSettings.from_environ({})

    assert (settings.submitter, settings.home, settings.model_name) == ("local", Path(".retrain"), "digits")
    assert settings.blob is None
    assert settings.ledger.folder == Path(".retrain/ledger")
    assert (settings.debounce_quiet, settings.debounce_max_wait) == (
        timedelta(minutes=2),
        timedelta(minutes=15),
    )
    assert (settings.cooldown, settings.max_runs_per_day) == (timedelta(hours=1), 6)
    assert settings.http_max_body_bytes == 65536
    assert settings.storage_connection_string is None
    assert (settings.azureml_datastore, settings.data_datastore) == (
        "workspaceblobstore",
        "workspaceblobstore",
    )


def test_every_variable_is_read():
    settings = AppSettings.from_environ(
        {
            "RETRAIN_SUBMITTER": "azureml",
            "RETRAIN_HOME": "/var/retrain",
            "RETRAIN_MODEL_NAME": "digits-v2",
            "RETRAIN_BLOB_ACCOUNT": "retraindata",
            "RETRAIN_BLOB_CONTAINER": "landing",
            "RETRAIN_BLOB_PREFIX": "raw/digits/",
            "RETRAIN_BLOB_SUFFIXES": " .parquet ",
            "RETRAIN_BLOB_ENDPOINT": "https://retraindata.blob.core.chinacloudapi.cn/",
            "RETRAIN_DEBOUNCE_QUIET_SECONDS": "30",
            "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "300",
            "RETRAIN_COOLDOWN_SECONDS": "0",
            "RETRAIN_MAX_RUNS_PER_DAY": "24",
            "RETRAIN_LEDGER": "https://retrainstate.blob.core.windows.net/ledger/front-door/",
            "RETRAIN_HTTP_MAX_BODY_BYTES": "1024",
            "RETRAIN_AZUREML_DATASTORE": "retrain_checkpoints",
            "RETRAIN_AZUREML_DATA_DATASTORE": "retrain_landing",
            "UNRELATED": "ignored",
        }
    )

    assert (settings.submitter, settings.home, settings.model_name) == (
        "azureml",
        Path("/var/retrain"),
        "digits-v2",
    )
    blob = settings.blob
    assert (blob.account, blob.container, blob.prefix, blob.folder) == (
        "retraindata",
        "landing",
        "raw/digits",
        "raw/digits/",
    )
    assert blob.suffixes == (".parquet",)
    assert blob.container_url == "https://retraindata.blob.core.chinacloudapi.cn/landing"
    assert blob.endpoint.dfs_url == "https://retraindata.dfs.core.chinacloudapi.cn"
    assert settings.ledger.url == "https://retrainstate.blob.core.windows.net/ledger/front-door"
    assert (settings.ledger.container, settings.ledger.prefix, settings.ledger.folder) == (
        "ledger",
        "front-door",
        None,
    )
    assert (settings.debounce_quiet_seconds, settings.debounce_max_wait_seconds) == (30, 300)
    assert (settings.cooldown_seconds, settings.max_runs_per_day, settings.http_max_body_bytes) == (
        0,
        24,
        1024,
    )
    assert (settings.azureml_datastore, settings.data_datastore) == ("retrain_checkpoints", "retrain_landing")


def test_the_data_datastore_is_the_pipelines_unless_set():
    """One container for data and checkpoints keeps working with the one setting it always had."""
    settings = AppSettings.from_environ(
        {"RETRAIN_AZUREML_DATASTORE": "lake", "RETRAIN_AZUREML_DATA_DATASTORE": " "}
    )

    assert (settings.azureml_datastore, settings.data_datastore) == ("lake", "lake")
    assert settings == AppSettings.from_environ({"RETRAIN_AZUREML_DATASTORE": "lake"})
    assert "datastore=lake data_datastore=lake" in settings.describe()


def test_the_cost_settings_are_read_by_components_cost_from_the_same_variables():
    environ = {"RETRAIN_GPU_HOUR_PRICE": "3.67", "RETRAIN_SPOT_DISCOUNT": "0.7", "RETRAIN_MTBE_HOURS": " 6 "}

    settings = AppSettings.from_environ(environ)

    assert settings.cost == CostSettings.from_environ(environ)
    assert (settings.cost.gpu_hour_price, settings.cost.spot_discount, settings.cost.mtbe_hours) == (
        3.67,
        0.7,
        6.0,
    )
    assert AppSettings.from_environ({}).cost == CostSettings()  # unset: the documented defaults
    assert "cost=(gpu_hour_price=3.67 spot_discount=0.7 " in settings.describe()


def test_the_home_folder_moves_the_default_ledger_and_an_explicit_ledger_folder_wins():
    assert AppSettings.from_environ({"RETRAIN_HOME": "/srv/r"}).ledger.spec == "/srv/r/ledger"
    assert AppSettings.from_environ({"RETRAIN_LEDGER": "/data/ledger"}).ledger.spec == "/data/ledger"


def test_empty_variables_count_as_unset():
    settings = AppSettings.from_environ(
        {"RETRAIN_SUBMITTER": "", "RETRAIN_BLOB_PREFIX": " ", "RETRAIN_LEDGER": ""}
    )
    assert (settings.submitter, settings.blob, settings.ledger.spec) == ("local", None, ".retrain/ledger")


def test_the_emulator_is_configured_with_its_connection_string():
    settings = AppSettings.from_environ({**ON_EMULATOR, "RETRAIN_LEDGER": f"{EMULATOR}/ledger"})

    assert settings.blob.endpoint.is_emulator
    assert settings.blob.container_url == f"{EMULATOR}/landing"
    assert settings.blob.endpoint.dfs_url is None
    assert settings.ledger.url == f"{EMULATOR}/ledger"


def test_use_development_storage_means_azurites_well_known_account():
    settings = AppSettings.from_environ(
        {**ON_EMULATOR, "RETRAIN_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    )
    assert settings.blob.account == "devstoreaccount1"


@pytest.mark.parametrize(
    ("environ", "named", "expected"),
    [
        ({"RETRAIN_SUBMITTER": "cloud"}, "RETRAIN_SUBMITTER", "expected one of local, azureml, dry-run"),
        ({"RETRAIN_MODEL_NAME": "Digits"}, "RETRAIN_MODEL_NAME", "lowercase letters"),
        ({"RETRAIN_MODEL_NAME": "d" * 41}, "RETRAIN_MODEL_NAME", "1-40"),
        ({"RETRAIN_HOME": "a\x00b"}, "RETRAIN_HOME", "NUL"),
        (
            {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "2m"},
            "RETRAIN_DEBOUNCE_QUIET_SECONDS",
            "expected a whole number",
        ),
        (
            {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "-1"},
            "RETRAIN_DEBOUNCE_QUIET_SECONDS",
            "expected a whole number",
        ),
        ({"RETRAIN_COOLDOWN_SECONDS": "1.5"}, "RETRAIN_COOLDOWN_SECONDS", "expected a whole number"),
        ({"RETRAIN_COOLDOWN_SECONDS": "999999999"}, "RETRAIN_COOLDOWN_SECONDS", "from 0 to 604800"),
        ({"RETRAIN_MAX_RUNS_PER_DAY": "0"}, "RETRAIN_MAX_RUNS_PER_DAY", "from 1 to 1440"),
        ({"RETRAIN_HTTP_MAX_BODY_BYTES": "0"}, "RETRAIN_HTTP_MAX_BODY_BYTES", "from 1 to"),
        (
            {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "600", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "60"},
            "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS",
            "at least as long as the quiet period",
        ),
        ({"RETRAIN_BLOB_ACCOUNT": "retraindata"}, "RETRAIN_BLOB_CONTAINER", "is unset"),
        ({"RETRAIN_BLOB_CONTAINER": "landing"}, "RETRAIN_BLOB_ACCOUNT", "is unset"),
        ({"RETRAIN_BLOB_PREFIX": "digits"}, "RETRAIN_BLOB_PREFIX", "expected all three"),
        ({**LANDING, "RETRAIN_BLOB_ACCOUNT": "Retrain_Data"}, "RETRAIN_BLOB_ACCOUNT", "3-24 lowercase"),
        ({**LANDING, "RETRAIN_BLOB_CONTAINER": "Landing"}, "RETRAIN_BLOB_CONTAINER", "container name"),
        ({**LANDING, "RETRAIN_BLOB_PREFIX": "../up"}, "RETRAIN_BLOB_PREFIX", "no '..'"),
        ({**LANDING, "RETRAIN_BLOB_PREFIX": "/abs"}, "RETRAIN_BLOB_PREFIX", "no leading '/'"),
        (
            {**LANDING, "RETRAIN_BLOB_SUFFIXES": ".csv,json"},
            "RETRAIN_BLOB_SUFFIXES",
            "each a dot and 1-10 lowercase letters or digits",
        ),
        ({**LANDING, "RETRAIN_BLOB_SUFFIXES": ".CSV"}, "RETRAIN_BLOB_SUFFIXES", "lowercase letters"),
        ({**LANDING, "RETRAIN_BLOB_SUFFIXES": ","}, "RETRAIN_BLOB_SUFFIXES", "file suffixes"),
        (
            {**LANDING, "RETRAIN_BLOB_ENDPOINT": "https://otherstore.blob.core.windows.net"},
            "RETRAIN_BLOB_ENDPOINT",
            "is not the endpoint of account 'retraindata'",
        ),
        (
            {**LANDING, "RETRAIN_BLOB_ENDPOINT": "https://retraindata.example.com"},
            "RETRAIN_BLOB_ENDPOINT",
            "neither an Azure Blob Storage account over https nor Azurite",
        ),
        (
            {**LANDING, "RETRAIN_BLOB_ENDPOINT": "http://retraindata.blob.core.windows.net"},
            "RETRAIN_BLOB_ENDPOINT",
            "over https",
        ),
        (
            {**LANDING, "RETRAIN_BLOB_ENDPOINT": "https://retraindata.blob.core.windows.net/?sv=1&sig=abc"},
            "RETRAIN_BLOB_ENDPOINT",
            "credentials do not belong in the URL",
        ),
        ({"RETRAIN_SUBMITTER": "azureml"}, "RETRAIN_BLOB_ACCOUNT", "when RETRAIN_SUBMITTER=azureml"),
        (
            {"RETRAIN_LEDGER": "https://retrainstate.blob.core.windows.net"},
            "RETRAIN_LEDGER",
            "names no container",
        ),
        (
            {"RETRAIN_LEDGER": "https://retrainstate.blob.core.windows.net/Ledger"},
            "RETRAIN_LEDGER",
            "container name",
        ),
        (
            {"RETRAIN_LEDGER": "https://retrainstate.blob.core.windows.net/ledger/a/../b"},
            "RETRAIN_LEDGER",
            "no '..'",
        ),
        ({"RETRAIN_LEDGER": "ftp://host/ledger"}, "RETRAIN_LEDGER", None),
        (
            {**ON_EMULATOR, "RETRAIN_STORAGE_CONNECTION_STRING": ""},
            "RETRAIN_BLOB_ENDPOINT",
            "which needs RETRAIN_STORAGE_CONNECTION_STRING",
        ),
        (
            {"RETRAIN_LEDGER": f"{EMULATOR}/ledger"},
            "RETRAIN_LEDGER",
            "which needs RETRAIN_STORAGE_CONNECTION_STRING",
        ),
        (
            {**ON_EMULATOR, "RETRAIN_LEDGER": "https://retrainstate.blob.core.windows.net/ledger"},
            "RETRAIN_LEDGER",
            "where the managed identity is used",
        ),
        (
            {
                **ON_EMULATOR,
                "RETRAIN_BLOB_ACCOUNT": "other",
                "RETRAIN_BLOB_ENDPOINT": "http://127.0.0.1:10000/other",
            },
            "RETRAIN_STORAGE_CONNECTION_STRING",
            "is for account 'devstoreaccount1'",
        ),
        ({"RETRAIN_GPU_HOUR_PRICE": "$3"}, "RETRAIN_GPU_HOUR_PRICE", "expected a number such as 3.67"),
        ({"RETRAIN_SPOT_DISCOUNT": "1"}, "RETRAIN_SPOT_DISCOUNT", "expected a fraction in [0, 1)"),
        ({"RETRAIN_MTBE_HOURS": "0"}, "RETRAIN_MTBE_HOURS", "expected a number of hours > 0"),
        ({"RETRAIN_LOW_PRIORITY_COMPUTES": "gpu spot"}, "RETRAIN_LOW_PRIORITY_COMPUTES", "compute names"),
        ({"RETRAIN_PIPELINE_PARAMETERS": "epochs"}, "RETRAIN_PIPELINE_PARAMETERS", "expected name=value"),
        ({"RETRAIN_PIPELINE_PARAMETERS": "epochs="}, "RETRAIN_PIPELINE_PARAMETERS", "expected name=value"),
        ({"RETRAIN_PIPELINE_PARAMETERS": "Epochs=3"}, "RETRAIN_PIPELINE_PARAMETERS", "expected name=value"),
        ({"RETRAIN_PIPELINE_PARAMETERS": "epochs=3,epochs=4"}, "RETRAIN_PIPELINE_PARAMETERS", "twice"),
        ({"RETRAIN_TRAIN_PROCESSES_PER_NODE": "0"}, "RETRAIN_TRAIN_PROCESSES_PER_NODE", "from 1 to 16"),
        ({"RETRAIN_TRAIN_NODES": "two"}, "RETRAIN_TRAIN_NODES", "expected a whole number"),
        (
            {"RETRAIN_AZUREML_DATASTORE": "retrain-checkpoints"},
            "RETRAIN_AZUREML_DATASTORE",
            "expected a datastore name (letters, digits, '_'), such as workspaceblobstore",
        ),
        (
            {"RETRAIN_AZUREML_DATA_DATASTORE": "landing/raw"},
            "RETRAIN_AZUREML_DATA_DATASTORE 'landing/raw'",
            "expected a datastore name (letters, digits, '_'), such as workspaceblobstore",
        ),
        (
            {"RETRAIN_SUBMITTER": "dry-run", "RETRAIN_LANDING_FOLDER": "landing"},
            "RETRAIN_LANDING_FOLDER",
            "expected RETRAIN_LANDING_FOLDER unset, or RETRAIN_SUBMITTER=local",
        ),
    ],
)
def test_an_invalid_setting_stops_start_up_with_one_line_naming_it(environ, named, expected):
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(environ)

    message = str(raised.value)
    assert named in message
    assert expected is None or expected in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("connection_string", "expected"),
    [
        (
            f"AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY}",
            "lacks AccountName, AccountKey or BlobEndpoint",
        ),
        (f"AccountKey={ACCOUNT_KEY};garbage", "malformed"),
        (
            f"DefaultEndpointsProtocol=https;AccountName=retraindata;AccountKey={ACCOUNT_KEY};"
            "BlobEndpoint=https://retraindata.blob.core.windows.net",
            "for Azurite only",
        ),
    ],
    ids=["no-endpoint", "malformed", "cloud-account"],  # the ids never carry the key
)
def test_a_bad_connection_string_is_refused_without_quoting_its_key(connection_string, expected):
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ({**ON_EMULATOR, "RETRAIN_STORAGE_CONNECTION_STRING": connection_string})

    assert expected in str(raised.value)
    assert "RETRAIN_STORAGE_CONNECTION_STRING" in str(raised.value)
    assert ACCOUNT_KEY not in str(raised.value)


def test_the_connection_string_never_shows_in_repr_or_the_start_up_line():
    settings = AppSettings.from_environ(ON_EMULATOR)

    assert settings.storage_connection_string == CONNECTION_STRING
    for text in (repr(settings), str(settings), settings.describe()):
        assert ACCOUNT_KEY not in text
    assert "connection_string=set" in settings.describe()


def test_a_secret_in_a_bad_value_is_masked_in_the_message():
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ({"RETRAIN_SUBMITTER": f"AccountKey={ACCOUNT_KEY}"})
    assert ACCOUNT_KEY not in str(raised.value)
    assert "AccountKey=***" in str(raised.value)


def test_mask_secrets_covers_keys_sas_tokens_and_shared_key_headers():
    text = (
        f"AccountKey={ACCOUNT_KEY};SharedAccessSignature=sv=1&sig={ACCOUNT_KEY} SharedKey acct:{ACCOUNT_KEY}"
    )
    assert ACCOUNT_KEY not in mask_secrets(text)


def test_settings_are_frozen_and_validated_when_built_directly():
    settings = AppSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.model_name = "other"  # type: ignore[misc]
    with pytest.raises(SettingsError, match="RETRAIN_MAX_RUNS_PER_DAY"):
        AppSettings(max_runs_per_day=True)  # a boolean is not a count


@pytest.mark.parametrize(
    "name", ["digits", "a", "fraud-v2", "x" * 40, "x" * 41, "Digits", "2fast", "-x", "a_b", ""]
)
def test_the_model_name_rule_is_the_run_requests(name):
    def run_request_accepts() -> bool:
        try:
            RunRequest(
                model_name=name, data=DataRef("rd-0123456789abcdef", "azureml:digits-raw:rd-0123456789abcdef")
            )
        except (SubmissionError, DataError):
            return False
        return True

    def settings_accept() -> bool:
        try:
            AppSettings(model_name=name)
        except SettingsError:
            return False
        return True

    assert settings_accept() == run_request_accepts()


def test_the_example_local_settings_are_valid():
    """local.settings.json.example is what a developer copies: its RETRAIN_* values must start the app."""
    example = Path(__file__).resolve().parents[3] / "local.settings.json.example"
    lines = [line for line in example.read_text().splitlines() if not line.strip().startswith("//")]
    values = json.loads("\n".join(lines))["Values"]

    settings = AppSettings.from_environ(values)

    assert settings.blob is not None and settings.blob.endpoint.is_emulator
    assert settings.storage_connection_string is not None


def test_the_run_shape_and_the_landing_folder_are_read():
    settings = AppSettings.from_environ(
        {
            "RETRAIN_PIPELINE_PARAMETERS": " epochs=12 , hidden_width=512,checkpoint_every_seconds=auto ",
            "RETRAIN_TRAIN_PROCESSES_PER_NODE": "2",
            "RETRAIN_TRAIN_NODES": "3",
            "RETRAIN_LANDING_FOLDER": "incoming",
        }
    )

    assert settings.pipeline_parameters == {
        "epochs": "12", "hidden_width": "512", "checkpoint_every_seconds": "auto"
    }  # fmt: skip
    assert (settings.processes_per_node, settings.nodes) == (2, 3)
    assert settings.landing_folder == Path("incoming")
    assert "train=3x2" in settings.describe() and "landing_folder=incoming" in settings.describe()


def test_a_pipeline_parameter_the_pipeline_has_no_input_for_stops_start_up(tmp_path):
    from function_app.wiring import build_front_door

    settings = AppSettings.from_environ(
        {
            "RETRAIN_SUBMITTER": "dry-run",
            "RETRAIN_HOME": str(tmp_path),
            "RETRAIN_PIPELINE_PARAMETERS": "bogus=1",
        }
    )
    with pytest.raises(
        SettingsError, match=r"^RETRAIN_PIPELINE_PARAMETERS: parameters \['bogus'\]: not inputs"
    ):
        build_front_door(settings, {})
