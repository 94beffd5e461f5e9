"""A fresh MLflow SQLite store opened by two processes at once: set up once, under its lock, and both work.

MLflow migrates a fresh SQLite file on first use without any lock; two processes doing it at once fail
("duplicate column name: step"), as two `retrain run`s on a fresh state folder did.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mlflow.tracking import MlflowClient

from training.mlflow_setup import LOCK_SUFFIX, sqlite_database

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
