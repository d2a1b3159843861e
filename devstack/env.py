"""Reading the benchmarks' and the chaos run's settings from the environment: one parser, one
kind of error, so ``make bench`` and ``make chaos`` refuse a bad value with the same message
naming it."""

import os


class EnvError(ValueError):
    """An environment variable holds a value the run cannot use; the message names it."""


def env_int(name: str, default: int) -> int:
    """A whole number of at least 1; unset or empty gives ``default``."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise EnvError(f"{name} must be at least 1, got {value}")
    return value


def env_ints(name: str, default: str) -> list[int]:
    """Comma-separated whole numbers, each at least 1, at least one of them."""
    raw = os.environ.get(name) or default
    try:
        values = [int(r) for r in raw.split(",") if r.strip()]
    except ValueError:
        raise EnvError(f"{name}={raw!r} must be comma-separated whole numbers") from None
    if not values or min(values) < 1:
        raise EnvError(f"{name}={raw!r} needs at least one value, each at least 1")
    return values


def env_choices(name: str, default: str, known: tuple[str, ...]) -> list[str]:
    """Comma-separated names, each one of ``known``."""
    raw = os.environ.get(name) or default
    chosen = [p.strip() for p in raw.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in known]
    if unknown:
        raise EnvError(f"{name}: unknown value(s) {unknown}; known: {', '.join(known)}")
    return chosen
