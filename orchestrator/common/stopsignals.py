"""The signals that stop orch the way Ctrl-C does, and console output that cannot fail once its terminal is gone."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = [
    "STOP_SIGNALS",
    "deferred",
    "forgiving_output",
    "install",
    "raise_interrupt",
    "raises",
    "rearm",
    "settle",
    "stop_taken",
]

# Ctrl-C; SIGTERM (cron timeouts, kill); SIGHUP (the terminal closed, the SSH session dropped). Each unwinds orch
# through every `finally`, so servers are torn down and the experiment is recorded `interrupted`.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The reader of orch's output is gone: a pipe closed (EPIPE), a terminal hung up (EIO).
_READER_GONE = frozenset({errno.EPIPE, errno.EIO})


class _Latch:
    """Where this process stands with its stop (signals are the process's, so there is one): whether a stop was
    taken, and the teardowns (`deferred` blocks) in progress."""

    def __init__(self) -> None:
        self.taken = False  # a stop was taken (raised, or held for a block's end): later signals are only counted
        self.pending = False  # taken inside a `deferred` block: raised when the outermost block ends
        self.depth = 0  # `deferred` blocks in progress
        self.notice: Callable[[], None] | None = None  # said once, at the first signal heard in the current block


_LATCH = _Latch()


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The handler orch installs for Ctrl-C, SIGTERM and SIGHUP: the first signal unwinds exactly as Ctrl-C does
    (KeyboardInterrupt), at once, or inside a `deferred` block (a teardown) when the block ends; every later one is
    only counted until `rearm`. It does nothing else: a flood of signals (a `kill -INT` loop) then finds nothing to
    nest, nothing to stack up and nothing raised in the middle of the teardown the first one started."""
    latch = _LATCH
    if latch.depth and latch.notice is not None:
        notice, latch.notice = latch.notice, None
        with contextlib.suppress(Exception):  # a print caught half-way (reentrant) is not worth a teardown
            notice()
    if latch.taken:
        return
    latch.taken = True
    if latch.depth:
        latch.pending = True
        return
    raise KeyboardInterrupt


def install(*, sigint: bool = False) -> None:
    """Ctrl-C, SIGTERM and SIGHUP unwind like Ctrl-C, the first one only (raise_interrupt). With `sigint`, Ctrl-C
    even if it was ignored at start; without, an ignored Ctrl-C (`orch nightly &` in a script) stays ignored.

    A SIGHUP ignored at start stays ignored: `nohup orch nightly ...` asks to outlive the terminal. SIGTERM is
    always taken: cron and schedulers send it to stop a job, whatever it inherited."""
    if sigint or signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupt)
    signal.signal(signal.SIGTERM, raise_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, raise_interrupt)


def raises(handler: Any) -> bool:
    """Whether this signal handler raises KeyboardInterrupt (Python's for Ctrl-C, orch's for all three)."""
    return handler is signal.default_int_handler or handler is raise_interrupt


def stop_taken() -> None:
    """A stop signal was taken by a handler of the caller's own (the benchmark client's, around its event loop),
    which raises KeyboardInterrupt itself: orch's handler, back in place, only counts the signals after it."""
    _LATCH.taken = True


def rearm() -> None:
    """orch goes on after a stop it has handled (a nightly item stopped at its timeout by the night's own signal):
    the next stop signal unwinds again."""
    _LATCH.taken = _LATCH.pending = False


@contextlib.contextmanager
def deferred(notice: Callable[[], None] | None = None) -> Iterator[None]:
    """A block (a teardown) that a stop signal does not cut short: the first one is raised as KeyboardInterrupt when
    the outermost such block ends (in place of what the block raised, which becomes its context), later ones are
    only counted; `notice` is said at the first signal heard in the block. An ignored signal (SIGHUP under nohup)
    stays ignored. Outside the main thread (which alone hears signals) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    latch = _LATCH
    # Another handler than orch's (a library's caller, a test) gives way to orch's for the block, and the stop the
    # block took is then the caller's: it is raised, and orch's latch forgets it.
    swapped = {
        sig: handler
        for sig in STOP_SIGNALS
        if (handler := signal.getsignal(sig)) is not raise_interrupt and handler not in (signal.SIG_IGN, None)
    }
    outer = latch.notice
    latch.depth += 1
    latch.notice = notice
    try:
        for sig in swapped:
            signal.signal(sig, raise_interrupt)
        yield
    finally:
        latch.notice = outer
        try:
            for sig, handler in swapped.items():
                signal.signal(sig, handler)
        finally:
            latch.depth -= 1
        if not latch.depth and latch.pending:
            latch.pending = False
            if swapped:
                latch.taken = False
            raise KeyboardInterrupt


def settle() -> None:
    """orch has done all it had to (torn down, stored, printed) and exits: a stop signal from here on is ignored, so
    that the exit status stands. Python puts the default action back while it shuts down, and a signal of a flood
    arriving then would kill the process by that signal instead of letting it exit 130 (or 0)."""
    # A signal that arrived just before its handler became SIG_IGN is still pending; when Python then runs it, it
    # finds no handler and prints "OSError: Signal 2 ignored due to race condition" with a traceback (CPython
    # bpo-43406; seen under a `kill -INT` flood). Ignoring it is what this function asks for: nothing to print.
    sys.unraisablehook = _without_ignored_signals(sys.unraisablehook)
    for sig in STOP_SIGNALS:
        if raises(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_IGN)


def _without_ignored_signals(hook: Callable[[Any], object]) -> Callable[[Any], object]:
    if getattr(hook, "drops_ignored_signals", False):
        return hook

    def quiet(unraisable: Any) -> object:
        error = unraisable.exc_value
        if isinstance(error, OSError) and "ignored due to race condition" in str(error):
            return None
        return hook(unraisable)

    quiet.drops_ignored_signals = True  # type: ignore[attr-defined]
    return quiet


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
