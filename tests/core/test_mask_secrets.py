"""The one masking function (core/secrets.py `mask_secrets`), case by case: each place a credential hides
is masked, and the text around it, and harmless look-alikes, are left as they were. Then what is built on
it: masking a record, masking what is logged, and taking a tracking URI's password apart from it."""

from __future__ import annotations

import io
import logging

import pytest

from core.errors import InputError
from core.secrets import (
    MLFLOW_PASSWORD_VARIABLE,
    MLFLOW_USERNAME_VARIABLE,
    mask_logged_secrets,
    mask_secrets,
    mask_secrets_in,
    mlflow_credentials_apart,
    tracking_credentials_apart,
)

SECRET = "S3cr3tV4lue"
KEY = "Zm9vYmFy/c2VjcmV0+a2V5=="  # base64, like an account key: '/', '+' and '='

MASKED = [
    # user info, with '//', with the one '/' a path leaves, without a scheme, a key holding '/'
    (f"GET https://user:{SECRET}@host.example.com/x", "GET https://***@host.example.com/x"),
    (f"--data https:/user:{SECRET}@example.com/raw: gone", "--data https:/***@example.com/raw: gone"),
    (f"mlflow at http://u:{SECRET}@127.0.0.1:5000", "mlflow at http://***@127.0.0.1:5000"),
    (f"login user:{SECRET}@db.example.com", "login user:***@db.example.com"),
    (f"'user:{SECRET}@localhost:5432'", "'user:***@localhost:5432'"),
    (f"https://acct:{KEY}@acct.blob.core.windows.net/c", "https://***@acct.blob.core.windows.net/c"),
    # a SAS token: the signature goes, what describes the token stays
    (
        f"https://a.blob.core.windows.net/c?sv=2024&se=2026-01-01&sp=r&sig={SECRET}%3D",
        "https://a.blob.core.windows.net/c?sv=2024&se=2026-01-01&sp=r&sig=***",
    ),
    # connection strings
    (
        f"AccountName=acct;AccountKey={KEY};EndpointSuffix=x",
        "AccountName=acct;AccountKey=***;EndpointSuffix=x",
    ),
    (f"Endpoint=sb://n/;SharedAccessKeyName=send;SharedAccessKey={SECRET}", "Endpoint=sb://n/;SharedAccessKeyName=send;SharedAccessKey=***"),
    (f"BlobEndpoint=https://a/;SharedAccessSignature=sv=1&sig={SECRET}", "BlobEndpoint=https://a/;SharedAccessSignature=***&sig=***"),
    # token-like query parameters, and the short names that are credentials in a query only
    (f"http://h:5000/?token={SECRET}&experiment=7", "http://h:5000/?token=***&experiment=7"),
    (f"https://h/cb?access_token={SECRET}&refresh_token={SECRET}", "https://h/cb?access_token=***&refresh_token=***"),
    (f"https://h/x?api_key={SECRET}&apikey={SECRET}&x-api-key={SECRET}", "https://h/x?api_key=***&apikey=***&x-api-key=***"),
    (f"https://h/x?password={SECRET}&pwd={SECRET}&passwd={SECRET}", "https://h/x?password=***&pwd=***&passwd=***"),
    (f"https://h/x?secret={SECRET}&client_secret={SECRET}&page=2", "https://h/x?secret=***&client_secret=***&page=2"),
    (f"https://f.azurewebsites.net/api/retrain?code={SECRET}&model=digits", "https://f.azurewebsites.net/api/retrain?code=***&model=digits"),
    (f"https://h/x?key={SECRET}", "https://h/x?key=***"),
    # name=value wherever it stands, in any case; a trigger's pairs
    (
        f"MLFLOW_TRACKING_PASSWORD={SECRET} AWS_SECRET_ACCESS_KEY={SECRET}",
        "MLFLOW_TRACKING_PASSWORD=*** AWS_SECRET_ACCESS_KEY=***",
    ),
    (f"source=cli,Token={SECRET},who=ops", "source=cli,Token=***,who=ops"),
    # headers, JSON and YAML
    (f"Authorization: Bearer {SECRET}.abc", "Authorization: Bearer ***"),
    (f"Authorization: Basic {KEY}", "Authorization: Basic ***"),
    (f"Authorization: SharedKey acct:{KEY}", "Authorization: SharedKey ***:***"),
    (f"x-api-key: {SECRET}", "x-api-key: ***"),
    (f'{{"password": "{SECRET}", "epochs": 2}}', '{"password": "***", "epochs": 2}'),
    (f"{{'client_secret': '{SECRET}'}}", "{'client_secret': '***'}"),
    (f"store:\n  password: {SECRET}\n  host: h", "store:\n  password: ***\n  host: h"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "masked"), MASKED)
def test_each_place_a_credential_hides_is_masked(text, masked):
    assert mask_secrets(text) == masked
    assert SECRET not in mask_secrets(text) and "c2VjcmV0" not in mask_secrets(text)
    assert mask_secrets(masked) == masked  # masking again changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "nothing secret: https://acct.blob.core.windows.net/c; design=1",
        "expected KEY=VALUE (a pipeline or component input); exit code=1; cache key=ab12",
        "run_key=digits-rd-0123 checkpoint_key=x partition_key=y",
        "azureml:digits-raw@latest and azureml://datastores/ws/paths/raw/",
        "git@github.com:org/repo.git, someone@example.com",
        "sqlite:////tmp/home/mlflow.db at 13:40:44,038 rank0",
        "Basic usage; the token: bucket; tokens=3; design=1; config=x",
        "https://h/x?sv=2024&se=2026-01-01&sp=r&sr=c&skoid=abc&page=2",
    ],
)
def test_harmless_text_and_harmless_parameters_are_left_as_they_are(text):
    assert mask_secrets(text) == text


