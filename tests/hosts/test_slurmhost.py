"""Slurm as a host (orchestrator/hosts/slurm.py) against a real one-node cluster: `orch ab --host slurm:PARTITION`
end to end, Ctrl-C while queued and while running, an allocation ended at its time limit, a crashed session."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.agent import ops
from orchestrator.errors import HostError, InventoryError
from orchestrator.hosts import slurm_cli
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.inventory import load_inventory, parse_target
from orchestrator.hosts.slurm import SlurmHost, request_for
from orchestrator.hosts.slurm_cli import Slurm
from orchestrator.ui.events import Lines
from tests import slurmcluster
from tests.conftest import NAMESPACE, REPO
from tests.slurmcluster import PARTITION, SlurmCluster, unavailable_reason

UNAVAILABLE = unavailable_reason()
needs_cluster = pytest.mark.skipif(UNAVAILABLE is not None and not os.environ.get("CI"), reason=str(UNAVAILABLE))
SimProfiles = Callable[..., dict[str, Path]]
VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurmcluster.for_module()


@pytest.fixture
def cli(cluster: SlurmCluster) -> Iterator[Slurm]:
    """orch's view of the test cluster; afterwards no job may be live and no step, task or server process alive."""
    yield Slurm(conf=str(cluster.conf), timeout_s=20)
    slurmcluster.left_clean(cluster)
    assert ops.op_find(NAMESPACE) == [], "the test left servers running"


def orch_on(cluster: SlurmCluster, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """`orch ARGS` in tmp_path as a subprocess whose Slurm commands reach this cluster."""
    # `python3` on the node is the tests' interpreter (it has psutil): srun hands orch's PATH to the step.
    env = cluster.env({**os.environ, "PYTHONPATH": str(REPO), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]})
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # SIGINT comes from the test only
    )


def _ab(*extra: str, runs: int = 2, max_tokens: int = 32) -> list[str]:
    # --workdir: the servers' logs (and the agent) go to the node's ~/.orch otherwise
    return [
        "ab",
        "baseline",
        "eagle3",
        "--sim",
        "--blocks",
        "1",
        "--runs",
        str(runs),
        "--warmup",
        "0",
        "--max-tokens",
        str(max_tokens),
        "--grace",
        "2",
        "--min-run-s",
        "0",
        "--db",
        "r.db",
        "--workdir",
        "w",
        *extra,
    ]


def read_until(proc: subprocess.Popen[str], needle: str, seen: list[str], timeout: float = 60.0) -> str:
    """Read orch's output into `seen` until a line holds `needle`; that line."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return line
        assert time.monotonic() < deadline, f"{needle!r} not within {timeout}s:\n{''.join(seen)}"
    raise AssertionError(f"{needle!r} never appeared:\n{''.join(seen)}")


def job_of(line: str) -> str:
    return line.split("allocation ", 1)[1].split()[0]


def end_at_time_limit(cluster: SlurmCluster, proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Once orch runs its second run, Slurm ends the allocation as at its time limit: (job id, orch's output)."""
    seen: list[str] = []
    job = job_of(read_until(proc, "granted allocation", seen))
    read_until(proc, "Run 2/", seen)
    # Slurm's own time-limit enforcement, without waiting the limit out: it acts at its next 30-second check.
    cluster.run("scontrol", "update", f"JobId={job}", "EndTime=now+1")
    out, _ = proc.communicate(timeout=90)
    return job, "".join(seen) + out


def runs_kept(db_path: Path) -> None:
    """The experiment failed, and the runs that finished before are in the store."""
    with sqlite3.connect(db_path) as db:
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        status = db.execute("SELECT status FROM experiments").fetchone()[0]
    assert runs >= 1 and status == "failed"


