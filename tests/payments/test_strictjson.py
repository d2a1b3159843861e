import json
import re

import pytest

from payments.strictjson import MAX_DEPTH, StrictJSONError, loads


def errors_of(raw) -> dict[str, list[str]]:
    with pytest.raises(StrictJSONError) as info:
        loads(raw)
    return info.value.errors


def test_plain_object_is_parsed():
    assert loads(b'{"a": "b", "n": 12, "f": 1.5, "l": [null, true]}') == {
        "a": "b",
        "n": 12,
        "f": 1.5,
        "l": [None, True],
    }


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_are_refused(constant):
    assert errors_of(f'{{"amount": {constant}}}') == {
        "amount": [f"{constant} is not a number JSON allows"]
    }


def test_a_float_that_overflows_to_infinity_is_refused():
    assert errors_of(b'{"x": 1e999}') == {"x": ["a number out of the range of a double"]}


@pytest.mark.parametrize("number", [str(2**53), "-" + str(2**53), "1" * 5000])
def test_integers_beyond_the_safe_range_are_refused(number):
    assert "out of range" in errors_of(f'{{"x": {number}}}')["x"][0]


def test_the_largest_safe_integer_is_accepted():
    assert loads(str(2**53 - 1)) == 2**53 - 1


def test_a_nul_character_is_refused_naming_the_field():
    assert errors_of(b'{"message": "a\\u0000b"}') == {"message": ["contains a NUL character"]}


def test_an_unpaired_surrogate_is_refused_naming_the_field():
    assert errors_of(b'{"message": "\\ud800"}') == {"message": ["contains an unpaired surrogate"]}


def test_a_paired_surrogate_escape_is_an_ordinary_character():
    assert loads(b'{"m": "\\ud83d\\ude00"}') == {"m": "\U0001f600"}


def test_a_bad_string_deep_inside_a_field_names_the_field_and_the_path():
    assert errors_of(b'{"meta": {"tags": ["ok", "\\u0000"]}}') == {
        "meta": ["at meta.tags[1]: contains a NUL character"]
    }


def test_a_bad_key_is_refused():
    assert errors_of(b'{"meta": {"\\u0000": 1}}') == {
        "meta": ["at meta.<key>: a key contains a NUL character"]
    }


def test_nesting_over_the_limit_is_refused_and_at_the_limit_accepted():
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads(at_limit) is not None
    over = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert "nested deeper than" in errors_of(over)["non_field_errors"][0]


def test_nesting_at_the_interpreter_recursion_limit_is_a_clean_error():
    deep = "[" * 100_000 + "]" * 100_000
    assert "nested deeper than" in errors_of(deep)["non_field_errors"][0]


def test_duplicate_keys_are_refused_naming_where():
    assert errors_of(b'{"amount": "1.00", "amount": "9.00"}') == {
        "amount": ["given more than once (a duplicate key)"]
    }
    assert errors_of(b'{"meta": [{"a": 1, "a": 2}]}') == {
        "meta": ["at meta[0].a: given more than once (a duplicate key)"]
    }


@pytest.mark.parametrize(
    "raw",
    [
        "{}".encode("utf-16"),
        b'{"a": "\xff"}',
        b"\xef\xbb\xbf{}",
    ],
    ids=["utf-16", "invalid-utf-8", "bom"],
)
def test_bodies_that_are_not_plain_utf8_are_refused(raw):
    assert errors_of(raw)["non_field_errors"]


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": 1,}', b"'a'"])
def test_malformed_json_is_refused(raw):
    assert "not valid JSON" in errors_of(raw)["non_field_errors"][0]


def test_whatever_is_accepted_round_trips_through_strict_json():
    body = {"a": ["x", {"b": 1.25}], "c": "\u00e9\U0001f600"}
    assert loads(json.dumps(body, allow_nan=False).encode()) == body


OUT_OF_RANGE = (
    "is out of range: integers are exact up to 2**53 - 1; send a longer number as a string"
)


def _digits_shown(errors: dict[str, list[str]]) -> list[str]:
    """Every run of 5 or more digits (any script) in the refusal, keys included."""
    return re.findall(r"\d{5,}", json.dumps(errors, ensure_ascii=False))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b'{"account_number": 77668056869313516}',
            {"account_number": [f"an integer of 17 digits {OUT_OF_RANGE}"]},
        ),
        (b"-77668056869313516", {"non_field_errors": [f"an integer of 17 digits {OUT_OF_RANGE}"]}),
        (
            b'{"a": {"b": [1, 77668056869313516000]}}',
            {"a": [f"at a.b[1]: an integer of 20 digits {OUT_OF_RANGE}"]},
        ),
        (
            b'{"77668056869313516": "x", "77668056869313516": "y"}',
            {"****3516": ["given more than once (a duplicate key)"]},
        ),
        (
            b'{"meta": {"7766805686931": 1, "7766805686931": 2}}',
            {"meta": ["at meta.****6931: given more than once (a duplicate key)"]},
        ),
        (b'{"7766805686931": "a\\u0000"}', {"****6931": ["contains a NUL character"]}),
        (
            '{"m": {"\u0667\u0667\u0666\u0666\u0668\u0660\u0665\u0666\u0668": "\\u0000"}}'.encode(),
            {"m": ["at m.****\u0660\u0665\u0666\u0668: contains a NUL character"]},
        ),
        (
            b'{"m": {"acct 7766-8056-8693-1351": "\\ud800"}}',
            {"m": ["at m.acct ****1351: contains an unpaired surrogate"]},
        ),
        (b'{"1234": "\\u0000"}', {"1234": ["contains a NUL character"]}),
        (b'{"x": 7766805686931351.5e999}', {"x": ["a number out of the range of a double"]}),
    ],
    ids=[
        "17-digit-number",
        "bare-body",
        "nested-20-digits",
        "duplicate-17-digit-key",
        "duplicate-13-digit-key",
        "nul-under-13-digit-key",
        "arabic-indic-key",
        "grouped-key",
        "4-digit-key",
        "overflowing-float",
    ],
)
def test_a_refusal_names_where_and_never_quotes_a_bank_number(raw, expected):
    errors = errors_of(raw)
    assert errors == expected
    assert _digits_shown(errors) == []
