"""A flood of SIGINTs (a tight `kill -INT` loop) while orch runs: the first one stops the run, the rest neither cut
the teardown short nor raise anywhere; exit 130, nothing left running, the experiment `interrupted`, no traceback."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import wait_for_line
from tests.faults.support import FAST, assert_nothing_left, assert_plain, start, stored

SimProfiles = Callable[..., dict[str, Path]]
NOISE = ("Traceback", "RecursionError", "Event loop is closed", "lost sys.stderr", "Task was destroyed",
         "reentrant call")  # fmt: skip
FLOOD_S = 4.0  # long enough to cover the run's end, the teardown and the exit

OPEN_LOOP = ("--rate", "200", "--duration", "20", "--max-concurrency", "8", "--runs", "1")
CLOSED_LOOP = ("--runs", "50")


@pytest.mark.parametrize(
    ("command", "load", "client"),
    [
        ("bench", OPEN_LOOP, "host"),
        ("bench", OPEN_LOOP, "local"),
        ("ab", CLOSED_LOOP, "host"),
        ("ab", CLOSED_LOOP, "local"),
    ],
    ids=["bench-open-loop-host", "bench-open-loop-local", "ab-closed-loop-host", "ab-closed-loop-local"],
)
def test_a_flood_of_sigints_still_tears_down_and_exits_130_quietly(
    sim_profiles: SimProfiles, tmp_path: Path, command: str, load: tuple[str, ...], client: str
) -> None:
    paths = sim_profiles()
    ports = [int(port) for p in paths.values() if (port := yaml.safe_load(p.read_text()).get("port"))]
    arms = ("baseline", "eagle3") if command == "ab" else ("baseline",)
    db = tmp_path / "r.db"
    proc = start(command, *arms, "--sim", *load, "--max-tokens", "40", "--client", client, *FAST, "--db", str(db),
                 cwd=tmp_path)  # fmt: skip
    seen: list[str] = []
    flood: subprocess.Popen[bytes] | None = None
    try:
        wait_for_line(proc, "env check", seen)
        time.sleep(1.0)
        # As the reviewer did: `while kill -INT $pid; do :; done`, bounded. Once orch exits it stays a zombie until
        # communicate() reaps it, so the loop never reaches a process this test did not start.
        flood = subprocess.Popen(["bash", "-c", 'while kill -INT "$1" 2>/dev/null; do :; done', "flood", str(proc.pid)])
        time.sleep(FLOOD_S)
        flood.kill()
        flood.wait(10)
        out, _ = proc.communicate(timeout=90)
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
            flood.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(seen) + out
    assert proc.returncode == 130, text
    for noise in NOISE:
        assert noise not in text, text
    assert_plain(text)
    assert text.count("teardown in progress") <= 1, text  # said once, not once per signal
    for port in ports:
        assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]
    assert stored(db, "SELECT COUNT(*) FROM launches WHERE status = 'running'") == [(0,)]
