"""Strict JSON for bodies that come from outside: accepted means storable and processable.

Python's ``json`` accepts things the rest of the pipeline cannot keep: ``NaN`` and ``Infinity``
(and ``1e999``, which becomes infinity), strings holding NUL or an unpaired surrogate (PostgreSQL's
``jsonb`` and ``text`` refuse both), integers of thousands of digits, duplicate keys (which
value wins is a parser's choice), and nesting deep enough to exhaust the recursion limit
somewhere downstream. ``loads`` refuses all of them up front, naming where the problem is, so
an edge can answer 400 instead of accepting a body that fails later, unseen.

A refusal never quotes a value, and names keys with any bank number in them masked
(``payments.kernel.bank_numbers``): one parser serves every endpoint, the vault's too, where a
number sent bare (``"account_number": 77668056869313516``) is a bank account's.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from payments.http_limits import bounded_errors
from payments.kernel.bank_numbers import mask_bank_numbers

MAX_DEPTH = 32
# Integers a JSON consumer in any language reads exactly (IEEE 754 doubles).
MAX_SAFE_INTEGER = 2**53 - 1

NON_FIELD = "non_field_errors"


class StrictJSONError(ValueError):
    """The body is not acceptable JSON; ``errors`` maps each field (its top-level key, or
    ``non_field_errors``) to what is wrong with it, with the path inside the field."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items())
        super().__init__(f"invalid JSON body: {summary}")


class _Refused:
    """A number the parser does not take, left where it stood so that the walk over the tree
    names its place (the parser's hooks are not told where they are)."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


class _DuplicateKeys(dict):
    """An object that named a key more than once; the walk names each such key."""

    duplicates: list[str]


def _refuse_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float | _Refused:
    value = float(text)
    if not math.isfinite(value):
        return _Refused("a number out of the range of a double")
    return value


def _safe_int(text: str) -> int | _Refused:
    # Check the length before converting: int() of a huge digit string is slow, or refused.
    # The digits are never quoted back: a refused number may be a bank account's.
    digits = len(text.lstrip("-"))
    if digits > 16 or abs(int(text)) > MAX_SAFE_INTEGER:
        return _Refused(
            f"an integer of {digits} digits is out of range: integers are exact up to 2**53 - 1;"
            " send a longer number as a string"
        )
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    duplicates: list[str] = []
    for key, _ in pairs:
        if key in seen and key not in duplicates:
            duplicates.append(key)
        seen.add(key)
    flagged = _DuplicateKeys(obj)
    flagged.duplicates = duplicates
    return flagged


def _key_shown(key: str) -> str:
    """A key as a refusal names it: any bank number in it masked, then cut to 64 characters."""
    return mask_bank_numbers(key)[:64]


def _string_problem(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate"
    return None


def _check_tree(data: Any, *, max_depth: int) -> dict[str, list[str]]:
    """Walk the parsed value without recursion; report strings that cannot be stored and
    nesting deeper than ``max_depth``, each under its top-level field."""
    errors: dict[str, list[str]] = {}

    def report(path: tuple, problem: str) -> None:
        field = _key_shown(path[0]) if path and isinstance(data, dict) else NON_FIELD
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{_key_shown(p)}" for p in path)
        message = f"{'at ' + where.lstrip('.') + ': ' if len(path) > 1 else ''}{problem}"
        errors.setdefault(field, []).append(message)

    stack: list[tuple[Any, tuple, int]] = [(data, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            problem = _string_problem(value)
            if problem:
                report(path, problem)
        elif isinstance(value, _Refused):
            report(path, value.problem)
        elif isinstance(value, dict | list):
            if depth >= max_depth:
                report(path, f"nested deeper than {max_depth} levels")
                continue
            for key in getattr(value, "duplicates", ()):
                shown = key if _string_problem(key) is None else "<key>"
                report((*path, shown), "given more than once (a duplicate key)")
            if isinstance(value, dict):
                for key, item in value.items():
                    problem = _string_problem(key)
                    if problem:
                        report((*path, "<key>"), f"a key {problem}")
                        continue
                    stack.append((item, (*path, key), depth + 1))
            else:
                for index, item in enumerate(value):
                    stack.append((item, (*path, index), depth + 1))
    return errors


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw`` (UTF-8) strictly; raise ``StrictJSONError`` naming what is refused."""
    data = _parsed(raw, max_depth=max_depth)
    errors = _check_tree(data, max_depth=max_depth)
    if errors:
        raise StrictJSONError(errors)
    return data


def loads_with_items(
    raw: bytes | str, *, key: str, max_depth: int = MAX_DEPTH
) -> tuple[Any, dict[int, dict[str, list[str]]]]:
    """Parse ``raw`` as ``loads`` does, except that what ``loads`` refuses inside an item of the
    list under ``key`` (a NUL, an unpaired surrogate, a number out of range, a duplicate key,
    nesting too deep) is that item's own problem, not the body's: the item is returned with each
    such value replaced by a note saying what was refused, and its errors by its position. One
    bad event of a page is then refused alone and the page read. Anything else ``loads``
    refuses still raises ``StrictJSONError``."""
    data = _parsed(raw, max_depth=max_depth)
    item_errors: dict[int, dict[str, list[str]]] = {}
    items = data.get(key) if isinstance(data, dict) else None
    if isinstance(items, list):
        for index, item in enumerate(items):
            errors = _check_tree(item, max_depth=max_depth - 2)
            if errors:
                item_errors[index] = errors
                items[index] = _scrubbed(item, depth=max_depth - 2)
    errors = _check_tree(data, max_depth=max_depth)
    if errors:
        raise StrictJSONError(errors)
    return data, item_errors


def _scrubbed(value: Any, *, depth: int) -> Any:
    """``value`` with what ``_check_tree`` reports replaced by notes, so it can be stored."""
    if isinstance(value, _Refused):
        return f"(refused: {value.problem})"
    if isinstance(value, str):
        problem = _string_problem(value)
        return f"(refused: {problem})" if problem else value
    if isinstance(value, dict | list):
        if depth <= 0:
            return "(refused: nested too deep)"
        if isinstance(value, list):
            return [_scrubbed(item, depth=depth - 1) for item in value]
        kept = {}
        for number, (name, item) in enumerate(value.items()):
            name = name if _string_problem(name) is None else f"(refused key {number})"
            kept[name] = _scrubbed(item, depth=depth - 1)
        return kept
    return value


def _parsed(raw: bytes | str, *, max_depth: int) -> Any:
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJSONError(
                {NON_FIELD: [f"Body is not UTF-8: byte {exc.start} cannot be decoded."]}
            ) from None
    else:
        text = raw
    if text.startswith("\ufeff"):
        raise StrictJSONError(
            {NON_FIELD: ["Body starts with a byte order mark; send plain UTF-8."]}
        )
    try:
        data = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_safe_int,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise StrictJSONError(
            {NON_FIELD: [f"Body is not acceptable JSON: nested deeper than {max_depth} levels."]}
        ) from None
    except ValueError as exc:
        raise StrictJSONError({NON_FIELD: [f"Body is not valid JSON: {exc}"]}) from None
    return data


class StrictJSONParser(JSONParser):
    """DRF's JSON parser with ``loads``' rules; a refused body is a 400 naming each field, the
    ``errors`` of the module's error envelope (``payments.api.errors``)."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            return loads(raw)
        except StrictJSONError as exc:
            # Bounded: thousands of refused fields are named by their first few and a count.
            raise ParseError({"errors": bounded_errors(exc.errors)}) from None
