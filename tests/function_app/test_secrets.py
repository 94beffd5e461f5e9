"""No secret from a URL setting's user info, SAS signature or account key appears in any output: start-up's
exception and log records, and the `retrain` CLI's stdout and stderr at debug level. The secrets are made up
here, random each run, and hold the characters that have broken URL parsers before: '/', '+', '=', '%2F'."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from function_app import runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60
ACCOUNT, CONTAINER = "retraindata", "landing"
CLOUD = f"https://{ACCOUNT}.blob.core.windows.net"
EMULATOR_HOST = "http://127.0.0.1:10000"


def made_up_secret() -> str:
    """40-odd random characters with '/', '+', '=' and '%2F' spread through them."""
    pieces = [secrets.token_urlsafe(9) for _ in range(4)]
    return f"{pieces[0]}/{pieces[1]}+{pieces[2]}%2F{pieces[3]}="


SECRET = made_up_secret()
# Every 8-character piece: a message that shows part of the secret leaks it too.
PIECES = tuple(SECRET[start : start + 8] for start in range(len(SECRET) - 7))


def leaked(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


def _url_placements(endpoint: str, path: str) -> dict[str, str]:
    """`endpoint` + `path` with the secret where people paste one."""
    scheme, rest = endpoint.split("://", 1)
    return {
        "user info": f"{scheme}://user:{SECRET}@{rest}{path}",
        "user info, key alone": f"{scheme}://{SECRET}@{rest}{path}",
        "SAS query": f"{endpoint}{path}?sv=2024-08-04&sr=c&sp=racwl&sig={SECRET}",
        "SAS without '?'": f"{endpoint}{path}&sig={SECRET}",
        "fragment": f"{endpoint}{path}#sig={SECRET}",
        "account key": f"{endpoint}{path};AccountKey={SECRET}",
        "another scheme": f"abfss://user:{SECRET}@{ACCOUNT}.dfs.core.windows.net{path}",
    }


def _connection_strings() -> dict[str, str]:
    emulator = f"{EMULATOR_HOST}/devstoreaccount1"
    return {
        "account key, another account": (
            f"DefaultEndpointsProtocol=http;AccountName=other;AccountKey={SECRET};BlobEndpoint={emulator};"
        ),
        "account key, not the emulator": (
            f"DefaultEndpointsProtocol=https;AccountName={ACCOUNT};AccountKey={SECRET};BlobEndpoint={CLOUD};"
        ),
        "account key, malformed": f"AccountName=devstoreaccount1;AccountKey={SECRET};BlobEndpoint",
        "blob endpoint user info": (
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"BlobEndpoint=http://user:{SECRET}@127.0.0.1:10000/devstoreaccount1;"
        ),
        "blob endpoint SAS": (
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"BlobEndpoint={emulator}?sig={SECRET};"
        ),
        "shared access signature": f"BlobEndpoint={emulator};SharedAccessSignature=sv=1&sig={SECRET}",
    }


def _cases() -> list[tuple[str, dict[str, str]]]:
    cases = []
    for where, url in _url_placements(CLOUD, f"/{CONTAINER}/ledger").items():
        cases.append((f"RETRAIN_LEDGER {where}", {"RETRAIN_LEDGER": url}))
    for where, url in _url_placements(f"{EMULATOR_HOST}/devstoreaccount1", "/ledger").items():
        cases.append((f"RETRAIN_LEDGER on the emulator, {where}", {"RETRAIN_LEDGER": url}))
    for where, url in _url_placements(CLOUD, "").items():
        landing = {"RETRAIN_BLOB_ACCOUNT": ACCOUNT, "RETRAIN_BLOB_CONTAINER": CONTAINER}
        cases.append((f"RETRAIN_BLOB_ENDPOINT {where}", {**landing, "RETRAIN_BLOB_ENDPOINT": url}))
    for where, text in _connection_strings().items():
        emulator_ledger = {"RETRAIN_LEDGER": f"{EMULATOR_HOST}/devstoreaccount1/ledger"}
        cases.append(
            (
                f"RETRAIN_STORAGE_CONNECTION_STRING {where}",
                {**emulator_ledger, "RETRAIN_STORAGE_CONNECTION_STRING": text},
            )
        )
    return cases


CASES = _cases()


@pytest.mark.parametrize(("case", "settings"), CASES, ids=[case for case, _ in CASES])
def test_start_up_shows_no_secret_in_its_error_or_its_log(tmp_path, caplog, case, settings):
    environ = {"RETRAIN_SUBMITTER": "dry-run", "RETRAIN_HOME": str(tmp_path), **settings}

    # Any refusal will do: what matters is its text.
    with caplog.at_level(logging.DEBUG), pytest.raises(Exception) as raised:
        runtime.start(environ)

    shown = "\n".join([str(raised.value), repr(raised.value), caplog.text])
    shown += "\n".join(str(record.args) for record in caplog.records)
    assert leaked(shown) == [], f"{case}: {shown}"


def _retrain(home: Path, settings: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")}
    return subprocess.run(
        [sys.executable, "-m", "retrain_cli", "--verbose", *argv],
        cwd=home,
        env={**environ, "PYTHONPATH": str(REPO_ROOT), "RETRAIN_SUBMITTER": "dry-run", **settings},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


# The CLI runs a subprocess per case: the placements that broke parsers before, not every one.
CLI_PLACEMENTS = ("user info", "SAS query", "another account", "blob endpoint user info", "blob endpoint SAS")
CLI_CASES = [(case, settings) for case, settings in CASES if case.endswith(CLI_PLACEMENTS)]


def test_the_cli_shows_no_secret_at_debug_level(tmp_path):
    # Every case in one test, so the suite pays for each subprocess and nothing else. `flush` starts the
    # whole front door; `ledger` reads only the ledger's settings, so only theirs can stop it.
    for case, settings in CLI_CASES:
        for command in ("flush", "ledger"):
            if command == "ledger" and "RETRAIN_BLOB_ENDPOINT" in settings:
                continue
            result = _retrain(tmp_path, settings, command)

            assert result.returncode == 2, f"{case}, {command}: {result.stdout}{result.stderr}"
            assert leaked(result.stdout + result.stderr) == [], f"{case}: {result.stdout}{result.stderr}"


def test_a_working_emulator_ledger_shows_no_account_key_at_debug_level(tmp_path, azurite):
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(azurite.connection_string).create_container("secret-ledger")
    settings = {
        "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/secret-ledger",
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "RETRAIN_BLOB_ACCOUNT": azurite.account,
        "RETRAIN_BLOB_CONTAINER": CONTAINER,
        "RETRAIN_BLOB_ENDPOINT": azurite.blob_endpoint,
    }

    for command in ("flush", "ledger"):
        result = _retrain(tmp_path, settings, command)

        assert result.returncode == 0, result.stderr
        key_pieces = {azurite.account_key[start : start + 8] for start in range(len(azurite.account_key) - 7)}
        output = result.stdout + result.stderr
        assert "DEBUG" in output  # the SDK's request logging was on
        assert [piece for piece in key_pieces if piece in output] == []
