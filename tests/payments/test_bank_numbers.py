"""The masking rule of ``payments.kernel.bank_numbers``, case by case: what is masked to its last 4
digits, and what is kept whole because a reader needs it and a bank number does not take its
shape."""

import pytest

from payments.kernel.bank_numbers import mask_bank_numbers, mask_bank_numbers_in_urls

ARABIC = "".join(chr(0x0660 + int(d)) for d in "77668056869313516")
FULL_WIDTH = "".join(chr(0xFF10 + int(d)) for d in "7766805686931")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("77668056869313516", "****3516"),
        ("account 7766805686931 closed", "account ****6931 closed"),
        ("12345", "****2345"),
        ("7766 8056 8693 1351 6", "****3516"),
        ("7766-8056-8693", "****8693"),
        ("acct_77668056869313516x", "acct_****3516x"),
        (ARABIC, "****" + ARABIC[-4:]),
        (FULL_WIDTH, "****" + FULL_WIDTH[-4:]),
        ("****3516", "****3516"),
    ],
)
def test_a_run_of_5_or_more_digits_or_a_long_digit_group_is_masked_to_its_last_4(text, shown):
    assert mask_bank_numbers(text) == shown
    assert mask_bank_numbers(shown) == shown


@pytest.mark.parametrize(
    "text",
    [
        "1234",
        "R01 returned",
        "550e8400-e29b-41d4-a716-446655440000",
        "2026-11-02",
        "2026-11-02T12:00:00.123456+00:00",
        "2026-11-02 12:00:00",
        "12500.00",
        "amount 999999999999.99 USD",
        "10.0.0.1",
        "",
    ],
)
def test_what_a_bank_number_does_not_look_like_is_kept_whole(text):
    assert mask_bank_numbers(text) == text


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (
            '"GET /api/merchants/758259572987/balance/ HTTP/1.1" 400 123456',
            '"GET /api/merchants/****2987/balance/ HTTP/1.1" 400 123456',
        ),
        ("GET /x?m=%37%37%36%36%38%30%35%36 200", "GET /x?m=****8056 200"),
        ("GET /x?m=7766+8056+8693 200", "GET /x?m=****8693 200"),
        (
            "Bad Request: /x/\\u0667\\u0667\\u0666\\u0666\\u0668/",
            "Bad Request: /x/****%D9%A7%D9%A6%D9%A6%D9%A8/",
        ),
        ("GET /x?m=77668056%0Afake 200", "GET /x?m=****8056%0Afake 200"),
        ("GET /x?m=1234&id=42 200 99999", "GET /x?m=1234&id=42 200 99999"),
    ],
)
def test_a_log_line_is_masked_in_its_urls_only(line, shown):
    assert mask_bank_numbers_in_urls(line) == shown
