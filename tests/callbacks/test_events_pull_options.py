"""``processor_events_pull``'s options: each in its documented range, in digits 0-9, refused
otherwise with a usage error naming the option (before the processor or the queue is asked)."""

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--page-size", "0"),
        ("--page-size", "501"),  # PROCESSOR_EVENTS_PULL_PAGE_SIZE's range is 1-500
        ("--page-size", "99999999999999999999"),
        ("--page-size", "\uff11\uff10"),  # full-width "10": int() reads it
        ("--page-size", "-1"),
        ("--page-size", "1e2"),
        ("--max-pages", "0"),
        ("--max-pages", "10001"),
        ("--max-pages", "\u0665"),  # Arabic-Indic 5
        ("--every", "nan"),
        ("--every", "inf"),
        ("--every", "1e400"),
        ("--every", "86401"),
        ("--every", "\uff15"),  # float() reads full-width digits too
        ("--every", "-1"),
    ],
)
def test_an_option_outside_its_range_or_charset_is_a_usage_error_naming_it(option, value):
    with pytest.raises(CommandError, match=f"argument {option}"):
        call_command("processor_events_pull", option, value)


@pytest.mark.parametrize("cursor", ["c 1", "c\x001", "c" * 513, "\ud800"])
def test_a_cursor_set_by_hand_outside_its_charset_is_refused(cursor):
    with pytest.raises(CommandError, match="1-512 characters"):
        call_command("processor_events_pull", "--set-cursor", cursor)


@pytest.mark.parametrize(
    ("command", "value"),
    [
        ("bank_statements_collect", "nan"),
        ("bank_statements_collect", "inf"),
        ("nacha_collect", "-1"),
        ("nacha_collect", "\uff16\uff10"),
    ],
)
def test_the_drop_rounds_refuse_a_minimum_age_that_is_no_number_of_seconds(command, value):
    with pytest.raises(CommandError, match="argument --min-age-seconds"):
        call_command(command, "--min-age-seconds", value)
