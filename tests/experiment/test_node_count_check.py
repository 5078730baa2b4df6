"""A multi-node profile on too few hosts is refused before the run's header lines (ab, bench, reproduce)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest

from orchestrator.cli import main
from orchestrator.errors import HostError
from tests.cli.test_hosts_list import write_inventory
from tests.conftest import WriteProfile, free_port


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    return write_inventory(tmp_path)


@pytest.fixture
def two_node(write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile("nu-2node", engine="sglang", model_path="/m", tp_size=2, nnodes=2, port=free_port())
    write_profile("one", engine="sglang", model_path="/m", tp_size=1, port=free_port())
    monkeypatch.chdir(tmp_path)


def _never_connect(*args: Any, **kwargs: Any) -> NoReturn:
    raise HostError("opened the host")


@pytest.mark.usefixtures("two_node")
@pytest.mark.parametrize(
    ("host", "what"),
    [("node-a", "but node-a is one host"), ("local", "but local is one host"), ("solo", "but solo is one host"),
     ("me@10.1.1.1", "but me@10.1.1.1 is one host")],
)  # fmt: skip
def test_too_few_nodes_is_refused_before_the_plan(
    host: str, what: str, inventory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orchestrator.experiment.run.resolve_host", _never_connect)
    assert main(["bench", "nu-2node", "--sim", "--host", host, "--inventory", str(inventory)]) == 2
    captured = capsys.readouterr()
    need = "profile 'nu-2node' has nnodes: 2, so --host must name an inventory group of at least 2 hosts"
    assert need in captured.err
    assert what in captured.err and "opened the host" not in captured.err
    assert "plan:" not in captured.out and "results database:" not in captured.out and "SIMULATED" not in captured.out
    assert main(["ab", "one", "nu-2node", "--sim", "--host", host, "--inventory", str(inventory), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "error" and what in doc["error"]


@pytest.mark.usefixtures("two_node")
@pytest.mark.parametrize("host", ["pair", "h100", "slurm:gpu"])
def test_enough_nodes_or_slurm_pass_the_early_check(
    host: str, inventory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orchestrator.experiment.run.resolve_host", _never_connect)
    assert main(["bench", "nu-2node", "--sim", "--host", host, "--inventory", str(inventory)]) == 1
    captured = capsys.readouterr()
    assert "opened the host" in captured.err and "plan:" in captured.out


@pytest.mark.usefixtures("two_node")
def test_a_bad_inventory_is_left_to_opening_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a: {adress: x}\n")
    monkeypatch.setattr("orchestrator.experiment.run.resolve_host", _never_connect)
    assert main(["bench", "nu-2node", "--sim", "--host", "a", "--inventory", str(bad)]) == 1
    assert "opened the host" in capsys.readouterr().err


@pytest.mark.usefixtures("two_node")
def test_a_multi_node_bundle_on_one_host_is_refused_before_reproducing(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.results import bundleformat

    db = str(tmp_path / "r.db")
    fast = ["--runs", "1", "--warmup", "0", "--max-tokens", "8", "--min-run-s", "0", "--grace", "2", "--gpu-wait", "0"]
    (tmp_path / "none.yaml").write_text("hosts: {}\n")  # this machine as it is (the fixture's `local` is not)
    assert main(["bench", "one", "--sim", *fast, "--db", db, "--inventory", str(tmp_path / "none.yaml")]) == 0
    bundle = tmp_path / "one.orch.json"
    assert main(["export", "last", "--db", db, "--format", "bundle", "-o", str(bundle)]) == 0
    data = json.loads(bundle.read_text())
    data["content"]["profiles"][0].update(nnodes=2, tp_size=2)  # as if it had been measured on a group
    data["digest"] = bundleformat.digest_of(data)
    bundle.write_text(json.dumps(data))
    capsys.readouterr()
    monkeypatch.setattr("orchestrator.experiment.run.resolve_host", _never_connect)
    args = ["reproduce", str(bundle), "--host", "node-a", "--inventory", str(inventory), "--db", db]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "has nnodes: 2, so --host must name an inventory group of at least 2 hosts" in captured.err, captured.err
    assert "(the bundle was measured on 'local')" in captured.err
    assert "reproducing" not in captured.out and "opened the host" not in captured.err
