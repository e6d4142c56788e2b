"""`--users` ranges: parsing, errors, fit to the dataset."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_client.users import UserRangeError, check_users_fit, format_user_ranges, parse_user_ranges


def test_ranges_and_singles_in_order() -> None:
    assert parse_user_ranges("1-3,7, 10 - 11") == [1, 2, 3, 7, 10, 11]
    assert parse_user_ranges("5") == [5]
    assert parse_user_ranges("300-310")[-1] == 310


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("0", "1-based"),
        ("0-5", "1-based"),
        ("5-3", "descending"),
        ("1,,2", "bad item"),
        ("a-b", "bad item"),
        ("-3", "bad item"),
        ("1-2-3", "bad item"),
        ("1.5", "bad item"),
        ("1-3,2", "twice"),
        ("1-3,3-4", "twice"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_message(spec: str, fragment: str) -> None:
    with pytest.raises(UserRangeError, match=fragment):
        parse_user_ranges(spec)


def test_users_beyond_the_dataset() -> None:
    check_users_fit([1, 943], 943, "ml-100k")
    with pytest.raises(UserRangeError, match=r"beyond dataset 'ml-100k', which has users 1\.\.943: 944"):
        check_users_fit([1, 944, 945], 943, "ml-100k")


@given(st.sets(st.integers(min_value=1, max_value=400), min_size=1, max_size=60))
def test_format_round_trips(users: set[int]) -> None:
    assert parse_user_ranges(format_user_ranges(sorted(users))) == sorted(users)
