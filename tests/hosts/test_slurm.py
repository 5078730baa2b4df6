"""hosts/slurm_cli.py against a real one-node Slurm cluster: allocate, steps, release, Ctrl-C, time limit, leftovers."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest

from orchestrator.hosts import slurm_cli
from orchestrator.hosts.slurm_cli import AllocationRequest, Slurm, SlurmError, SlurmInputError
from tests import slurmcluster
from tests.conftest import NAMESPACE
from tests.slurmcluster import NODE, PARTITION, SlurmCluster, unavailable_reason

REPO = Path(__file__).resolve().parents[2]
UNAVAILABLE = unavailable_reason()
# CI installs Slurm and munge (.ci/run), so there a missing Slurm is a failure, not a skip.
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(UNAVAILABLE is not None and not os.environ.get("CI"), reason=str(UNAVAILABLE)),
]
GPUS = AllocationRequest(partition=PARTITION, nodes=1, time_limit_min=5, gres="gpu:8")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    c = SlurmCluster.start()
    print(f"\nslurm test cluster {c.name} started in {c.started_in_s:.2f}s")
    try:
        yield c
    finally:
        leaked = c.stop()
        print(f"\nslurm test cluster {c.name} stopped in {c.stopped_in_s:.2f}s")
    assert not leaked, f"the test cluster had to clean up after the tests: {leaked}"


@pytest.fixture
def cli(cluster: SlurmCluster) -> Iterator[Slurm]:
    """orch's view of the test cluster; afterwards no job may be live and no step or client process alive."""
    yield Slurm(conf=str(cluster.conf), timeout_s=20)
    slurmcluster.left_clean(cluster)


def _no_trace(cluster: SlurmCluster, job_id: str) -> None:
    """The job has ended and none of the cluster's step, task or client processes is left."""
    assert job_id not in cluster.live_jobs()
    cluster.wait_no_processes()


