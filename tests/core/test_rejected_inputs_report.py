"""The prepare step's report of the raw files it left out (core/rejected_inputs.py): what a task raises,
what the step writes, and what the front door reads back, with no secret in any of it."""

from __future__ import annotations

import pytest

from core.errors import InputError
from core.rejected_inputs import (
    REPORT_FILE,
    RawFilesRejected,
    RejectedFile,
    parse_report,
    read_report,
    write_report,
)

SAS_URL = "https://acct.blob.core.windows.net/c/bad.csv?sv=2024-01-01&sig=SECRETSIGNATURE"


def test_a_report_reads_back_as_written_in_name_order_and_none_is_not_unknown(tmp_path):
    files = [RejectedFile("circle/b.png", "not a readable image"), RejectedFile("a.csv", "missing column")]
    assert read_report(tmp_path / "none") is None  # no report: a prepare step from before them
    write_report(tmp_path / "out", files)
    assert read_report(tmp_path / "out") == tuple(sorted(files, key=lambda file: file.name))
    write_report(tmp_path / "empty", [])
    assert read_report(tmp_path / "empty") == ()


def test_a_reason_is_one_line_without_secrets_and_a_name_stays_below_the_raw_folder():
    rejected = RejectedFile("bad.csv", f"cannot read\n{SAS_URL}")
    assert "\n" not in rejected.reason and "SECRETSIGNATURE" not in rejected.reason
    for name in ("", "/etc/passwd", "../x.csv", "a/../b.csv"):
        with pytest.raises(InputError, match="expected a path below the raw folder"):
            RejectedFile(name, "why")


def test_the_error_a_task_raises_names_its_first_file_and_counts_the_rest():
    error = RawFilesRejected(
        [RejectedFile("a.csv", "missing column 'label'"), RejectedFile("b.csv", "empty")]
    )
    assert str(error) == "a.csv: missing column 'label' (and 1 more raw file(s) that do not fit: b.csv)"
    assert isinstance(error, InputError)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe",
        b"[]",
        b'{"format": "other", "files": []}',
        b'{"format": "retrain-rejected/1", "files": [{"name": "../x"}]}',
    ],
)
def test_a_report_that_is_not_one_is_a_one_line_value_error(tmp_path, data):
    (tmp_path / REPORT_FILE).write_bytes(data)
    with pytest.raises(ValueError) as raised:
        parse_report(data)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError):
        read_report(tmp_path)
