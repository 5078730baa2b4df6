"""Tests of the test harness itself: the real sshd (tests/sshd.py) and the fake nvidia-smi."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import paramiko
import psutil
import pytest

from tests import fake_nvidia_smi
from tests.conftest import NAMESPACE, free_port
from tests.sshd import SSHD, SSHDError, sshd_fixture

REPO = Path(__file__).resolve().parents[1]
GPU_QUERY = "index,name,driver_version,memory.total,memory.used,temperature.gpu,clocks.sm,power.draw,uuid"
APP_QUERY = "pid,used_memory,gpu_uuid"
CSV = "--format=csv,noheader,nounits"


# ---- fixtures and helpers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fake-gpu")
    return fake_nvidia_smi.install(base / "bin", base / "state.json")


@pytest.fixture(scope="module")
def shared_sshd(tmp_path_factory: pytest.TempPathFactory, fake_bin: Path) -> Iterator[SSHD]:
    """One server for the tests that do not disturb it, with the fake nvidia-smi on its PATH."""
    yield from sshd_fixture(tmp_path_factory, path_prepend=str(fake_bin))


@pytest.fixture
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """A server of its own for a test that drops, rotates or stops it."""
    yield from sshd_fixture(tmp_path_factory)


def paramiko_client(server: SSHD, known_hosts: Path | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or server.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            "127.0.0.1",
            port=server.port,
            username="root",
            key_filename=str(server.client_key),
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
            banner_timeout=10,
            auth_timeout=10,
        )
    except BaseException:
        client.close()
        raise
    return client


def run_remote(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, _ = client.exec_command(command, timeout=10)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


def dead(pid: int) -> bool:
    """Gone, or a zombie (PID 1 here does not reap orphans)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def smi(fake_bin: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(fake_bin / "nvidia-smi"), *args],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def rows(text: str) -> list[list[str]]:
    return [[f.strip() for f in line.split(",")] for line in text.splitlines() if line.strip()]


def apps_by_pid(fake_bin: Path) -> dict[int, tuple[int, str]]:
    res = smi(fake_bin, f"--query-compute-apps={APP_QUERY}", CSV)
    assert res.returncode == 0, res.stdout + res.stderr
    return {int(pid): (int(mib), uuid) for pid, mib, uuid in rows(res.stdout)}


def memory_used(fake_bin: Path) -> dict[int, int]:
    res = smi(fake_bin, "--query-gpu=index,memory.used", CSV)
    assert res.returncode == 0, res.stdout + res.stderr
    return {int(i): int(used) for i, used in rows(res.stdout)}


def gpu_snapshot(fake_bin: Path) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """Compute apps {pid: (gpu index, MiB)} and memory.used per GPU, consistent with each other.

    Every GPU's memory.used must be the idle baseline plus its apps. Other test sessions may start and stop GPU
    users between the two queries, so an inconsistent pair is retried; only a lasting mismatch fails.
    """
    index_of = {fake_nvidia_smi.gpu_uuid(i): i for i in range(64)}
    seen: list[object] = []
    for _ in range(20):
        before = apps_by_pid(fake_bin)
        used = memory_used(fake_bin)
        if apps_by_pid(fake_bin) != before:
            continue
        apps = {pid: (index_of[uuid], mib) for pid, (mib, uuid) in before.items()}
        expected = {
            i: min(fake_nvidia_smi.IDLE_MIB + sum(m for g, m in apps.values() if g == i), fake_nvidia_smi.TOTAL_MIB)
            for i in used
        }
        if used == expected:
            return apps, used
        seen.append((used, apps))
        time.sleep(0.05)
    raise AssertionError(f"memory.used never matched the compute apps: {seen[-3:]}")


def foreign_gpu_user(mib: int, index: int) -> subprocess.Popen[bytes]:
    """A stand-in for somebody else's job on a GPU."""
    env = {**os.environ, "FAKE_GPU_MIB": str(mib), "FAKE_GPU_INDEX": str(index), "FAKE_GPU_SCOPE": NAMESPACE}
    return subprocess.Popen(["sleep", "60"], env=env, stdin=subprocess.DEVNULL)


