"""`python -m infra.event_routing`: the Event Grid filters written from the models' files, from the folder
RETRAIN_MODELS_DIR names as the front door reads it, a user's task routed by its raw_suffixes, and a model
that cannot be routed refused in one line that leaves the routing file as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from components.local.model_init import init_model
from infra.event_routing import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_routing_honours_the_models_folder_and_routes_a_custom_task_by_its_raw_suffixes(tmp_path, capsys):
    init_model("house", "custom", tmp_path / "mymodels")
    out = tmp_path / "event-routing.json"

    assert main([], {"RETRAIN_MODELS_DIR": str(tmp_path / "mymodels")}, out) == 0

    routing = json.loads(out.read_text())
    assert routing["servedModels"] == "*"
    assert routing["subscriptions"] == [
        {
            "model": "house",
            "subjectBeginsWith": "/blobServices/default/containers/landing/blobs/house/",
            "suffixes": [".csv"],
        }
    ]
    assert capsys.readouterr().out == f"wrote {out}\n"


def test_a_model_that_cannot_be_routed_is_one_line_without_a_traceback_and_the_file_is_kept(tmp_path):
    init_model("house", "custom", tmp_path / "mymodels")
    task_file = tmp_path / "mymodels" / "house_task.py"
    task_file.write_text(task_file.read_text().replace('raw_suffixes = (".csv",)', "raw_suffixes = SUFFIXES"))
    environ = {
        **{key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")},
        "RETRAIN_MODELS_DIR": str(tmp_path / "mymodels"),
    }
    routing_file = REPO_ROOT / "infra" / "event-routing.json"
    before = routing_file.read_bytes()

    done = subprocess.run(
        [sys.executable, "-m", "infra.event_routing"],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(
        f"python -m infra.event_routing: error: {tmp_path / 'mymodels' / 'house.toml'}: [trigger] "
        "suffixes is unset, and the raw_suffixes of task"
    )
    assert "HouseTask.raw_suffixes is SUFFIXES" in done.stderr
    assert done.stderr.endswith('expected [trigger] suffixes = [".csv"], the files its task reads\n')
    assert routing_file.read_bytes() == before


def test_an_empty_models_folder_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "event-routing.json"
    assert main([], {"RETRAIN_MODELS_DIR": str(tmp_path / "empty")}, out) == 2
    error = capsys.readouterr().err
    assert error == (
        f"python -m infra.event_routing: error: RETRAIN_MODELS=*, but {tmp_path / 'empty'} holds no *.toml; "
        "expected the models' configuration files there (`retrain init NAME` writes one; RETRAIN_MODELS_DIR "
        "moves the folder)\n"
    )
    assert not out.exists()
