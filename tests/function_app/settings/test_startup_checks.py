"""Start-up checks what it can: a pipeline parameter is read by its component input's type and bounds, and
a bad one stops start-up with one line naming it, its value and the expected form; the read-only
`retrain ledger` needs only the ledger's location."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
from helpers.function_app.corpus import blob_created

from components.errors import SubmissionError
from components.parameters import check_parameter_texts
from components.specs import load_pipeline_spec
from function_app import runtime
from function_app.local.cli import register_commands
from function_app.settings.app import AppSettings, SettingsError
from function_app.wiring import build_front_door


def _start(tmp_path: Path, parameters: str):
    settings = AppSettings.from_environ(
        {
            "RETRAIN_SUBMITTER": "dry-run",
            "RETRAIN_HOME": str(tmp_path),
            "RETRAIN_PIPELINE_PARAMETERS": parameters,
        }
    )
    return build_front_door(settings, {})


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("epochs=NaN", "parameter epochs is 'NaN'; expected a whole number >= 1"),
        ("epochs=-1", "parameter epochs is '-1'; expected a whole number >= 1"),
        ("epochs=0", "parameter epochs is '0'; expected a whole number >= 1"),
        ("epochs=abc", "parameter epochs is 'abc'; expected a whole number >= 1"),
        ("epochs=2.5", "parameter epochs is '2.5'; expected a whole number >= 1"),
        ("seed=-3", "parameter seed is '-3'; expected a whole number >= 0"),
        ("learning_rate=inf", "parameter learning_rate is 'inf'; expected a number > 0"),
        ("learning_rate=nan", "parameter learning_rate is 'nan'; expected a number > 0"),
        ("learning_rate=fast", "parameter learning_rate is 'fast'; expected a number > 0"),
        ("mtbe_hours=-2", "parameter mtbe_hours is '-2'; expected a number of hours > 0"),
        ("global_batch_size=0", "parameter global_batch_size is '0'; expected a whole number >= 1"),
        (
            "checkpoint_every_steps=0",
            "parameter checkpoint_every_steps is '0'; expected a whole number >= 1, or 'off'",
        ),
        ("epochs=3,min_improvement=-0.1", "parameter min_improvement is '-0.1'; expected a number >= 0"),
    ],
)
def test_a_pipeline_parameter_its_input_refuses_stops_start_up_in_one_line(tmp_path, parameters, message):
    with pytest.raises(SettingsError) as raised:
        _start(tmp_path, parameters)

    assert str(raised.value) == f"RETRAIN_PIPELINE_PARAMETERS: {message}"


SECRET = "S3cretPassw0rd"
LOCK_URL = "https://lockstore.blob.core.windows.net/locks/retrain"


@pytest.mark.parametrize("submitter", ["local", "dry-run"])
@pytest.mark.parametrize(
    "lock",
    [
        f"https://retrain:{SECRET}@lockstore.blob.core.windows.net/locks",
        f"{LOCK_URL}?sv=2024-11-04&sp=rwl&sig={SECRET}",
        f"https://lockstore.blob.core.windows.net/locks#{SECRET}",
    ],
)
def test_a_registry_lock_with_credentials_stops_start_up_masked_before_anything_is_spent(
    tmp_path, submitter, lock
):
    # The register step refuses such a lock only after a whole training, each run counted in the budget.
    environ = {
        "RETRAIN_SUBMITTER": submitter,
        "RETRAIN_HOME": str(tmp_path / "home"),
        "RETRAIN_PIPELINE_PARAMETERS": f"epochs=1,registry_lock={lock}",
    }
    with pytest.raises(SettingsError) as raised:
        runtime.start(environ)
    message = str(raised.value)
    assert message.startswith("RETRAIN_PIPELINE_PARAMETERS registry_lock 'https://lockstore.blob.core.")
    assert "credentials do not belong in the URL" in message
    assert SECRET not in message and "\n" not in message
    assert not (tmp_path / "home").exists()  # no ledger, no claim, no budget


def test_a_registry_lock_the_submitter_s_register_step_can_open_starts(tmp_path):
    local = {"RETRAIN_HOME": str(tmp_path), "RETRAIN_SUBMITTER": "local"}
    for lock in (LOCK_URL, str(tmp_path / "locks")):  # locally a folder is a lock too
        settings = AppSettings.from_environ({**local, "RETRAIN_PIPELINE_PARAMETERS": f"registry_lock={lock}"})
        assert settings.pipeline_parameters["registry_lock"] == lock
    dry_run = {**local, "RETRAIN_SUBMITTER": "dry-run"}
    assert AppSettings.from_environ({**dry_run, "RETRAIN_PIPELINE_PARAMETERS": f"registry_lock={LOCK_URL}"})
    # On Azure ML the register steps of two jobs run on two nodes: a folder serialises nothing.
    with pytest.raises(SettingsError, match=r"registry_lock '/.*/locks': a folder, which register steps on"):
        AppSettings.from_environ(
            {**dry_run, "RETRAIN_PIPELINE_PARAMETERS": f"registry_lock={tmp_path / 'locks'}"}
        )


def test_a_registry_lock_in_a_model_s_file_is_checked_as_its_runs_would_use_it(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "digits.toml").write_text(
        f'[pipeline]\nregistry_lock = "{LOCK_URL}?sig={SECRET}"\n\n[trigger]\nprefix = "digits"\n'
    )
    environ = {"RETRAIN_HOME": str(tmp_path), "RETRAIN_MODELS": "digits", "RETRAIN_MODELS_DIR": str(folder)}
    with pytest.raises(SettingsError) as raised:  # refused where the file is read, masked
        AppSettings.from_environ(environ)
    message = str(raised.value)
    assert message.startswith(f"{folder / 'digits.toml'}: [pipeline] registry_lock is 'https://")
    assert SECRET not in message and "expected a folder, or a blob container URL" in message
    # ... and so is `retrain run --param registry_lock=...`, before anything is pinned.
    lock = f"https://u:{SECRET}@x.blob.core.windows.net/l"
    with pytest.raises(SubmissionError) as refused:
        check_parameter_texts(load_pipeline_spec(), {"registry_lock": lock})
    assert str(refused.value).startswith("parameter registry_lock is 'https://***@x.blob.core.windows.net/l'")


def test_parameters_within_their_inputs_bounds_start(tmp_path):
    front = _start(
        tmp_path,
        "epochs=1,seed=0,learning_rate=1e-4,mtbe_hours=0.5,checkpoint_every_seconds=auto,"
        "checkpoint_every_steps=50,min_improvement=0",
    )
    assert front.settings.pipeline_parameters["epochs"] == "1"


def test_a_boolean_input_takes_true_or_false_only():
    from components.parameters import parse_text_value, value_fits
    from components.specs import Port

    flag = Port("flag", "boolean")
    assert [parse_text_value(text, flag) for text in ("true", "False")] == [True, False]
    with pytest.raises(ValueError):
        parse_text_value("maybe", flag)
    assert not value_fits(1, flag) and value_fits(True, flag)


def test_the_settings_line_goes_to_the_debug_log(tmp_path, app_settings, caplog):
    with caplog.at_level(logging.DEBUG, logger="function_app.runtime"):
        runtime.start(app_settings(tmp_path / "home"))

    [line] = [record for record in caplog.records if "front door settings" in record.getMessage()]
    assert line.levelno == logging.DEBUG


# -- read-only commands ---------------------------------------------------------------------------------


def _retrain(capsys, environ: dict[str, str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="retrain")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    args.environ = environ
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_retrain_ledger_needs_only_the_ledgers_location(tmp_path, app_settings, capsys):
    home = tmp_path / "home"
    front = runtime.start(app_settings(home))
    front.deliver(blob_created(), "blob")
    expected = front.ledger.snapshot()
    # Settings that would stop the front door (no blob scope for Azure ML, a parameter no input takes)
    # do not concern a command that only reads the ledger.
    unrelated = {"RETRAIN_SUBMITTER": "azureml", "RETRAIN_PIPELINE_PARAMETERS": "epochs=NaN"}

    code, out, err = _retrain(
        capsys, {"RETRAIN_LEDGER": str(home / "ledger"), **unrelated}, "ledger", "--json"
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == expected and len(expected["events"]) == 1

    code, out, _ = _retrain(capsys, {"RETRAIN_HOME": str(home), **unrelated}, "ledger", "--json")
    assert code == 0 and json.loads(out) == expected  # RETRAIN_HOME/ledger when RETRAIN_LEDGER is unset


def test_retrain_ledger_reads_a_ledger_on_azurite_with_the_connection_string_only(
    tmp_path, app_settings, azurite, capsys
):
    from azure.storage.blob import BlobServiceClient

    container = "ledger-read-only"
    BlobServiceClient.from_connection_string(azurite.connection_string).create_container(container)
    on_azurite = {
        "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/{container}",
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
    }
    front = runtime.start(app_settings(tmp_path / "home", **on_azurite))
    front.deliver(blob_created(), "blob")

    code, out, err = _retrain(capsys, on_azurite, "ledger", "--json")

    assert (code, err) == (0, "")
    assert json.loads(out) == front.ledger.snapshot()


def test_retrain_ledger_refuses_a_bad_location_in_one_line(capsys):
    code, out, err = _retrain(capsys, {"RETRAIN_LEDGER": "ftp://host/ledger"}, "ledger")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "RETRAIN_LEDGER" in err and "expected a folder" in err
