import json
import os
import signal

import pytest

from training.engine.preemption import (
    ELASTIC_ERROR_FILE_VARIABLE,
    PREEMPTED_EXIT_CODE,
    PreemptionNotice,
    report_preemption_to_launcher,
)


@pytest.fixture
def notice():
    notice = PreemptionNotice().install()
    yield notice
    notice.uninstall()


def test_sigterm_raises_the_flag_once_and_repeats_change_nothing(notice):
    assert not notice.received
    os.kill(os.getpid(), signal.SIGTERM)
    first = notice.received_at
    os.kill(os.getpid(), signal.SIGTERM)
    assert notice.received and notice.received_at == first


def test_a_second_ctrl_c_aborts_without_waiting_for_the_save(notice):
    os.kill(os.getpid(), signal.SIGINT)
    assert notice.received
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_uninstall_restores_the_previous_handlers():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    PreemptionNotice().install().uninstall()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_preempted_worker_reports_its_exit_code_in_torchruns_error_file(tmp_path):
    error_file = tmp_path / "attempt_0" / "0" / "error.json"
    report_preemption_to_launcher({ELASTIC_ERROR_FILE_VARIABLE: str(error_file)})
    report = json.loads(error_file.read_text())
    assert report["message"]["errorCode"] == PREEMPTED_EXIT_CODE
    assert report["message"]["message"].startswith("Preempted")


def test_without_torchrun_there_is_no_error_file_to_write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report_preemption_to_launcher({})
    assert list(tmp_path.iterdir()) == []
