"""What became of a run, in the one line the commands print beside its status (components/outcome.py).

The gate's decisions themselves come from real runs in test_local_pipeline.py; here, the wording for each
kind of details a submission can carry, and what a run without a readable decision gives."""

from __future__ import annotations

import json
import logging

import pytest

from components.outcome import REGISTRATION_FILE, describe_outcome, gate_details, score_lines, training_line

# What torchrun prints after a worker's own error line: the step's reason is the worker's line, not these.
TORCHRUN_REPORT = [
    "[rank0]: retrain: error: --data /x: not a prepared data version; expected a prep step's output",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "  error_file: <N/A>",
    "============================================================",
]


@pytest.mark.parametrize(
    ("status", "details", "line"),
    [
        ("Completed", {"registered_version": "3", "decision": "registered"}, "Completed, registered as v3"),
        (
            "Completed",
            {
                "registered_version": "2",
                "decision": "registered",
                "reasons": ["mse 0.1 beats champion v1's 0.2"],
            },
            "Completed, registered as v2: mse 0.1 beats champion v1's 0.2",
        ),
        (
            "Completed",
            {
                "registered_version": None,
                "decision": "refused",
                "reasons": ["accuracy 0.41 < 0.8", "f1 worse"],
            },
            "Completed, refused: accuracy 0.41 < 0.8; f1 worse",
        ),
        (
            "Failed",
            {"failed_step": "train", "log_tail": TORCHRUN_REPORT, "error": "step 'train' failed"},
            "Failed at train: --data /x: not a prepared data version; expected a prep step's output",
        ),
        (
            "Failed",
            {"failed_step": "prep", "log_tail": ["Killed"], "error": "step 'prep' was killed by SIGKILL"},
            "Failed at prep: step 'prep' was killed by SIGKILL",
        ),
        (
            "Failed",
            {"failed_step": "prep", "log_tail": ["out of memory", ""]},
            "Failed at prep: out of memory",
        ),
        (
            "Failed",
            {
                "failed_step": "prep",
                "log_tail": ["retrain: error: https://a.blob.core.windows.net/c?sig=SECRET"],
            },
            "Failed at prep: https://a.blob.core.windows.net/c?sig=***",
        ),
        ("Completed", {"recorded": "/dry-runs/x"}, "Completed"),  # a dry run: no gate ran
        ("Running", {"run_id": "r"}, "Running"),
        # GET /api/retrain/{id}: the event's own decision beside a submission still under way.
        ("Queued", {"decision": "submitted"}, "Queued"),
    ],
    ids=[
        "registered",
        "registered-why",
        "refused",
        "step-error-line",
        "runner-headline",
        "last-log-line",
        "secret-masked",
        "dry-run",
        "running",
        "event-decision",
    ],
)
def test_each_outcome_reads_as_one_line_beside_the_status(status, details, line):
    assert describe_outcome(status, details) == line


def test_a_run_without_a_readable_decision_reports_none(tmp_path, caplog):
    assert gate_details({"result": str(tmp_path)}) == {}  # a pipeline with no register step

    (tmp_path / REGISTRATION_FILE).write_text('{"decision": ')
    with caplog.at_level(logging.WARNING, logger="components.outcome"):
        assert gate_details({"registration": str(tmp_path)}) == {}
    assert f"{tmp_path / REGISTRATION_FILE} is unreadable" in caplog.text


def test_the_scores_table_puts_the_primary_metric_first_and_marks_what_a_side_lacks():
    record = {
        "metrics": {"accuracy": 0.95, "macro_f1": 0.9412, "recall_0": float("nan")},
        "champion_compared": {"version": "4", "metrics": {"accuracy": 0.9, "macro_f1": 0.93, "old": 1.0}},
        "decision": {"primary_metric": "macro_f1"},
    }
    assert score_lines(record) == [
        "metric    candidate  champion v4",
        "macro_f1     0.9412       0.9300  (primary)",
        "accuracy     0.9500       0.9000",
        "recall_0        nan            -",
        "old               -       1.0000",
    ]
    first = {"metrics": {"mse": 0.5}, "champion_compared": {"version": None, "metrics": None}}
    assert score_lines(first) == ["metric  candidate  no champion", "mse        0.5000            -"]
    broken = {"metrics": {"mse": 0.5}, "champion_compared": {"version": "2", "metrics": None}}
    assert score_lines(broken)[0] == "metric  candidate  champion v2 (unloadable)"
    assert score_lines(None) == score_lines({"metrics": "?"}) == []


def test_the_training_line_names_how_it_ended_the_candidate_and_lost_checkpoints(tmp_path):
    metadata = {
        "steps": 120, "stopped_at_step": 120, "stop_reason": "early_stopping", "candidate": "best",
        "candidate_step": 80,
        "validation": {"metric": "validation_loss", "patience": 3, "best_value": 0.123456},
        "checkpoints": {"not_saved": [{"step": 100, "reason": "interval"}]},
        "evictions_survived": 1,
    }  # fmt: skip
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))

    assert training_line(tmp_path) == (
        "train: stopped early at step 120: validation_loss did not improve in 3 validations; candidate: the "
        "best step's weights, step 80 (validation_loss 0.1235); 1 checkpoint(s) not saved (see the train "
        "step's log); survived 1 eviction(s)"
    )
    metadata.update(stop_reason="completed", candidate="last", candidate_step=120, checkpoints={})
    metadata.update(evictions_survived=0)
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    assert training_line(tmp_path) == "train: ran all 120 steps; candidate: the last step's weights, step 120"
    assert training_line(tmp_path / "gone") is None
