"""What `POST /api/retrain` is bound to: an Idempotency-Key belongs to one model and one body, on the local
ledger and on Azurite; `retrain trigger --model-name` names the model where several are served; and the
request's own URL is checked before anything is claimed, so an odd port or an IPv6 host never costs a 500
after the claim (issue 20, items 5, 14 and 15)."""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import pytest
from helpers.function_app.front_door_settings import app_settings

from function_app.local.cli import register_commands
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

FUNCTION_URL = "https://retrain-fn.azurewebsites.net/api/retrain"
WAIT = {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "60", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "60"}  # claims stay


def two_models(home: Path, **overrides: str) -> dict[str, str]:
    """App settings serving alpha (tabular, under alpha/) and beta (images, under beta/) from home/models."""
    folder = home / "models"
    folder.mkdir(parents=True, exist_ok=True)
    for name, task in (("alpha", "tabular"), ("beta", "image")):
        (folder / f"{name}.toml").write_text(f'[task]\nref = "{task}"\n\n[trigger]\nprefix = "{name}"\n')
    environ = app_settings(home, RETRAIN_MODELS="alpha,beta", RETRAIN_MODELS_DIR=str(folder), **overrides)
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):
        environ.pop(single)
    return environ


@pytest.fixture(params=["local", "azurite"])
def ledger_settings(request, tmp_path) -> dict[str, str]:
    """Where the ledger lives: a local folder, or a fresh container on Azurite."""
    if request.param == "local":
        return {}
    azurite = request.getfixturevalue("azurite")
    container = f"keys-{uuid.uuid4().hex[:12]}"
    azurite.service_client().create_container(container)
    return {
        "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/{container}/front-door",
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
    }


def _door(environ: dict[str, str]):
    return build_front_door(AppSettings.from_environ(environ), environ)


def test_a_key_reused_for_another_model_is_422_and_claims_nothing(tmp_path, ledger_settings):
    environ = two_models(tmp_path / "home", **WAIT, **ledger_settings)
    door, other_instance = _door(environ), _door(environ)
    key = {"Idempotency-Key": "nightly-2026-12-01"}

    first = door.retrain(b'{"model_name": "alpha", "reason": "nightly"}', key, FUNCTION_URL)
    elsewhere = other_instance.retrain(b'{"model_name": "beta", "reason": "nightly"}', key, FUNCTION_URL)

    assert first.status == 202
    assert elsewhere.status == 422
    assert elsewhere.body == {
        "error": "the Idempotency-Key was used before for model 'alpha'; expected a new key for a request "
        "for 'beta'"
    }
    assert door.ledger.claims("beta") == []  # no second claim under the same id
    [claim] = door.ledger.claims("alpha")
    assert claim.record.id == first.body["id"] and claim.record.item.reason == "nightly"
    # The same key, model and body stays idempotent; the same key and model with another body is refused.
    again = other_instance.retrain(b'{ "reason": "nightly", "model_name": "alpha" }', key, FUNCTION_URL)
    assert again.status == 202 and again.body == first.body
    changed = door.retrain(b'{"model_name": "alpha", "reason": "other"}', key, FUNCTION_URL)
    assert changed.status == 422 and "another request body" in changed.body["error"]
    assert len(door.ledger.claims("alpha")) == 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrain")
    register_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def test_trigger_names_the_model_when_several_are_served(tmp_path, capsys):
    environ = two_models(tmp_path / "home", **WAIT)

    def trigger(*argv: str) -> tuple[int, str]:
        args = _parser().parse_args(["trigger", *argv])
        args.environ, args.state_root = environ, Path(environ["RETRAIN_HOME"])
        code = args.handler(args)
        return code, capsys.readouterr().out

    code, out = trigger("--reason", "new labels")
    assert code == 2 and "model_name is missing; expected one of this front door's models" in out

    code, out = trigger("--model-name", "beta", "--reason", "new labels")
    assert code == 0 and out.startswith("202 ")
    request_id = json.loads(out.removeprefix("202 "))["id"]
    door = _door(environ)
    [claim] = door.ledger.claims("beta")
    assert claim.record.id == request_id and claim.record.item.reason == "new labels"
    assert door.ledger.claims("alpha") == []


@pytest.mark.parametrize(
    "url",
    [
        "https://retrain-fn.azurewebsites.net:99999/api/retrain",
        "https://retrain-fn.azurewebsites.net:http/api/retrain?code=k3y",
        "http://[::1/api/retrain",
    ],
)
def test_a_request_url_without_a_valid_host_and_port_is_400_before_any_claim(tmp_path, url):
    door = _door(app_settings(tmp_path / "home"))

    answer = door.retrain(b'{"reason": "nightly"}', {"Idempotency-Key": "n-1"}, url)

    assert answer.status == 400
    assert "the request URL's host and port" in answer.body["error"]
    assert "expected a host name or [IPv6 address], and a port from 1 to 65535" in answer.body["error"]
    assert "\n" not in answer.body["error"] and "k3y" not in answer.body["error"]
    assert door.ledger.claims("digits") == []
    # The key was not spent: the same request from a well-formed URL is taken.
    assert door.retrain(b'{"reason": "nightly"}', {"Idempotency-Key": "n-1"}, FUNCTION_URL).status == 202


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://[::1]:7071/api/retrain?code=k3y", "http://[::1]:7071/api/retrain"),
        ("https://[2001:db8::7]/api/retrain/", "https://[2001:db8::7]/api/retrain"),
        (
            "https://user:pw@retrain-fn.azurewebsites.net:8443/api/retrain",
            "https://retrain-fn.azurewebsites.net:8443/api/retrain",
        ),
    ],
)
def test_the_status_url_keeps_an_ipv6_host_s_brackets_and_the_port(tmp_path, url, base):
    door = _door(app_settings(tmp_path / "home"))

    answer = door.retrain(b"{}", {}, url)

    assert answer.status == 202
    assert answer.body["status_url"] == f"{base}/{answer.body['id']}"
