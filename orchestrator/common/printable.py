"""Text from files, servers and bundles made printable: its control characters shown as escapes, never obeyed by a
terminal (stdlib only; the host's lines reach the same terminals)."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast

# What a terminal obeys instead of showing, or what reorders the text around it: C0 controls (ESC starts colour,
# title, clipboard (OSC 52) and clear-screen sequences; CR and BS overwrite what was printed), DEL, C1 controls
# (0x9b is a one-byte CSI on some terminals), the bidi embeddings, overrides, isolates and marks (which make a line
# read other than it is stored), and Unicode's line and paragraph separators (new lines to some renderers).
_OTHER = r"\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ANY = re.compile(rf"[\x00-\x1f{_OTHER}]")
_BUT_LINES = re.compile(rf"[\x00-\x08\x0b-\x1f{_OTHER}]")  # tab (\x09) and newline (\x0a) pass
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(m: re.Match[str]) -> str:
    char = m.group(0)
    if char in _NAMED:
        return _NAMED[char]
    # \xNN for C0 (as Python writes them); \uNNNN above, which is also a valid escape inside a JSON string: a raw
    # DEL or C1 character in JSON output (ensure_ascii=False) stays the same JSON value once made visible.
    return f"\\x{ord(char):02x}" if ord(char) < 0x20 else f"\\u{ord(char):04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """text with every control character written as its escape (ESC as \\x1b, a newline as \\n): one field that
    stays one field on one line. With lines, newlines and tabs stay (text of several lines: a log tail, a report)
    and everything else is still shown, not obeyed."""
    pattern = _BUT_LINES if lines else _ANY
    return pattern.sub(_shown, text) if pattern.search(text) else text


class VisibleWriter:
    """A text stream that shows control characters instead of writing them (newlines and tabs pass): the last guard
    on what the command line prints, whatever printed it. Everything else is the stream underneath (`raw`)."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.raw.write(visible(text, lines=True))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def unguarded(stream: TextIO) -> TextIO:
    """The stream under a VisibleWriter (for a writer that emits escape sequences on purpose: the live view, which
    makes its own text visible first), else the stream itself."""
    return stream.raw if isinstance(stream, VisibleWriter) else stream


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """sys.stdout and sys.stderr as VisibleWriters while the block runs (as they were after it)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _guard(out), _guard(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def _guard(stream: TextIO) -> TextIO:
    return stream if isinstance(stream, VisibleWriter) else cast(TextIO, VisibleWriter(stream))
