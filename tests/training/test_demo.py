"""`retrain demo` (what `make demo` runs) tells the whole training story and leaves its results behind."""

from __future__ import annotations

import json

from training.cli import main


def test_demo_trains_through_an_eviction_and_reports_where_everything_is(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RETRAIN_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["demo"]) == 0
    output = capsys.readouterr().out

    demo = tmp_path / "demo"
    metadata = json.loads((demo / "model" / "metadata.json").read_text())
    assert metadata["resumes"] == 1 and metadata["evictions_survived"] == 1
    assert [attempt["ended"] for attempt in metadata["attempts"]] == ["preempted", "completed"]
    assert "EVICTION NOTICE (SIGTERM)" in output and "exiting with code 75" in output
    assert "resumed from checkpoint" in output
    assert str(demo / "model" / "model.pt") in output and str(demo / "model" / "metadata.json") in output
    assert metadata["mlflow_run_id"] in output and (tmp_path / "mlflow.db").exists()