def test_a_record_is_masked_in_every_string_and_under_every_credential_name():
    record = {
        "parameters": {"mlflow_tracking_uri": f"http://u:{SECRET}@h.example.com", "epochs": "2"},
        "command": ["python", "--uri", f"https://h/x?sig={SECRET}"],
        "options": {"password": SECRET, "api_key": SECRET, "hidden_width": 8, "key_count": "3"},
        "count": 3,
        "done": None,
    }
    assert mask_secrets_in(record) == {
        "parameters": {"mlflow_tracking_uri": "http://***@h.example.com", "epochs": "2"},
        "command": ["python", "--uri", "https://h/x?sig=***"],
        "options": {"password": "***", "api_key": "***", "hidden_width": 8, "key_count": "3"},
        "count": 3,
        "done": None,
    }


def test_what_any_logger_writes_is_masked_even_through_a_handler_of_its_own():
    stream, own = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    # As MLflow configures its loggers: a handler of its own, not propagating to the root.
    library = logging.getLogger("mlflow-like.rest_utils")
    library.propagate, library_handler = False, logging.StreamHandler(own)
    library.addHandler(library_handler)
    root.addHandler(handler)
    factory = logging.getLogRecordFactory()
    try:
        mask_logged_secrets()
        mask_logged_secrets()  # idempotent: one layer of masking
        url = f"http://u:{SECRET}@127.0.0.1:5000/api/2.0"
        logging.getLogger("retrain.step").warning("API request to %s failed", url)
        library.warning("API request to %s failed", url)
        try:
            raise ConnectionError(f"cannot reach {url}")
        except ConnectionError:
            library.exception("tracking failed")
    finally:
        logging.setLogRecordFactory(factory)
        root.removeHandler(handler)
        library.removeHandler(library_handler)
    assert stream.getvalue() == "WARNING API request to http://***@127.0.0.1:5000/api/2.0 failed\n"
    assert own.getvalue().startswith("API request to http://***@127.0.0.1:5000/api/2.0 failed\n")
    assert "ConnectionError: cannot reach http://***@127.0.0.1:5000/api/2.0" in own.getvalue()
    assert SECRET not in stream.getvalue() + own.getvalue()


def test_a_tracking_uri_gives_its_user_info_to_mlflows_variables_and_keeps_the_rest():
    uri, environment = tracking_credentials_apart(f"https://ops:{SECRET}%40x@mlflow.example.com:8443/t?x=1")
    assert uri == "https://mlflow.example.com:8443/t?x=1"
    # percent-decoded, as requests decodes user info before it sends basic auth
    assert environment == {MLFLOW_USERNAME_VARIABLE: "ops", MLFLOW_PASSWORD_VARIABLE: f"{SECRET}@x"}
    for plain in ("http://127.0.0.1:5000", "sqlite:////tmp/mlflow.db", "databricks://profile", "off", ""):
        assert tracking_credentials_apart(plain) == (plain, {})


def test_mlflow_is_given_no_store_uri_with_user_info_its_login_goes_to_its_variables():
    # MLflow prints the URI it has ("View run ... at: URI") straight to stdout, past every masking.
    environ = {
        "MLFLOW_TRACKING_URI": f"https://ops:{SECRET}@mlflow.example.com/t",
        "MLFLOW_REGISTRY_URI": f"https://ops:{SECRET}@mlflow.example.com/r",
        "PATH": "/usr/bin",
    }
    assert mlflow_credentials_apart(environ, f"http://ops:{SECRET}@127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert environ == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com/t",
        "MLFLOW_REGISTRY_URI": "https://mlflow.example.com/r",
        "PATH": "/usr/bin",
        MLFLOW_USERNAME_VARIABLE: "ops",
        MLFLOW_PASSWORD_VARIABLE: SECRET,
    }
    # URIs without user info, and no option, change nothing; an existing login is kept.
    plain = {"MLFLOW_TRACKING_URI": "sqlite:////tmp/mlflow.db", MLFLOW_USERNAME_VARIABLE: "me"}
    assert mlflow_credentials_apart(plain, None) is None
    assert plain == {"MLFLOW_TRACKING_URI": "sqlite:////tmp/mlflow.db", MLFLOW_USERNAME_VARIABLE: "me"}


def test_two_different_mlflow_logins_are_refused_in_one_line_that_shows_neither():
    # MLflow sends one user and password per process, to whichever store it calls.
    environ = {"MLFLOW_TRACKING_URI": f"https://ops:{SECRET}@a.example.com"}
    with pytest.raises(InputError) as raised:
        mlflow_credentials_apart(environ, f"https://ops:{SECRET}x@b.example.com")
    message = str(raised.value)
    assert message.startswith("MLFLOW_TRACKING_URI and --mlflow-tracking-uri carry different users or ")
    assert SECRET not in message and "\n" not in message


def test_a_token_in_a_tracking_uri_is_not_echoed_by_the_registrys_error(monkeypatch):
    from training.gate.registry import MlflowStore, ModelRegistry, RegistryError

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # nothing listens on port 1: fail at once
    registry = ModelRegistry(MlflowStore(f"http://127.0.0.1:1/?token={SECRET}"))
    with pytest.raises(RegistryError) as raised:
        registry.aliases("digits")
    message = str(raised.value)
    assert message.startswith("cannot read model 'digits' in the MLflow registry at http://127.0.0.1:1/: ")
    assert "?token=***" in message and SECRET not in message