class Lines:
    """A pipe's lines read on a thread, so a test can wait for one with a deadline."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.q.put(raw.decode(errors="replace"))
        self.q.put("")

    def next(self, timeout: float = 20.0) -> str:
        line = self.q.get(timeout=timeout)
        self.seen.append(line)
        return line

    def until(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.next(max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{needle!r} never came:\n{''.join(self.seen)}") from None
            if needle in line:
                return line
            if line == "":
                raise AssertionError(f"{needle!r} never came before EOF:\n{''.join(self.seen)}")


ECHO = (
    "import json, os, sys\n"
    "for line in sys.stdin:\n"
    "    msg = json.loads(line)\n"
    "    env = {k: os.environ.get(k) for k in ('SLURM_JOB_ID', 'SLURMD_NODENAME', 'CUDA_VISIBLE_DEVICES')}\n"
    "    print(json.dumps({'id': msg['id'], 'env': env}))\n"
)


def test_allocate_reports_nodes_and_a_step_speaks_json_lines(cluster: SlurmCluster, cli: Slurm) -> None:
    states: list[slurm_cli.QueueState] = []
    with slurm_cli.held(cli, GPUS, namespace=NAMESPACE, label="exp-1", on_state=states.append, poll_s=0.2) as alloc:
        assert alloc.nodes == (NODE,) and alloc.partition == PARTITION
        assert slurm_cli.nodes(cli, alloc.job_id) == (NODE,)
        assert states[-1].state == "RUNNING" and states[-1].job_id == alloc.job_id
        name = slurm_cli.parse_name(alloc.name)
        assert name is not None and (name.namespace, name.label) == (NAMESPACE, "exp-1")
        assert name.host == socket.gethostname() and name.owner.startswith(f"{os.getpid()}:")

        # The agent channel to come: one JSON line each way, answered before stdin closes (srun -u: a pty).
        proc = slurm_cli.step(cli, alloc.job_id, NODE, [sys.executable, "-c", ECHO])
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        replies = Lines(proc.stdout)
        for i in range(3):
            proc.stdin.write(json.dumps({"id": i}).encode() + b"\n")
            proc.stdin.flush()
            reply = json.loads(replies.next())
            assert reply["id"] == i
        assert reply["env"] == {
            "SLURM_JOB_ID": alloc.job_id,
            "SLURMD_NODENAME": NODE,
            "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        }
        proc.stdin.close()
        assert proc.wait(20) == 0, proc.stderr.read()
        assert slurm_cli.job_state(cli, alloc.job_id).state == "RUNNING"  # a step's end is not the allocation's
    assert slurm_cli.job_state(cli, alloc.job_id).state == "CANCELLED"
    _no_trace(cluster, alloc.job_id)


@pytest.mark.parametrize(("gres", "visible"), [(None, "0,1,2,3,4,5,6,7"), ("gpu:2", "0,1"), ("none", "unset")])
def test_a_steps_gres_sets_cuda_visible_devices(cli: Slurm, gres: str | None, visible: str) -> None:
    with slurm_cli.held(cli, GPUS, namespace=NAMESPACE, poll_s=0.2) as alloc:
        script = 'echo "${CUDA_VISIBLE_DEVICES-unset}"; nvidia-smi -L | wc -l'
        proc = slurm_cli.step(cli, alloc.job_id, NODE, ["sh", "-c", script], gres=gres)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        # the node's (fake) nvidia-smi, put on PATH by the cluster's TaskProlog, shows all 8 GPUs
        assert out.decode().split() == [visible, "8"]


def test_release_ends_the_job_and_its_steps(cluster: SlurmCluster, cli: Slurm) -> None:
    alloc = slurm_cli.allocate(cli, GPUS, namespace=NAMESPACE, poll_s=0.2)
    proc = slurm_cli.step(
        cli, alloc.job_id, NODE, [sys.executable, "-u", "-c", "import time; print('up'); time.sleep(300)"]
    )
    assert proc.stdout is not None
    assert Lines(proc.stdout).next() == "up\n"
    t0 = time.monotonic()
    end = slurm_cli.release(cli, alloc.job_id)
    assert end.state == "CANCELLED" and end.describe() == f"allocation {alloc.job_id} was cancelled (CANCELLED)"
    assert proc.wait(10) != 0 and time.monotonic() - t0 < 10
    _no_trace(cluster, alloc.job_id)
    assert slurm_cli.release(cli, alloc.job_id).state == "CANCELLED"  # idempotent


def test_bad_requests_are_clear_errors_and_leave_nothing(
    cluster: SlurmCluster, cli: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SlurmInputError, match=r"Slurm has no partition 'nope' \(.*invalid partition"):
        slurm_cli.allocate(cli, AllocationRequest(partition="nope"), namespace=NAMESPACE)
    with pytest.raises(SlurmInputError, match=r"can ever satisfy 1 node\(s\) with GRES 'gpu:9'"):
        slurm_cli.allocate(cli, AllocationRequest(gres="gpu:9"), namespace=NAMESPACE)
    with pytest.raises(SlurmInputError, match="refused GRES 'tpu:1'"):
        slurm_cli.allocate(cli, AllocationRequest(gres="tpu:1"), namespace=NAMESPACE)
    assert cluster.live_jobs() == []

    # munge down (here: a config whose munge socket does not exist) fails fast with what to check
    conf = tmp_path / "slurm.conf"
    conf.write_text(cluster.conf.read_text().replace(f"{cluster.root}/munge.sock", str(tmp_path / "no.sock")))
    with pytest.raises(SlurmError, match=r"could not authenticate `salloc` through munge \(.*\): is munged running"):
        slurm_cli.allocate(Slurm(conf=str(conf)), GPUS, namespace=NAMESPACE)
    with pytest.raises(SlurmError, match=rf"SLURM_CONF={tmp_path}/nothing.conf does not exist"):
        slurm_cli.job_state(Slurm(conf=str(tmp_path / "nothing.conf")), "1")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with monkeypatch.context() as m:
        m.setenv("PATH", str(empty))
        with pytest.raises(SlurmError, match="Slurm's `salloc` is not on PATH"):
            slurm_cli.allocate(cli, GPUS, namespace=NAMESPACE)
    gone = slurm_cli.job_state(cli, "999999")
    assert (gone.state, gone.live) == (slurm_cli.GONE, False) and "no longer known" in gone.describe()


def test_a_pending_request_reports_why_and_gives_up_at_its_deadline(cluster: SlurmCluster, cli: Slurm) -> None:
    cluster.run("salloc", "--no-shell", "-J", "holder", "--time=5", "--exclusive", "-N1")  # the node is taken
    states: list[slurm_cli.QueueState] = []
    try:
        with pytest.raises(SlurmError, match=r"did not grant allocation \d+ within 1.5s \(PENDING, reason Resources\)"):
            slurm_cli.allocate(cli, GPUS, namespace=NAMESPACE, on_state=states.append, wait_s=1.5, poll_s=0.2)
        assert states and {(s.state, s.reason) for s in states} == {("PENDING", "Resources")}
        # It gave up at its deadline, not minutes later: the last report is within a poll or two of 1.5 s (a loaded
        # machine once made it 1.602 s; the bound is behaviour, not speed).
        assert states[0].waited_s < 1.5 and states[-1].waited_s < 4.0
        assert cluster.run("squeue", "-h", "-o", "%j").stdout.split() == ["holder"]
    finally:
        cluster.cancel_all()


CHILD = """
import signal, sys, time
from orchestrator.hosts import slurm_cli
conf, ns = sys.argv[1:3]
cli = slurm_cli.Slurm(conf=conf, timeout_s=20)
req = slurm_cli.AllocationRequest(partition="debug", time_limit_min=5, gres="gpu:8")
def show(st):
    print("queue", st.job_id, st.state, st.reason, flush=True)
