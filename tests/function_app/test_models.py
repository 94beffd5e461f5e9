"""Many models behind one front door: the served models come from their configuration files
(RETRAIN_MODELS), a blob event goes to the one model whose scope holds it, a drift alert and POST
/api/retrain to the model they name, and scopes that overlap stop start-up naming both models."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.function_app import corpus
from helpers.function_app.front_door_settings import app_settings
from helpers.function_app.served_models import IMAGE, TABULAR, served_environ, write_model

from components.local.model_init import init_model
from function_app.events.drift_alerts import parse_drift_alert
from function_app.events.http_retrain import HttpRejection, parse_http_retrain
from function_app.events.parsing import parse_blob_created
from function_app.events.triggers import REJECTED, Rejection, TriggerRequest
from function_app.local.watch import WatchError, watched_scopes
from function_app.settings.app import AppSettings, SettingsError
from function_app.wiring import build_front_door

NOW = datetime(2026, 11, 29, 10, 42, tzinfo=UTC)
NO_ACCOUNT = {"RETRAIN_BLOB_ACCOUNT": "", "RETRAIN_BLOB_CONTAINER": ""}  # empty: unset


@pytest.fixture
def two_models(tmp_path: Path) -> dict[str, str]:
    """alpha: tabular data under alpha/; beta: images under beta/; both in the corpus's container."""
    write_model(tmp_path / "models", "alpha", TABULAR, 'prefix = "alpha"')
    write_model(tmp_path / "models", "beta", IMAGE, 'prefix = "beta"')
    return served_environ(tmp_path, "alpha,beta")


def _blob_event(name: str, etag: str, event_id: str) -> dict:
    return corpus.blob_created(name=name, eTag=etag, envelope={"id": event_id})


# -- routing -----------------------------------------------------------------------------------------------


def test_a_mixed_storm_gives_each_model_only_its_own_blobs(two_models):
    # Passes once FrontDoor.flush() submits every served model's batch (the lead's loop over
    # settings.models); until then only the first model's batch is submitted.
    front = build_front_door(AppSettings.from_environ(two_models), two_models, clock=lambda: NOW)
    blobs = {f"alpha/part-{n:03}.csv": "alpha" for n in range(12)}
    blobs |= {f"beta/img-{n:03}.png": "beta" for n in range(12)}
    events = [_blob_event(name, f"0x{n:015X}", f"ev-{n}") for n, name in enumerate(blobs)]
    storm = events + random.Random(13).sample(events, 9)  # redeliveries, same id and content
    random.Random(7).shuffle(storm)

    decisions = [front.deliver(event, "blob").decision for event in storm]
    submissions = front.flush(ignore_quiet=True)

    assert REJECTED not in decisions
    by_model = {record.model_name: record for record in submissions}
    assert sorted(by_model) == ["alpha", "beta"] and len(submissions) == 2
    for model, record in by_model.items():
        names = sorted(pin.url.split(f"/{corpus.CONTAINER}/", 1)[1] for pin in record.inputs)
        assert names == sorted(name for name, owner in blobs.items() if owner == model)


def test_each_blob_event_is_routed_to_the_model_whose_scope_holds_it(two_models):
    settings = AppSettings.from_environ(two_models)
    alpha = parse_blob_created(corpus.blob_created(name="alpha/part-1.csv"), settings, NOW)
    beta = parse_blob_created(corpus.blob_created(name="beta/cat.png"), settings, NOW)
    assert isinstance(alpha, TriggerRequest) and alpha.model_name == "alpha"
    assert isinstance(beta, TriggerRequest) and beta.model_name == "beta"


@pytest.mark.parametrize(
    ("name", "container", "reason"),
    [
        ("beta/table.csv", corpus.CONTAINER, "none of the suffixes .png, .jpg, .jpeg for model 'beta'"),
        ("alpha/cat.png", corpus.CONTAINER, "none of the suffixes .csv, .parquet for model 'alpha'"),
        (
            "gamma/part-1.csv",
            corpus.CONTAINER,
            "not under a served model's prefix; expected a file under one of "
            "'alpha/' (alpha), 'beta/' (beta)",
        ),
        (
            "alpha/nested/part-1.csv",
            corpus.CONTAINER,
            "in a sub-folder of the prefix 'alpha/' of model 'alpha'",
        ),
        (
            "beta/circle/small/cat.png",
            corpus.CONTAINER,
            "lies 2 folder levels below the prefix 'beta/' of model",
        ),
        ("alpha/part-1.csv", "archive", "container 'archive' is not a served model's"),
    ],
)
def test_a_blob_no_model_holds_is_rejected_saying_why(two_models, name, container, reason):
    settings = AppSettings.from_environ(two_models)
    result = parse_blob_created(corpus.blob_created(name=name, container=container), settings, NOW)
    assert isinstance(result, Rejection)
    assert reason in result.reason


