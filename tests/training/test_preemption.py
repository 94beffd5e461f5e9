import os
import signal

import pytest

from training.preemption import PreemptionNotice


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
