"""Two orch sessions on one host: neither can harm the other's run, whatever HOME or --workdir each uses."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from orchestrator.agent import ops
from orchestrator.config.profile import load
from orchestrator.errors import HostError, OrchError
from orchestrator.experiment import resume
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import single
from tests.conftest import NAMESPACE, REPO, wait_for_line
from tests.faults.support import FAST, assert_nothing_left, assert_plain, orch_env, run, start, stored

SimProfiles = Callable[..., dict[str, Path]]


def test_a_second_session_and_orch_down_never_touch_a_live_run(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    paths = sim_profiles()
    port = yaml.safe_load(paths["base"].read_text())["port"]
    db = tmp_path / "first.db"
    first = start(
        "bench", "baseline", "--sim", "--runs", "40", "--max-tokens", "120", *FAST, "--db", str(db), cwd=tmp_path
    )
    seen: list[str] = []
    try:
        wait_for_line(first, "Run 1/40", seen)
        # Another user-like session: its own HOME (so its own state dir, results and default workdir) and --workdir.
        other = orch_env(home=tmp_path / "other-home")
        second = run(
            "bench", "eagle3", "--sim", "--runs", "1", "--max-tokens", "8", *FAST,
            "--workdir", str(tmp_path / "other-workdir"), cwd=tmp_path, env=other,
        )  # fmt: skip
        assert second.rc == 1, second.text
        assert "busy: another orch session holds it" in second.err and "--wait" in second.err
        assert "cleaning up" not in second.text
        assert_plain(second.text)
        down = run("down", "--grace", "2", cwd=tmp_path, env=other)
        assert down.rc == 1, down.text
        assert "in use by a live orch session" in down.err and "--force" in down.err
        # The first run carries on, unharmed.
        wait_for_line(first, "Run 3/40", seen)
        forced = run("down", "--force", "--grace", "2", cwd=tmp_path, env=other)
        assert forced.rc == 0 and "stopped " in forced.out, forced.text
        out, _ = first.communicate(timeout=60)
        seen.append(out)
        assert first.returncode == 1, "".join(seen)
        assert_plain("".join(seen))
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert_nothing_left(port)
    assert stored(db, "SELECT status FROM experiments") == [("failed",)]
    assert stored(db, "SELECT COUNT(*) FROM runs")[0][0] >= 3  # every run that finished is kept


OWNER_SCRIPT = """
import json, sys, time
from orchestrator.agent import ops
info = ops.op_launch([sys.executable, "-c", "import time; time.sleep(60)"], {ops.MARKER: sys.argv[1]}, sys.argv[2])
print(json.dumps(info), flush=True)
time.sleep(60)
"""


def test_preflight_and_down_refuse_a_launch_whose_owner_is_alive(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """Belt and braces behind the lock: a launch whose owning process lives is never torn down by another."""
    lid = f"{NAMESPACE}:20260101T000000-0wner000"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, lid, str(tmp_path / "o.log")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        pid = json.loads(owner.stdout.readline())["pid"]
        found = ops.op_find(NAMESPACE)
        assert [p["owner_state"] for p in found] == ["alive"]
        prof = load(str(sim_profiles()["baseline"]))
        try:
            single.preflight(LocalHost(), prof, NAMESPACE)
            raise AssertionError("preflight tore down or ignored a live session's launch")
        except HostError as e:
            assert "still running" in str(e) and lid in str(e)
        assert ops.op_alive(pid)["alive"]
        result = ops.op_down(NAMESPACE, grace_s=1)
        assert result["stopped"] == [] and [x["launch_id"] for x in result["live"]] == [lid]
        assert ops.op_alive(pid)["alive"]
        owner.kill()
        owner.wait(10)
        time.sleep(0.1)
        # Its owner is dead: now it is a leftover like any other, and the next preflight cleans it up.
        record = single.preflight(LocalHost(), prof, NAMESPACE)
        assert [c["launch_id"] for c in record["cleaned"]] == [lid]
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
    assert_nothing_left()


def test_a_running_experiment_is_not_resumed_by_a_second_session(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    """Another namespace (so another host lock) with the same store: `orch ab --resume` of a running experiment is
    refused, naming its owner, and runs nothing; the owner's experiment goes on unharmed (it ran the same launches
    concurrently, and the statistics counted both)."""
    sim_profiles()
    db = tmp_path / "shared.db"
    first = start(
        "ab", "baseline", "eagle3", "--sim", "--blocks", "2", "--runs", "40", "--max-tokens", "120", *FAST,
        "--db", str(db), cwd=tmp_path,
    )  # fmt: skip
    other_ns = f"{NAMESPACE}-b"
    other = orch_env(home=tmp_path / "other-home", ORCH_NAMESPACE=other_ns)
    seen: list[str] = []
    try:
        wait_for_line(first, "Run 1/40", seen)
        ((exp_id,),) = stored(db, "SELECT id FROM experiments")
        resumed = ("ab", "--resume", str(exp_id), "--db", str(db), "--grace", "2", "--gpu-wait", "0")
        second = run(*resumed, cwd=tmp_path, env=other, timeout=60)
        assert second.rc == 1, second.text
        assert f"experiment {exp_id} is running: orch PID {first.pid} on this machine" in second.err, second.text
        assert "launch" not in second.out.lower() and "cleaning up" not in second.text
        assert_plain(second.text)
        assert stored(db, "SELECT status, owner_json FROM experiments")[0][0] == "running"
        assert json.loads(str(stored(db, "SELECT owner_json FROM experiments")[0][0]))["pid"] == first.pid
        assert stored(db, "SELECT COUNT(*) FROM launches") == [(1,)]  # the owner's launch, and no other
        wait_for_line(first, "Run 3/40", seen)  # the owner carries on
        first.send_signal(signal.SIGINT)
        out, _ = first.communicate(timeout=60)
        seen.append(out)
        assert first.returncode == 130, "".join(seen)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        ops.op_down(other_ns, grace_s=2)  # had the second session launched anything
    assert ops.op_find(other_ns) == []
    assert_nothing_left()
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]
    assert stored(db, "SELECT COUNT(*) FROM launches") == [(1,)]


def test_a_running_experiment_of_another_machine_is_not_resumed_from_here() -> None:
    """Whether another machine's orch still runs cannot be told from here: refused, saying where to resume it."""
    exp = {"id": "e1", "status": "running", "owner_json": json.dumps({"pid": 7, "host": "gpu-box-9"})}
    with pytest.raises(OrchError, match=r"orch PID 7 on gpu-box-9 owns it.*resume it on gpu-box-9"):
        resume.check_not_running(exp)
    resume.check_not_running({**exp, "status": "interrupted"})
    resume.check_not_running({**exp, "owner_json": None})  # an older orch's: no owner recorded, resumable as before
    mine = json.dumps({"pid": 8, "host": socket.gethostname()})
    with pytest.raises(OrchError, match=r"orch PID 8 on this machine .* owns it"):
        resume.check_not_running({**exp, "owner_json": mine})
