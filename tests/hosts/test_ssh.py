"""SSH hosts against a real OpenSSH server on 127.0.0.1: host keys, full A/B, dropped connections, Ctrl-C, lock."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import engines
from orchestrator.agent import lock, ops
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import HostError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.inventory import load_inventory, parse_target
from orchestrator.hosts.ssh import SSHHost, keyscan_command
from orchestrator.results.store import Store
from orchestrator.ui.events import Lines
from tests import fake_nvidia_smi
from tests.conftest import NAMESPACE, run_orch, wait_for_line
from tests.sshd import SSHD

SimProfiles = Callable[..., dict[str, Path]]
REPO = Path(__file__).resolve().parents[2]

# CI installs openssh-server (.ci/run), so there a missing sshd is a failure, not a skip.
pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(
        not Path("/usr/sbin/sshd").exists() and not os.environ.get("CI"),
        reason="openssh-server is not installed (apt-get install openssh-server)",
    ),
]


@pytest.fixture(scope="module")
def fake_gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fakebin")
    fake_nvidia_smi.install(d, d / "state.json", gpus=2)
    return d


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory, fake_gpu_dir: Path) -> Iterator[SSHD]:
    server = SSHD.start(tmp_path_factory.mktemp("sshd"), path_prepend=str(fake_gpu_dir))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def remote(sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HostConfig:
    """The test sshd as an inventory host; ORCH_SSH_CONFIG makes `testbox` resolve like an ssh_config alias."""
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(sshd.ssh_config))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "testbox": {
                        "python": sys.executable,
                        "workdir": str(tmp_path / "remote"),
                        "reconnect_s": 20,
                        "gpu_idle_mib": 1024,
                    }
                }
            }
        )
    )
    monkeypatch.setenv("ORCH_HOSTS", str(inventory))
    return load_inventory()["testbox"]


def _nothing_left() -> None:
    assert ops.op_find(NAMESPACE) == []


def _bench(runs: int = 2, max_tokens: int = 24) -> BenchConfig:
    return BenchConfig(min_run_s=0, runs=runs, warmup=1, max_tokens=max_tokens, warmup_max_tokens=4)


def orch(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return run_orch(*args, cwd=cwd, merge_stderr=True)


# ------------------------------------------------------------------ inventory


def test_inventory_validation(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  gpu-box:\n    adress: 10.0.0.1\n")
    with pytest.raises(
        HostError, match=r"hosts\.yaml: hosts\.gpu-box\.adress: unknown field \(did you mean 'address'\?\)"
    ):
        load_inventory(str(inv))
    inv.write_text("hosts:\n  gpu-box:\n    port: 99999\n")
    with pytest.raises(HostError, match=r"hosts\.gpu-box\.port: expected an integer from 1 to 65535, got 99999"):
        load_inventory(str(inv))
    inv.write_text("hosts:\n  gpu-box:\n    foreign_port: nuke\n")
    with pytest.raises(HostError, match=r"foreign_port: expected one of refuse, kill-with-force"):
        load_inventory(str(inv))
    inv.write_text("hosts:\n  gpu-box:\n    python: /root/ml-env/bin/python3\n    gpus: 8\n")
    box = load_inventory(str(inv))["gpu-box"]
    assert (box.address, box.python, box.gpus, box.foreign_port) == ("gpu-box", "/root/ml-env/bin/python3", 8, "refuse")
    with pytest.raises(HostError, match="no such host inventory file"):
        load_inventory(str(tmp_path / "missing.yaml"))


def test_parse_target() -> None:
    assert parse_target("local", {}).is_local
    t = parse_target("alice@10.1.230.174:2222", {})
    assert (t.user, t.address, t.port) == ("alice", "10.1.230.174", 2222)
    assert parse_target("gpu-box", {}).address == "gpu-box"
    with pytest.raises(HostError, match="expected 'local', a name from the host inventory"):
        parse_target("bad host; rm -rf /", {})


# ------------------------------------------------------------------ host keys


def test_keyscan_hint_names_the_real_port_and_host(tmp_path: Path) -> None:
    known = tmp_path / "known hosts"
    assert keyscan_command("gpu-box", 22, known) == f"ssh-keyscan gpu-box >> '{known}'"
    assert keyscan_command("10.1.2.3", 2222, known) == f"ssh-keyscan -p 2222 10.1.2.3 >> '{known}'"


def test_unknown_host_key_hint_is_a_command_that_works(
    sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(known)))
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(cfg))
    box = HostConfig(name="testbox", address="testbox", python=sys.executable, workdir=str(tmp_path / "w"))
    with pytest.raises(HostError) as refused:
        SSHHost(box)
    hint = str(refused.value).split("e.g. ", 1)[1]
    assert hint == f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known}"
    subprocess.run(["bash", "-c", hint], check=True, capture_output=True, timeout=60)
    with SSHHost(box) as host:  # the hint, run as printed, is all it took
        assert host.call("hello")["protocol"] == ops.PROTOCOL_VERSION


def test_unknown_host_key_is_refused_then_accepted_on_request(
    sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(empty)))
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(cfg))
    box = HostConfig(name="testbox", address="testbox", python=sys.executable, workdir=str(tmp_path / "w"))
    with pytest.raises(
        HostError,
        match=rf"unknown host key for \[127\.0\.0\.1\]:{sshd.port}: ssh-ed25519 SHA256:\S+"
        r".*--accept-new-host-key",
    ):
        SSHHost(box)
    assert empty.read_text() == ""  # nothing was trusted silently
    with SSHHost(box, accept_new_host_key=True) as host:
        assert host.call("hello")["protocol"] == ops.PROTOCOL_VERSION
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in empty.read_text()
    with SSHHost(box) as host:  # now known: no opt-in needed
        assert host.call("alive", pid=os.getpid())["alive"]


def test_changed_host_key_is_always_refused(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = SSHD.start(tmp_path_factory.mktemp("sshd-rotate"))
    try:
        monkeypatch.setenv("ORCH_SSH_CONFIG", str(server.ssh_config))
        box = HostConfig(name="testbox", address="testbox", python=sys.executable, workdir=str(tmp_path / "w"))
        SSHHost(box).close()
        server.rotate_host_key()
        for accept in (False, True):
            with pytest.raises(HostError, match=r"HOST KEY CHANGED for \[127\.0\.0\.1\]:\d+: known_hosts has SHA256:"):
                SSHHost(box, accept_new_host_key=accept)
    finally:
        server.stop()


# ------------------------------------------------------------------ full runs


def test_full_ab_over_ssh_through_the_cli(remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    proc = orch(
        "ab",
        "baseline",
        "eagle3",
        "--host",
        "testbox",
        "--sim",
        "--blocks",
        "1",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--max-tokens",
        "32",
        "--grace",
        "2",
        "--min-run-s",
        "0",
        "--json",
        "--db",
        str(tmp_path / "r.db"),
        cwd=tmp_path,
    )
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    doc = json.loads(out[out.index("{\n") :])
    assert doc["host"] == "testbox" and doc["simulated"] is True
    assert [len(a["runs"]) for a in doc["arms"]] == [2, 2]
    assert all(r["tokens"] == 32 for a in doc["arms"] for r in a["runs"])
    assert doc["arms"][0]["env_check"]["ok"] and doc["arms"][1]["accept_length"] is not None
    assert doc["host_facts"]["gpus"] and len(doc["host_facts"]["gpus"]) == 2  # the fake nvidia-smi on PATH
    assert "GPU memory idle after" in out  # teardown waited for the (fake) GPU memory to come back
    _nothing_left()


def test_connection_dropped_mid_run_reconnects_and_finishes(
    remote: HostConfig, sshd: SSHD, sim_profiles: SimProfiles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    store = Store(tmp_path / "r.db")
    events: list[str] = []
    dropped: list[int] = []

    def drop_after_first_run(name: str, run: object) -> None:
        if not dropped and not getattr(run, "warmup", True):
            dropped.extend(sshd.drop_connections())

    with SSHHost(remote) as host:
        cfg = ABConfig(bench=_bench(runs=3, max_tokens=40), simulate=True, namespace=NAMESPACE, grace_s=2)
        result = run_ab(host, [prof], cfg, store, events=Lines(events.append), on_run=drop_after_first_run)
        reconnects = host.stats.reconnects
    assert dropped, "the test should have killed the sshd session processes"
    assert reconnects >= 1
    # The warning names what is retried: the host-side call that was cut off (when a call, not a tunnel, saw it).
    lost = [r.getMessage() for r in caplog.records if "connection was lost" in r.getMessage()]
    assert all("during the host-side call '" in m and "then making that call again" in m for m in lost), lost
    (arm,) = result.arms
    assert len(arm.timed) == 3 and all(r.tokens == 40 for r in arm.timed)
    _nothing_left()


def test_connection_lost_for_good_exits_with_cleanup_advice_then_down_cleans(
    remote: HostConfig, sshd: SSHD, sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    short = HostConfig(**{**remote.__dict__, "reconnect_s": 3.0})
    store = Store(tmp_path / "r.db")
    paused: list[bool] = []

    def cut(name: str, run: object) -> None:
        if not paused and not getattr(run, "warmup", True):
            os.kill(sshd.pid, signal.SIGSTOP)  # the listener accepts nothing: reconnecting cannot succeed
            paused.append(True)
            sshd.drop_connections()

    try:
        with SSHHost(short) as host:
            cfg = ABConfig(bench=_bench(runs=5, max_tokens=40), simulate=True, namespace=NAMESPACE, grace_s=2)
            with pytest.raises(HostError, match=r"could not reconnect within 3s.*orch down --host testbox"):
                run_ab(host, [prof], cfg, store, on_run=cut)
        assert ops.op_find(NAMESPACE), "the detached server survives the lost connection"
    finally:
        os.kill(sshd.pid, signal.SIGCONT)
    assert store.experiments()[0]["status"] == "failed"
    proc = orch("down", "--host", "testbox", "--grace", "2", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stopped " in out, out
    _nothing_left()


def test_ctrl_c_over_ssh_tears_down_the_remote_server(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    proc = orch(
        "bench",
        "baseline",
        "--host",
        "testbox",
        "--sim",
        "--runs",
        "50",
        "--warmup",
        "0",
        "--max-tokens",
        "40",
        "--grace",
        "2",
        "--min-run-s",
        "0",
        "--db",
        str(tmp_path / "r.db"),
        cwd=tmp_path,
    )
    seen: list[str] = []
    wait_for_line(proc, "Run 1/50", seen)
    assert ops.op_find(NAMESPACE)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + out
    assert "torn down" in out
    # orch dropped the connection on purpose: nothing may look like a network failure.
    assert "connection lost" not in out.lower() and "reconnect" not in out.lower(), out
    _nothing_left()


def test_ctrl_c_while_the_server_loads_over_ssh_tears_it_down_at_once(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    # The wait for readiness is one long agent call: Ctrl-C must end it (the agent exits with its channel) and the
    # teardown must follow through a fresh agent, promptly.
    sim_profiles(sim={"load_s": 120})
    args = ["--host", "testbox", "--sim", "--warmup", "0", "--grace", "2", "--min-run-s", "0"]
    proc = orch("bench", "baseline", *args, "--db", str(tmp_path / "r.db"), cwd=tmp_path)
    seen: list[str] = []
    wait_for_line(proc, "launched PID", seen)
    time.sleep(1.0)  # well inside the wait
    assert ops.op_find(NAMESPACE)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + out
    assert time.monotonic() - t0 < 60 and "torn down" in out  # at once: not after the 120 s load
    assert "connection lost" not in out.lower() and "reconnect" not in out.lower(), out
    _nothing_left()


def test_an_arm_over_ssh_costs_four_calls_and_no_channel_whatever_its_load_time(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    prof = load(str(sim_profiles(sim={"load_s": 2.0})["baseline"]))
    states: list[tuple[str, Any]] = []
    with SSHHost(remote) as host:
        tunnels = host.stats.channels_by_kind.get("tunnel", 0)
        cfg = ABConfig(bench=_bench(runs=2, max_tokens=8), simulate=True, namespace=NAMESPACE, grace_s=2)
        # Watched, like the CLI's live view: the server's log lines come with the agent's progress events.
        watched = Lines(phases=lambda name, **data: states.append((name, data.get("log"))))
        run_ab(host, [prof], cfg, Store(tmp_path / "r.db"), events=watched)
        by_op = dict(host.stats.by_op)
        tunnels = host.stats.channels_by_kind.get("tunnel", 0) - tunnels
    per_experiment = sum(by_op.pop(op) for op in ("facts", "lock", "unlock"))
    assert per_experiment == 3 and by_op.pop("bench_run") == 3  # one per run: 1 warmup + 2 timed
    assert sum(by_op.values()) == 4, by_op  # preflight, launch, wait_ready (+ env, fingerprint), teardown
    assert tunnels == 0  # readiness, GET /server_info and the benchmark all run on the host
    # Every run's power was sampled on the host inside the run's own bench_run call (counted above: no extra call).
    db = sqlite3.connect(tmp_path / "r.db")
    energies = [json.loads(m)["energy"] for (m,) in db.execute("SELECT metrics_json FROM runs")]
    db.close()
    assert len(energies) == 3 and all(e.get("j_per_token") for e in energies), energies
    loading_logs = [log for name, log in states if name == "loading" and log]
    assert any("Load weight begin" in log for log in loading_logs), states
    _nothing_left()


def test_a_call_after_close_is_refused_not_reconnected(remote: HostConfig, caplog: pytest.LogCaptureFixture) -> None:
    host = SSHHost(remote)
    host.close()
    with pytest.raises(HostError, match="closed by orch"):
        host.call("hello")
    assert not any("connection was lost" in r.getMessage() for r in caplog.records)
    assert host.stats.reconnects == 0


def test_a_local_client_reaches_the_host_through_the_ssh_tunnel(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    """--client local: the requests go from here through direct-tcpip channels (relay.Relay) to the host's server."""
    sim_profiles()
    args = ("--host", "testbox", "--sim", "--runs", "2", "--warmup", "0", "--max-tokens", "32", "--client", "local")
    proc = orch(
        "bench", "baseline", *args, "--grace", "2", "--min-run-s", "0", "--db", str(tmp_path / "r.db"), cwd=tmp_path
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert len(re.findall(r"Run \d/2: 32 tokens", out)) == 2, out
    _nothing_left()


def test_two_sessions_on_one_host_are_serialised_by_the_lock(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    common = [
        "--host",
        "testbox",
        "--sim",
        "--runs",
        "3",
        "--warmup",
        "0",
        "--max-tokens",
        "40",
        "--grace",
        "2",
        "--min-run-s",
        "0",
    ]
    # The first session holds the host until the queued one has said it waits (its 40 runs would take a minute), then
    # is stopped with Ctrl-C: how long anything takes on a loaded machine decides nothing (3 short runs once ended
    # before the queued session reached the lock, and it never had to wait).
    first_args = ["--runs", "40", "--max-tokens", "200", "--db", str(tmp_path / "1.db")]
    first = orch("bench", "baseline", *common, *first_args, cwd=tmp_path)
    seen: list[str] = []
    wait_for_line(first, "launched PID", seen)
    busy = orch("bench", "baseline", *common, "--db", str(tmp_path / "2.db"), cwd=tmp_path)
    busy_out, _ = busy.communicate(timeout=60)
    assert busy.returncode == 1
    assert re.search(rf"testbox is busy: another orch session holds it \(.*pid {first.pid} since .*--wait", busy_out)
    queued = orch("bench", "baseline", *common, "--wait", "120", "--db", str(tmp_path / "3.db"), cwd=tmp_path)
    queued_seen: list[str] = []
    wait_for_line(queued, "waiting up to 120s", queued_seen)
    assert first.poll() is None, "the first session ended before the queued one waited for it"
    first.send_signal(signal.SIGINT)
    first_out, _ = first.communicate(timeout=120)
    queued_out, _ = queued.communicate(timeout=120)
    assert first.returncode == 130 and queued.returncode == 0, "".join(queued_seen) + queued_out
    assert "torn down" in first_out, first_out
    # Ctrl-C abandons the first session's agent (its reply in flight must never be read); the host lock goes to a
    # keeper and on to the session's next agent, never back to the kernel: the queued session got the host only once
    # the first was done, and found nothing of it left to clean up.
    assert "leftover" not in queued_out, queued_out
    first_end = sqlite3.connect(tmp_path / "1.db").execute("SELECT finished_at FROM experiments").fetchone()[0]
    queued_start = sqlite3.connect(tmp_path / "3.db").execute("SELECT started_at FROM launches").fetchone()[0]
    assert queued_start >= first_end - 0.5  # the queued session launched only after the first one was done
    _nothing_left()


# ------------------------------------------------------------------ GPU checks with the fake nvidia-smi


def test_foreign_gpu_process_blocks_the_launch(remote: HostConfig, sim_profiles: SimProfiles) -> None:
    prof = load(str(sim_profiles()["baseline"]))
    foreign = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "FAKE_GPU_MIB": "30000", "FAKE_GPU_INDEX": "1", "FAKE_GPU_SCOPE": NAMESPACE},
    )
    try:
        time.sleep(0.2)
        with SSHHost(remote) as host:
            cfg = ABConfig(bench=_bench(), simulate=True, namespace=NAMESPACE, grace_s=2)
            with pytest.raises(
                HostError, match=rf"testbox is not idle.*GPU 1 is used by PID {foreign.pid} .*30000 MiB"
            ):
                run_ab(host, [prof], cfg, Store(":memory:"))
        assert foreign.poll() is None  # reported, never touched
    finally:
        foreign.kill()
        foreign.wait()
    _nothing_left()


