"""Output files: refused before any work when they could not be written, then written atomically."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from orchestrator.errors import InputError, StoreError


def writable_target(path: str, option: str | None = None) -> Path:
    """`path` as a file that can be written, else InputError (exit 2: the argument is wrong) naming it, and the
    option it was given to. The file is written next to itself and renamed into place, so its directory must be
    writable too."""
    where = f"{option} {path}" if option else path
    target = Path(path)
    parent = target.parent
    if target.is_dir():
        raise InputError(f"{where}: is a directory; give a file name")
    if not parent.is_dir():
        raise InputError(f"{where}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"{where}: not writable (permission denied)")
    return target


def write_atomically(path: str | Path, text: str, what: str) -> None:
    """Readers see the old file or the whole new one, never half of it; StoreError naming `what` on failure."""
    target = Path(path)
    # Not mkstemp: its 0600 would make a file meant to be sent to someone unreadable to them; this one gets the umask.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        try:
            with open(tmp, "x", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        raise StoreError(f"{path}: cannot write {what}: {e.strerror or e}") from e