def kill_child(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        proc.kill()
    proc.wait(5)


# ---- sshd -------------------------------------------------------------------------------------------------------


@pytest.mark.ssh
def test_openssh_client_and_remote_path(shared_sshd: SSHD, fake_bin: Path) -> None:
    res = subprocess.run(
        ["ssh", "-F", str(shared_sshd.ssh_config), "-o", "BatchMode=yes", "testbox", "true"],
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    # Root's ~/.bashrc runs for non-interactive ssh commands too; the SetEnv PATH entry must survive it.
    res = shared_sshd.ssh("command -v nvidia-smi")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(fake_bin / "nvidia-smi")
    assert shared_sshd.target() == f"root@127.0.0.1:{shared_sshd.port}"
    line = shared_sshd.known_hosts.read_text().strip()
    assert line.startswith(f"[127.0.0.1]:{shared_sshd.port} ssh-ed25519 AAAA")


@pytest.mark.ssh
def test_paramiko_verifies_host_key(shared_sshd: SSHD, tmp_path: Path) -> None:
    client = paramiko_client(shared_sshd)
    try:
        assert run_remote(client, "echo ok; exit 3") == (3, "ok\n")
    finally:
        client.close()
    # Without the known_hosts entry RejectPolicy refuses the (unknown) server.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        paramiko_client(shared_sshd, known_hosts=empty).close()


@pytest.mark.ssh
def test_paramiko_reads_the_ssh_config(shared_sshd: SSHD) -> None:
    cfg = paramiko.SSHConfig.from_path(str(shared_sshd.ssh_config)).lookup("testbox")
    assert cfg["hostname"] == "127.0.0.1"
    assert cfg["port"] == str(shared_sshd.port)
    assert cfg["user"] == "root"
    identity: object = cfg["identityfile"]  # a list, though the stubs say str
    assert identity == [str(shared_sshd.client_key)]
    assert cfg["userknownhostsfile"] == str(shared_sshd.known_hosts)


@pytest.mark.ssh
def test_remote_nvidia_smi_through_setenv_path(shared_sshd: SSHD, fake_bin: Path) -> None:
    gpu = foreign_gpu_user(12345, 6)
    try:
        time.sleep(0.05)
        res = shared_sshd.ssh(f"nvidia-smi --query-gpu=index,memory.used {CSV}")
        assert res.returncode == 0, res.stderr
        used = {int(i): int(m) for i, m in rows(res.stdout)}
        assert sorted(used) == list(range(8))
        assert used[6] >= 12345 + fake_nvidia_smi.IDLE_MIB
    finally:
        kill_child(gpu)


@pytest.mark.ssh
def test_rotate_host_key_is_a_changed_key(sshd: SSHD) -> None:
    client = paramiko_client(sshd)
    client.close()
    old_key, old_pid, port = sshd.host_public_key(), sshd.pid, sshd.port
    sshd.rotate_host_key()
    assert sshd.port == port
    assert sshd.pid != old_pid and dead(old_pid)
    assert sshd.host_public_key() != old_key
    with pytest.raises(paramiko.BadHostKeyException):
        paramiko_client(sshd).close()
    res = sshd.ssh("true")
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr


@pytest.mark.ssh
def test_drop_connections_breaks_open_sessions(sshd: SSHD) -> None:
    client = paramiko_client(sshd)
    try:
        assert run_remote(client, "echo before") == (0, "before\n")
        sessions = sshd.session_pids()
        assert len(sessions) == 1  # root login: the monitor is the session process (`sshd: root@notty`)
        assert "root@notty" in " ".join(psutil.Process(sessions[0]).cmdline())
        listener = sshd.pid
        assert sshd.drop_connections() == sessions
        assert all(dead(p) for p in sessions)
        assert sshd.pid == listener and not dead(listener)
        with pytest.raises((paramiko.SSHException, EOFError, OSError)):
            run_remote(client, "echo after")
    finally:
        client.close()
    fresh = paramiko_client(sshd)
    try:
        assert run_remote(fresh, "echo again") == (0, "again\n")
    finally:
        fresh.close()


def remote_sleep(sshd: SSHD) -> tuple[subprocess.Popen[bytes], int]:
    """Run `sleep 60` over a connection of its own; returns the ssh client and the remote sleep's PID."""
    ssh = subprocess.Popen(
        sshd.ssh_argv("echo $$; exec sleep 60"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert ssh.stdout is not None
    line = ssh.stdout.readline().decode().strip()
    assert line.isdigit(), (line, ssh.stderr.read() if ssh.stderr else b"")
    pid = int(line)
    deadline = time.monotonic() + 5
    while psutil.Process(pid).name() != "sleep":  # the remote bash printed its PID just before `exec`
        assert time.monotonic() < deadline, psutil.Process(pid).cmdline()
        time.sleep(0.01)
    return ssh, pid


@pytest.mark.ssh
def test_dropped_commands_are_orphans_that_stop_kills(sshd: SSHD) -> None:
    ssh, sleeper = remote_sleep(sshd)
    try:
        assert sshd.orphan_pids() == []
        sshd.drop_connections()
        assert ssh.wait(10) == 255  # the client saw its connection die
        # Like a real drop without a pty: the command runs on, reparented away from sshd.
        assert not dead(sleeper)
        assert sshd.orphan_pids() == [sleeper]
        sshd.stop()
        assert dead(sleeper)
    finally:
        sshd.stop()
        if ssh.poll() is None:
            kill_child(ssh)


@pytest.mark.ssh
def test_stop_leaves_nothing_running(sshd: SSHD) -> None:
    client = paramiko_client(sshd)
    ssh, sleeper = remote_sleep(sshd)
    marked: int | None = None
    lid = f"{NAMESPACE}:harness-marked-{os.getpid()}"
    try:
        # A detached orch-marked process is orch's to stop: sshd.stop() must leave it (the sweep reports leaks).
        res = sshd.ssh(f"ORCH_LAUNCH_ID={lid} setsid sleep 60 > /dev/null 2>&1 < /dev/null & echo $!")
        assert res.returncode == 0, res.stderr
        marked = int(res.stdout)
        deadline = time.monotonic() + 10
        while len(sshd.session_pids()) != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sessions = sshd.session_pids()
        assert len(sessions) == 2, sessions
        seen = [sshd.pid, *sessions, sleeper]
        assert sshd.orphan_pids() == [marked]
        assert sshd.orphan_pids(include_marked=False) == []
        sshd.stop()
        assert all(dead(p) for p in seen), [p for p in seen if not dead(p)]
        assert not dead(marked)
        assert ssh.wait(10) == 255  # the client saw its connection die
        sshd.stop()  # idempotent
        # Nothing listens on the port any more.
        with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
            paramiko_client(sshd).close()
    finally:
        sshd.stop()
        client.close()
        if ssh.poll() is None:
            kill_child(ssh)
        if marked is not None and not dead(marked) and psutil.Process(marked).environ().get("ORCH_LAUNCH_ID") == lid:
            os.kill(marked, signal.SIGKILL)


@pytest.mark.ssh
def test_bad_config_is_reported(tmp_path: Path) -> None:
    with pytest.raises(SSHDError, match=r"sshd -t.*rejected(.|\n)*NoSuchOption"):
        SSHD.start(tmp_path, extra_config="NoSuchOption yes")


# ---- fake nvidia-smi --------------------------------------------------------------------------------------------


def test_idle_gpus_show_low_memory(fake_bin: Path) -> None:
    res = smi(fake_bin, f"--query-gpu={GPU_QUERY}", CSV)
    assert res.returncode == 0, res.stderr
    table = rows(res.stdout)
    assert [r[0] for r in table] == [str(i) for i in range(8)]
    first = table[0]
    assert first[1:4] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "575.57.08", "97887"]
    assert first[8].startswith("GPU-") and len({r[8] for r in table}) == 8
    float(first[7])
    # Other test sessions may run GPU users of their own: a GPU is idle unless a compute app sits on it.
    apps, used = gpu_snapshot(fake_bin)
    busy = {gpu for gpu, _ in apps.values()}
    assert len(busy) < 8, "every GPU looks busy"
    assert all(used[i] == fake_nvidia_smi.IDLE_MIB for i in range(8) if i not in busy), used
    lines = smi(fake_bin, "-L").stdout.splitlines()
    assert lines[0] == f"GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: {first[8]})"


def test_foreign_gpu_user_appears_and_goes(fake_bin: Path) -> None:
    user = foreign_gpu_user(30000, 5)
    try:
        time.sleep(0.05)
        assert apps_by_pid(fake_bin)[user.pid] == (30000, fake_nvidia_smi.gpu_uuid(5))
        apps, used = gpu_snapshot(fake_bin)
        assert apps[user.pid] == (5, 30000)
        assert used[5] >= fake_nvidia_smi.IDLE_MIB + 30000
    finally:
        kill_child(user)
    assert user.pid not in apps_by_pid(fake_bin)
    # A zombie holds no GPU memory: kill without reaping, look, then reap.
    zombie = foreign_gpu_user(1000, 5)
    try:
        time.sleep(0.05)
        assert zombie.pid in apps_by_pid(fake_bin)
        os.kill(zombie.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert zombie.pid not in apps_by_pid(fake_bin)
    finally:
        kill_child(zombie)


def test_fake_sees_only_its_own_session(fake_bin: Path) -> None:
    """Hermetic: another orch session's workers and another test run's GPU users are invisible to this fake."""
    other = f"other-{os.getpid()}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GPU_")}
    strangers = [
        subprocess.Popen(
            ["sleep", "60", "--multiprocessing-fork"],
            env={**base, "ORCH_LAUNCH_ID": f"{other}:x"},
            stdin=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            ["sleep", "60"],
            env={**base, "FAKE_GPU_MIB": "30000", "FAKE_GPU_SCOPE": other},
            stdin=subprocess.DEVNULL,
        ),
        subprocess.Popen(["sleep", "60"], env={**base, "FAKE_GPU_MIB": "30000"}, stdin=subprocess.DEVNULL),
    ]
    mine = foreign_gpu_user(1000, 2)
    try:
        time.sleep(0.05)
        apps = apps_by_pid(fake_bin)
        assert mine.pid in apps
        assert not {p.pid for p in strangers} & set(apps)
    finally:
        for p in [*strangers, mine]:
            kill_child(p)


def test_simulator_workers_hold_gpus(fake_bin: Path, tmp_path: Path) -> None:
    """Spawned workers of a marked launch occupy GPUs 0, 1, ... in start order; the main process holds none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_SIM_", "FAKE_GPU_"))}
    env.update(
        PYTHONPATH=str(REPO),
        ORCH_LAUNCH_ID=f"{NAMESPACE}:harness-{os.getpid()}",
        ORCH_SIM_LOAD_S="30",
        ORCH_SIM_WARMUP_S="0",
    )
    cmd = [sys.executable, "-m", "orchestrator.sim", "--model-path", "/m", "--port", str(free_port()), "--tp-size", "2"]
    with (tmp_path / "sim.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        workers: list[psutil.Process] = []
        while time.monotonic() < deadline:
            kids = psutil.Process(proc.pid).children(recursive=True)
            workers = [k for k in kids if "--multiprocessing-fork" in k.cmdline()]
            if len(workers) == 3:  # two schedulers (tp 2) and the detokenizer
                break
            assert proc.poll() is None, (tmp_path / "sim.log").read_text()
            time.sleep(0.05)
        assert len(workers) == 3, (tmp_path / "sim.log").read_text()
        order = sorted(workers, key=lambda p: (p.create_time(), p.pid))
        apps = apps_by_pid(fake_bin)
        assert proc.pid not in apps
        for k, w in enumerate(order):
            assert apps[w.pid] == (fake_nvidia_smi.WORKER_MIB, fake_nvidia_smi.gpu_uuid(k))
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 5
    while any(w.pid in apps_by_pid(fake_bin) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.pid in apps_by_pid(fake_bin) for w in workers)


def test_state_file_and_errors(fake_bin: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"gpus": 2, "extra_used_mib": {"1": 50000}}))
    env = {"FAKE_NVIDIA_SMI_STATE": str(state)}
    res = smi(fake_bin, "--query-gpu=memory.used,index,memory.free", CSV, env=env)
    assert res.returncode == 0, res.stderr
    table = rows(res.stdout)
    assert [r[1] for r in table] == ["0", "1"]
    assert int(table[1][0]) >= 50000 + fake_nvidia_smi.IDLE_MIB
    assert int(table[1][0]) + int(table[1][2]) == fake_nvidia_smi.TOTAL_MIB

    state.write_text(json.dumps({"fail": "Failed to initialize NVML: Driver/library version mismatch"}))
    res = smi(fake_bin, "-L", env=env)
    assert (res.returncode, res.stdout.strip()) == (1, "Failed to initialize NVML: Driver/library version mismatch")

    # Plain `nvidia-smi`: the status header with the driver and CUDA versions; a state "name" is another GPU model.
    state.write_text(json.dumps({"name": "NVIDIA H100 80GB HBM3"}))
    res = smi(fake_bin, env=env)
    assert res.returncode == 0 and f"CUDA Version: {fake_nvidia_smi.CUDA}" in res.stdout
    assert smi(fake_bin, "--query-gpu=name", CSV, env=env).stdout.splitlines()[0] == "NVIDIA H100 80GB HBM3"

    for args in (
        ["--query-gpu=index"],
        ["--query-gpu=index,bogus", CSV],
        ["-q"],
        ["--query-gpu=index", "--format=csv"],
    ):
        res = smi(fake_bin, *args)
        assert res.returncode == 9, (args, res.stdout)
        assert res.stdout.strip(), args


def test_fake_is_fast(fake_bin: Path) -> None:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        assert smi(fake_bin, f"--query-gpu={GPU_QUERY}", CSV).returncode == 0
        best = min(best, time.perf_counter() - t0)
    # Not a speed test (a loaded CI machine took 0.21 s): only a pathological fake, one that imports something heavy
    # or hangs, takes seconds; every test that polls the GPUs would then crawl.
    assert best < 5.0, f"fake nvidia-smi took {best:.3f}s"
