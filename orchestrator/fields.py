"""Field checkers shared by profile and host-inventory validation: each returns the value or raises FieldError."""

from __future__ import annotations

import difflib
import math
import re
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

# Messages quote the offending value; a 1 MB string or an alias bomb must not become a 1 MB (or endless) message.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3


def show(v: Any) -> str:
    """repr(v), bounded in length and depth, for error messages."""
    return _REPR.repr(v)


def key_name(k: Any) -> str:
    """A mapping key as it appears in a field path (`env.NAME`), bounded like show(); a key holding a newline, an
    escape sequence or a bidi override is quoted as show() quotes it (its repr), so it cannot start a line of its own
    or rewrite the one it is in."""
    if isinstance(k, str) and k.isprintable():
        return k if len(k) <= 80 else k[:77] + "..."
    return show(k)


class FieldError(Exception):
    """A value is wrong; the message says what was expected and what was found (the caller adds where)."""


def text(v: Any) -> str:
    if not isinstance(v, str):
        raise FieldError(f"expected text, got {show(v)}")
    return v


def nonempty_str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise FieldError(f"expected a non-empty string, got {show(v)}")
    if "\0" in v:
        raise FieldError("contains a NUL byte")
    return v


def int_range(lo: int, hi: int) -> Any:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise FieldError(f"expected an integer from {lo} to {hi}, got {show(v)}")
        if not lo <= v <= hi:
            raise FieldError(f"expected an integer from {lo} to {hi}, got {show(v)}")
        return v

    return check


def float_range(lo: float, hi: float, lo_open: bool = False) -> Any:
    """A finite number in [lo, hi] (or (lo, hi]); NaN and infinities are refused: every comparison with NaN is
    false, so a NaN timeout would pass a range check and then wait forever."""
    expected = f"a number {'>' if lo_open else '>='} {lo} and <= {hi}"

    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise FieldError(f"expected {expected}, got {show(v)}")
        if not math.isfinite(v):
            raise FieldError(f"expected {expected}, got {show(v)} (not a finite number)")
        if (v <= lo if lo_open else v < lo) or v > hi:
            raise FieldError(f"expected {expected}, got {show(v)}")
        return float(v)

    return check


# One duration syntax for every option and field that takes a time (orch ab --duration, --stall-timeout, a suite's
# deadline, an SLO's limits): seconds as a plain number, or numbers with units, largest first. A message or a help
# text shows examples of it that its own option takes (duration_forms: those of these within its range).
PLAIN_EXAMPLES = ("30", "2.5")
UNIT_EXAMPLES = ("500ms", "30s", "5m", "3h", "1h30m", "2d")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_DURATION_RE = re.compile(rf"(?:{_NUMBER}\s*(?:ms|d|h|m|s)\s*)+")
_PART_RE = re.compile(rf"({_NUMBER})\s*(ms|d|h|m|s)")


def seconds_of(v: Any) -> float | None:
    """A duration in seconds: a number, or text such as "30", "2.5", "500ms", "30s", "5m", "3h", "1h30m" or "2d"
    (units largest first, each at most once); None for anything else, NaN and infinities included."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        value = float(v)
    elif isinstance(v, str) and len(v) <= 100:
        text = v.strip().lower()
        try:
            value = float(text)
        except ValueError:
            if not _DURATION_RE.fullmatch(text):
                return None
            parts = _PART_RE.findall(text)
            units = [unit for _, unit in parts]
            if units != sorted(set(units), key=list(_UNIT_SECONDS).index):
                return None  # "30s5m", "1m1m": not a duration anyone means
            value = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    else:
        return None
    return value if math.isfinite(value) else None


def seconds_text(seconds: float) -> str:
    """A bound of a duration's range as the user would type it: 1ms, 500ms, 30s, 10m, 1d (else plain seconds)."""
    for unit, size in _UNIT_SECONDS.items():
        count = seconds / size
        if count >= 1 and count == round(count) and (unit != "ms" or seconds < 1):
            return f"{count:g}{unit}"
    return f"{seconds:g}s"


