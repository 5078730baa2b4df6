"""Issue 15 follow-ups in the CLI: `hosts list` shows Slurm entries and groups, help texts name Slurm and groups,
Ctrl-C says what the interrupted command leaves behind (one JSON document under --json), and a multi-node profile
on too few hosts is refused before the run's header lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import cli, main
from orchestrator.errors import HostError
from tests.conftest import REPO, WriteProfile, free_port

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


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(INVENTORY).replace("KEY", str(key)))
    return path


# ---------------------------------------------------------------- orch hosts list


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


# ---------------------------------------------------------------- --help


def _help(*words: str) -> str:
    out = CliRunner().invoke(cli, [*words, "--help"], terminal_width=200).output
    return " ".join(out.split())


@pytest.mark.parametrize("command", ["ab", "bench", "reproduce"])
def test_run_help_names_slurm_groups_and_the_remote_workdir(command: str) -> None:
    out = _help(command)
    assert "slurm:PARTITION" in out and "a group of hosts for multi-node profiles" in out
    assert "or a Slurm host with a profile of nnodes > 1" in out  # --allow-node-mismatch
    assert "~/.orch on SSH and Slurm hosts" in out and "the user state dir on this machine" in out


def test_fail_on_help_is_true_for_each_command() -> None:
    ab, bench = _help("ab"), _help("bench")
    assert "allowed with --resume" in ab and "--resume" not in bench
    assert "expect.tok_s" in bench and "an arm slower than the first" in ab and "expect.tok_s" not in ab


@pytest.mark.parametrize("command", ["ab", "bench", "reproduce"])
def test_run_help_lists_options_only(command: str) -> None:
    out = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    other = out[out.index("Other options:") :]
    assert "PROFILE" not in other and "BUNDLE" not in other  # arguments stay in the usage line (click 8.5.1)
    host = out[out.index("Host:") : out.index("Output:")]
    assert "--allow-node-mismatch" in host


@pytest.mark.parametrize("command", ["status", "down"])
def test_status_and_down_help_say_what_host_takes(command: str) -> None:
    assert "slurm:PARTITION" in _help(command)


# ---------------------------------------------------------------- Ctrl-C


def _interrupt(*args: Any, **kwargs: Any) -> NoReturn:
    raise KeyboardInterrupt


def test_interrupting_a_look_only_command_claims_no_teardown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orchestrator.cli.hosts.resolve_host", _interrupt)
    assert main(["status", "--host", "slurm:debug", "--json"]) == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"status": "interrupted", "error": "Interrupted.", "exit_code": 130}
    assert captured.err.strip() == "Interrupted."
    assert main(["hosts", "check", "slurm:debug"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == "Interrupted."
    assert main(["down", "--host", "slurm:debug"]) == 130
    assert "may have stopped only some of orch's servers" in capsys.readouterr().err


def test_interrupting_a_run_still_says_torn_down_and_answers_in_json(
    write_profile: WriteProfile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_profile("p", engine="sglang", model_path="/m", tp_size=1, port=free_port())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("orchestrator.experiment.resolve_host", _interrupt)
    assert main(["bench", "p", "--sim", "--json", "--db", str(tmp_path / "r.db")]) == 130
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["status"] == "interrupted" and doc["exit_code"] == 130 and "torn down" in doc["error"]
    assert "Interrupted: servers started by this run were torn down; results so far are stored." in captured.err


def test_ctrl_c_while_connecting_answers_in_json(tmp_path: Path) -> None:
    """A real SIGINT while `orch hosts check` waits for an SSH banner that never comes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(30)
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "hosts", "check", f"me@127.0.0.1:{port}", "--json"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            conn, _ = listener.accept()  # orch is now waiting for the banner
            with conn:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 130, err
    assert json.loads(out)["status"] == "interrupted"
    assert "Interrupted." in err and "torn down" not in err and "Traceback" not in err


# ---------------------------------------------------------------- nnodes against --host, before anything starts


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
    monkeypatch.setattr("orchestrator.experiment.resolve_host", _never_connect)
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
    monkeypatch.setattr("orchestrator.experiment.resolve_host", _never_connect)
    assert main(["bench", "nu-2node", "--sim", "--host", host, "--inventory", str(inventory)]) == 1
    captured = capsys.readouterr()
    assert "opened the host" in captured.err and "plan:" in captured.out


@pytest.mark.usefixtures("two_node")
def test_a_bad_inventory_is_left_to_opening_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a: {adress: x}\n")
    monkeypatch.setattr("orchestrator.experiment.resolve_host", _never_connect)
    assert main(["bench", "nu-2node", "--sim", "--host", "a", "--inventory", str(bad)]) == 1
    assert "opened the host" in capsys.readouterr().err


@pytest.mark.usefixtures("two_node")
def test_a_multi_node_bundle_on_one_host_is_refused_before_reproducing(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator import bundleformat

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
    monkeypatch.setattr("orchestrator.experiment.resolve_host", _never_connect)
    args = ["reproduce", str(bundle), "--host", "node-a", "--inventory", str(inventory), "--db", db]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "has nnodes: 2, so --host must name an inventory group of at least 2 hosts" in captured.err, captured.err
    assert "(the bundle was measured on 'local')" in captured.err
    assert "reproducing" not in captured.out and "opened the host" not in captured.err
