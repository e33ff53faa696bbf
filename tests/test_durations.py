"""parse_duration: the forms users write, and clear errors for the rest."""

from __future__ import annotations

from datetime import timedelta

import pytest

from multilock.backend import MAX_DURATION, parse_duration
from multilock.errors import ConfigurationError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        ("30", 30.0),
        ("1.5", 1.5),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("2d", 172800.0),
        ("1h30m", 5400.0),
        ("1m30s500ms", 90.5),
        (" 1h 30m ", 5400.0),
        ("1.5s", 1.5),
        ("5M", 300.0),
        (timedelta(minutes=2), 120.0),
        (timedelta(milliseconds=1), 0.001),
    ],
)
def test_accepted_forms(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("5x", "'5x'"),
        ("", "''"),
        ("ms", "'ms'"),
        ("1h-30m", "'1h-30m'"),
        ("-5", "must be positive"),
        (0, "must be positive"),
        (-1.0, "must be positive"),
        ("0s", "must be positive"),
        (float("inf"), "finite"),
        (float("nan"), "finite"),
        (timedelta(0), "must be positive"),
        (True, "boolean"),
        (None, "NoneType"),
        ([1], "list"),
    ],
)
def test_rejected_with_the_value_in_the_message(value: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid ttl") as info:
        parse_duration(value, what="ttl")
    assert fragment in str(info.value)


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("soon")


@pytest.mark.parametrize(
    "value",
    [1e12, 10**30, 10**400, timedelta.max, "99999999999999999999999d", MAX_DURATION * 2],
    ids=repr,
)
def test_longer_than_the_maximum_is_one_short_line(value: object) -> None:
    with pytest.raises(ConfigurationError, match="longer than the maximum") as info:
        parse_duration(value, what="ttl")
    message = str(info.value)
    assert "100 years" in message
    assert "\n" not in message
    assert len(message) < 200  # a 400-digit int is shown cut short


def test_the_maximum_is_inclusive_and_can_be_lowered() -> None:
    assert parse_duration(MAX_DURATION) == MAX_DURATION
    assert parse_duration(int(MAX_DURATION)) == MAX_DURATION
    assert parse_duration("2s", maximum=2.0) == 2.0
    with pytest.raises(ConfigurationError, match=r"invalid timeout: '2\.5s' .* maximum of 2 s"):
        parse_duration("2.5s", what="timeout", maximum=2.0)
    # A float takes a path of its own (the scheduler's computed ttls): the same bounds.
    assert parse_duration(2.0, maximum=2.0) == 2.0
    with pytest.raises(ConfigurationError, match="maximum of 2 s"):
        parse_duration(2.000001, what="ttl", maximum=2.0)
