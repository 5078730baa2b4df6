"""`orch hosts list` shows each inventory entry as what it is: this machine, an SSH host, a Slurm entry or a group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main

INVENTORY = {
    "hosts": {
        "local": {"python": "/usr/bin/python3", "workdir": "/tmp/orch-w"},
        "node-a": {"address": "10.0.0.11", "port": 2222, "user": "me", "identity_file": ["KEY"]},
        "node-b": {"address": "10.0.0.12"},
        "pair": {"nodes": ["node-a", "node-b"], "port_stride": 1},
        "solo": {"nodes": ["node-a"]},
        "h100": {"scheduler": "slurm", "partition": "gpu", "gres": "gpu:8", "time_limit_min": 120,
                 "python": "/opt/py"},
        "dbg": {"scheduler": "slurm", "gpus": 4, "exclusive": False, "account": "proj-42"},
    }
}  # fmt: skip


def write_inventory(tmp_path: Path) -> Path:
    """INVENTORY as hosts.yaml under tmp_path, its identity file a real path there."""
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(INVENTORY).replace("KEY", str(key)))
    return path


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    return write_inventory(tmp_path)


def test_hosts_list_shows_each_entry_as_what_it_is(inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hosts", "list", "--inventory", str(inventory)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["h100"].startswith("h100  Slurm: partition gpu, exclusive, GRES gpu:8, 120 min  python=/opt/py")
    # No partition: the cluster's default; GRES from `gpus`, as orch asks Slurm for it.
    assert "Slurm: the default partition, account proj-42, shared, GRES gpu:4, 60 min" in lines["dbg"]
    assert "gpus=4" in lines["dbg"]
    assert lines["pair"].startswith("pair  group: node-a, node-b (port_stride 1)  [")
    assert lines["solo"].startswith("solo  group: node-a  [")
    assert lines["node-a"].startswith("node-a  me@10.0.0.11:2222  python=default")
    assert lines["local"].startswith("local  this machine  python=/usr/bin/python3  workdir=/tmp/orch-w")
    assert "None" not in out and "ssh_config Host" not in out and "id_test" not in out
    assert list(lines) == ["dbg", "h100", "local", "node-a", "node-b", "pair", "solo"]  # hosts, then groups


def test_hosts_list_json_gives_every_entry_its_kind(inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hosts", "list", "--inventory", str(inventory), "--json"]) == 0
    text = capsys.readouterr().out
    doc = json.loads(text)
    assert doc["status"] == "ok" and doc["inventory"] == str(inventory)
    entries = {e["name"]: e for e in doc["hosts"]}
    assert {n: e["kind"] for n, e in entries.items()} == {
        "dbg": "slurm", "h100": "slurm", "local": "local", "node-a": "ssh", "node-b": "ssh", "pair": "group",
        "solo": "group",
    }  # fmt: skip
    assert entries["h100"] | {"source": ""} == {
        "name": "h100", "kind": "slurm", "partition": "gpu", "account": None, "gres": "gpu:8",
        "time_limit_min": 120, "exclusive": True, "port_stride": 0, "init_address": None, "python": "/opt/py",
        "gpus": None, "workdir": None, "source": "",
    }  # fmt: skip
    assert entries["dbg"]["gres"] == "gpu:4" and entries["dbg"]["partition"] is None
    assert entries["pair"]["nodes"] == ["node-a", "node-b"] and entries["pair"]["port_stride"] == 1
    assert entries["node-a"]["endpoint"] == "me@10.0.0.11:2222" and entries["node-a"]["port"] == 2222
    assert "id_test" not in text and "identity_file" not in text


def test_hosts_list_json_without_an_inventory_and_with_a_bad_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["hosts", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hosts"] == [] and doc["inventory"] is None and str(tmp_path / "hosts.yaml") in doc["searched"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a: {}\n  g: {nodes: [a, b]}\n")
    assert main(["hosts", "list", "--inventory", str(bad), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "error" and "'b' is not a host of this inventory" in doc["error"]
