"""The helpers every room shares (core/): secret masking, the blob URL and prefix rules, the
atomic write, the file sha256, and the spot and interval formulas against hand-computed values."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from core.blob_urls import check_prefix, parse_account_endpoint, parse_blob_url, require_name_in_container
from core.errors import CheckpointError, InputError
from core.files import create_atomically, file_sha256, write_atomically
from core.secrets import displayable_url, mask_secrets
from core.spot import IntervalInputs, SpotScenario, checkpoint_interval, spot_estimate
from function_app.ledger.records import LedgerError
from function_app.ledger.store import open_ledger_store
from function_app.settings.storage import LedgerLocation, SettingsError
from training.checkpoint.blob_store import open_blob_store

# Made up, shaped like the real thing: an account key is base64, so it may hold '/', '+' and '='.
KEY = "Zm9vYmFy/c2VjcmV0+a2V5=="
SIGNATURE = "c2lnbmF0dXJl%2Fxyz%3D"
USER_INFO_URL = f"https://retraindata:{KEY}@retraindata.blob.core.windows.net/checkpoints/run-1"


# -- masking --------------------------------------------------------------------------------------------


def test_mask_secrets_hides_user_info_signatures_and_account_keys():
    text = (
        f"GET {USER_INFO_URL} failed; retried https://acct.blob.core.windows.net/c/b?sv=2024&sig={SIGNATURE}"
        f"&se=2 with 'DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};'"
    )
    masked = mask_secrets(text)
    for secret in (KEY, "Zm9vYmFy", "a2V5", SIGNATURE, "c2lnbmF0dXJl"):
        assert secret not in masked
    assert "https://***@retraindata.blob.core.windows.net/checkpoints/run-1" in masked
    assert "?sv=2024&sig=***&se=2" in masked
    assert "AccountName=acct;AccountKey=***;" in masked
    assert mask_secrets("nothing secret: https://acct.blob.core.windows.net/c; design=1") == (
        "nothing secret: https://acct.blob.core.windows.net/c; design=1"
    )


def test_a_displayable_url_drops_user_info_query_and_fragment():
    shown = displayable_url(f"{USER_INFO_URL}?sv=1&sig={SIGNATURE}#frag")
    assert shown == "https://retraindata.blob.core.windows.net/checkpoints/run-1"


@pytest.mark.parametrize(
    "url",
    [
        USER_INFO_URL,  # the key's '/' makes the parser see 'retraindata:Zm9vYmFy' as host and port
        f"https://retraindata.blob.core.windows.net/checkpoints/run-1?sv=2024&sig={SIGNATURE}",
        f"https://retraindata.blob.core.windows.net/checkpoints/run-1?AccountKey={KEY}",
        f"https://retraindata.blob.core.windows.net/checkpoints/run-1#AccountKey={KEY}",
    ],
    ids=["user-info-key-with-slash", "sas-sig", "account-key-query", "fragment"],
)
def test_a_checkpoints_url_with_credentials_is_refused_naming_the_option_without_the_secret(url):
    with pytest.raises(CheckpointError) as raised:
        parse_blob_url(url, "--checkpoints", CheckpointError)
    message = str(raised.value)
    assert message.startswith("--checkpoints 'https://retraindata.blob.core.windows.net/checkpoints/run-1'")
    assert "credentials do not belong in the URL" in message
    for secret in ("Zm9vYmFy", "c2VjcmV0", "a2V5", "c2lnbmF0dXJl"):
        assert secret not in message
    assert "\n" not in message


def test_the_three_blob_url_readers_refuse_a_user_info_key_alike_without_echoing_it():
    # The landing/ledger setting, the ledger's own opener and the checkpoint store share the one parser.
    ledger_url = USER_INFO_URL.replace("checkpoints/run-1", "ledger")
    refusals = []
    for error_type, read in (
        (SettingsError, lambda: LedgerLocation.parse(ledger_url)),
        (LedgerError, lambda: open_ledger_store(ledger_url)),
        (CheckpointError, lambda: open_blob_store(USER_INFO_URL)),
    ):
        with pytest.raises(error_type) as raised:
            read()
        refusals.append(str(raised.value))
    assert [message.split(" 'https://")[0] for message in refusals] == [
        "RETRAIN_LEDGER",
        "ledger URL",
        "checkpoint store URL",
    ]
    for message in refusals:
        assert "credentials do not belong in the URL" in message
        assert "Zm9vYmFy" not in message and "c2VjcmV0" not in message


# -- blob URLs and the prefix rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "account_url", "container", "prefix", "is_emulator"),
    [
        (
            "https://retraindata.blob.core.windows.net/landing/digits/2024/",
            "https://retraindata.blob.core.windows.net",
            "landing",
            "digits/2024",
            False,
        ),
        (
            "https://retraindata.blob.core.chinacloudapi.cn:443/landing",
            "https://retraindata.blob.core.chinacloudapi.cn",
            "landing",
            "",
            False,
        ),
        (
            "http://127.0.0.1:10000/devstoreaccount1/ckpts/runs/r1",
            "http://127.0.0.1:10000/devstoreaccount1",
            "ckpts",
            "runs/r1",
            True,
        ),
    ],
)
def test_a_blob_url_splits_into_endpoint_container_and_prefix(
    url, account_url, container, prefix, is_emulator
):
    location = parse_blob_url(url, "--data")
    assert (location.endpoint.url, location.container, location.prefix) == (account_url, container, prefix)
    assert location.endpoint.is_emulator is is_emulator
    assert location.url == url.removesuffix("/").replace(":443", "")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://retraindata.blob.core.windows.net/c", "neither an Azure Blob Storage account over https"),
        ("https://retraindata.blob.core.windows.net:8443/c", "neither an Azure Blob Storage account"),
        ("https://retraindata.example.com/c", "neither an Azure Blob Storage account"),
        ("http://127.0.0.1:10000", "neither an Azure Blob Storage account"),
        ("http://127.0.0.1:10000/Dev_Account/c", "'Dev_Account' is not a storage account name"),
        ("https://retraindata.blob.core.windows.net", "it names no container"),
        ("https://retraindata.blob.core.windows.net/Bad--Name", "'Bad--Name' is not a container name"),
        ("https://retraindata.blob.core.windows.net/c1c/a//b", "the prefix 'a//b' is not a folder path"),
        ("https://retraindata.blob.core.windows.net/c1c/a/../b", "the prefix 'a/../b' is not a folder path"),
        ("https://retraindata.blob.core.windows.net:port/c", "it cannot be parsed"),
    ],
)
def test_an_unusable_blob_url_gets_one_line_naming_the_setting_and_the_expected_form(url, why):
    with pytest.raises(InputError) as raised:
        parse_blob_url(url, "RETRAIN_SOMETHING")
    message = str(raised.value)
    assert message.startswith("RETRAIN_SOMETHING ") and why in message
    assert "expected https://<account>.blob.core.windows.net/<container>/<prefix>" in message


class _Refused(Exception):
    pass


def test_a_blob_of_the_container_is_named_in_it_and_one_of_another_refused_masked():
    base = "https://acct.blob.core.windows.net"
    name = require_name_in_container(f"{base}/landing/a%20b/c.csv?sig=abc", "landing", _Refused, "x")
    assert name == "a b/c.csv"
    with pytest.raises(_Refused) as raised:
        require_name_in_container(f"{base}/other/c.csv?sv=1&sig=s3cr3t", "landing", _Refused, "its blobs")
    message = str(raised.value)
    assert "not in the container landing; expected its blobs" in message
    assert "s3cr3t" not in message and "\n" not in message


def test_an_account_endpoint_keeps_the_path_after_it():
    endpoint, rest = parse_account_endpoint(
        "http://localhost:10000/devstoreaccount1/", "RETRAIN_BLOB_ENDPOINT"
    )
    assert (endpoint.account, endpoint.url, endpoint.is_emulator, rest) == (
        "devstoreaccount1",
        "http://localhost:10000/devstoreaccount1",
        True,
        [],
    )
    cloud, rest = parse_account_endpoint("https://retraindata.blob.core.usgovcloudapi.net/landing/x", "E")
    assert cloud.dfs_url == "https://retraindata.dfs.core.usgovcloudapi.net" and rest == ["landing", "x"]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", ""),
        ("digits", "digits"),
        ("digits/2024/", "digits/2024"),
        ("a.b_c=d-e/F9", "a.b_c=d-e/F9"),
        ("x" * 255, "x" * 255),
        ("/".join(["x" * 99] * 7), "/".join(["x" * 99] * 7)),  # 699 characters
    ],
)
def test_the_prefix_rule_accepts_folder_paths_and_drops_one_trailing_slash(prefix, expected):
    assert check_prefix(prefix, "RETRAIN_BLOB_PREFIX") == expected


@pytest.mark.parametrize(
    "prefix",
    # "a//": one trailing '/' is dropped, a second is an empty folder name.
    ["/abs", "a//b", "../up", "a/./b", "a b", "a//", "x" * 256, "/".join(["x" * 100] * 7), ".hidden", "é"],
)
def test_the_prefix_rule_refuses_anything_else_naming_the_setting(prefix):
    with pytest.raises(SettingsError, match=r"^RETRAIN_BLOB_PREFIX .*expected folder names .*no '\.\.'"):
        check_prefix(prefix, "RETRAIN_BLOB_PREFIX", SettingsError)


# -- files ----------------------------------------------------------------------------------------------


def _names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_write_atomically_writes_bytes_or_a_writer_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "new" / "folder" / "record.json"
    write_atomically(path, b"first")
    write_atomically(path, lambda handle: handle.write(b"second"), sync_folder=True)
    assert path.read_bytes() == b"second"
    assert _names(path.parent) == ["record.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model.pt"
    write_atomically(path, b"old")

    def fails_half_way(handle):
        handle.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, fails_half_way)
    assert path.read_bytes() == b"old"
    assert _names(tmp_path) == ["model.pt"]


def test_create_atomically_creates_once_and_never_overwrites(tmp_path):
    path = tmp_path / "events" / "k-1.json"
    assert create_atomically(path, b"the claim", sync_folder=True)
    assert not create_atomically(path, b"a later claim")
    assert path.read_bytes() == b"the claim"
    assert _names(path.parent) == ["k-1.json"]


def test_a_new_file_gets_the_mode_a_plain_open_gives(tmp_path):
    write_atomically(tmp_path / "atomic", b"x")
    (tmp_path / "plain").write_bytes(b"x")
    assert (tmp_path / "atomic").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_file_sha256_of_a_known_file_and_of_one_larger_than_a_read(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    assert file_sha256(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    data = bytes(range(256)) * (3 * 4096 + 1)  # three 1 MiB reads and a bit
    (tmp_path / "big").write_bytes(data)
    assert file_sha256(tmp_path / "big") == hashlib.sha256(data).hexdigest()


# -- the formulas ---------------------------------------------------------------------------------------


def test_spot_estimate_on_a_hand_computed_case():
    # 2 evictions x (0.5 h interval / 2 lost + 0.1 h restart) = 0.7 h extra: 6.7 h on 4 GPUs = 26.8 GPU-h
    # against 24 dedicated; spot at 40 % of the price costs 0.4 x 26.8 / 24 = 0.44667 of dedicated.
    estimate = spot_estimate(SpotScenario(4, 6, 2, 0.6, checkpoint_every=0.5, restart_overhead=0.1))
    assert estimate.wall_hours == pytest.approx(6.7)
    assert estimate.lost_hours == pytest.approx(0.5)
    assert estimate.gpu_hours == pytest.approx(26.8)
    assert estimate.dedicated_gpu_hours == pytest.approx(24)
    assert estimate.cost_vs_dedicated == pytest.approx(0.4 * 26.8 / 24)
    assert estimate.verdict == "spot pays: 55% cheaper than dedicated"


def test_spot_that_is_evicted_too_often_costs_more_than_dedicated():
    # No checkpoints: each of 4 evictions loses half of a 2 h run, 2 + 4 x 1 = 6 h; 0.5 x 6 / 2 = 1.5.
    estimate = spot_estimate(SpotScenario(1, 2, 4, 0.5))
    assert estimate.cost_vs_dedicated == pytest.approx(1.5)
    assert estimate.verdict == "dedicated pays: spot costs 50% more"


def test_young_and_daly_intervals_on_a_hand_computed_case():
    # C = 8 s, M = 3600 s: Young sqrt(2 C M) = 240 s; Daly 240 (1 + sqrt(1/900)/3 + 1/8100) - 8
    # = 240 x 8191 / 8100 - 8 = 234.6963 s.
    advice = checkpoint_interval(IntervalInputs(checkpoint_seconds=8, mtbe_hours=1))
    assert advice.young_seconds == pytest.approx(240)
    assert advice.daly_seconds == pytest.approx(240 * 8191 / 8100 - 8)
    assert advice.overhead_fraction == pytest.approx(8 / advice.daly_seconds + advice.daly_seconds / 7200)
    assert advice.lost_seconds_per_eviction == pytest.approx(advice.daly_seconds / 2)


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: SpotScenario(0, 1, 0, 0.5), "--gpus"),
        (lambda: SpotScenario(1, 1, 0, 1.0), "--discount"),
        (lambda: SpotScenario(1, float("nan"), 0, 0.5), "--hours"),
        (lambda: IntervalInputs(True, 1), "--checkpoint-seconds"),
        (lambda: IntervalInputs(1, 0), "--mtbe-hours"),
    ],
)
def test_formula_inputs_refuse_bad_values_naming_the_option(build, option):
    with pytest.raises(InputError, match=f"^{option} "):
        build()
