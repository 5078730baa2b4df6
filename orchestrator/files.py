"""Files at a path the user gives: one rule for every file orch writes (checked before any work and again on write),
and input files opened so that a FIFO or a device cannot hang or flood the read."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from orchestrator.errors import InputError, StoreError

STDOUT = "-"
SQLITE_MAGIC = b"SQLite format 3\x00"
# SQLite's files beside a database FILE: FILE-journal (rollback journal), FILE-wal (write-ahead log: committed rows
# that are not in FILE yet) and FILE-shm (the WAL's shared-memory index). Written over, a store loses rows.
SQLITE_SIBLINGS = ("-journal", "-wal", "-shm")
WAL_MAGICS = (bytes.fromhex("377f0682"), bytes.fromhex("377f0683"))  # a WAL file's header, big-endian
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")  # a rollback journal's header (zeroed once it is done with)
READER_WAIT_S = 5.0  # how long a named pipe may wait for its reader


@dataclass(frozen=True)
class Output:
    """Where an output goes. kind: "stdout" (the path `-`); "stream" (an existing character device or FIFO, such
    as /dev/null or a named pipe: written through, never replaced); "file" (missing or a regular file: written
    next to itself and renamed into place). `reading` are the files the command reads (its results database, an
    input bundle): never written over."""

    path: str
    kind: Literal["stdout", "stream", "file"]
    option: str | None = None
    reading: tuple[str, ...] = ()

    @property
    def to_stdout(self) -> bool:
        return self.kind == "stdout"


def output_target(path: str | Path, option: str | None = None, reading: Sequence[str | Path] = ()) -> Output:
    """`path` as an output, else InputError (exit 2: the argument is wrong) naming it and its option. Refused: a
    directory, a symbolic link (replacing the link would not write where it points; following it as root in a
    shared directory is how files get clobbered) unless it leads to a device or pipe (/dev/stdout, >(cmd)), a
    block device or socket, a SQLite database or its -journal, -wal or -shm file (existing or not), a file the
    command reads, a file or directory it may not write."""
    name = str(path)
    where = f"{option} {name}" if option else name
    kept = tuple(str(p) for p in reading)
    if name == STDOUT:
        return Output(name, "stdout", option, kept)
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        _new_file(name, where)
        _refuse_sqlite(name, where)  # a -wal or -journal that SQLite would create (and read) beside a database
        return Output(name, "file", option, kept)
    except OSError as e:
        raise InputError(f"{where}: cannot use it as an output: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            mode = os.stat(name).st_mode
        except OSError:
            mode = 0  # a dangling link
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise InputError(
                f"{where}: is a symbolic link (to {os.readlink(name)}); orch replaces an output file whole and would "
                "replace the link, not the file it points to: give the file's own path (or - for stdout)"
            )
        st = os.stat(name)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{where}: is a directory; give a file name")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return Output(name, "stream", option, kept)
    if not stat.S_ISREG(st.st_mode):
        kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket or other special file"
        raise InputError(f"{where}: is {kind}, not a regular file; orch writes outputs only to files (or - for stdout)")
    for other in kept:
        with contextlib.suppress(OSError):
            if os.path.samefile(name, other):
                raise InputError(f"{where}: is {other}, which this command reads; give another file name")
    _refuse_sqlite(name, where)
    _new_file(name, where)
    if not os.access(name, os.W_OK):
        raise InputError(f"{where}: not writable (permission denied)")
    return Output(name, "file", option, kept)


def _new_file(name: str, where: str) -> None:
    # A file is written next to itself and renamed into place, so its directory must exist and be writable.
    parent = Path(name).parent
    if not parent.is_dir():
        raise InputError(f"{where}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{where}: not writable (permission denied)")


def _refuse_sqlite(name: str, where: str) -> None:
    """InputError if `name` is an SQLite file: a database, a write-ahead log or rollback journal (by their headers),
    or a -journal, -wal or -shm named for a database beside it (an -shm has no header, and a journal's is zeroed
    between transactions), whether or not that file exists yet."""
    head = _head(name, len(SQLITE_MAGIC))
    if head == SQLITE_MAGIC:
        raise InputError(f"{where}: is a SQLite database (a results store?); orch never writes an output over one")
    kind = "a SQLite write-ahead log" if head[:4] in WAL_MAGICS else None
    kind = "a SQLite rollback journal" if head[:8] == JOURNAL_MAGIC else kind
    for suffix in SQLITE_SIBLINGS:
        if kind is None and name.endswith(suffix) and _head(name[: -len(suffix)], len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            kind = f"the {suffix} file of the SQLite database {name[: -len(suffix)]}"
    if kind is not None:
        raise InputError(
            f"{where}: is {kind} (a results store's?); orch never writes an output over a SQLite database or its "
            "journal, write-ahead log or shared-memory file: that database would lose rows"
        )


def _head(name: str, size: int) -> bytes:
    """The first `size` bytes of a regular file; b"" for anything else (a FIFO is never opened: that could block)."""
    try:
        if not stat.S_ISREG(os.stat(name).st_mode):
            return b""
        with open(name, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def write_output(target: Output | str | Path, text: str, what: str) -> None:
    """Write `text` where `target` says, by the rule of output_target, checked again now (a night runs for hours
    between the first check and the write). A file: readers see the old file or the whole new one, never half of
    it. StoreError (exit 1) naming `what` when the write fails; InputError when the target is refused."""
    if not isinstance(target, Output):
        target = output_target(target)
    target = output_target(target.path, target.option, target.reading)
    if target.kind == "stdout":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        if target.kind == "stream":
            _write_through(target, text)
        else:
            _replace(target, text)
    except OSError as e:
        raise StoreError(f"{target.path}: cannot write {what}: {e.strerror or e}") from e


def _write_through(target: Output, text: str) -> None:
    # O_NONBLOCK only for the open: a FIFO nobody reads (ENXIO) is waited for a little, as a reader started just
    # before orch (`cat pipe &`) may not have opened it yet, then an error rather than a hang after a night's work.
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK
    if not os.path.islink(target.path):
        flags |= os.O_NOFOLLOW
    deadline = time.monotonic() + READER_WAIT_S
    while True:
        try:
            fd = os.open(target.path, flags)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                raise OSError(e.errno, f"a named pipe with no reader (waited {READER_WAIT_S:g}s)") from None
            time.sleep(0.05)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise InputError(f"{target.path}: changed into a regular file while orch worked; not written")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _replace(target: Output, text: str) -> None:
    path = Path(target.path)
    # Not mkstemp: its 0600 would make a file meant to be sent to someone unreadable to them; this one gets the umask.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:  # "x": O_EXCL, so never through a link planted at that name
            f.write(text)
        # Checked once more right before the rename: what stands at the path now is what gets replaced.
        if output_target(target.path, target.option, target.reading).kind != "file":
            raise InputError(f"{target.path}: is no longer a regular file (or missing); not written")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class NotRegularFile(OSError):
    """Not a regular file (a FIFO, a device, a directory): reading it could block forever or never end."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file but {kind}")
        self.kind = kind


def open_regular(path: str | Path) -> BinaryIO:
    """The file opened for reading, refused with NotRegularFile before a byte is read if it is a FIFO, a device
    (/dev/zero) or a directory. Opened without blocking, so a FIFO with no writer cannot hang the open itself."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
            raise NotRegularFile(next((k for test, k in kinds if test(mode)), "a device"))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
