"""Field checkers shared by profile and host-inventory validation: each returns the value or raises FieldError."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any


class FieldError(Exception):
    """A value is wrong; the message says what was expected and what was found (the caller adds where)."""


def text(v: Any) -> str:
    if not isinstance(v, str):
        raise FieldError(f"expected text, got {v!r}")
    return v


def nonempty_str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise FieldError(f"expected a non-empty string, got {v!r}")
    if "\0" in v:
        raise FieldError("contains a NUL byte")
    return v


def int_range(lo: int, hi: int) -> Any:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise FieldError(f"expected an integer from {lo} to {hi}, got {v!r}")
        if not lo <= v <= hi:
            raise FieldError(f"expected an integer from {lo} to {hi}, got {v}")
        return v

    return check


def float_range(lo: float, hi: float, lo_open: bool = False) -> Any:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise FieldError(f"expected a number {'>' if lo_open else '>='} {lo} and <= {hi}, got {v!r}")
        if (v <= lo if lo_open else v < lo) or v > hi:
            raise FieldError(f"expected a number {'>' if lo_open else '>='} {lo} and <= {hi}, got {v}")
        return float(v)

    return check


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise FieldError(f"expected true or false, got {v!r}")
    return v


def choice(options: tuple[str, ...]) -> Any:
    def check(v: Any) -> str:
        if v not in options:
            hint = did_you_mean(str(v), options)
            raise FieldError(f"expected one of {', '.join(options)}, got {v!r}{hint}")
        return str(v)

    return check


def str_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in v):
        raise FieldError(f"expected a list of strings, got {v!r}")
    if any("\0" in str(x) for x in v):
        raise FieldError("an item contains a NUL byte")
    return tuple(str(x) for x in v)


def did_you_mean(word: str, options: Any) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_fields(
    data: Mapping[str, Any], schema: Mapping[str, Callable[[Any], Any]], where: str, error: type[Exception]
) -> dict[str, Any]:
    """Validate a mapping against a schema; errors read `<where>.<key>: <problem>`."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        checker = schema.get(str(key))
        if checker is None:
            raise error(f"{where}.{key}: unknown field{did_you_mean(str(key), schema)}")
        if value is None:
            continue
        try:
            out[str(key)] = checker(value)
        except FieldError as e:
            raise error(f"{where}.{key}: {e}") from None
    return out
