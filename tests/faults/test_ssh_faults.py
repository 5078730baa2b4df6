"""SSH failures as a user meets them through the CLI: each says what happened and what to do, exits 1, no traceback."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.agent import ops
from tests.conftest import NAMESPACE, free_port, run_orch
from tests.sshd import SSHD, _keygen, sshd_fixture

SimProfiles = Callable[..., dict[str, Path]]

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(
        not Path("/usr/sbin/sshd").exists() and not os.environ.get("CI"),
        reason="openssh-server is not installed (apt-get install openssh-server)",
    ),
]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    yield from sshd_fixture(tmp_path_factory)


def _use_ssh_config(sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **replace: Path) -> None:
    """Point orch at this server's ssh_config (alias `testbox`) with some of its files swapped; an inventory entry."""
    text = sshd.ssh_config.read_text()
    for attr, new in replace.items():
        text = text.replace(str(getattr(sshd, attr)), str(new))
    cfg = tmp_path / "ssh_config"
    cfg.write_text(text)
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(cfg))
    inventory = tmp_path / "hosts.yaml"
    box = {"python": sys.executable, "workdir": str(tmp_path / "remote"), "connect_timeout_s": 5}
    inventory.write_text(yaml.safe_dump({"hosts": {"testbox": box}}))
    monkeypatch.setenv("ORCH_HOSTS", str(inventory))


def _bench_fails(host: str, cwd: Path, *extra: str) -> str:
    """`orch bench baseline --sim --host HOST` must fail cleanly before launching anything; returns its output."""
    proc = run_orch(
        "bench", "baseline", "--sim", "--host", host, "--runs", "1", "--warmup", "0", *extra, cwd=cwd, merge_stderr=True
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if "Error" in line]
    assert len(errors) == 1 and errors[0] == out.strip().splitlines()[-1], f"one clear error line, last:\n{out}"
    assert errors[0].startswith("Error: "), out
    assert ops.op_find(NAMESPACE) == []
    return out


def test_host_unreachable(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    port = free_port()  # bound and released: nothing listens there
    out = _bench_fails(f"root@127.0.0.1:{port}", tmp_path)
    assert f"cannot connect to root@127.0.0.1:{port}" in out and "connection refused" in out
    assert f"sshd listens on port {port}" in out  # what to check


def test_auth_failure_with_wrong_key(
    sshd: SSHD, sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    wrong = tmp_path / "wrong_ed25519"
    _keygen(wrong)
    _use_ssh_config(sshd, tmp_path, monkeypatch, client_key=wrong)
    out = _bench_fails("testbox", tmp_path)
    assert re.search(rf"root@127\.0\.0\.1:{sshd.port}: authentication failed", out)
    assert str(wrong) in out and "authorized_keys" in out and "identity_file" in out


def test_unknown_host_key_is_refused(
    sshd: SSHD, sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    _use_ssh_config(sshd, tmp_path, monkeypatch, known_hosts=empty)
    out = _bench_fails("testbox", tmp_path)
    assert re.search(rf"unknown host key for \[127\.0\.0\.1\]:{sshd.port}: ssh-ed25519 SHA256:\S+", out)
    assert "--accept-new-host-key" in out
    assert empty.read_text() == ""  # nothing trusted silently


def test_changed_host_key_is_always_refused(
    tmp_path_factory: pytest.TempPathFactory, sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    # Its own server: rotating the host key restarts it.
    for server in sshd_fixture(tmp_path_factory):
        _use_ssh_config(server, tmp_path, monkeypatch)
        server.rotate_host_key()
        for extra in ((), ("--accept-new-host-key",)):
            out = _bench_fails("testbox", tmp_path, *extra)
            assert re.search(r"HOST KEY CHANGED for \[127\.0\.0\.1\]:\d+: known_hosts has SHA256:\S+", out), out
            assert "ssh-keygen -R" in out and "refuses to connect" in out
