"""Two orch sessions on one host: neither can harm the other's run, whatever HOME or --workdir each uses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from orchestrator.agent import ops
from orchestrator.config.profile import load
from orchestrator.errors import HostError
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