def test_models_in_other_accounts_take_their_own_accounts_blobs(tmp_path):
    write_model(tmp_path / "models", "alpha", TABULAR, 'prefix = "alpha"')
    write_model(tmp_path / "models", "beta", TABULAR, 'account = "otherstore"\nprefix = "alpha"')
    settings = AppSettings.from_environ(served_environ(tmp_path, "alpha,beta"))
    other = "https://otherstore.blob.core.windows.net"
    topic = corpus.STORAGE_TOPIC.replace(corpus.ACCOUNT, "otherstore")
    event = corpus.blob_created(
        name="alpha/x.csv", url=corpus.blob_url("alpha/x.csv", endpoint=other), envelope={"topic": topic}
    )

    routed = parse_blob_created(event, settings, NOW)
    home = parse_blob_created(corpus.blob_created(name="alpha/x.csv"), settings, NOW)

    assert isinstance(routed, TriggerRequest) and routed.model_name == "beta"
    assert routed.blob is not None and routed.blob.url.startswith(other)
    assert isinstance(home, TriggerRequest) and home.model_name == "alpha"
    foreign = parse_blob_created(
        corpus.blob_created(name="alpha/x.csv", envelope={"topic": topic}), settings, NOW
    )
    assert isinstance(foreign, Rejection) and "expected the blob's own account" in foreign.reason


# -- drift alerts and HTTP -----------------------------------------------------------------------------------


def test_a_drift_alert_goes_to_the_model_it_names(two_models):
    settings = AppSettings.from_environ(two_models)
    beta = parse_drift_alert(corpus.retrain_drift_detected(model_name="beta"), settings, NOW)
    fraud = parse_drift_alert(corpus.retrain_drift_detected(model_name="fraud"), settings, NOW)
    assert isinstance(beta, TriggerRequest) and beta.model_name == "beta"
    assert isinstance(fraud, Rejection)
    assert "'fraud' is not this front door's model; expected one of: 'alpha', 'beta'" in fraud.reason


def test_a_model_monitor_alert_goes_to_its_tagged_model_else_the_only_one(two_models, tmp_path):
    settings = AppSettings.from_environ(two_models)
    breach = {"azureml_modelmonitor_threshold_breached": corpus.BREACH_MESSAGE}
    tagged = parse_drift_alert(
        corpus.run_status_changed(tags={**breach, "retrain.model_name": "beta"}), settings, NOW
    )
    untagged = parse_drift_alert(corpus.run_status_changed(tags=breach), settings, NOW)
    v1 = parse_drift_alert(corpus.dataset_drift_detected(), settings, NOW)

    assert isinstance(tagged, TriggerRequest) and tagged.model_name == "beta"
    assert isinstance(untagged, Rejection) and "serves several ('alpha', 'beta')" in untagged.reason
    assert isinstance(v1, Rejection) and "names no model" in v1.reason
    one = AppSettings.from_environ(served_environ(tmp_path, "beta"))
    only = parse_drift_alert(corpus.run_status_changed(tags=breach), one, NOW)
    assert isinstance(only, TriggerRequest) and only.model_name == "beta"


def _post(settings: AppSettings, body: dict) -> TriggerRequest | HttpRejection:
    return parse_http_retrain(json.dumps(body).encode(), {}, settings, NOW, new_id=lambda: "http-1")


def test_a_retrain_request_names_its_model_when_several_are_served(two_models, tmp_path):
    settings = AppSettings.from_environ(two_models)
    missing, unknown = _post(settings, {}), _post(settings, {"model_name": "fraud"})
    beta = _post(settings, {"model_name": "beta"})

    assert isinstance(missing, HttpRejection) and missing.status == 400
    assert (
        "model_name is missing; expected one of this front door's models: 'alpha', 'beta'" in missing.reason
    )
    assert isinstance(unknown, HttpRejection) and unknown.status == 400
    assert "not this front door's model" in unknown.reason
    assert isinstance(beta, TriggerRequest) and beta.model_name == "beta"
    one = AppSettings.from_environ(served_environ(tmp_path, "beta"))
    implied = _post(one, {})
    assert isinstance(implied, TriggerRequest) and implied.model_name == "beta"


