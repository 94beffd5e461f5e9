"""core/errors.py: one root for every error a user can act on, each room's kept where it was."""

from __future__ import annotations

import pytest

from components.errors import ConfigError, PipelineError, SubmissionError
from components.local.execution import LocalStepFailed
from core.errors import CheckpointError, InputError, RetrainError
from function_app.events.parsing import PayloadError
from function_app.ledger.records import DamagedRecord, LedgerError
from function_app.local.cli import CliError
from function_app.pinning import PinError
from function_app.policy.state import PolicyError
from function_app.settings.storage import SettingsError


@pytest.mark.parametrize(
    "error",
    [InputError, CheckpointError, PipelineError, SubmissionError, ConfigError, LedgerError, PolicyError,
     SettingsError, PayloadError, PinError, CliError],
)  # fmt: skip
def test_every_room_error_is_a_retrain_error_exiting_2_by_default(error):
    assert issubclass(error, RetrainError) and error("x").exit_code == 2


@pytest.mark.parametrize("error", [PolicyError, SettingsError, PayloadError])
def test_those_callers_catch_as_value_errors_still_are(error):
    assert issubclass(error, ValueError)


def test_the_roots_own_errors_are_one_line_and_the_rooms_keep_their_text():
    assert str(InputError("a\n  b")) == "a b"
    assert (
        str(DamagedRecord("r", "cut short"))
        == "ledger record r is unreadable (cut short); expected the ledger's JSON"
    )
    failed = LocalStepFailed("run-1", "train", 3, __import__("pathlib").Path("/log"), ["line 1", "line 2"])
    assert str(failed).splitlines()[1:] == ["  | line 1", "  | line 2"]  # the log tail stays lines
    assert (failed.exit_code, failed.step_exit_code) == (2, 3)  # the command's exit code, and the step's
    assert CliError("x", 75).exit_code == 75
