"""formatting.number: the one way numbers are written for people (status, the report, the model cards)."""
from __future__ import annotations

import pytest

from trainer.formatting import number


@pytest.mark.parametrize(("value", "spec", "text"), [
    (517.0312, ".5g", "517.03"), (-0.07142, "+.4f", "-0.0714"), (0.834, ".1%", "83.4%"), (6, "d", "6"),
    (6.0, "d", "6.0"),  # a float given an integer spec: as it is, not an error
    ("ohlc", ".4g", "ohlc"), (True, ".3f", "True"),
    (None, "+.3f", "-"), (float("nan"), ".4g", "-"), (float("inf"), ".4g", "-"),
])
def test_a_number_is_formatted_and_no_number_is_a_dash(value, spec, text):
    assert number(value, spec) == text


def test_what_stands_for_no_number_is_the_callers():
    assert number(None, ".4g", missing="n/a") == "n/a" and number(1.5, ".4g", missing="n/a") == "1.5"