def test_a_retrain_request_s_data_lies_in_its_own_model_s_scope(two_models):
    settings = AppSettings.from_environ(two_models)
    own = _post(settings, {"model_name": "beta", "data": corpus.blob_url("beta")})
    other = _post(settings, {"model_name": "beta", "data": corpus.blob_url("alpha")})
    assert isinstance(own, TriggerRequest) and own.data_uri == corpus.blob_url("beta")
    assert isinstance(other, HttpRejection) and "outside the prefix 'beta/'" in other.reason


# -- start-up ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "beta"),
    [
        ('prefix = "data"', 'prefix = "data"'),  # the same folder, a shared suffix
        ('prefix = "data"', 'prefix = "data/new"'),  # a folder above the other
        ("", 'prefix = "data"'),  # the container's root is above every folder
        ('prefix = "data"', 'prefix = "data/new"\nsuffixes = [".parquet", ".json"]'),  # one shared suffix
    ],
)
def test_overlapping_scopes_stop_start_up_naming_both_models(tmp_path, alpha, beta):
    alpha_file = write_model(tmp_path / "models", "alpha", TABULAR, alpha)
    beta_file = write_model(tmp_path / "models", "beta", TABULAR, beta)
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(served_environ(tmp_path, "alpha,beta"))
    message = str(raised.value)
    assert "'alpha'" in message and "'beta'" in message
    assert str(alpha_file) in message and str(beta_file) in message and "overlap" in message


@pytest.mark.parametrize(
    ("alpha", "beta"),
    [
        ('prefix = "data"', 'prefix = "data-new"'),  # siblings, not a folder and its sub-folder
        ('prefix = "data"', 'prefix = "data"\ncontainer = "archive"'),
        ('prefix = "data"', 'prefix = "data"\naccount = "otherstore"'),
        ('prefix = "data"', 'prefix = "data"\nsuffixes = [".json"]'),  # no shared suffix
    ],
)
def test_disjoint_scopes_are_served_side_by_side(tmp_path, alpha, beta):
    write_model(tmp_path / "models", "alpha", TABULAR, alpha)
    write_model(tmp_path / "models", "beta", TABULAR, beta)
    settings = AppSettings.from_environ(served_environ(tmp_path, "alpha,beta"))
    assert [route.name for route in settings.models] == ["alpha", "beta"]


def test_a_served_model_carries_its_files_task_options_parameters_and_scope(tmp_path):
    path = write_model(tmp_path / "models", "beta", IMAGE + "\n[task.options]\nsize = 16", 'prefix = "beta"')
    path.write_text(path.read_text() + "\n[pipeline]\nepochs = 3\n")
    settings = AppSettings.from_environ(served_environ(tmp_path, "*"))
    (route,) = settings.models
    assert (route.name, route.task, dict(route.task_options), route.config) == (
        "beta",
        "image",
        {"size": 16},
        path,
    )
    assert route.parameters["epochs"] == 3
    assert route.scope is not None
    assert (route.scope.container, route.scope.prefix, route.scope.suffixes) == (
        corpus.CONTAINER,
        "beta",
        (".png", ".jpg", ".jpeg"),
    )
    assert route.scope.endpoint.url == corpus.ENDPOINT
    assert settings.model_name == "beta" and settings.blob is None


def test_the_endpoint_setting_is_its_own_accounts_and_a_model_without_an_account_takes_no_blobs(tmp_path):
    write_model(tmp_path / "models", "alpha", TABULAR, 'account = "otherstore"\ncontainer = "landing"')
    write_model(tmp_path / "models", "beta", TABULAR, 'prefix = "beta"')
    environ = served_environ(
        tmp_path, "alpha,beta", RETRAIN_BLOB_ENDPOINT=f"https://{corpus.ACCOUNT}.blob.core.chinacloudapi.cn"
    )
    alpha, beta = AppSettings.from_environ(environ).models
    assert alpha.scope is not None and alpha.scope.endpoint.url == "https://otherstore.blob.core.windows.net"
    assert beta.scope is not None and beta.scope.endpoint.url.endswith(".chinacloudapi.cn")

    for variable in ("RETRAIN_BLOB_ACCOUNT", "RETRAIN_BLOB_CONTAINER"):
        environ.pop(variable)
    environ.pop("RETRAIN_BLOB_ENDPOINT")
    without = AppSettings.from_environ(environ)
    assert without.model("beta") is not None and without.model("beta").scope is None
    rejected = parse_blob_created(corpus.blob_created(name="beta/x.csv"), without, NOW)
    assert isinstance(rejected, Rejection)