def test_hosts_check_and_status_over_ssh(remote: HostConfig, tmp_path: Path) -> None:
    proc = orch("hosts", "check", "testbox", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert re.search(r"ok\s+connected to testbox \(root@127\.0\.0\.1:\d+\)", out)
    assert re.search(r"ok\s+2 GPUs: ", out) and "warn  sglang is not installed" in out
    assert "ok    no orch launches running" in out
    proc = orch("status", "--host", "testbox", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "nothing launched by orch is running on testbox" in out and "GPU 0:" in out


def test_hosts_list_shows_ssh_config_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host gpu-alias\n  HostName 10.9.8.7\n  Port 2299\n  User alice\n")
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(cfg))
    inv = tmp_path / "hosts.yaml"
    hosts = {
        "aliased": {"address": "gpu-alias"},
        "pinned": {"address": "gpu-alias", "port": 2200, "user": "bob"},
        "plain": {"address": "10.1.1.1"},
        "broken": {"address": "gpu-alias", "identity_file": [str(tmp_path / "missing-key")]},
    }
    inv.write_text(yaml.safe_dump({"hosts": hosts}))
    monkeypatch.setenv("USER", "carol")
    assert main(["hosts", "list", "--inventory", str(inv)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "alice@10.9.8.7:2299 (ssh_config Host gpu-alias)" in lines["aliased"]
    assert "bob@10.9.8.7:2200 (ssh_config Host gpu-alias)" in lines["pinned"]  # the inventory wins
    assert "carol@10.1.1.1:22 " in lines["plain"]
    assert "missing-key: no such file" in lines["broken"] and "Traceback" not in lines["broken"]


def _fake_engine_packages(root: Path) -> Path:
    """sglang and torch importable from root, with __version__ but no dist-info (metadata cannot see them)."""
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text('__version__ = "0.5.9"\n')
    (root / "torch").mkdir()
    # Real packages may print while importing; the probe must not be confused by it.
    (root / "torch" / "__init__.py").write_text('print("torch says hello")\n__version__ = "2.9.1+cu128"\n')
    return root


def test_hosts_check_finds_sglang_by_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    fake = _fake_engine_packages(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), str(REPO)]))
    monkeypatch.chdir(tmp_path)
    assert main(["hosts", "check", "local"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ok\s+sglang 0\.5\.9\n", out) and re.search(r"ok\s+torch 2\.9\.1\+cu128\n", out), out
    # One line for each registered engine's package: vLLM's CPU build lives in a venv of its own, not this one.
    assert all(f" {engines.get(n).version_package} " in out for n in engines.names()), out
    vllm = r"warn\s+vllm is not installed for \S+ \(vllm profiles can only run with --sim, unless a profile's python: "
    assert re.search(vllm + "names another interpreter", out), out
    facts = ops.op_facts(packages=engines.fact_packages())
    assert facts["sglang"] == "0.5.9" and facts["torch"] == "2.9.1+cu128"
    assert "sglang" not in sys.modules, "the agent must not import sglang itself"
    # Installed per metadata but broken on import: still reported, with a warning saying why.
    (fake / "sglang" / "__init__.py").write_text("raise ImportError('libcuda.so.1: cannot open shared object')\n")
    dist = fake / "sglang-0.5.8.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.8\n")
    assert main(["hosts", "check", "local"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ok\s+sglang 0\.5\.8\n", out)
    assert "warn  sglang is installed but `import sglang` fails" in out and "libcuda.so.1" in out


def test_concurrent_calls_share_one_agent_channel(remote: HostConfig) -> None:
    # Calls from a second thread (e.g. a tunnel) and the main thread share one agent channel safely.
    with SSHHost(remote) as host:
        errors: list[BaseException] = []

        def hammer() -> None:
            try:
                for _ in range(20):
                    assert host.call("alive", pid=os.getpid())["alive"]
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and host.stats.by_op == {"alive": 80}


def test_lock_and_server_of_a_crashed_orch_are_recovered(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    common = ["--host", "testbox", "--sim", "--warmup", "0", "--max-tokens", "24", "--grace", "2", "--min-run-s", "0"]
    crashed = orch("bench", "baseline", *common, "--runs", "50", "--db", str(tmp_path / "1.db"), cwd=tmp_path)
    seen: list[str] = []
    wait_for_line(crashed, "Run 1/50", seen)
    crashed.kill()  # no teardown, no unlock: the laptop died
    crashed.wait()
    assert ops.op_find(NAMESPACE), "the detached server outlives the crashed orch"
    # The agent saw its connection close and exited, so the kernel released the lock: no --wait needed.
    # --wait only absorbs the moment sshd takes to notice; a stale lock would still fail after 30 s.
    nxt = orch(
        "bench", "baseline", *common, "--runs", "1", "--wait", "30", "--db", str(tmp_path / "2.db"), cwd=tmp_path
    )
    out, _ = nxt.communicate(timeout=120)
    assert nxt.returncode == 0, out
    assert re.search(r"cleaning up \d+ leftover process\(es\) of earlier orch launch", out)
    _nothing_left()


def test_interrupted_call_never_hands_its_reply_to_the_next_call(remote: HostConfig, tmp_path: Path) -> None:
    held = str(tmp_path / "held.lock")
    assert lock.op_lock(held, {"session": "other"})["acquired"]  # makes a remote lock call block
    try:
        with SSHHost(remote) as host:

            def interrupt(signum: int, frame: object) -> None:
                raise KeyboardInterrupt

            old = signal.signal(signal.SIGALRM, interrupt)
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            try:
                with pytest.raises(KeyboardInterrupt):
                    host.call("lock", path=held, holder={"session": "mine"}, wait_s=3)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
            # The abandoned lock reply must not be read as the answer to this call.
            reply = host.call("alive", pid=os.getpid())
            assert set(reply) == {"alive", "status"} and reply["alive"] is True
            assert host.call("hello")["protocol"] == ops.PROTOCOL_VERSION
    finally:
        lock.op_unlock(held)


def test_blocks_over_ssh_interrupted_resumed_and_gpu_clock_drift_warned(
    remote: HostConfig, sim_profiles: SimProfiles, fake_gpu_dir: Path, tmp_path: Path
) -> None:
    """The blocked design over SSH: Ctrl-C in block 2, `--resume` on the same host finishes the schedule, and a
    GPU whose clock under load dropped between launches (throttling, per the fake nvidia-smi) is warned about."""
    sim_profiles()
    db = str(tmp_path / "r.db")
    state = fake_gpu_dir / "state.json"
    assert not state.exists()
    common = ["--runs", "2", "--warmup", "1", "--max-tokens", "32", "--grace", "2", "--min-run-s", "0", "--db", db]
    proc = orch(
        "ab",
        "baseline",
        "eagle3",
        "--host",
        "testbox",
        "--sim",
        "--blocks",
        "2",
        "--order",
        "abba",
        *common,
        cwd=tmp_path,
    )
    seen: list[str] = []
    try:
        wait_for_line(proc, "launch 3/4: block 2/2, eagle3", seen)  # abba: block 2 starts with the second arm
        state.write_text(json.dumps({"busy_clock_mhz": {"0": 1980}}))
        wait_for_line(proc, "Run 1/2", seen)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, "".join(seen) + out
        _nothing_left()
        exp_id = sqlite3.connect(db).execute("SELECT id FROM experiments").fetchone()[0]
        proc = orch("ab", "--resume", exp_id, "--grace", "2", "--json", "--db", db, cwd=tmp_path)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
    finally:
        state.unlink(missing_ok=True)
    doc = json.loads(out[out.index("{\n") :])
    assert doc["host"] == "testbox" and doc["status"] == "complete" and doc["blocks"] == 2
    assert doc["design"]["schedule"] == [[0, 1], [1, 0]]
    assert [(la["block"], la["profile"]) for la in doc["launches"]] == [
        (0, "baseline"),
        (0, "eagle3"),
        (1, "eagle3"),
        (1, "baseline"),
    ]
    assert all(la["gpus"] and la["gpus"]["gpus"] for la in doc["launches"])  # nvidia-smi under load, per launch
    assert doc["comparisons"][0]["verdict"] in ("slower", "inconclusive")
    assert any("GPU 0 SM clock under load changed between launches" in w and "1980" in w for w in doc["warnings"])
    assert not any("GPU 1" in w for w in doc["warnings"])
    _nothing_left()


def test_a_run_over_ssh_reports_its_tokens_live_through_the_agents_heartbeats(
    remote: HostConfig, sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.ui import progress

    seen: list[dict[str, float]] = []
    monkeypatch.setattr(progress, "remote_live", lambda data: seen.append(dict(data)))
    prof = load(str(sim_profiles()["baseline"]))
    with SSHHost(remote) as host:
        # 160 tokens at the simulator's ~82 tok/s: about 2 s per run, so the 1 s heartbeat fires mid-run.
        cfg = ABConfig(bench=_bench(runs=1, max_tokens=160), simulate=True, namespace=NAMESPACE, grace_s=2)
        run_ab(host, [prof], cfg, Store(tmp_path / "r.db"))
    mid_run = [s for s in seen if s.get("active") and 0 < s["tokens"] < 160]
    assert mid_run and all(s["elapsed"] > 0 for s in mid_run), seen
    _nothing_left()


def test_live_run_prefers_a_fresh_host_report_and_falls_back_to_this_process() -> None:
    from orchestrator.client import stream
    from orchestrator.ui import progress

    progress._REMOTE.clear()
    assert progress.live_run() is None  # nothing in flight anywhere
    progress.remote_live({"active": 1, "tokens": 42, "elapsed": 2.0})
    assert progress.live_run() == (42.0, 2.0)
    progress._REMOTE["at"] -= progress.REMOTE_FRESH_S + 1  # stale: the run ended or the link is quiet
    started = time.monotonic() - 1.0
    stream._LIVE.update(active=1.0, tokens=7.0, started=started)
    try:
        tokens, elapsed = progress.live_run() or (0.0, 0.0)
        # This process's own run: elapsed is counted from its start (however slow the machine is right now).
        assert tokens == 7.0 and 1.0 <= elapsed <= time.monotonic() - started
    finally:
        stream._LIVE["active"] = 0.0
        progress._REMOTE.clear()
