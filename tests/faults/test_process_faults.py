"""Server and orch process faults, end to end through the CLI: each leaves nothing running, frees the port, keeps
every finished run, says what happened and what to do, and exits with the right code."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from orchestrator import engines
from orchestrator.agent import ops, teardown
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import BenchError
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import lifecycle, single
from orchestrator.launch.benchmark import local_runner, run_benchmark
from tests.conftest import NAMESPACE, wait_for_line
from tests.faults.support import (
    FAST,
    assert_nothing_left,
    assert_plain,
    run,
    start,
    stored,
)
from tests.wires import wire

SimProfiles = Callable[..., dict[str, Path]]


def _baseline(sim_profiles: SimProfiles, **sim: Any) -> int:
    """Write the profiles with these simulator knobs; return the baseline's port."""
    paths = sim_profiles(sim=sim or None)
    return int(yaml.safe_load(paths["base"].read_text())["port"])


def _bench(tmp_path: Path, *extra: str, runs: int = 2, tokens: int = 16) -> tuple[Any, Path]:
    db = tmp_path / "r.db"
    out = run("bench", "baseline", "--sim", "--runs", str(runs), "--max-tokens", str(tokens), *FAST, *extra,
              "--db", str(db), cwd=tmp_path)  # fmt: skip
    return out, db


def test_server_exits_during_load(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    port = _baseline(sim_profiles, fault="exit-during-load")
    out, db = _bench(tmp_path)
    assert out.rc == 1, out.text
    assert "exited during startup" in out.err and "Initialization failed" in out.err  # the log tail says why
    assert "--resume" not in out.text  # one arm: nothing to resume
    assert_plain(out.text)
    assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("failed",)]