@pytest.mark.parametrize(
    ("files", "overrides", "expected"),
    [
        ({}, {"RETRAIN_MODEL_NAME": "alpha"}, "RETRAIN_MODEL_NAME is set, but RETRAIN_MODELS serves"),
        ({}, {"RETRAIN_BLOB_PREFIX": "alpha"}, "expected RETRAIN_BLOB_PREFIX unset (each file's [trigger])"),
        ({}, {"RETRAIN_MODELS": "alpha,gamma"}, "gamma.toml does not exist"),
        ({}, {"RETRAIN_MODELS": "alpha,alpha"}, "names 'alpha' twice"),
        ({}, {"RETRAIN_MODELS": "Alpha"}, "is not a model name"),
        ({}, {"RETRAIN_LANDING_FOLDER": "landing", "RETRAIN_SUBMITTER": "local"}, "2 models are served"),
        ({"gamma": 'ref = "audio.tasks:Clips"'}, {"RETRAIN_MODELS": "gamma"}, "[trigger] suffixes is unset"),
        ({"gamma": TABULAR}, {"RETRAIN_MODELS": "gamma", "RETRAIN_BLOB_CONTAINER": ""}, "container is unset"),
        (
            {"gamma": TABULAR},
            {"RETRAIN_MODELS": "gamma", "RETRAIN_SUBMITTER": "azureml", **NO_ACCOUNT},
            "gamma.toml: [trigger] account and container are unset",
        ),
    ],
)
def test_serving_from_files_refuses_what_contradicts_them(two_models, tmp_path, files, overrides, expected):
    for name, task in files.items():
        write_model(tmp_path / "models", name, task)
    environ = {**two_models, **overrides}
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(environ)
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_model_made_by_init_custom_is_routed_by_its_task_s_raw_suffixes_without_importing_it(tmp_path):
    # `retrain init house --task custom` writes a [trigger] without suffixes: the default is the task's
    # raw_suffixes, which the front door reads from the task file (it imports torch; start-up never does).
    init_model("house", "custom", tmp_path / "models")
    environ = served_environ(tmp_path, "house")
    (route,) = AppSettings.from_environ(environ).models
    assert route.scope is not None and route.scope.suffixes == (".csv",)
    accepted = parse_blob_created(
        corpus.blob_created(name="house/batch-0001.csv"), AppSettings.from_environ(environ), NOW
    )
    assert isinstance(accepted, TriggerRequest)

    task_file = tmp_path / "models" / "house_task.py"
    task_file.write_text(
        task_file.read_text().replace('raw_suffixes = (".csv",)', 'raw_suffixes = (".tsv",)')
    )
    settings = AppSettings.from_environ(environ)  # the edited file is what routes
    assert settings.models[0].scope is not None and settings.models[0].scope.suffixes == (".tsv",)
    assert isinstance(parse_blob_created(corpus.blob_created(name="house/a.csv"), settings, NOW), Rejection)
    assert isinstance(
        parse_blob_created(corpus.blob_created(name="house/a.tsv"), settings, NOW), TriggerRequest
    )


def test_a_task_whose_raw_suffixes_only_running_it_tells_stops_start_up_in_one_line(tmp_path):
    init_model("house", "custom", tmp_path / "models")
    task_file = tmp_path / "models" / "house_task.py"
    computed = 'raw_suffixes = tuple(s.lower() for s in (".CSV",))'
    task_file.write_text(task_file.read_text().replace('raw_suffixes = (".csv",)', computed))
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(served_environ(tmp_path, "house"))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'models' / 'house.toml'}: [trigger] suffixes is unset, and ")
    assert "HouseTask.raw_suffixes is computed" in message
    assert message.endswith('expected [trigger] suffixes = [".csv"], the files its task reads')


def test_suffixes_follow_the_task_in_the_single_model_settings_too(tmp_path):
    environ = app_settings(tmp_path, RETRAIN_BLOB_SUFFIXES=".png,.jpg")
    settings = AppSettings.from_environ(environ)
    assert settings.blob is not None and settings.blob.suffixes == (".png", ".jpg")
    image = corpus.blob_created(name=f"{corpus.PREFIX}/cat.png")
    assert isinstance(parse_blob_created(image, settings, NOW), TriggerRequest)


# -- the local watch -----------------------------------------------------------------------------------------


def test_the_watch_polls_every_served_scope_or_the_chosen_models(two_models):
    settings = AppSettings.from_environ(two_models)
    assert [scope.prefix for scope in watched_scopes(settings, None, container=True)] == ["alpha", "beta"]
    assert [scope.prefix for scope in watched_scopes(settings, "beta", container=False)] == ["beta"]
    with pytest.raises(WatchError, match="a folder plays one model's prefix"):
        watched_scopes(settings, None, container=False)
    with pytest.raises(WatchError, match="not a served model"):
        watched_scopes(settings, "fraud", container=True)
