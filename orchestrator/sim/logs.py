"""Line-oriented logging for the simulator: every line is tagged [orch-sim] and flushed at once."""

from __future__ import annotations

import sys
import time

BANNER = "[orch-sim] SIMULATOR of {engine} — all timings are simulated, not measured on a GPU"
TAG = "[orch-sim]"

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
_threshold = 20


def set_level(name: str) -> None:
    """Set the minimum level printed (SGLang's --log-level names; unknown names mean info)."""
    global _threshold
    _threshold = _LEVELS.get(name.lower(), 20)


def enabled(level: str) -> bool:
    return _LEVELS.get(level, 20) >= _threshold


def emit(line: str) -> None:
    """Write one raw line; a single write call keeps lines from several processes sharing a file whole."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        # The log file or pipe is gone (e.g. the reader died); the simulator keeps running regardless.
        pass


def log(msg: str, level: str = "info", prefix: str = "", force: bool = False) -> None:
    """SGLang-style line `[time prefix] msg`, tagged as simulated; warnings and errors say so."""
    if not (force or enabled(level)):
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    kind = "" if level in ("info", "debug") else f"{level.upper()}: "
    emit(f"{TAG} [{stamp}{prefix}] {kind}{msg}")


def banner(engine: str = "sglang.launch_server") -> None:
    emit(BANNER.format(engine=engine))
