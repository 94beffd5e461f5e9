"""A fresh MLflow SQLite store opened by two processes at once: set up once, under its lock, and both work.

MLflow migrates a fresh SQLite file on first use without any lock; two processes doing it at once fail
("duplicate column name: step"), as two `retrain run`s on a fresh state folder did.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from mlflow.tracking import MlflowClient

from training.mlflow_setup import (
    CACHE_VARIABLE,
    LOCK_SUFFIX,
    cache_folder,
    experiment_id,
    mlflow_client,
    schema_template,
    sqlite_database,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

# Each process imports MLflow first (seconds), says so, and opens the store only when told to, so that
# both open it at the same moment however long their imports took.
OPENER = textwrap.dedent(
    """
    import sys
    from training.mlflow_setup import experiment_id, mlflow_client

    import mlflow.tracking

    print("ready", flush=True)
    sys.stdin.readline()
    client = mlflow_client(sys.argv[1], registry_uri=sys.argv[1])
    run = client.create_run(experiment_id(client, "retrain", None))
    client.log_metric(run.info.run_id, "loss", 1.0, step=1)
    client.search_registered_models(max_results=1)
    print("opened", run.info.run_id, flush=True)
    """
)


def test_two_processes_opening_a_fresh_store_at_once_both_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    command = [sys.executable, "-c", OPENER, uri]
    processes = [subprocess.Popen(command, cwd=REPO_ROOT, text=True, **pipes) for _ in range(2)]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in processes:  # both start opening now
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = [process.communicate(timeout=120) for process in processes]

    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-3000:]
        assert "Traceback" not in err
    run_ids = {out.split()[1] for out, _ in results}
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name == "retrain"]
    assert {run.info.run_id for run in client.search_runs([experiment.experiment_id])} == run_ids
    assert (tmp_path / f"mlflow.db{LOCK_SUFFIX}").is_file()


def test_only_a_sqlite_file_is_set_up_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sqlite_database(f"sqlite:///{tmp_path}/m.db") == tmp_path / "m.db"
    assert sqlite_database("sqlite:///m.db?timeout=30") == tmp_path / "m.db"
    for other in ("sqlite://", "sqlite:///:memory:", "http://mlflow:5000", "azureml://x", "databricks"):
        assert sqlite_database(other) is None


def _tables_and_schema(database: Path) -> tuple[list[str], list[tuple]]:
    with sqlite3.connect(database) as connection:
        tables = sorted(
            row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        )
        version = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    connection.close()
    return tables, version


def _default_experiment_location(uri: str) -> str:
    return MlflowClient(uri).get_experiment("0").artifact_location


def test_a_fresh_store_starts_as_the_schema_template_and_ends_as_a_migrated_one(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    migrated = tmp_path / "migrated" / "mlflow.db"
    migrated.parent.mkdir()
    MlflowClient(f"sqlite:///{migrated}", registry_uri=f"sqlite:///{migrated}").search_registered_models()

    copied = tmp_path / "state" / "mlflow.db"
    copied.parent.mkdir()
    template = schema_template(os.environ)
    assert template is not None and template.parent == tmp_path / "cache"
    client = mlflow_client(f"sqlite:///{copied}", registry_uri=f"sqlite:///{copied}")
    assert copied.read_bytes() != b"" and _tables_and_schema(copied) == _tables_and_schema(migrated)
    # The Default experiment is made where this store's user made it, not where the template was built.
    location = _default_experiment_location(f"sqlite:///{copied}")
    assert location == _default_experiment_location(f"sqlite:///{migrated}") == str(tmp_path / "mlruns" / "0")
    # And the store works: runs, metrics and the registry.
    run = client.create_run(experiment_id(client, "houses", str(tmp_path / "artifacts")))
    client.log_metric(run.info.run_id, "loss", 0.5, step=1)
    client.create_registered_model("houses")
    assert [model.name for model in client.search_registered_models()] == ["houses"]
    assert [experiment.name for experiment in client.search_experiments()] == ["houses", "Default"]


def test_a_cache_that_cannot_be_written_costs_only_the_migration(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv(CACHE_VARIABLE, str(blocked / "retrain"))
    assert schema_template(os.environ) is None
    database = tmp_path / "mlflow.db"
    client = mlflow_client(f"sqlite:///{database}", registry_uri=f"sqlite:///{database}")
    client.create_registered_model("houses")
    assert [model.name for model in client.search_registered_models()] == ["houses"]


def test_the_cache_folder_follows_its_settings(tmp_path):
    assert cache_folder({CACHE_VARIABLE: str(tmp_path / "c")}) == tmp_path / "c"
    assert cache_folder({"XDG_CACHE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "retrain"
    assert cache_folder({}) == Path.home() / ".cache" / "retrain"
