"""Open-loop faults, end to end through the CLI: Ctrl-C in the middle of an open-loop run with requests held in the
client ends it quietly (every task cancelled and awaited), and a rate no client could carry in its open-file limit
stops sending, says client-limited (not the server), and ends in bounded time."""

from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import wait_for_line
from tests.faults.support import FAST, assert_nothing_left, assert_plain, orch_env, start, stored

SimProfiles = Callable[..., dict[str, Path]]
# What asyncio prints when a run's tasks outlive its event loop (or a coroutine is made and never run).
ASYNCIO_NOISE = ("Task was destroyed but it is pending", "Event loop is closed", "was never awaited", "Traceback")


@pytest.mark.parametrize("client", ["host", "local"])
def test_ctrl_c_mid_open_loop_run_exits_130_without_asyncio_noise(
    sim_profiles: SimProfiles, tmp_path: Path, client: str
) -> None:
    # 400 req/s against a cap of 8 in flight: hundreds of requests are held in the client when Ctrl-C comes, and each
    # request cancelled would start a held one (a task born after the cancelling) without the fix.
    port = int(yaml.safe_load(sim_profiles()["base"].read_text())["port"])
    db = tmp_path / "r.db"
    proc = start("bench", "baseline", "--sim", "--rate", "400", "--duration", "20", "--max-concurrency", "8",
                 "--runs", "1", "--max-tokens", "16", "--client", client, *FAST, "--db", str(db),
                 cwd=tmp_path)  # fmt: skip
    seen: list[str] = []
    try:
        wait_for_line(proc, "env check", seen)  # the run starts right after: 20 s of arrivals
        time.sleep(1.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(seen) + out
    assert proc.returncode == 130, text
    assert "Interrupted" in text, text
    for noise in ASYNCIO_NOISE:
        assert noise not in text, text
    assert_plain(text)
    assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]


def _few_open_files() -> None:
    # What `ulimit -n 256` gives orch (and the server it launches, which inherits it).
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_a_rate_beyond_the_clients_open_files_is_client_limited_and_bounded(
    sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    """The fault pass's `--rate 10000 --duration 5`: it ran out of descriptors, its own watchdog failed (EMFILE on
    /proc/PID/stat), the report blamed the launch, and the 5 s run took minutes. Now sending stops when the client
    is full, the run is invalid as client-limited (with what to do), and it ends in bounded time."""
    port = int(yaml.safe_load(sim_profiles()["base"].read_text())["port"])
    db = tmp_path / "r.db"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "baseline", "--sim", "--rate", "10000", "--duration", "5",
         "--runs", "1", "--max-tokens", "256", *FAST, "--db", str(db)],
        cwd=tmp_path, text=True, capture_output=True, env=orch_env(), stdin=subprocess.DEVNULL,
        preexec_fn=_few_open_files, timeout=300,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text  # its only run measured the client: nothing to report
    # Bounded by behaviour, not by a stopwatch: sending stopped once the client's descriptors were full, before the
    # 5 s schedule ended, with no more requests started than 256 descriptors can hold.
    stopped = re.search(r"sending stopped at ([0-9.]+)s after (\d+) of (\d+) requests", text)
    assert stopped, text
    assert float(stopped[1]) < 5 and int(stopped[2]) < 256 < int(stopped[3]), text
    assert "Run 1/1 @ 10000 req/s: INVALID, client-limited: " in text and "in flight were cut" in text, text
    assert "ulimit -n 256" in text and "not the server's" in text, text
    assert "Too many open files" not in text and "the launch broke" not in text, text
    assert "limited by the server" not in text, text
    assert_plain(text)
    assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("failed",)]
    ((valid, reason),) = stored(db, "SELECT valid, invalid_reason FROM runs WHERE warmup = 0")
    assert valid == 0 and str(reason).startswith("client-limited: "), reason