try:
    with slurm_cli.held(cli, req, namespace=ns, on_state=show, poll_s=0.2) as alloc:
        task = "import time; print('up', flush=True); time.sleep(300)"
        step = slurm_cli.step(cli, alloc.job_id, "localhost", [sys.executable, "-c", task])
        assert step.stdout.readline() == b"up\\n"
        print("holding", alloc.job_id, step.pid, flush=True)
        time.sleep(300)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _orch_like(cluster: SlurmCluster, ns: str) -> subprocess.Popen[bytes]:
    """An orch-like process holding an allocation (with a step once granted) until Ctrl-C; says where it is."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cluster.conf), ns],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_ctrl_c_while_queued_cancels_the_request(cluster: SlurmCluster, cli: Slurm) -> None:
    cluster.run("salloc", "--no-shell", "-J", "holder", "--time=5", "--exclusive", "-N1")
    child = _orch_like(cluster, NAMESPACE)
    assert child.stdout is not None
    out = Lines(child.stdout)
    job_id = out.until("queue ").split()[1]
    assert out.seen[-1].split()[2:] == ["PENDING", "Resources"]
    child.send_signal(signal.SIGINT)
    out.until("interrupted")
    assert child.wait(20) == 130
    assert slurm_cli.job_state(cli, job_id).state == "CANCELLED"
    assert cluster.run("squeue", "-h", "-o", "%j").stdout.split() == ["holder"]  # the other job is untouched
    cluster.wait_no_processes()  # salloc too (the holder's job has no process: --no-shell)
    cluster.cancel_all()


def test_ctrl_c_while_running_releases_the_allocation_and_its_steps(cluster: SlurmCluster, cli: Slurm) -> None:
    child = _orch_like(cluster, NAMESPACE)
    assert child.stdout is not None
    out = Lines(child.stdout)
    _, job_id, step_pid = out.until("holding").split()
    assert int(step_pid) in {p.pid for p in cluster.processes()}
    child.send_signal(signal.SIGINT)
    out.until("interrupted")
    assert child.wait(30) == 130
    assert slurm_cli.job_state(cli, job_id).state == "CANCELLED"
    _no_trace(cluster, job_id)


def test_an_allocation_past_its_time_limit_is_reported_as_timeout(cluster: SlurmCluster, cli: Slurm) -> None:
    req = AllocationRequest(partition=PARTITION, time_limit_min=1, gres="gpu:8")
    with slurm_cli.held(cli, req, namespace=NAMESPACE, poll_s=0.2) as alloc:
        proc = slurm_cli.step(cli, alloc.job_id, NODE, [sys.executable, "-c", "import time; time.sleep(300)"])
        # Slurm's own time-limit enforcement without waiting a minute: move the job's end time close. slurmctld
        # acts at its next 30-second time-limit check, so this takes 0-31 s.
        cluster.run("scontrol", "update", f"JobId={alloc.job_id}", "EndTime=now+1")
        t0 = time.monotonic()
        state = slurm_cli.job_state(cli, alloc.job_id)
        while state.live and time.monotonic() - t0 < 60:
            time.sleep(0.5)
            state = slurm_cli.job_state(cli, alloc.job_id)
        assert state.state == "TIMEOUT", state
        assert state.describe() == f"allocation {alloc.job_id} was ended by Slurm at its time limit (TIMEOUT)"
        _, err = proc.communicate(timeout=20)
        assert b"DUE TO TIME LIMIT" in err and proc.returncode != 0
    assert slurm_cli.job_state(cli, alloc.job_id).state == "TIMEOUT"  # release after the end keeps Slurm's verdict
    _no_trace(cluster, alloc.job_id)


def _dead_session() -> str:
    proc = subprocess.Popen(["sleep", "30"])
    created = psutil.Process(proc.pid).create_time()
    proc.kill()
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:{created:.3f}"


def test_leftovers_are_only_this_namespaces_dead_sessions(cluster: SlurmCluster, cli: Slurm) -> None:
    dead = _dead_session()
    names = {
        "dead": slurm_cli.job_name(NAMESPACE, dead),
        "dead-labelled": slurm_cli.job_name(NAMESPACE, dead, label="nightly-3"),
        "alive": slurm_cli.job_name(NAMESPACE),  # this very process: a live session
        "other-namespace": slurm_cli.job_name(NAMESPACE + "-x", dead),
        "other-host": slurm_cli.job_name(NAMESPACE, "elsewhere" + dead[dead.index(":") :]),
        "foreign": "orch-but-not-ours",
    }
    ids = {}
    for key, name in names.items():
        if key in ("dead", "alive"):  # running allocations, one core each (the node has two)
            cluster.run("salloc", "--no-shell", "-J", name, "--time=5", "-N1", "-n1", "--gres=gpu:1")
        else:  # the rest pend, held (a pending leftover counts too)
            cluster.run("sbatch", "--hold", "-J", name, "--time=5", "-N1", "-n1", "--wrap", "true")
        ids[key] = cluster.run("squeue", "-h", "-n", name, "-o", "%i").stdout.strip()
    assert cluster.run("squeue", "-h", "-j", ids["dead"], "-o", "%T").stdout.strip() == "RUNNING"
    found = slurm_cli.find_leftovers(cli, NAMESPACE)
    assert sorted(left.job_id for left in found) == sorted([ids["dead"], ids["dead-labelled"]])
    assert slurm_cli.release_leftovers(cli, NAMESPACE) == found
    assert sorted(cluster.live_jobs()) == sorted(ids[k] for k in ("alive", "other-namespace", "other-host", "foreign"))
    assert slurm_cli.find_leftovers(cli, NAMESPACE) == []
    cluster.cancel_all()
