"""SIGHUP (the terminal closed, the SSH session dropped) stops orch exactly as SIGTERM does: servers torn down, the
experiment `interrupted`, exit 130, even when printing fails because the terminal is gone; `nohup` is respected."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests import slurmcluster
from tests.conftest import REPO, WriteProfile
from tests.faults.support import FAST, assert_nothing_left, assert_plain, orch_env, stored
from tests.hosts.test_slurmhost import VENV_BIN, needs_cluster
from tests.nightly.test_nightly import DEFAULTS, sim_profile, write_suite
from tests.slurmcluster import PARTITION

SimProfiles = Callable[..., dict[str, Path]]
RUNS = ("--runs", "50", "--max-tokens", "40", *FAST)
COMMANDS = {
    "ab": ("ab", "baseline", "eagle3", "--sim", *RUNS),
    "bench": ("bench", "baseline", "--sim", *RUNS),
    "reproduce": ("reproduce", "eagle3", "--sim", "--claim", "94", *RUNS),
}


def _as_in_a_terminal() -> None:
    # A terminal session's default, even when the test run itself was started under nohup.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:  # a failed assertion must not leave an orch running; its server goes with its teardown
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _start(procs: list[subprocess.Popen[str]], *args: str, cwd: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=orch_env(), stdin=subprocess.DEVNULL, preexec_fn=_as_in_a_terminal,
    )  # fmt: skip
    procs.append(proc)
    return proc


def _until(proc: subprocess.Popen[str], *marks: str) -> str:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if any(m in line for m in marks):
            return "".join(seen)
    raise AssertionError("".join(seen))


def _hang_up(proc: subprocess.Popen[str], seen: str, *, terminal_gone: bool) -> str:
    """SIGHUP; with terminal_gone, the output's reader is gone first, so every later print of orch's fails."""
    if terminal_gone:
        assert proc.stdout is not None
        proc.stdout.close()
    proc.send_signal(signal.SIGHUP)
    if terminal_gone:
        proc.wait(timeout=60)
        return seen
    return seen + proc.communicate(timeout=60)[0]


def _ports(paths: dict[str, Path]) -> list[int]:
    ports = (yaml.safe_load(p.read_text()).get("port") for p in paths.values())
    return [int(port) for port in ports if port is not None]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sighup_mid_run_tears_down_like_sigterm(
    sim_profiles: SimProfiles, tmp_path: Path, started: list[subprocess.Popen[str]], command: str
) -> None:
    ports = _ports(sim_profiles())
    db = tmp_path / "r.db"
    proc = _start(started, *COMMANDS[command], "--db", str(db), cwd=tmp_path)
    text = _hang_up(proc, _until(proc, "Run 2/50"), terminal_gone=False)
    assert proc.returncode == 130, text
    assert "Interrupted: servers started by this run were torn down" in text, text
    assert_plain(text)
    for port in ports:
        assert_nothing_left(port)
    assert stored(db, "SELECT DISTINCT status FROM experiments") == [("interrupted",)]
    assert stored(db, "SELECT COUNT(*) FROM runs WHERE valid = 1")[0][0] >= 2
    if command == "ab":
        assert "orch ab --resume" in text, text


def test_sighup_after_the_terminal_is_gone_still_tears_down_and_stores(
    sim_profiles: SimProfiles, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """Every print after the hangup fails (here EPIPE; a hung-up terminal gives EIO): the teardown still completes,
    the runs and the `interrupted` status are stored, and the experiment can be resumed."""
    ports = _ports(sim_profiles())
    db = tmp_path / "r.db"
    proc = _start(started, *COMMANDS["ab"], "--db", str(db), cwd=tmp_path)
    _hang_up(proc, _until(proc, "Run 2/50"), terminal_gone=True)
    assert proc.returncode == 130
    for port in ports:
        assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]
    assert stored(db, "SELECT COUNT(*) FROM runs WHERE valid = 1")[0][0] >= 2
    assert stored(db, "SELECT COUNT(*) FROM launches WHERE status = 'running'") == [(0,)]


@pytest.mark.parametrize("terminal_gone", [False, True], ids=["terminal", "terminal-gone"])
def test_sighup_mid_night_tears_down_like_sigterm(
    write_profile: WriteProfile, tmp_path: Path, started: list[subprocess.Popen[str]], terminal_gone: bool
) -> None:
    sim_profile(write_profile, "slow", load_s=30)
    suite = write_suite(tmp_path, [{"name": "slow", "bench": "slow"}])
    db = tmp_path / "n.db"
    proc = _start(started, "nightly", str(suite), "--db", str(db), cwd=tmp_path)
    text = _hang_up(proc, _until(proc, "waiting for readiness", "launch 1/1"), terminal_gone=terminal_gone)
    assert proc.returncode == 130, text
    if not terminal_gone:
        assert "**INTERRUPTED** `slow`" in text, text
        assert_plain(text)
    assert stored(db, "SELECT status, exit_code FROM nights") == [("interrupted", 130)]
    assert stored(db, "SELECT item, status FROM night_items") == [("slow", "interrupted")]
    assert_nothing_left()


def test_nohup_keeps_sighup_ignored() -> None:
    """`nohup orch …` asks orch to outlive the terminal: orch takes SIGTERM but leaves an ignored SIGHUP ignored."""
    probe = (
        "import signal; from orchestrator.common import stopsignals; stopsignals.install(); "
        "print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, "
        "signal.getsignal(signal.SIGTERM) is stopsignals.raise_interrupt)"
    )
    ignored = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )  # fmt: skip
    assert ignored.stdout.split() == ["True", "True"], ignored.stderr


@pytest.mark.slurm
@needs_cluster
def test_sighup_twice_stops_every_fanned_out_child_and_releases_its_allocation(
    write_profile: WriteProfile, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """The children run in their own sessions, so a hangup reaches them only as the night's forwarded interrupt; a
    second SIGHUP (the shell's, then the terminal's) while they stop must not make the night kill them outright."""
    for name in ("one", "two"):  # each child's teardown then takes its grace: the second SIGHUP comes during it
        sim_profile(write_profile, name, fault="ignore-sigterm")
    entry = {"scheduler": "slurm", "partition": PARTITION, "exclusive": False, "gres": "gpu:1", "time_limit_min": 5}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"c1": entry, "c2": entry}}))
    items = [{"name": "one", "bench": "one", "host": "c1"}, {"name": "two", "bench": "two", "host": "c2"}]
    workload = {**DEFAULTS["workload"], "runs": 50, "max_tokens": 100}
    defaults = {**DEFAULTS, "grace": 5, "workload": workload}
    suite = write_suite(tmp_path, items, wait="60s", fan_out=True, defaults=defaults)
    db = tmp_path / "n.db"
    with slurmcluster.running() as cluster:
        env = cluster.env({**orch_env(), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]})
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "nightly", str(suite), "--db", str(db)], cwd=tmp_path, env=env,
            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_as_in_a_terminal,
        )  # fmt: skip
        started.append(proc)
        jobs = lambda: cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()  # noqa: E731
        until = time.monotonic() + 60
        while len(jobs()) < 2:
            assert time.monotonic() < until and proc.poll() is None, "two allocations never existed at once"
            time.sleep(0.2)
        time.sleep(2)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)  # the children are tearing down (their servers ignore SIGTERM for the grace period)
        proc.send_signal(signal.SIGHUP)
        text = proc.communicate(timeout=90)[0]
        assert proc.returncode == 130, text
        assert jobs() == [], text
        cluster.wait_no_processes()
        assert_nothing_left()
        assert stored(db, "SELECT item, status FROM night_items ORDER BY item") == [
            ("one", "interrupted"),
            ("two", "interrupted"),
        ]
        assert "teardown in progress" in text, text
        assert_plain(text)
