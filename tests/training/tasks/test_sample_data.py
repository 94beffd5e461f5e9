from __future__ import annotations

import itertools

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from sklearn.datasets import load_digits

from core.errors import InputError
from training.cli import main
from training.tasks.tabular.sample_data import (
    OVERLAP_ROWS,
    batch_ranges,
    digits_table,
    with_label_noise,
    write_sample_batches,
)
from training.tasks.tabular.schema import DIGITS_SCHEMA

N_DIGITS = 1797


def test_batches_hold_every_digit_with_overlapping_redeliveries(tmp_path):
    paths = write_sample_batches(tmp_path / "raw", batches=4)

    assert [path.name for path in paths] == [f"batch-000{number}.csv" for number in range(1, 5)]
    assert sorted(path.name for path in (tmp_path / "raw").iterdir()) == [path.name for path in paths]
    tables = [pa_csv.read_csv(path) for path in paths]
    assert all(table.column_names == list(DIGITS_SCHEMA.columns) for table in tables)
    keys = [table.column("row_key").to_pylist() for table in tables]
    assert set().union(*keys) == {f"digits-{index:04d}" for index in range(N_DIGITS)}
    assert sum(len(batch) for batch in keys) == N_DIGITS + 3 * OVERLAP_ROWS
    for earlier, later in itertools.pairwise(tables):
        assert earlier.slice(earlier.num_rows - OVERLAP_ROWS).equals(later.slice(0, OVERLAP_ROWS))


def test_rows_are_the_scikit_learn_digits(tmp_path):
    (path,) = write_sample_batches(tmp_path, batches=1)
    table = pa_csv.read_csv(path)
    digits = load_digits()

    assert table.column("row_key")[42].as_py() == "digits-0042"
    assert np.array_equal(table.column("label").to_numpy(), digits.target)
    pixels = np.column_stack([table.column(name).to_numpy() for name in DIGITS_SCHEMA.feature_columns])
    assert np.array_equal(pixels, digits.data)


def test_parquet_batches_hold_the_same_rows_as_csv(tmp_path):
    csv_paths = write_sample_batches(tmp_path / "csv", batches=3)
    parquet_paths = write_sample_batches(tmp_path / "parquet", batches=3, file_format="parquet")

    assert [path.name for path in parquet_paths] == [
        "batch-0001.parquet",
        "batch-0002.parquet",
        "batch-0003.parquet",
    ]
    for csv_path, parquet_path in zip(csv_paths, parquet_paths, strict=True):
        assert pq.read_table(parquet_path).equals(pa_csv.read_csv(csv_path))


def test_file_names_sort_in_arrival_order(tmp_path):
    paths = write_sample_batches(tmp_path, batches=12)

    first_keys = [pa_csv.read_csv(path).column("row_key")[0].as_py() for path in sorted(paths)]
    assert sorted(paths) == paths
    assert first_keys == sorted(first_keys)


def test_batch_ranges_cover_all_rows_and_redeliver_the_previous_tail():
    assert batch_ranges(10, 3, overlap=2) == [range(0, 3), range(1, 7), range(5, 10)]
    # With one row per chunk there is only one row to re-deliver.
    assert batch_ranges(3, 3, overlap=5) == [range(0, 1), range(0, 2), range(1, 3)]


def test_refuses_to_overwrite_an_existing_batch_file(tmp_path):
    existing = tmp_path / "batch-0003.csv"
    existing.write_text("precious\n")

    with pytest.raises(InputError, match=r"batch-0003\.csv: already exists"):
        write_sample_batches(tmp_path, batches=4)

    assert existing.read_text() == "precious\n"
    assert [path.name for path in tmp_path.iterdir()] == ["batch-0003.csv"]


@pytest.mark.parametrize("batches", [0, -1, N_DIGITS + 1])
def test_rejects_batch_counts_outside_one_to_the_number_of_rows(tmp_path, batches):
    with pytest.raises(InputError, match=r"expected a whole number from 1 to 1797") as raised:
        write_sample_batches(tmp_path / "raw", batches=batches)

    assert "\n" not in str(raised.value)
    assert not (tmp_path / "raw").exists()


def test_rejects_an_unknown_file_format(tmp_path):
    with pytest.raises(InputError, match=r"'json' is not supported; expected one of csv, parquet"):
        write_sample_batches(tmp_path, file_format="json")


def test_cli_writes_batches(tmp_path):
    assert main(["sample-data", "--out", str(tmp_path / "raw"), "--batches", "2", "--format", "parquet"]) == 0

    assert sorted(path.name for path in (tmp_path / "raw").iterdir()) == [
        "batch-0001.parquet",
        "batch-0002.parquet",
    ]


def test_cli_writes_sample_images_in_class_folders_for_the_image_task(tmp_path):
    raw = tmp_path / "raw"
    assert main(["sample-data", "--task", "image", "--out", str(raw), "--per-class", "2", "--seed", "5"]) == 0

    assert sorted(path.relative_to(raw).as_posix() for path in raw.rglob("*.png")) == [
        f"{shape}/{shape}-s5-{number:04d}.png"
        for shape in ("circle", "cross", "square", "triangle")
        for number in range(2)
    ]


def test_cli_refuses_tabular_options_for_images_on_one_line(tmp_path, capsys):
    code = main(["sample-data", "--task", "image", "--out", str(tmp_path / "raw"), "--format", "parquet"])

    assert code != 0
    assert capsys.readouterr().err.splitlines() == [
        "retrain: error: --label-noise and --format are for --task tabular; images are PNG files"
    ]
    assert not (tmp_path / "raw").exists()


def test_cli_reports_a_bad_batch_count_on_one_line(tmp_path, capsys):
    code = main(["sample-data", "--out", str(tmp_path / "raw"), "--batches", "0"])

    lines = capsys.readouterr().err.splitlines()
    assert code != 0
    assert len(lines) == 1
    assert lines[0].startswith("retrain: error: batches=0 is out of range")
    assert not (tmp_path / "raw").exists()


def test_label_noise_relabels_exactly_that_fraction_to_other_classes_deterministically():
    clean = digits_table()
    noisy = with_label_noise(clean, 0.25, seed=3)
    before = clean.column("label").to_numpy()
    after = noisy.column("label").to_numpy()
    assert (before != after).sum() == round(0.25 * clean.num_rows)
    assert set(after) <= set(before)
    assert noisy.drop_columns(["label"]).equals(clean.drop_columns(["label"]))
    assert with_label_noise(clean, 0.25, seed=3).equals(noisy)


def test_label_noise_outside_zero_to_one_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"--label-noise 1.5: expected a fraction of rows from 0 to 1"):
        write_sample_batches(tmp_path / "raw", label_noise=1.5)
    assert not (tmp_path / "raw").exists()
