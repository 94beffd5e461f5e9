"""The lineage schema: the trigger argument, the code version, and tags read back as written."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import training
from core.errors import InputError
from training.gate import lineage as lineage
from training.gate.lineage import (
    Trigger,
    code_version,
    decision_tags,
    describe_tags,
    metric_tags,
    metrics_from_tags,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_manual_is_its_own_kind_without_an_event():
    trigger = Trigger.parse("manual")
    assert (trigger.kind, trigger.event_id) == ("manual", "none")
    assert trigger.tags()[lineage.TRIGGER] == "manual"


def test_pairs_name_the_kind_and_event_and_keep_every_pair():
    trigger = Trigger.parse("event_id=evt-42,kind=blob,url=https://acct/c/a.csv")
    assert (trigger.kind, trigger.event_id) == ("blob", "evt-42")
    assert trigger.tags() == {
        "retrain.trigger": "event_id=evt-42,kind=blob,url=https://acct/c/a.csv",
        "retrain.trigger.event_id": "evt-42",
        "retrain.trigger.kind": "blob",
        "retrain.trigger.url": "https://acct/c/a.csv",
    }


def test_a_value_may_contain_commas_and_a_source_stands_in_for_the_kind():
    trigger = Trigger.parse("files=a.csv,b.csv,source=schedule")
    assert dict(trigger.fields) == {"files": "a.csv,b.csv", "source": "schedule"}
    assert (trigger.kind, trigger.event_id) == ("schedule", "none")


@pytest.mark.parametrize("text", ["", "blob", "=x", "bad key=1"])
def test_a_malformed_trigger_is_refused(text: str):
    with pytest.raises(InputError, match=r"expected 'manual' or KEY=VALUE\[,KEY=VALUE...\]"):
        Trigger.parse(text)


def test_the_code_version_is_the_commit_of_the_packages_own_work_tree():
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        assert code_version() == ("package", training.__version__)
        return
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert code_version() == ("git", head.stdout.strip())


def test_a_package_inside_another_repository_reports_its_package_version(tmp_path: Path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    package = tmp_path / "venv" / "site-packages" / "training"
    package.mkdir(parents=True)
    assert code_version(package) == ("package", training.__version__)


def test_metrics_and_decisions_read_back_as_written():
    metrics = {"accuracy": 0.9734042553191489, "recall_3": 1.0, "loss": 0.0988}
    assert metrics_from_tags(metric_tags(metrics)) == metrics
    decision = {"accepted": False, "reasons": ["a; b", "c"], "champion_version": None}
    described = describe_tags(decision_tags(decision, {"primary_metric": "macro_f1"}))
    assert described["gate"] == {
        "accepted": False,
        "reasons": ["a; b", "c"],
        "champion_version": "none",
        "policy": {"primary_metric": "macro_f1"},
    }


def test_hand_edited_tags_are_shown_rather_than_failing():
    described = describe_tags({lineage.GATE_REASONS: "edited by hand", "retrain.metric.accuracy": "high"})
    assert described["gate"]["reasons"] == ["edited by hand"]
    assert metrics_from_tags({"retrain.metric.accuracy": "high"}) == {}


def test_a_module_task_s_code_hash_is_recorded_and_read_back(tmp_path: Path, monkeypatch):
    from core.task_ref import parse_task_ref
    from training.tasks.loader import task_code_sha256

    package = tmp_path / "flowerpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text("class Flowers: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = parse_task_ref("flowerpkg.task:Flowers")
    digest = task_code_sha256(ref)
    assert digest is not None and task_code_sha256(parse_task_ref("tabular")) is None
    task = {"ref": ref.text, "name": "flowers", "options": {}, "file_sha256": None, "code_sha256": digest}

    tags = lineage.lineage_of(
        tmp_path, "dv-0123456789abcdef", Trigger.parse("manual"), "rd-0123456789abcdef", "env:1", None,
        "0" * 64, None, task,
    ).tags()  # fmt: skip

    assert tags[lineage.TASK_CODE_SHA256] == digest and tags[lineage.TASK_FILE_SHA256] == "none"
    assert describe_tags(tags)["task"]["code_sha256"] == digest
    (package / "helpers.py").write_text("WIDTH = 9\n")  # the package's code, though not the task's module
    assert task_code_sha256(ref) != digest


def test_a_version_registered_before_the_rename_reads_its_data_versions_as_before():
    # retrain.data.raw_version and retrain.data.version were the lineage tags' names until the raw version
    # (rd-) became retrain.raw_version and the prepared one (dv-) retrain.data_version.
    old = {"retrain.data.raw_version": "rd-0123456789abcdef", "retrain.data.version": "dv-0123456789abcdef"}
    new = {lineage.RAW_DATA_VERSION: "rd-0123456789abcdef", lineage.DATA_VERSION: "dv-0123456789abcdef"}
    assert (lineage.RAW_DATA_VERSION, lineage.DATA_VERSION) == ("retrain.raw_version", "retrain.data_version")
    for tags in (old, new):
        described = lineage.describe_tags(tags)
        assert (described["raw_version"], described["data_version"]) == (
            "rd-0123456789abcdef", "dv-0123456789abcdef",
        )  # fmt: skip
