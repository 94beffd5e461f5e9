"""core/warm_start.py: RETRAIN_WARM_START, read alike by the local runner and `retrain train`."""

from __future__ import annotations

import pytest

from core.errors import InputError
from core.warm_start import warm_start_setting


@pytest.mark.parametrize(
    ("value", "warm"),
    [("on", True), ("1", True), (" TRUE ", True), ("yes", True),
     ("off", False), ("0", False), ("False", False), ("no", False)],
)  # fmt: skip
def test_the_switch_reads_the_usual_words_for_on_and_off(value, warm):
    assert warm_start_setting({"RETRAIN_WARM_START": value}) is warm


def test_warm_starts_are_on_unless_switched_off():
    assert warm_start_setting({}) is True


def test_any_other_value_is_refused_naming_the_variable_and_the_words_it_takes():
    with pytest.raises(InputError) as refused:
        warm_start_setting({"RETRAIN_WARM_START": "sometimes"})
    assert str(refused.value) == (
        "RETRAIN_WARM_START='sometimes': expected on or off (or 1 or 0, true or false, yes or no)"
    )
