"""core/names.py: the one model-name rule every room checks."""

from __future__ import annotations

import pytest

from components.errors import SubmissionError
from core.errors import InputError
from core.names import check_model_name, is_model_name


@pytest.mark.parametrize("name", ["digits", "a", "house-prices-2", "a" * 40])
def test_a_registered_model_name_is_accepted(name):
    assert is_model_name(name) and check_model_name(name, "--model-name") == name


@pytest.mark.parametrize(
    "name", ["Digits", "a" * 41, "1digits", "-a", "a_b", "a.b", "nl\n", "", "../x", 3, None]
)
def test_anything_else_is_one_line_naming_the_input_and_the_form(name):
    assert not is_model_name(name)
    with pytest.raises(InputError) as raised:
        check_model_name(name, "--model-name")
    message = str(raised.value)
    assert message.startswith("--model-name ") and "\n" not in message
    assert message.endswith("expected 1-40 lowercase letters, digits or '-', starting with a letter")


def test_a_room_gets_its_own_error_type():
    with pytest.raises(SubmissionError, match=r"^model name 'Bad': expected 1-40"):
        check_model_name("Bad", "model name", SubmissionError)
