"""The signals that stop orch the way Ctrl-C does, and console output that cannot fail once its terminal is gone."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["STOP_SIGNALS", "forgiving_output", "install", "raise_interrupt", "raises"]

# Ctrl-C; SIGTERM (cron timeouts, kill); SIGHUP (the terminal closed, the SSH session dropped). Each unwinds orch
# through every `finally`, so servers are torn down and the experiment is recorded `interrupted`.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The reader of orch's output is gone: a pipe closed (EPIPE), a terminal hung up (EIO).
_READER_GONE = frozenset({errno.EPIPE, errno.EIO})


def raise_interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    """The handler orch installs for SIGTERM and SIGHUP: unwind exactly as Ctrl-C does."""
    raise KeyboardInterrupt


def install(*, sigint: bool = False) -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C (with `sigint`, Ctrl-C too, even if it was ignored at start).

    A SIGHUP ignored at start stays ignored: `nohup orch nightly ...` asks to outlive the terminal. SIGTERM is
    always taken: cron and schedulers send it to stop a job, whatever it inherited."""
    if sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, raise_interrupt)


def raises(handler: Any) -> bool:
    """Whether this signal handler raises KeyboardInterrupt (Python's for Ctrl-C, orch's for SIGTERM/SIGHUP)."""
    return handler is signal.default_int_handler or handler is raise_interrupt


class _Forgiving(io.RawIOBase):
    """A file descriptor for output that outlives its reader: once a write finds it gone (EPIPE, EIO), the
    descriptor is pointed at /dev/null, so this and every later write, ours and our children's, succeeds unseen."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b: ReadableBuffer, /) -> int:
        data = memoryview(b)
        try:
            return os.write(self._fd, data)
        except OSError as e:
            if e.errno not in _READER_GONE:
                raise
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._fd)
            finally:
                os.close(devnull)
            return data.nbytes


def forgiving_output() -> None:
    """After a closed terminal or SSH session (SIGHUP) a print fails with EIO, and one into a closed pipe with
    EPIPE; the failure may come before the signal itself. A print must never cut short a teardown or the storing of
    results, so sys.stdout and sys.stderr drop their output instead once their reader is gone."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        try:
            fd = old.fileno()
        except (AttributeError, OSError, ValueError):
            continue  # closed at start, or not a real file (a test's capture): nothing to guard
        with contextlib.suppress(OSError, ValueError):
            old.flush()
        new = io.TextIOWrapper(
            io.BufferedWriter(_Forgiving(fd)),
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=old.line_buffering,
            write_through=getattr(old, "write_through", False),
        )
        setattr(sys, name, new)
