"""Multi-node profiles through Slurm: one allocation of nnodes nodes, a rank on each (its own agent step), against a
real two-node cluster (two slurmd on this machine, tests/slurmcluster.py)."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.agent import ops
from orchestrator.hosts.slurm_cli import Slurm
from orchestrator.report.html import ab_html
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from tests import slurmcluster
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_ports
from tests.hosts.test_slurmhost import end_at_time_limit, job_of, needs_cluster, orch_on, read_until, runs_kept
from tests.slurmcluster import PARTITION, SlurmCluster

HOST = "pair"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurmcluster.for_module(nodes=2, gpus=2)


@pytest.fixture
def cli(cluster: SlurmCluster) -> Iterator[Slurm]:
    """Afterwards no job may be live and no step, task or server process alive."""
    yield Slurm(conf=str(cluster.conf), timeout_s=20)
    slurmcluster.left_clean(cluster)
    assert ops.op_find(NAMESPACE) == [], "the test left servers running"


@pytest.fixture
def two_node(write_profile: WriteProfile, tmp_path: Path) -> Path:
    """An inventory entry `pair` (scheduler: slurm; rank 1 serves on the next port: both nodes are this machine)
    and two nnodes: 2 profiles."""
    inventory = {
        "hosts": {
            HOST: {
                "scheduler": "slurm",
                "partition": PARTITION,
                "gpus": 2,
                "python": sys.executable,
                "port_stride": 1,
                "time_limit_min": 10,
            }
        }
    }
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(inventory))
    common = {
        "engine": "sglang",
        "model_path": "/models/test-model",
        "tp_size": 4,
        "nnodes": 2,
        "ready_timeout_s": 30,
        "env": {"NCCL_PROTO": "LL"},
        "sim": FAST_SIM,
    }
    write_profile("base2", **common, port=free_ports(2))  # rank 1 on the next port (port_stride 1)
    write_profile(
        "eagle2",
        **common,
        port=free_ports(2),
        speculative={"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1},
    )
    return tmp_path / "hosts.yaml"


def _ab(*extra: str, runs: int = 2, max_tokens: int = 24) -> list[str]:
    return [
        "ab", "base2", "eagle2", "--sim", "--host", HOST, "--blocks", "1", "--runs", str(runs), "--warmup", "0",
        "--max-tokens", str(max_tokens), "--grace", "2", "--min-run-s", "0", "--db", "r.db", "--workdir", "w", *extra,
    ]  # fmt: skip


@pytest.mark.slurm
@needs_cluster
def test_a_two_node_ab_runs_in_one_two_node_allocation(
    cluster: SlurmCluster, cli: Slurm, two_node: Path, tmp_path: Path
) -> None:
    proc = orch_on(cluster, tmp_path, *_ab())
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert f"{HOST}: Slurm granted allocation" in out
    job = job_of(out.split("Slurm granted ", 1)[1])
    # rank i on the allocation's i-th node, each through its own agent step; rank 0 reached at its NodeAddr
    for profile in ("base2", "eagle2"):
        assert f"{profile}: node rank 0 ({HOST}/n1) launched" in out, out
        assert f"{profile}: node rank 1 ({HOST}/n2) launched" in out, out
    assert "2 nodes rendezvous at 127.0.0.1:" in out
    assert "ready after" in out and "(every node)" in out
    with sqlite3.connect(tmp_path / "r.db") as db:
        config = json.loads(db.execute("SELECT config_json FROM experiments").fetchone()[0])
        nodes = [json.loads(row[0])["nodes"] for row in db.execute("SELECT preflight_json FROM launches")]
        counts = db.execute("SELECT COUNT(*) FROM runs WHERE warmup = 0").fetchone()[0]
    assert sorted(config["host_facts"]["nodes"]) == [f"{HOST}/n1", f"{HOST}/n2"]
    assert [[(n["rank"], n["host"]) for n in launch] for launch in nodes] == [
        [(0, f"{HOST}/n1"), (1, f"{HOST}/n2")]
    ] * 2
    assert counts == 4
    assert job not in cluster.live_jobs()  # released at the end
    # the reports say it ran on two nodes, and the HTML one shows each node's facts in its own column
    result = load_result(Store(tmp_path / "r.db"), "last")
    label = f"{HOST} (nodes {HOST}/n1, {HOST}/n2)"
    assert f"host {label})" in ab_text(result) and f"on {label}" in ab_markdown(result)
    page = ab_html(result)
    assert 'id="table-nodes"' in page and f"<th>{HOST}/n2</th>" in page, page
    assert "{&#x27;" not in page and "{'" not in page  # no Python dict printed raw


@pytest.mark.slurm
@needs_cluster
def test_ctrl_c_mid_run_leaves_no_job_and_no_rank(
    cluster: SlurmCluster, cli: Slurm, two_node: Path, tmp_path: Path
) -> None:
    proc = orch_on(cluster, tmp_path, *_ab(runs=50, max_tokens=100))
    seen: list[str] = []
    read_until(proc, "Run 1/", seen)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + out
    assert cluster.live_jobs() == []
    cluster.wait_no_processes()
    assert ops.op_find(NAMESPACE) == []


@pytest.mark.slurm
@needs_cluster
def test_a_nightly_item_with_a_two_node_profile_gets_a_two_node_allocation(
    cluster: SlurmCluster, cli: Slurm, two_node: Path, tmp_path: Path
) -> None:
    suite = {
        "suite": "pair-night", "deadline": "5m", "wait": "5s", "min_history": 3,
        "defaults": {"host": HOST, "sim": True, "timeout": "120s", "gpu_wait": 0, "grace": 2,
                     "workload": {"runs": 1, "warmup": 0, "max_tokens": 24, "min_run_s": 0}},
        "items": [{"name": "two-node", "bench": "base2"}],
    }  # fmt: skip
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    check = orch_on(cluster, tmp_path, "nightly", "suite.yaml", "--check")
    out, _ = check.communicate(timeout=60)
    assert check.returncode == 0, out
    proc = orch_on(cluster, tmp_path, "nightly", "suite.yaml", "--db", "n.db", "--now", "2026-11-01T02:00")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert f"node rank 1 ({HOST}/n2) launched" in out, out
    with sqlite3.connect(tmp_path / "n.db") as db:
        assert db.execute("SELECT item, status FROM night_items").fetchall() == [("two-node", "complete")]
    assert cluster.live_jobs() == []


@pytest.mark.slurm
@needs_cluster
def test_a_two_node_allocation_ended_at_its_time_limit_is_said_once_with_the_runs_kept(
    cluster: SlurmCluster, cli: Slurm, two_node: Path, tmp_path: Path
) -> None:
    proc = orch_on(cluster, tmp_path, *_ab(runs=500, max_tokens=200))
    job, text = end_at_time_limit(cluster, proc)
    assert proc.returncode == 1, text
    reason = f"allocation {job} was ended by Slurm at its time limit (TIMEOUT): orch asked for 10 min"
    ended = f"teardown: nothing left to stop — Slurm ended allocation {job} (TIMEOUT) and every process in it"
    # every node says its teardown had nothing left; the reason itself comes once, as the error
    assert f"node rank 0 ({HOST}/n1): {ended}" in text and f"node rank 1 ({HOST}/n2): {ended}" in text, text
    assert "TEARDOWN FAILED" not in text and "Traceback" not in text
    assert text.count(reason) == 1, text
    # said before Slurm was asked: the plan (about 48 min here) outlasts the limit
    warning = "WARNING: the plan takes about "
    assert (
        warning in text and "longer than the 10 min time limit orch asks Slurm for (time_limit_min of pair in" in text
    )
    assert text.index(warning) < text.index("granted allocation")
    runs_kept(tmp_path / "r.db")
    assert cluster.live_jobs() == []
    cluster.wait_no_processes()
    assert ops.op_find(NAMESPACE) == []


@pytest.mark.slurm
@needs_cluster
def test_slurm_nodes_on_one_machine_without_a_port_stride_are_refused_before_launching(
    cluster: SlurmCluster, cli: Slurm, two_node: Path, tmp_path: Path
) -> None:
    args = _ab()
    args[args.index(HOST)] = f"slurm:{PARTITION}"  # no inventory entry, so no port_stride
    proc = orch_on(cluster, tmp_path, *args)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert f"slurm:{PARTITION}/n1 and slurm:{PARTITION}/n2 of slurm:{PARTITION} are one machine" in out, out
    assert "--host slurm:PARTITION has no inventory entry: write one with `scheduler: slurm`" in out
    assert "launched" not in out and "Traceback" not in out
    assert cluster.live_jobs() == []  # the allocation is released
