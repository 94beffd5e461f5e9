"""Names as MLflow takes them (training/mlflow_names.py): held to MLflow's own validation, injective and
reversible; and a user task whose metrics have odd names, tracked through training, evaluation and
registration on a real MLflow store, every run ending FINISHED with its names recorded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers.training.regression_task import write_sample
from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    _validate_metric_name,
    _validate_param_name,
    _validate_tag_name,
)

from training.cli import main
from training.gate.lineage import metrics_from_tags
from training.gate.register import REGISTRATION_FILE
from training.mlflow_names import (
    NAMES_ARTIFACT,
    NAMES_TAG,
    NameCollision,
    is_valid_key,
    mlflow_key,
    original_name,
    record_renamed,
)
from training.mlflow_setup import mlflow_client

TRICKY = [
    *("", ".", "..", "...", "/", "//", "a/", "/a", "a//b", "a/./b", "a/../b", "./a", "..a", "a/.", "a/.."),
    *("colour=yellow", "psi.colour=yellow", "city:other", "recall@10", "mae (abs)", "a\nb", "tab\there"),
    *("-_", "-_3d", "--_", "a-_b", "x" * 300, "x" * 249 + "=", "😀", "\ud800", "é\u0301", "C:\\data"),
]
PIECES = ["a", "Z", "0", "_", "-", ".", "/", " ", ":", "=", "@", "%", "\n", "é", "²", "€", "😀", "-_", ".."]


def corpus() -> list[str]:
    """The tricky names, and 2,000 seeded random ones of the pieces that break MLflow's rules."""
    generator = random.Random(41)
    names = [*TRICKY]
    for _ in range(2000):
        length = generator.choice((generator.randint(0, 12), generator.randint(100, 300)))
        names.append("".join(generator.choice(PIECES) for _ in range(length)))
    return list(dict.fromkeys(names))


def test_every_key_is_one_mlflow_takes_and_reads_back_to_its_name_alone():
    keys: dict[str, str] = {}
    for name in corpus():
        key = mlflow_key(name)
        for validate in (_validate_metric_name, _validate_param_name, _validate_tag_name):
            validate(key)  # MLflow's own rule (raises on a key it refuses)
        assert len(key) <= MAX_ENTITY_KEY_LENGTH and is_valid_key(key)
        assert keys.setdefault(key, name) == name, f"{name!r} and {keys[key]!r} share {key!r}"
        assert mlflow_key(name) == key  # stable
        if "-_sha256-" in key:  # shortened (a literal '-_' is always escaped): its name is in the record
            assert len(name) > MAX_ENTITY_KEY_LENGTH // 12 and original_name(key) is None
        else:
            assert original_name(key) == name


def test_a_name_mlflow_takes_everywhere_is_logged_as_it_is_and_others_are_escaped_readably():
    for name in ("loss", "validation_accuracy", "psi.pixel_38", "train/loss", "r²", "top-5 acc", "test_mse"):
        assert mlflow_key(name) == name
    assert mlflow_key("psi.colour=yellow") == "psi.colour-_3dyellow"
    assert mlflow_key("description:chars") == "description-_3achars"  # ':' is refused on Windows
    assert mlflow_key("a/../b") == "a/-_2e./b"
    assert mlflow_key("x-_y") == "x-_2d_y"  # the escape itself, so that nothing else reads as one
    assert original_name("a-_zz") is None and original_name("x-_y") is None  # not keys it makes


def test_over_long_names_share_a_prefix_yet_get_keys_of_their_own():
    first, second = "feature " * 40 + "one", "feature " * 40 + "two"

    keys = {mlflow_key(first), mlflow_key(second)}

    assert len(keys) == 2
    assert all(len(key) <= MAX_ENTITY_KEY_LENGTH and key.startswith("feature feature") for key in keys)


