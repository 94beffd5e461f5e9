"""Bad numbers and bad bytes are stopped where they enter prepare: one line naming the file, row and column
(or line), nothing written, and nothing from the data printed raw to the user's terminal."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.errors import InputError
from core.text import escaped, has_unsafe_characters
from training.cli import main
from training.tasks.image.prepare import prepare_images
from training.tasks.tabular.schema import DIGITS_SCHEMA
from training.tasks.tabular.task import DIGITS_OPTIONS

HEADER = list(DIGITS_SCHEMA.columns)
DIGITS = ["--task-options", json.dumps(DIGITS_OPTIONS)]
HOSTILE = "a\x1b[31m\x1b]0;pwned\x07\u202e\r\nb"  # colour, window title, bell, bidi override, line break


def _rows(count: int = 40) -> list[list[str]]:
    return [
        [f"key-{index:04d}", str(index % 10), *(str((index * 7 + column) % 17) for column in range(64))]
        for index in range(count)
    ]


def _csv_bytes(rows: list[list[str]], header: list[str] = HEADER) -> bytes:
    return "".join(",".join(row) + "\n" for row in [header, *rows]).encode()


def _prepare(tmp_path: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    """Run `retrain prepare` on tmp_path/raw; assert it failed in one line and wrote nothing."""
    capsys.readouterr()
    code = main(["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "out"), *options])
    lines = capsys.readouterr().err.splitlines()
    assert code != 0
    assert len(lines) == 1, lines
    assert not (tmp_path / "out").exists()
    return lines[0]


# "nan", as pandas reads it, is a missing value (test_tabular_columns.py), not a number out of range.
@pytest.mark.parametrize("value", ["1e308", "inf", "-1e39", "-inf", "3.5e38"])
def test_a_feature_outside_float32_is_refused_naming_file_row_and_column(tmp_path, capsys, value):
    rows = _rows()
    rows[6][2 + 5] = value  # data row 7, column pixel_5
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "batch-0001.csv").write_bytes(_csv_bytes(rows))

    line = _prepare(tmp_path, capsys, *DIGITS)

    assert (
        f"batch-0001.csv: data row 7, column 'pixel_5': expected a finite number within float32's range "
        f"(|x| <= 3.4e38) or a blank (if the column holds names, declare it in the task option column_types "
        f"as \"categorical\"), got '{value}'"
    ) in line


def test_the_largest_float32_values_are_accepted(tmp_path):
    rows = _rows()
    rows[0][2] = "3.4028234e38"
    rows[1][2] = "-3.4028234e38"
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "batch-0001.csv").write_bytes(_csv_bytes(rows))

    assert main(["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "out"), *DIGITS]) == 0


@pytest.mark.parametrize(
    ("data", "line_number"),
    [
        (_csv_bytes([], header=[*HEADER[:-1], "caf\xe9"]).replace("é".encode(), b"\xe9"), 1),
        (_csv_bytes(_rows()).replace(b"key-0005", b"k\xe9y-0005"), 7),
    ],
    ids=["latin-1 header", "latin-1 body"],
)
def test_a_csv_that_is_not_utf8_is_refused_in_one_line_naming_the_file(tmp_path, capsys, data, line_number):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "batch-0001.csv").write_bytes(data)

    for options in (DIGITS, ()):  # the pinned columns read by pyarrow; open ones read from the header
        line = _prepare(tmp_path, capsys, *options)

        assert f"batch-0001.csv: line {line_number} (byte offset " in line
        assert line.endswith("is not UTF-8; expected UTF-8 text (save the CSV file as UTF-8)")


def test_a_non_utf8_byte_past_the_first_read_chunk_is_found_on_its_line(tmp_path, capsys):
    header_bytes = len(_csv_bytes([]))
    rows = _rows()
    # A valid 'é' that straddles the scan's 1 MiB chunk boundary must not be taken for the bad byte.
    rows[0][0] = "x" * ((1 << 20) - 1 - header_bytes) + "\xe9"
    rows[3][0] = "bad\xe9"
    data = _csv_bytes(rows).replace("bad\xe9".encode(), b"bad\xe9")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "batch-0001.csv").write_bytes(data)
    bad_offset = data.index(b"bad\xe9") + 3

    line = _prepare(tmp_path, capsys, *DIGITS)

    assert data[(1 << 20) - 1 : (1 << 20) + 1] == "\xe9".encode()
    assert f"batch-0001.csv: line 5 (byte offset {bad_offset}) is not UTF-8" in line


def test_a_column_name_with_control_characters_is_shown_escaped(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    header_name = HOSTILE.replace("\r\n", "")  # a line break would end the header row
    rows = [[*row, "0"] for row in _rows()]
    (tmp_path / "raw" / "batch-0001.csv").write_bytes(_csv_bytes(rows, header=[*HEADER, header_name]))

    pinned = _prepare(tmp_path, capsys, *DIGITS)  # an unexpected column, quoted
    (tmp_path / "raw" / "batch-0001.csv").write_bytes(_csv_bytes([], header=[*HEADER[:-1], header_name]))
    opened = _prepare(tmp_path, capsys)  # no rows, the expected header quoted from the file's own

    for line in (pinned, opened):
        assert not has_unsafe_characters(line), line
        assert "\\x1b]0;pwned\\x07" in line
    assert "\\u202e" in pinned


def test_escaped_writes_every_control_format_and_separator_character_as_an_escape():
    hostile = "".join(chr(code) for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x200B, 0x2028, 0xDCE9])

    shown = escaped(hostile + "café ünïcode")

    assert shown.endswith("café ünïcode")
    assert all(unicodedata.category(char)[0] not in "CZ" or char == " " for char in shown)
    assert "\\x1b" in shown and "\\x07" in shown and "\\r" in shown and "\\u2028" in shown


def _png(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), shade, dtype=np.uint8)).save(path)


def test_a_class_folder_name_with_control_characters_is_shown_escaped(tmp_path):
    _png(tmp_path / "raw" / HOSTILE.replace("\r\n", "") / "one.png", 10)

    with pytest.raises(InputError) as refused:
        prepare_images(tmp_path / "raw", tmp_path / "out", size=(8, 8))

    assert "found 1 class folder(s) with images (a\\x1b[31m\\x1b]0;pwned\\x07\\u202eb)" in str(refused.value)
    assert not has_unsafe_characters(str(refused.value))
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_a_decodable_image_is_refused_naming_it_escaped(tmp_path):
    for index in range(20):
        _png(tmp_path / "raw" / "cat" / f"{index:02d}.png", index)
        _png(tmp_path / "raw" / "dog" / f"{index:02d}.png", 200 + index)
    (tmp_path / "raw" / "dog" / "bad\x1b[2J.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")

    with pytest.raises(InputError) as refused:
        prepare_images(tmp_path / "raw", tmp_path / "out", size=(8, 8))

    message = str(refused.value)
    assert message.startswith(f"{tmp_path}/raw/dog/bad\\x1b[2J.png: not a readable image (")
    assert message.endswith("expected a PNG or JPEG image")
    assert "\n" not in message and not has_unsafe_characters(message)
    assert not (tmp_path / "out").exists()


def test_a_raw_folder_and_file_names_with_control_characters_are_logged_escaped(tmp_path, caplog):
    raw = tmp_path / f"raw{HOSTILE.replace('/', '')}"
    raw.mkdir()
    (raw / "batch-0001.csv").write_bytes(_csv_bytes(_rows()))
    (raw / f"notes{HOSTILE.replace('/', '')}.txt").write_bytes(b"not data")
    caplog.set_level("INFO")

    code = main(["prepare", "--raw", str(raw), "--out", str(tmp_path / "out"), *DIGITS])

    assert code == 0  # the stray file is ignored, and said so
    messages = [record.getMessage() for record in caplog.records]
    assert [message for message in messages if has_unsafe_characters(message)] == []
    assert any("ignoring 1 files" in message and "\\x1b]0;pwned\\x07" in message for message in messages)