@pytest.mark.slurm
@needs_cluster
def test_ab_through_slurm_end_to_end(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    proc = orch_on(cluster, tmp_path, *_ab("--host", f"slurm:{PARTITION}", "--json"))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert f"slurm:{PARTITION}: Slurm granted allocation" in out
    doc = json.loads(out[out.index("{\n") :])
    assert doc["host"] == f"slurm:{PARTITION}" and doc["simulated"] is True
    assert [len(a["runs"]) for a in doc["arms"]] == [2, 2]
    assert all(r["tokens"] == 32 for a in doc["arms"] for r in a["runs"])
    assert doc["arms"][0]["env_check"]["ok"] and doc["arms"][1]["accept_length"] is not None
    assert len(doc["host_facts"]["gpus"]) == 8  # the node's fake nvidia-smi, through the agent's step
    assert "GPU memory idle after" in out
    # the agent was installed on the node through the step's stdin, into the workdir asked for
    assert list((tmp_path / "w").glob("agent-*/orch_agent.py"))
    assert cluster.live_jobs() == []  # released at the end


@pytest.mark.slurm
@needs_cluster
def test_a_local_client_reaches_the_node_through_the_relay(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    """--client local: every connection goes from here to the node's server through a relay step (relay.Relay);
    one run of one arm, since each connection costs a step."""
    sim_profiles()
    args = _ab("--host", f"slurm:{PARTITION}", "--client", "local", "--json", runs=1)
    proc = orch_on(cluster, tmp_path, "bench", *args[2:])  # `orch bench baseline`, not `ab baseline eagle3`
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    doc = json.loads(out[out.index("{\n") :])
    assert [r["tokens"] for a in doc["arms"] for r in a["runs"]] == [32]
    assert cluster.live_jobs() == []


@pytest.mark.slurm
@needs_cluster
def test_every_arm_runs_in_one_allocation_released_at_close(
    cluster: SlurmCluster, cli: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    phases: list[str] = []
    config = HostConfig(
        name="gpus", scheduler="slurm", partition=PARTITION, gpus=8, python=sys.executable, workdir=str(tmp_path)
    )
    view = Lines(events.append, lambda name, **_: phases.append(name))
    with SlurmHost(config, cli=cli, events=view, poll_s=0.2) as host:
        job = host.job_id
        assert slurm_cli.job_state(cli, job).state == "RUNNING"
        name = cluster.run("squeue", "-h", "-j", job, "-o", "%j|%l|%b").stdout.strip().split("|")
        assert slurm_cli.parse_name(name[0]) is not None and name[1] == "1:00:00" and "gpu:8" in name[2]
        assert host.call("hello")["protocol"] == ops.PROTOCOL_VERSION
        # the agent's step ends (here: killed); the next call starts another in the same allocation
        assert host._link is not None
        host._link.stream.proc.kill()  # type: ignore[attr-defined]
        assert host.call("hello")["protocol"] == ops.PROTOCOL_VERSION
        assert host.job_id == job and host.stats.reconnects == 1
    assert slurm_cli.job_state(cli, job).state == "CANCELLED"
    with pytest.raises(HostError, match="orch released allocation"):
        host.call("hello")
    assert any("granted allocation" in e for e in events) and "slurm queue" in phases  # the live view's phase


@pytest.mark.slurm
@needs_cluster
def test_ctrl_c_while_queued_leaves_no_job_and_no_process(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    cluster.run("salloc", "--no-shell", "-J", "holder", "--time=5", "--exclusive", "-N1")  # the node is taken
    proc = orch_on(cluster, tmp_path, *_ab("--host", f"slurm:{PARTITION}"))
    seen: list[str] = []
    line = read_until(proc, "is queued (PENDING, reason Resources)", seen)
    assert "asked Slurm for 1 node, 60 min, exclusive" in line
    job = job_of(line)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, "".join(seen) + out
    assert slurm_cli.job_state(cli, job).state == "CANCELLED"
    assert cluster.run("squeue", "-h", "-o", "%j").stdout.split() == ["holder"]
    cluster.cancel_all()


@pytest.mark.slurm
@needs_cluster
def test_ctrl_c_while_running_leaves_no_job_and_no_process(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    proc = orch_on(cluster, tmp_path, *_ab("--host", f"slurm:{PARTITION}", runs=50, max_tokens=100))
    seen: list[str] = []
    job = job_of(read_until(proc, "granted allocation", seen))
    read_until(proc, "Run 1/", seen)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + out
    assert "interrupted; continue it with: orch ab --resume" in out
    assert slurm_cli.job_state(cli, job).state == "CANCELLED"
    assert cluster.live_jobs() == []


@pytest.mark.slurm
@needs_cluster
def test_an_experiment_resumes_on_another_slurm_host_of_its_partition(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    """Cut short on `slurm:debug` (no inventory entry, the default time limit), continued on an entry of the same
    partition with more time: a new allocation, the experiment's own settings."""
    sim_profiles()
    proc = orch_on(cluster, tmp_path, *_ab("--host", f"slurm:{PARTITION}", runs=3, max_tokens=100))
    seen: list[str] = []
    read_until(proc, "Run 1/", seen)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + out
    exp_id = out.split("continue it with: orch ab --resume ", 1)[1].split()[0]
    entry = {"scheduler": "slurm", "partition": PARTITION, "time_limit_min": 30}
    hosts = {"longer": entry, "elsewhere": {**entry, "partition": "x"}}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    refused = orch_on(cluster, tmp_path, "ab", "--resume", exp_id, "--host", "elsewhere", "--db", "r.db")
    out, _ = refused.communicate(timeout=60)
    assert refused.returncode == 2 and "may resume on another Slurm host of the same partition" in out, out
    resumed = orch_on(cluster, tmp_path, "ab", "--resume", exp_id, "--host", "longer", "--db", "r.db")
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out
    assert "longer: Slurm granted allocation" in out and "(time limit 30 min)" in out
    with sqlite3.connect(tmp_path / "r.db") as db:
        assert db.execute("SELECT status FROM experiments").fetchone()[0] == "complete"
    assert cluster.live_jobs() == []


@pytest.mark.slurm
@needs_cluster
def test_an_allocation_ended_at_its_time_limit_is_reported_and_the_runs_kept(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    (tmp_path / "hosts.yaml").write_text(
        yaml.safe_dump(
            {"hosts": {"cluster": {"scheduler": "slurm", "partition": PARTITION, "time_limit_min": 1, "gres": "gpu:8"}}}
        )
    )
    proc = orch_on(cluster, tmp_path, *_ab("--host", "cluster", runs=500, max_tokens=200))
    job, text = end_at_time_limit(cluster, proc)
    assert proc.returncode == 1, text
    reason = f"allocation {job} was ended by Slurm at its time limit (TIMEOUT): orch asked for 1 min"
    # Slurm ended every process of the job: the teardown says there was nothing left, and the reason comes once.
    ended = f": teardown: nothing left to stop — Slurm ended allocation {job} (TIMEOUT) and every process in it"
    assert any(line.split(ended)[0].endswith(("baseline", "eagle3")) for line in text.splitlines() if ended in line)
    assert "TEARDOWN FAILED" not in text
    assert text.count(reason) == 1, text
    assert f"Error: cluster: {reason}" in text
    assert "continue it with: orch ab --resume" in text
    assert "Traceback" not in text
    runs_kept(tmp_path / "r.db")
    assert cluster.live_jobs() == []


@pytest.mark.slurm
@needs_cluster
def test_a_crashed_session_leaves_no_server_and_its_allocation_is_released_by_the_next(
    cluster: SlurmCluster, cli: Slurm, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    sim_profiles()
    proc = orch_on(cluster, tmp_path, *_ab("--host", f"slurm:{PARTITION}", runs=50, max_tokens=100))
    seen: list[str] = []
    job = job_of(read_until(proc, "granted allocation", seen))
    read_until(proc, "Run 1/", seen)
    proc.kill()  # no cleanup of its own: the agent sees its stdin close, the allocation stays
    proc.communicate(timeout=10)
    cluster.wait_no_processes()  # the agent's step, and the server the agent's parent tore down
    assert ops.op_find(NAMESPACE) == []
    assert slurm_cli.job_state(cli, job).state == "RUNNING"
    events: list[str] = []
    config = HostConfig(name="c", scheduler="slurm", python=sys.executable, workdir=str(tmp_path))
    with SlurmHost(config, cli=cli, events=Lines(events.append)):
        assert slurm_cli.job_state(cli, job).state == "CANCELLED"
    assert f"released allocation {job} (RUNNING) left by an orch session that is gone" in events[0]


def test_inventory_and_host_spec_for_slurm(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        yaml.safe_dump(
            {"hosts": {"c": {"scheduler": "slurm", "partition": "gpu", "account": "p1", "gpus": 4, "exclusive": False}}}
        )
    )
    c = load_inventory(str(inv))["c"]
    assert (c.scheduler, c.address, c.is_local, c.time_limit_min) == ("slurm", None, False, 60)
    req = request_for(c)
    assert (req.partition, req.gres, req.account, req.exclusive, req.nodes) == ("gpu", "gpu:4", "p1", False, 1)
    spec = parse_target("slurm:debug", {})
    assert (spec.scheduler, spec.partition, spec.name) == ("slurm", "debug", "slurm:debug")
    assert parse_target("slurm:", {}).partition is None
    for bad, message in [
        ({"partition": "gpu"}, r"hosts\.c\.partition: only a Slurm host has it; add `scheduler: slurm`"),
        ({"scheduler": "slurm", "address": "h"}, r"hosts\.c\.address: a `scheduler: slurm` host is reached through"),
        ({"scheduler": "pbs"}, r"hosts\.c\.scheduler: expected one of slurm, got 'pbs'"),
        ({"scheduler": "slurm", "time_limit_min": 0}, r"hosts\.c\.time_limit_min: "),
    ]:
        inv.write_text(yaml.safe_dump({"hosts": {"c": bad}}))
        with pytest.raises(InventoryError, match=message):
            load_inventory(str(inv))


@pytest.mark.slurm
@needs_cluster
def test_hosts_check_on_slurm_says_its_queue_wait_like_a_run_does(
    cluster: SlurmCluster, cli: Slurm, tmp_path: Path
) -> None:
    proc = orch_on(cluster, tmp_path, "hosts", "check", f"slurm:{PARTITION}", "--json")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in (0, 1), out  # 1: a check failed on this node, still a full answer
    # the allocation's progress comes as plain lines (stderr), not through a logger, and --json's document is whole
    assert f"slurm:{PARTITION}: Slurm granted allocation" in out and "orch: slurm" not in out, out
    doc = json.loads(out[out.index("{") :])
    assert doc["host"] == f"slurm:{PARTITION}" and doc["checks"][0]["text"].startswith(
        f"connected to slurm:{PARTITION}"
    )
    assert cluster.live_jobs() == []
