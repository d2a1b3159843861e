"""ABA routing numbers: nine digits whose weighted sum (3, 7, 1, repeated) is a multiple of 10.

The check digit catches every single-digit typo and most transpositions, so a routing number
that fails it is refused before it reaches the vault or a file.
"""

_WEIGHTS = (3, 7, 1, 3, 7, 1, 3, 7, 1)


def check_digit(first_eight: str) -> int:
    """The ninth digit that makes ``first_eight`` a valid routing number."""
    total = sum(int(d) * w for d, w in zip(first_eight, _WEIGHTS[:8], strict=True))
    return (10 - total % 10) % 10


def routing_number_problem(value: str) -> str | None:
    """Why ``value`` is not a routing number, or None. The message never repeats the value."""
    if not isinstance(value, str) or len(value) != 9 or not value.isascii() or not value.isdigit():
        return "a routing number is 9 digits"
    prefix = int(value[:2])
    # Federal Reserve districts (00-12), thrifts (21-32), electronic (61-72), traveler's cheques.
    if not (prefix <= 12 or 21 <= prefix <= 32 or 61 <= prefix <= 72 or prefix == 80):
        return "a routing number starts 00-12, 21-32, 61-72 or 80"
    if check_digit(value[:8]) != int(value[8]):
        return "the routing number's check digit does not match"
    return None


def is_routing_number(value: str) -> bool:
    return routing_number_problem(value) is None