def test_server_hangs_during_load(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    port = _baseline(sim_profiles, fault="hang-during-load")
    t0 = time.monotonic()
    out, _ = _bench(tmp_path, "--ready-timeout", "2")
    assert out.rc == 1, out.text
    assert time.monotonic() - t0 < 30
    assert "not ready after 2s" in out.err
    assert_plain(out.text)
    assert_nothing_left(port)


def test_server_dies_mid_run(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    port = _baseline(sim_profiles, fault="die-after-tokens:40")
    out, db = _bench(tmp_path, runs=5)
    assert out.rc == 1, out.text
    assert "the server failed during run 3" in out.err and "not repeated" in out.err
    assert "repeating the run" in out.text and "not repeating the run" in out.text  # checked, then refused
    assert_plain(out.text)
    assert_nothing_left(port)
    # Two runs finished before the crash, and the failed one is kept as evidence.
    assert stored(db, "SELECT valid FROM runs ORDER BY rowid") == [(1,), (1,), (0,)]
    assert stored(db, "SELECT status FROM launches") == [("failed",)]


def test_server_ignores_sigterm(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    port = _baseline(sim_profiles, fault="ignore-sigterm")
    out, db = _bench(tmp_path)
    assert out.rc == 0, out.text
    assert "SIGKILL needed" in out.out
    assert_nothing_left(port)
    assert stored(db, "SELECT COUNT(*) FROM runs WHERE valid = 1") == [(2,)]


def test_worker_escapes_with_setsid(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    port = _baseline(sim_profiles, fault="escape-setsid")
    out, _ = _bench(tmp_path)
    assert out.rc == 0, out.text
    escaped = _pid_in_log(out.out, r"pid (\d+)\) called setsid")
    assert not psutil.pid_exists(escaped) or psutil.Process(escaped).status() == psutil.STATUS_ZOMBIE
    assert_nothing_left(port)


def _pid_in_log(out: str, pattern: str) -> int:
    """A PID the simulator wrote into its log (the log's path is in orch's `launched` line)."""
    log = re.search(r"log (\S+\.log)", out)
    assert log, out
    found = re.search(pattern, Path(log.group(1)).read_text())
    assert found, Path(log.group(1)).read_text()
    return int(found.group(1))


def test_every_run_invalid_fails_the_experiment(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """A benchmark with no valid run is not `complete`: exit 1 and the reason, runs kept."""
    port = _baseline(sim_profiles)
    out, db = _bench(tmp_path, "--min-run-s", "600")
    assert out.rc == 1, out.text
    assert "no valid timed run in baseline" in out.err and "orch show" in out.err
    assert "--resume" not in out.text
    assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("failed",)]
    assert stored(db, "SELECT COUNT(*) FROM runs WHERE valid = 0") == [(2,)]


def test_foreign_process_on_the_port_is_named_never_killed(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    port = _baseline(sim_profiles)
    squatter = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not teardown._listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        out, _ = _bench(tmp_path)
        assert out.rc == 1, out.text
        assert f"port {port}" in out.err and f"PID {squatter.pid}" in out.err and "will not kill it" in out.err
        assert_plain(out.text)
        assert squatter.poll() is None
        assert ops.op_find(NAMESPACE) == []
    finally:
        squatter.kill()
        squatter.wait(10)


@pytest.mark.parametrize("how", ["bench", "ab --port"])
def test_a_taken_port_suggests_the_runs_own_port(sim_profiles: SimProfiles, tmp_path: Path, how: str) -> None:
    """The refusal points at --port (and make demo's PORT=), not at editing the profile (README advises against a
    profile that only moves the port), and says that one port serves both arms of an A/B."""
    port = _baseline(sim_profiles)
    with socket.socket() as held:  # the test's own listener: nobody else's process is involved
        held.bind(("127.0.0.1", port))
        held.listen()
        if how == "bench":
            out, _ = _bench(tmp_path)
        else:
            out = run("ab", "baseline", "eagle3", "--sim", "--blocks", "1", "--runs", "1", "--max-tokens", "16",
                      *FAST, "--port", str(port), "--db", str(tmp_path / "r.db"), cwd=tmp_path)  # fmt: skip
    assert out.rc == 1, out.text
    assert f"port {port}" in out.err and f"PID {os.getpid()}" in out.err and "will not kill it" in out.err
    assert "--port N" in out.err and "make demo PORT=N" in out.err
    assert "one port for every arm" in out.err
    assert "give the profile another port" not in out.err
    assert_plain(out.text)
    assert ops.op_find(NAMESPACE) == []


DECOY = "import time\ntime.sleep(120)\n"


def test_a_decoy_named_like_sglang_survives_everything(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """orch never kills by name: a process whose command line is `python -m sglang.launch_server` is not its own."""
    pkg = tmp_path / "decoy" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(DECOY)
    decoy = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--port", "1"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "decoy")},
        start_new_session=True,
    )
    try:
        time.sleep(0.2)
        assert "sglang.launch_server" in " ".join(psutil.Process(decoy.pid).cmdline())
        port = _baseline(sim_profiles, fault="ignore-sigterm,escape-setsid")
        out, _ = _bench(tmp_path)
        assert out.rc == 0, out.text
        assert run("down", "--grace", "1", cwd=tmp_path).rc == 0
        assert run("down", "--force", "--grace", "1", cwd=tmp_path).rc == 0
        assert decoy.poll() is None, "orch killed a process that merely looks like SGLang"
        assert_nothing_left(port)
    finally:
        os.killpg(decoy.pid, signal.SIGKILL)
        decoy.wait(10)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_orch_interrupted_mid_run(sim_profiles: SimProfiles, tmp_path: Path, sig: signal.Signals) -> None:
    port = _baseline(sim_profiles)
    db = tmp_path / "r.db"
    proc = start("ab", "baseline", "eagle3", "--sim", "--runs", "50", "--max-tokens", "40", *FAST, "--db", str(db),
                 cwd=tmp_path)  # fmt: skip
    seen: list[str] = []
    try:
        wait_for_line(proc, "Run 2/50", seen)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(seen) + out
    assert proc.returncode == 130, text
    assert "Interrupted" in text and "orch ab --resume" in text
    assert_plain(text)
    assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]
    assert stored(db, "SELECT COUNT(*) FROM runs")[0][0] >= 2
    show = run("show", "last", "--db", str(db), cwd=tmp_path)
    assert show.rc == 1  # no launch completed yet: nothing to report, and it says so
    assert "no completed launch yet" in show.err


def test_orch_killed_mid_run(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """SIGKILL: nothing runs in orch any more, so the next session cleans up after it."""
    port = _baseline(sim_profiles)
    db = tmp_path / "r.db"
    proc = start("bench", "baseline", "--sim", "--runs", "50", "--max-tokens", "40", *FAST, "--db", str(db),
                 cwd=tmp_path)  # fmt: skip
    seen: list[str] = []
    try:
        wait_for_line(proc, "Run 2/50", seen)
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert ops.op_find(NAMESPACE), "the killed orch's server should still be running"
    listing = run("list", "--db", str(db), cwd=tmp_path)
    assert listing.rc == 0 and "interrupted" in listing.out and "running" not in listing.out, listing.text
    assert stored(db, "SELECT status FROM launches") == [("interrupted",)]
    assert "orch was killed" in str(stored(db, "SELECT error FROM experiments")[0][0])
    assert stored(db, "SELECT COUNT(*) FROM runs WHERE valid = 1")[0][0] >= 2
    # The next session finds the owner dead and the lock free: it cleans the leftover up and runs.
    out, _ = _bench(tmp_path, runs=1)
    assert out.rc == 0, out.text
    assert "cleaning up" in out.out
    assert_nothing_left(port)


def test_worker_hangs_mid_run(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """A dead worker leaves the main process and its port up: no token ever comes. Reported within seconds."""
    port = _baseline(sim_profiles, fault="worker-hang-after-tokens:40")
    out, db = _bench(tmp_path, "--stall-timeout", "5", runs=5)
    assert out.rc == 1, out.text
    # Reported at the first run, by the watchdog, and the other four runs not tried: not a stopwatch's bound.
    assert "exited" in out.err and "not repeated" in out.err
    assert_plain(out.text)
    assert_nothing_left(port)
    assert stored(db, "SELECT valid FROM runs ORDER BY rowid")[:2] == [(1,), (1,)]
    assert stored(db, "SELECT status FROM launches") == [("failed",)]


def test_a_stall_alone_is_bounded_and_never_retried(sim_profiles: SimProfiles) -> None:
    """Without the watchdog's help (no recorded process known to have died), the stall timeout ends the wait and
    the health check refuses a repeat: a hung server is not asked again."""
    prof = load(str(sim_profiles(sim={"fault": "worker-hang-after-tokens:40"})["baseline"]))
    host = LocalHost()
    cfg = BenchConfig(min_run_s=0, runs=5, warmup=0, max_tokens=16, stall_timeout_s=2.0)
    with lifecycle.running(
        host, prof, lifecycle.Settings(namespace=NAMESPACE, simulate=True, grace_s=2, gpu_wait_s=0)
    ) as srv:
        assert isinstance(srv, single.RunningServer)
        srv.processes = []  # as if the dead worker had never been recorded
        t0 = time.monotonic()
        with pytest.raises(BenchError, match="the server failed during run 3") as failure:
            run_benchmark(
                local_runner(srv.base_url, cfg, wire=wire("generate")),
                cfg,
                model="m",
                engine=engines.get("sglang"),
                recover=lambda err: single.server_problem(host, srv, prof) is None,
            )
        # The stall ended it (and no repeat): not the request timeout. A generous bound: it is no speed test.
        assert time.monotonic() - t0 < 2 + single.HEALTH_TIMEOUT_S + 45
        assert "stalled: no token for 2s" in str(failure.value)
    assert_nothing_left()


@pytest.mark.parametrize(
    ("fault", "pid_pattern"),
    [
        # Reparented to init, in its own session, still marked: the marker sweep finds it.
        ("escape-double-fork", r"FAULT escape-double-fork: pid (\d+)"),
        # Same PID under another program, outside the group, unmarked: found by the PIDs recorded at readiness.
        ("reexec-no-marker", r"FAULT reexec-no-marker: this detokenizer \(pid (\d+)\)"),
    ],
)
def test_an_escaping_worker_is_still_killed(
    sim_profiles: SimProfiles, tmp_path: Path, fault: str, pid_pattern: str
) -> None:
    port = _baseline(sim_profiles, fault=fault)
    out, _ = _bench(tmp_path)
    assert out.rc == 0, out.text
    assert not _alive(_pid_in_log(out.out, pid_pattern))
    assert_nothing_left(port)


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.1)
    return True
