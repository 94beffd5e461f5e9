from __future__ import annotations

import dataclasses
import json

import pytest

from training.errors import InputError
from training.tasks.tabular.schema import Manifest, SplitFractions, TableSchema


@pytest.mark.parametrize(
    ("fractions", "message"),
    [
        ((0.9, 0.1, 0.0), r"test=0.0 is out of range; expected a number between 0 and 1"),
        ((0.7, 0.2, 0.2), r"add up to 1.1"),
        ((1.2, -0.1, -0.1), r"train=1.2 is out of range"),
    ],
)
def test_split_fractions_are_validated(fractions, message):
    with pytest.raises(InputError, match=message):
        SplitFractions(*fractions)


def test_split_fractions_parse_three_numbers():
    assert SplitFractions.parse("0.7,0.2,0.1") == SplitFractions(0.7, 0.2, 0.1)
    with pytest.raises(InputError, match=r"is not three numbers; expected TRAIN,VALIDATION,TEST"):
        SplitFractions.parse("0.8,0.2")


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (("id", "y", ("id",), 10), r"names column 'id' twice"),
        (("id", "y", ("source_row",), 10), r"'source_row' is reserved"),
        (("id", "y", (), 10), r"at least one feature column"),
        (("id", "y", ("x",), 1), r"n_classes must be an integer of at least 2"),
    ],
)
def test_table_schema_is_validated(columns, message):
    with pytest.raises(InputError, match=message):
        TableSchema(*columns)


def test_data_version_ignores_provenance_and_time_but_not_content(prepared):
    manifest, _ = prepared

    elsewhere = dataclasses.replace(manifest, raw_files=(), previous_version="dv-0", created_at="2000-01-01")
    changed_split = dataclasses.replace(manifest.splits[2], content_sha256="0" * 64)
    changed = dataclasses.replace(manifest, splits=(*manifest.splits[:2], changed_split))
    assert elsewhere.data_version == manifest.data_version
    assert changed.data_version != manifest.data_version


def test_an_edited_manifest_is_not_trusted(prepared):
    manifest, _ = prepared
    document = json.loads(manifest.to_json())
    document["splits"]["test"]["content_sha256"] = "0" * 64

    with pytest.raises(InputError, match=r"manifest was edited"):
        Manifest.from_json(json.dumps(document))
