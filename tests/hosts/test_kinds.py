"""Host kinds declare what they do (hosts/base.KINDS): nothing outside hosts/ asks which kind a host is, and a new
kind that allocates nodes is one row there for the checks made before anything is launched."""

from __future__ import annotations

import ast

import pytest

from orchestrator.config.profile import load
from orchestrator.errors import InputError
from orchestrator.experiment import host as experiment_host
from orchestrator.hosts import base
from orchestrator.hosts.base import Capabilities, HostConfig
from orchestrator.launch import ports
from tests.conftest import REPO, WriteProfile

# The kinds' own package, and the simulator (which plays a Slurm step's environment, not a host of orch's).
OWNERS = ("orchestrator/hosts/", "orchestrator/sim/")


def kind_tests(source: str) -> list[str]:
    """Where code compares something with a host kind's name or reads HostConfig.scheduler, as `line: text`."""
    names = {k for k in base.KINDS if k not in ("local", "ssh")}
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and str(o.value).lower() in names for o in operands):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and node.attr == "scheduler" and isinstance(node.ctx, ast.Load):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_hosts_asks_which_kind_a_host_is() -> None:
    offenders = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(OWNERS):
            continue
        offenders += [f"{rel}:{hit}" for hit in kind_tests(path.read_text())]
    assert not offenders, f"ask HostConfig.capabilities (hosts/base.Capabilities) instead: {offenders}"


def test_the_check_finds_each_way_of_asking() -> None:
    source = 'a = c.scheduler == "slurm"\nb = "SLURM" != kind\nd = x.scheduler\nok = c.capabilities.allocates_nodes\n'
    assert sorted(hit.split(":")[0] for hit in kind_tests(source)) == ["1", "1", "2", "3"]


@pytest.fixture
def k8s(monkeypatch: pytest.MonkeyPatch) -> HostConfig:
    """A kind that exists only in this test: one row of KINDS."""
    monkeypatch.setitem(base.KINDS, "k8s", Capabilities(kind="k8s", allocates_nodes=True, allocator="Kubernetes"))
    return HostConfig(name="k8s:bench", scheduler="k8s", partition="bench", port_stride=1)


def test_a_new_kind_that_allocates_nodes_is_one_row(k8s: HostConfig, write_profile: WriteProfile) -> None:
    two = load(str(write_profile("two", engine="sglang", model_path="/models/m", tp_size=1, nnodes=2, port=30000)))
    assert (k8s.kind, k8s.is_local, k8s.allocation_pool) == ("k8s", False, ("k8s", "bench"))
    # It asks for as many nodes as a profile needs, where one SSH host is refused a two-node profile.
    experiment_host.check_nodes_for([two], 1, k8s.name, allocates=k8s.capabilities.allocates_nodes)
    ssh = HostConfig(name="box", address="10.0.0.1")
    with pytest.raises(InputError, match="nnodes: 2"):
        experiment_host.check_nodes_for([two], 1, ssh.name, allocates=ssh.capabilities.allocates_nodes)
    # Its node ranks may share a machine, so port_stride counts: rank 1 would need a port above 65535.
    with pytest.raises(InputError, match="rank 1 would need port 65536"):
        ports.check(65535, [two], k8s)
    ports.check(65535, [two], HostConfig(name="box", address="10.0.0.1", port_stride=1))  # one machine: no ranks
    # A resume may move between entries of one pool, never to another pool or kind.
    slurm = HostConfig(name="slurm:bench", scheduler="slurm", partition="bench")
    assert slurm.allocation_pool == ("slurm", "bench") != k8s.allocation_pool


def test_every_kind_has_its_row() -> None:
    configs = [
        HostConfig(name="local"),
        HostConfig(name="box", address="10.0.0.1"),
        HostConfig(name="s", scheduler="slurm"),
    ]
    assert [c.capabilities.kind for c in configs] == ["local", "ssh", "slurm"]
    assert [c.capabilities.allocates_nodes for c in configs] == [False, False, True]