def duration_examples(lo: float, hi: float, candidates: tuple[str, ...] = UNIT_EXAMPLES) -> list[str]:
    """The candidates (values of the duration syntax) that lie within [lo, hi]: the examples a message or a help text
    of an option of that range may show. Fewer than two of the unit examples: the range's own ends too."""
    inside = [c for c in candidates if (value := seconds_of(c)) is not None and lo <= value <= hi]
    if len(inside) >= 2 or candidates == PLAIN_EXAMPLES:
        return inside
    return list(dict.fromkeys([seconds_text(lo), *inside, seconds_text(hi)]))


def duration_forms(lo: float, hi: float, *, bare: bool = True) -> str:
    """The duration syntax in words, with examples within [lo, hi]: `seconds as a number (30, 2.5) or with units
    (500ms, 30s, 5m)`; without `bare`, numbers with units alone (an SLO's limits)."""
    units = f"with units ({', '.join(duration_examples(lo, hi))})"
    if not bare:
        return f"a number {units}"
    plain = ", ".join(duration_examples(lo, hi, PLAIN_EXAMPLES))
    return f"seconds as a number{f' ({plain})' if plain else ''} or {units}"


def seconds(lo: float, hi: float, *, bare: bool = True) -> Callable[[Any], float]:
    """A duration (seconds_of) from lo to hi seconds; FieldError says the range and the forms, with examples within
    it. Without `bare` a plain number is refused, saying so: an SLO's `ttft_p99=500` is 500 ms to whoever wrote it
    (vLLM's --goodput takes milliseconds), 500 s to orch."""

    def check(v: Any) -> float:
        value = seconds_of(v)
        plain = value is not None and _plain_number(v)
        if value is None or not lo <= value <= hi or (plain and not bare):
            hint = ""
            if plain and not bare and value is not None and value > 0:
                number = str(v).strip()
                hint = (
                    f"; a bare number is refused: vLLM's --goodput reads {number} as milliseconds, orch's durations "
                    f"as seconds: write {number}ms or {number}s"
                )
            raise FieldError(
                f"expected a duration from {seconds_text(lo)} to {seconds_text(hi)}: "
                f"{duration_forms(lo, hi, bare=bare)}, got {show(v)}{hint}"
            )
        return value

    return check


def _plain_number(v: Any) -> bool:
    """A duration given as a bare number of seconds (30, "2.5"), not with units."""
    if isinstance(v, int | float):
        return True
    try:
        float(str(v).strip())
    except ValueError:
        return False
    return True


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise FieldError(f"expected true or false, got {show(v)}")
    return v


def choice(options: tuple[str, ...]) -> Any:
    def check(v: Any) -> str:
        if v not in options:
            hint = did_you_mean(str(v), options) if isinstance(v, str) else ""
            raise FieldError(f"expected one of {', '.join(options)}, got {show(v)}{hint}")
        return str(v)

    return check


def str_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str | int | float) and not isinstance(x, bool) for x in v):
        raise FieldError(f"expected a list of strings, got {show(v)}")
    if any("\0" in str(x) for x in v):
        raise FieldError("an item contains a NUL byte")
    return tuple(str(x) for x in v)


def did_you_mean(word: str, options: Any) -> str:
    options = [str(o) for o in options]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        # Case alone (vLLM's eagle3 for SGLang's EAGLE3) is the commonest slip between engines.
        folded = {o.lower(): o for o in options}
        close = [folded[c] for c in difflib.get_close_matches(word.lower(), list(folded), n=1, cutoff=0.6)]
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_fields(
    data: Mapping[str, Any], schema: Mapping[str, Callable[[Any], Any]], where: str, error: type[Exception]
) -> dict[str, Any]:
    """Validate a mapping against a schema; errors read `<where>.<key>: <problem>`."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        checker = schema.get(str(key))
        if checker is None:
            raise error(f"{where}.{key_name(key)}: unknown field{did_you_mean(str(key), schema)}")
        if value is None:
            continue
        try:
            out[str(key)] = checker(value)
        except FieldError as e:
            raise error(f"{where}.{key_name(key)}: {e}") from None
    return out