def test_a_run_s_recorded_names_merge_and_refuse_a_key_taken_by_another_name(tmp_path: Path):
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("names", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id

    record_renamed(client, run_id, {"a-_3db": "a=b"})
    record_renamed(client, run_id, {"c-_3ad": "c:d"})

    recorded = json.loads(Path(client.download_artifacts(run_id, NAMES_ARTIFACT, str(tmp_path))).read_text())
    assert recorded == {"a-_3db": "a=b", "c-_3ad": "c:d"}
    with pytest.raises(NameCollision, match="cannot share it"):
        record_renamed(client, run_id, {"a-_3db": "something else"})


# -- a user task's odd metric names, end to end ----------------------------------------------------------

REGRESSION_TASK = Path(__file__).parents[1] / "helpers" / "training" / "regression_task.py"
ODD_METRICS = '''

class OddNames(RegressionTask):
    """The regression task reporting its scores under names a user may well choose."""

    name = "odd-names"
    metrics = MetricSet(
        (
            Metric("mae (abs)", "lower", "mean absolute error"),
            Metric("within@10%", "higher", "share of predictions within 10 % of the target"),
            Metric("r²", "higher", "coefficient of determination"),
            Metric("fit:r2", "higher", "the same, named with a colon"),
        )
    )
    default_primary_metric = "mae (abs)"

    def score(self, model, split):
        scores = super().score(model, split)
        x, y = split[torch.arange(len(split))]
        within = ((model(x).squeeze(-1) - y).abs() <= 0.1 * y.abs()).float().mean().item()
        return {"mae (abs)": scores["mae"], "within@10%": within, "r²": scores["r2"], "fit:r2": scores["r2"]}
'''
ODD = ("mae (abs)", "within@10%", "r²", "fit:r2")


def test_a_user_task_s_odd_metric_names_reach_mlflow_through_training_evaluation_and_registration(
    tmp_path: Path,
):
    task_file = tmp_path / "odd_names_task.py"
    task_file.write_text(REGRESSION_TASK.read_text() + ODD_METRICS)
    task = ("--task", f"{task_file}:OddNames")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = ("--mlflow-tracking-uri", uri)
    raw, data, model, evaluation, registration = (
        tmp_path / name for name in ("raw", "data", "model", "evaluation", "registration")
    )
    write_sample(raw, rows=300, seed=0)
    assert main(["prepare", *task, "--raw", str(raw), "--out", str(data)]) == 0
    train = ("--data", str(data), "--out", str(model), "--checkpoints", str(tmp_path / "checkpoints"))
    options = ("--epochs", "2", "--validate-every-epochs", "1", "--progress", "none", "--seed", "3")
    assert main(["train", *task, *train, *options, *store, "--mlflow-experiment", "houses"]) == 0
    steps = ("--model", str(model), "--data", str(data), *task, "--model-name", "houses", *store)
    assert main(["evaluate", *steps, "--out", str(evaluation)]) == 0
    gate = ("--evaluation", str(evaluation), "--raw-data-version", "rd-00000000000000bb")
    locks = ("--environment-version", "1", "--lock", str(tmp_path / "locks"), "--out", str(registration))
    assert main(["register", *steps, *gate, *locks]) == 0

    client = mlflow_client(uri)
    run_id = json.loads((model / "metadata.json").read_text())["mlflow_run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    renamed = json.loads(Path(client.download_artifacts(run_id, NAMES_ARTIFACT, str(tmp_path))).read_text())
    # Training's validations (one per epoch) and the evaluation's test scores, every one under a key MLflow
    # took, read back by the run's own record.
    logged = {renamed.get(key, key) for key in run.data.metrics}
    assert {"loss", *(f"validation_{name}" for name in ODD), *(f"test_{name}" for name in ODD)} <= logged
    validations = client.get_metric_history(run_id, mlflow_key("validation_within@10%"))
    assert len(validations) == 2
    assert renamed[mlflow_key("test_mae (abs)")] == "test_mae (abs)"
    assert "validation_r²" in run.data.metrics and "validation_r²" not in renamed  # MLflow takes it as it is
    # The registered version's metric tags read back to the task's names.
    record = json.loads((registration / REGISTRATION_FILE).read_text())
    assert record["registered_version"] == "1"
    version = client.get_model_version("houses", "1")
    assert metrics_from_tags(version.tags) == pytest.approx(record["metrics"])
    assert set(record["metrics"]) == set(ODD)
    assert "retrain.metric.mae -_28abs-_29" in json.loads(version.tags[NAMES_TAG])
