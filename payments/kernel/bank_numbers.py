"""Bank numbers: what looks like one, and how one is shown when it cannot be refused.

The module takes raw bank numbers at one edge only, the vault's, and seals them there. Every
other input refuses text that looks like one (``looks_like_bank_number``). What cannot be refused
without losing something, because it is not ours to choose, is shown masked instead
(``mask_bank_numbers``): a processor's free text and the members of its callbacks beyond the
contract, values and keys quoted back in a refusal, URLs in access logs.

The masking rule. A DFI account number is 4 to 17 digits, and the module never shows more of
one than its last 4 (``mask_account``: ``****1234``). So in text it did not write and does not
hold to a grammar, every run of 5 or more decimal digits of any script (Arabic-Indic and
full-width digits included), and every group of digits joined by single spaces or dashes holding
8 or more digits together (``7766-8056-8693``), is written as ``****`` and its last 4 digits.
A run of 4 digits or fewer is no more than the last 4 the module shows anyway: years, times,
R-codes, the parts of an IP address stay as they are. Left whole as well, because they are
shapes a bank number does not take and the records a reader needs: a UUID (our payment ids,
message ids), an ISO 8601 date or date-time (``2026-11-02``, ``2026-11-02 12:00:00.123456``) and
a decimal amount (at most 12 integer digits and exactly 2 decimals, ``12500.00``). What is lost:
longer bare numbers in free text, such as a Unix time, an amount in cents over 9999, or a
primary key over 9999 in an access log's URL, keep their last 4 digits only.

Fields held to a grammar of their own (the contract's ids, amounts, timestamps, codes) are not
passed through here: they are stored as validated.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote_plus

# ABA routing numbers have 9 digits and account numbers 4 to 17: a long digit run means someone
# pasted a bank number instead of the processor's token, or into a free-text field. The rule:
# 8 or more consecutive digits anywhere; or groups of digits joined by single spaces or dashes
# ("0210 0002 1", "021-000-021") holding 8 or more digits together, when the groups stand on
# their own (not glued to letters, as the digit groups of a UUID are). Any script's decimal
# digits count. It also refuses a date written 2026-11-30 (8 digits): write 2026/11/30.
_DIGIT_RUN_RE = re.compile(r"\d{8,}")
_DIGIT_GROUPS_RE = re.compile(r"(?<!\w)(?<!\w-)\d+(?:[ -]\d+)+(?!\w)(?!-\w)")
BANK_NUMBER_MESSAGE = (
    "looks like a raw bank account or routing number (8 or more digits, together or in groups "
    "joined by spaces or dashes); raw bank numbers are never accepted or stored"
)


def looks_like_bank_number(value: str) -> bool:
    if not value:
        return False
    if _DIGIT_RUN_RE.search(value):
        return True
    return any(_group_digits(match) >= 8 for match in _DIGIT_GROUPS_RE.findall(value))


def _group_digits(text: str) -> int:
    return len(text) - text.count(" ") - text.count("-")


def mask_account(value: str) -> str:
    """``****1234``: never more than the last 4 characters of an account number."""
    value = value.strip()
    return "****" + value[-4:] if value else ""


_MASKED_RUN = 5
_SHOWN_WHOLE = (
    # A UUID, its hex groups not glued to more hex.
    r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}(?![0-9A-Za-z])"
    # An ISO 8601 date, or date-time up to its fraction of a second.
    r"|(?<!\d)[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?)?"
    r"(?!\d)"
    # A decimal amount.
    r"|(?<![\d.])[0-9]{1,12}\.[0-9]{2}(?![\d])"
)
_CANDIDATE_RE = re.compile(
    rf"(?P<whole>{_SHOWN_WHOLE})|(?P<groups>{_DIGIT_GROUPS_RE.pattern})|(?P<run>\d{{{_MASKED_RUN},}})"
)
_RUN_RE = re.compile(rf"\d{{{_MASKED_RUN},}}")


def _masked(match: re.Match) -> str:
    text = match.group()
    if match.lastgroup == "whole":
        return text
    if match.lastgroup == "groups":
        if _group_digits(text) >= 8:
            return mask_account(re.sub(r"[ -]", "", text))
        return _RUN_RE.sub(lambda run: mask_account(run.group()), text)
    return mask_account(text)


def mask_bank_numbers(text: str) -> str:
    """``text`` with every digit run or group that may be a bank number masked to its last 4
    digits, by the rule of the module docstring. Masking what is masked changes nothing."""
    return _CANDIDATE_RE.sub(_masked, text) if text else text


def holds_bank_number(text: str) -> bool:
    """Whether ``mask_bank_numbers`` would change ``text``."""
    return mask_bank_numbers(text) != text


# A path, query or whole URL in a log line: from a slash (or a scheme) up to a space or quote.
_URL_RE = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*://|/)[^\s\"']*")


_URL_SAFE = "/:?#[]@!$&'()*+,;=~-._"
# A non-ASCII character as Python's unicode_escape writes it (Django escapes the path it logs).
_BACKSLASH_ESCAPE_RE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def _masked_url(match: re.Match) -> str:
    url = match.group()
    # Digits may come percent-encoded (%37%37..., or a non-ASCII digit's UTF-8 bytes), escaped
    # (\u0667), or as groups joined by "+": read decoded. When something was masked the URL is
    # written encoded again, so that no decoded line break or quote splits the log line.
    unescaped = _BACKSLASH_ESCAPE_RE.sub(lambda e: chr(int(e.group()[2:], 16)), url)
    decoded = unquote_plus(unescaped)
    masked = mask_bank_numbers(decoded)
    return quote(masked, safe=_URL_SAFE) if masked != decoded else url


def mask_bank_numbers_in_urls(text: str) -> str:
    """``text`` (a log line) with ``mask_bank_numbers`` applied inside every path, query and URL
    it holds, and nowhere else: a status, a size or a duration stays as it is."""
    return _URL_RE.sub(_masked_url, text) if text else text
