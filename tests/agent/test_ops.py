"""The host-side agent on real processes: launch detached, find by marker, read environ, kill only our own."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.agent import lock as hostlock
from orchestrator.agent import ops, processes, teardown
from orchestrator.common import redaction
from orchestrator.config.profile import load
from orchestrator.errors import HostError
from orchestrator.hosts.local import LocalHost
from orchestrator.launch import single
from tests.conftest import NAMESPACE, StepClock, WriteProfile, free_port

SLEEPER = "import time\nwhile True: time.sleep(0.1)\n"
# Ignores SIGTERM, so only the SIGKILL escalation can end it.
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)\n"
# Starts a child that leaves the process group with setsid, like a leaked SGLang scheduler.
ESCAPER = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.1)'], start_new_session=True)\n"
    "while True: time.sleep(0.1)\n"
)


def _alive(pid: int) -> bool:
    return bool(ops.op_alive(pid)["alive"])


def _launch(tmp_path: Path, code: str, extra_env: dict[str, str] | None = None) -> tuple[str, dict[str, object]]:
    lid = single.new_launch_id(NAMESPACE)
    env = {ops.MARKER: lid, **(extra_env or {})}
    info = ops.op_launch([sys.executable, "-c", code], env, str(tmp_path / "logs" / "x.log"))
    return lid, info


@pytest.fixture
def foreign() -> Iterator[subprocess.Popen[bytes]]:
    """A process this test owns but orch did not launch (no marker): orch must never signal it."""
    yield from _foreign([])


@pytest.fixture
def foreign_with_secrets() -> Iterator[subprocess.Popen[bytes]]:
    """The same, with secrets on its command line (as a foreign SGLang server would have)."""
    yield from _foreign(["--api-key", "sk-SECRET-1", "--hf-token=hf_SECRET-2", "--max-total-tokens", "8"])


def _foreign(extra_argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    port = free_port()
    code = (
        f"import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port}))\ns.listen()\nprint('up', flush=True)\ntime.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ops.MARKER}
    argv = [sys.executable, "-c", code, *extra_argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
    proc.port = port  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_launch_is_detached_found_by_marker_and_torn_down(tmp_path: Path) -> None:
    lid, info = _launch(tmp_path, SLEEPER, {"NCCL_PROTO": "LL", "HF_TOKEN": "hunter2"})
    pid = int(info["pid"])  # type: ignore[call-overload]
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own session and group
    assert psutil.Process(pid).ppid() != os.getpid()  # not our child: survives us like a real detached server
    found = ops.op_find(NAMESPACE)
    assert [p["pid"] for p in found if p["launch_id"] == lid] == [pid]
    env = ops.op_environ(lid, ["NCCL_PROTO", "NCCL_ALGO", "HF_TOKEN"])
    assert env[0]["env"]["NCCL_PROTO"] == "LL" and env[0]["env"]["NCCL_ALGO"] is None
    assert "hunter2" not in str(env) and env[0]["env"]["HF_TOKEN"].startswith("<redacted hmac:")
    # Digested on the host with the caller's key: equal to the caller's own digest of the value, per key.
    key = os.urandom(32)
    (keyed,) = ops.op_environ(lid, ["HF_TOKEN"], digest_key=key.hex())
    assert keyed["env"]["HF_TOKEN"] == redaction.redact("HF_TOKEN", "hunter2", key) != env[0]["env"]["HF_TOKEN"]
    report = ops.op_teardown(lid, pgid=pid, grace_s=5)
    assert report["sigterm"] and not report["sigkill"] and not report["remaining"]
    assert not _alive(pid)


def test_sigterm_ignored_escalates_to_sigkill(tmp_path: Path) -> None:
    lid, info = _launch(tmp_path, STUBBORN)
    pid = int(info["pid"])  # type: ignore[call-overload]
    time.sleep(0.3)  # let it install the handler
    report = ops.op_teardown(lid, pgid=pid, grace_s=0.5)
    assert report["sigkill"] == [pid] and not report["remaining"]
    assert not _alive(pid)


def test_escaped_setsid_child_is_killed_by_marker(tmp_path: Path) -> None:
    lid, info = _launch(tmp_path, ESCAPER)
    pid = int(info["pid"])  # type: ignore[call-overload]
    deadline = time.monotonic() + 5
    while len(ops.op_find(NAMESPACE)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    procs = [p for p in ops.op_find(NAMESPACE) if p["launch_id"] == lid]
    escaped = [p["pid"] for p in procs if p["pgid"] != pid]
    assert len(escaped) == 1
    report = ops.op_teardown(lid, pgid=pid, grace_s=2)
    assert not report["remaining"]
    assert all(not _alive(p["pid"]) for p in procs)


def test_foreign_port_owner_is_named_and_never_killed(
    foreign: subprocess.Popen[bytes], write_profile: WriteProfile
) -> None:
    port = foreign.port  # type: ignore[attr-defined]
    owners = teardown.op_port_owner(port)
    assert owners[0]["pid"] == foreign.pid and owners[0]["launch_id"] is None
    prof = load(str(write_profile("p", engine="sglang", model_path="/m", tp_size=1, port=port)))
    with pytest.raises(HostError, match=rf"port {port} on local is in use by PID {foreign.pid} \(.*python"):
        single.preflight(LocalHost(), prof, NAMESPACE)
    assert foreign.poll() is None  # still alive


def test_teardown_never_signals_a_foreign_group_even_with_its_pgid(foreign: subprocess.Popen[bytes]) -> None:
    # A stale record whose PGID now belongs to someone else: nothing carries our marker, so nothing is signalled.
    report = ops.op_teardown(f"{NAMESPACE}:gone-long-ago", pgid=foreign.pid, grace_s=0.2, port_wait_s=0)
    assert not report["sigterm"] and not report["sigkill"]
    assert foreign.poll() is None


def test_down_only_touches_its_namespace(tmp_path: Path) -> None:
    other_lid = "someone-else:20260101T000000-abcdef12"
    info = ops.op_launch([sys.executable, "-c", SLEEPER], {ops.MARKER: other_lid}, str(tmp_path / "o.log"))
    other = int(info["pid"])
    try:
        mine_lid, mine = _launch(tmp_path, SLEEPER)
        stopped = ops.op_down(NAMESPACE, grace_s=2)["stopped"]
        assert [s["launch_id"] for s in stopped] == [mine_lid]
        assert not _alive(int(mine["pid"])) and _alive(other)  # type: ignore[call-overload]
    finally:
        os.killpg(other, signal.SIGKILL)


def test_dispatch_reports_errors_as_data() -> None:
    assert ops.dispatch({"op": "nope"}) == {"ok": False, "error": "unknown host-side operation 'nope'"}
    bad = ops.dispatch({"op": "alive", "args": {"pidd": 1}})
    assert not bad["ok"] and "bad arguments for alive" in bad["error"]
    assert ops.dispatch({"op": "launch", "args": {"argv": [], "env": {}, "log_path": "/tmp/x"}})["ok"] is False
    with pytest.raises(HostError, match="local: unknown host-side operation"):
        LocalHost().call("nope")


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "l.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert ops.op_log_tail(str(log), lines=3) == "line 97\nline 98\nline 99"
    assert "no log at" in ops.op_log_tail(str(tmp_path / "missing.log"))


def test_port_free_after_bind_close() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert teardown._listening(port)
    assert not teardown._listening(port)


def test_namespace_is_matched_exactly_not_as_a_prefix(tmp_path: Path) -> None:
    longer = NAMESPACE + "x:20260101T000000-abcdef12"  # namespace "<ns>x" must not count as "<ns>"
    info = ops.op_launch([sys.executable, "-c", SLEEPER], {ops.MARKER: longer}, str(tmp_path / "o.log"))
    try:
        assert all(p["launch_id"] != longer for p in ops.op_find(NAMESPACE))
        assert ops.op_down(NAMESPACE, grace_s=1) == {"stopped": [], "live": []}
        assert _alive(int(info["pid"]))
    finally:
        os.killpg(int(info["pid"]), signal.SIGKILL)


def test_secret_values_are_redacted_but_comparable() -> None:
    assert redaction.redact("HF_TOKEN", "hunter2") == redaction.redact("HF_TOKEN", "hunter2") != "hunter2"
    assert redaction.redact("NCCL_PROTO", "LL") == "LL"
    argv = ["python", "-m", "x", "--api-key", "s3cret", "--hf-token=abc", "--speculative-num-draft-tokens", "4"]
    red = redaction.redact_argv(argv)
    assert "s3cret" not in red and "--hf-token=abc" not in red and red[-2:] == ["--speculative-num-draft-tokens", "4"]


def test_digests_are_keyed_hmacs_not_bare_hashes() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    d1 = redaction.redact("HF_TOKEN", "hunter2", k1)
    assert d1 == redaction.redact("HF_TOKEN", "hunter2", k1) == redaction.redact_argv(["--hf-token", "hunter2"], k1)[1]
    assert d1 != redaction.redact("HF_TOKEN", "hunter2", k2) != redaction.redact("HF_TOKEN", "hunter3", k1)
    # A guess cannot be confirmed without the key: no bare SHA-256 prefix of the value anywhere in the digest.
    bare = hashlib.sha256(b"hunter2").hexdigest()
    assert all(bare[i : i + 8] not in d1 for i in range(0, 56, 4))
    mac = hmac.new(k1, b"hunter2", hashlib.sha256).hexdigest()
    assert d1 == f"<redacted hmac:{mac[:16]}>"


@pytest.mark.parametrize(
    ("argv", "hidden"),
    [
        (["--api-key", "S1"], [1]),
        (["--api-key=S1"], [0]),
        (["--hf-token", "S1", "--admin-api-key=S2"], [1, 2]),
        (["--api_key", "S1", "--db-password", "S2", "--client-secret", "S3", "--aws-credentials", "S4"], [1, 3, 5, 7]),
        (["--ssl-passwd=S1", "--key", "S2", "--credential", "S3"], [0, 2, 4]),
        (["env", "HF_TOKEN=S1", "MY_API_KEY=S2", "NCCL_PROTO=LL", "python"], [1, 2]),
        # Counts and paths whose last word is not a secret word stay as they are.
        (["--speculative-num-draft-tokens", "4", "--max-total-tokens", "8", "--max-prefill-tokens=9"], []),
        (["--tokenizer-path", "/t", "--keyfile", "/k", "--monkey", "3", "--token-budget", "5"], []),
        # A secret flag followed by another flag has no value to hide (argparse refuses it anyway), nor at the end.
        (["--api-key", "--port", "1", "--api-key"], []),
    ],
)
def test_redact_argv_edge_cases(argv: list[str], hidden: list[int]) -> None:
    key = os.urandom(32)
    red = redaction.redact_argv(argv, key)
    for i, (before, after) in enumerate(zip(argv, red, strict=True)):
        if i not in hidden:
            assert after == before
        elif "=" in before:
            name, _, value = before.partition("=")
            assert after == f"{name}={redaction.redact('TOKEN', value, key)}"
        else:
            assert after == redaction.redact("TOKEN", before, key)
    assert redaction.secret_values(argv, {}) == [a.partition("=")[2] or a for i, a in enumerate(argv) if i in hidden]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "server_args=ServerArgs(model_path='m', api_key='sk-1', max_total_tokens=8, hf_token=None)",
            "server_args=ServerArgs(model_path='m', api_key='<redacted>', max_total_tokens=8, hf_token=None)",
        ),
        (
            '{"api_key": "sk-1", "speculative_num_draft_tokens": 4}',
            '{"api_key": "<redacted>", "speculative_num_draft_tokens": 4}',
        ),
        ("api_key=sk-1 token=abc password=hunter2", "api_key=<redacted> token=<redacted> password=<redacted>"),
        ("HF_TOKEN=hf_1; x", "HF_TOKEN=<redacted>; x"),
        ("Authorization: Bearer abc.def-1", "Authorization: Bearer <redacted>"),
        (
            "python -m x --api-key sk-1 --hf-token=t1 --port 1",
            "python -m x --api-key <redacted> --hf-token=<redacted> --port 1",
        ),
        # Prose and counts are left alone.
        ("first token: 0.5 s after 12 tokens, monkey=3", "first token: 0.5 s after 12 tokens, monkey=3"),
        ("secret: ready after 2.1s; password: see docs", "secret: ready after 2.1s; password: see docs"),
        (
            "api-key: abc, X-Api-Key: abc, token: 'abc'",
            "api-key: <redacted>, X-Api-Key: <redacted>, token: '<redacted>'",
        ),
        ("max_total_tokens=8 num_draft_tokens: 4", "max_total_tokens=8 num_draft_tokens: 4"),
        ("api_key=<redacted hmac:0123456789abcdef>", "api_key=<redacted hmac:0123456789abcdef>"),
    ],
)
def test_scrub_patterns(text: str, expected: str) -> None:
    assert redaction.scrub(text) == expected


def test_scrub_removes_known_secret_values_anywhere() -> None:
    text = "loading with key sk-SECRET-1 (x=sk-SECRET-1)\nhf_SECRET-2 rejected; ab ab"
    out = redaction.scrub(text, ["sk-SECRET-1", "hf_SECRET-2", "ab", ""])
    assert "SECRET" not in out and out.count("<redacted>") == 3
    assert out.endswith("ab ab")  # too short to be replaced in free text without garbling it
    # A longer secret containing a shorter one is replaced whole.
    assert redaction.scrub("abcdefgh", ["abcd", "abcdefgh"]) == "<redacted>"


def test_cmdlines_shown_from_the_host_are_masked(
    foreign_with_secrets: subprocess.Popen[bytes], write_profile: WriteProfile
) -> None:
    port = foreign_with_secrets.port  # type: ignore[attr-defined]
    (owner,) = teardown.op_port_owner(port)
    assert "SECRET" not in owner["cmdline"] and "--api-key <redacted>" in owner["cmdline"]
    assert "--hf-token=<redacted>" in owner["cmdline"] and "--max-total-tokens 8" in owner["cmdline"]
    # The same masked line in preflight's refusal, and in what `orch status`/teardown reports list (describe_process).
    prof = load(str(write_profile("p", engine="sglang", model_path="/m", tp_size=1, port=port)))
    with pytest.raises(HostError, match=rf"(?s)in use by PID {foreign_with_secrets.pid} \(.*--api-key <redacted>") as e:
        single.preflight(LocalHost(), prof, NAMESPACE)
    assert "SECRET" not in str(e.value)
    described = ops.describe_process(psutil.Process(foreign_with_secrets.pid))
    assert "SECRET" not in described["cmdline"] and "<redacted>" in described["cmdline"]


def test_lock_is_exclusive_and_reclaimed_only_from_our_own_session(tmp_path: Path) -> None:
    lock = str(tmp_path / "orch.lock")
    agent = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.agent", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdin is not None and agent.stdout is not None
        req = {"op": "lock", "args": {"path": lock, "holder": {"session": "S1", "user": "alice"}}, "id": 1}
        agent.stdin.write(json.dumps(req) + "\n")
        agent.stdin.flush()
        assert json.loads(agent.stdout.readline())["result"]["acquired"]
        other = hostlock.op_lock(lock, {"session": "S2"}, wait_s=0.3, reclaim=True)
        assert not other["acquired"] and other["holder"]["user"] == "alice" and agent.poll() is None
        # Same session (a reconnect after a silent drop): the stale agent of that session is ended, lock taken.
        mine = hostlock.op_lock(lock, {"session": "S1"}, wait_s=5, reclaim=True)
        assert mine["acquired"]
        assert agent.wait(timeout=10) is not None
    finally:
        hostlock.op_unlock(lock)
        if agent.poll() is None:
            agent.kill()
        agent.wait()


# Starts a helper that leaves the group and re-execs with the launch marker removed (a compile daemon, say), then
# prints its PID: only the PIDs recorded for the launch can find it again.
UNMARKER = (
    "import os, subprocess, sys, time\n"
    "env = {k: v for k, v in os.environ.items() if k != 'ORCH_LAUNCH_ID'}\n"
    "code = 'import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(60)'\n"
    "p = subprocess.Popen([sys.executable, '-c', code], env=env, start_new_session=True)\n"
    "print(p.pid, flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


def test_teardown_kills_recorded_processes_that_dropped_the_marker(tmp_path: Path) -> None:
    lid, info = _launch(tmp_path, UNMARKER)
    log = tmp_path / "logs" / "x.log"
    deadline = time.monotonic() + 10
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    helper = int(log.read_text().split()[0])
    try:
        recorded = ops.op_launch_procs(lid, int(info["pid"]))  # type: ignore[call-overload]
        assert helper in [p["pid"] for p in recorded]
        assert helper not in [p["pid"] for p in ops.op_find(NAMESPACE)]  # the marker cannot find it
        assert ops.op_launch_health(recorded)["ok"]
        report = ops.op_teardown(lid, pgid=int(info["pgid"]), grace_s=1, known=recorded)  # type: ignore[call-overload]
        assert report["unmarked"] == [helper]
        assert not _alive(helper)
        assert not ops.op_launch_health(recorded)["ok"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)


def test_recorded_pids_are_matched_with_their_start_time() -> None:
    """A PID reused by another process is never taken for a recorded member of a launch."""
    me = psutil.Process()
    same = {"pid": me.pid, "create_time": me.create_time()}
    other = {"pid": me.pid, "create_time": me.create_time() - 100}
    assert teardown.recorded_processes([same])[0] == [me]
    assert teardown.recorded_processes([other])[0] == [] and teardown.recorded_processes([other])[1] == [other]


def test_a_wall_clock_step_never_makes_a_live_process_look_gone(stepped_clock: StepClock) -> None:
    """A process is identified by its start ticks since boot: after the clock steps (psutil's create_time moves with
    it) a recorded live process is still itself, and a PID reused by another process is still not."""
    me = psutil.Process()
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        recorded = [processes.identity(me), processes.identity(psutil.Process(child.pid))]
        assert all("start_ticks" in r for r in recorded)  # Linux: the tests' platform
        my_owner = processes.self_owner()
        child_owner = f"{child.pid}:{recorded[1]['create_time']:.3f}@{recorded[1]['start_ticks']}"
        reused = {**recorded[0], "start_ticks": recorded[0]["start_ticks"] - 100}
        for seconds in (3600.0, -86400.0 * 365):
            stepped_clock(seconds)
            assert abs(psutil.Process().create_time() - recorded[0]["create_time"] - seconds) < 1
            alive, gone = teardown.recorded_processes(recorded)
            assert [p.pid for p in alive] == [me.pid, child.pid] and gone == []
            assert not ops.launch_problem(recorded)
            assert processes.owner_state(my_owner) == "me"
            assert processes.owner_state(child_owner) == "alive"
            assert teardown.recorded_processes([reused]) == ([], [reused])
            assert processes.owner_state(f"{me.pid}:{recorded[0]['create_time']:.3f}@{reused['start_ticks']}") == "dead"
    finally:
        child.kill()
        child.wait()
    assert processes.owner_state(child_owner) == "dead"


def test_a_record_without_start_ticks_is_matched_by_create_time_as_before() -> None:
    """Records and owners written by an older orch (no start ticks) keep today's comparison."""
    me = psutil.Process()
    old = {"pid": me.pid, "create_time": me.create_time()}
    assert teardown.recorded_processes([old])[0] == [me]
    assert processes.owner_state(f"{me.pid}:{me.create_time():.3f}") == "me"
    assert processes.owner_state(f"{me.pid}:{me.create_time() - 100:.3f}") == "dead"
    assert processes.owner_state("x:1") == processes.owner_state("1:y") == "dead"


def test_a_record_of_another_boot_is_never_a_process_of_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start ticks count from a boot: after a reboot a PID and start ticks can repeat. A record that names its boot
    (a launch's processes, a store's owner outlive the reboot) is matched only in that boot; one without (an older
    orch), or on a system without a boot id, as before."""
    me = psutil.Process()
    recorded = processes.identity(me)
    assert processes.boot_id() is not None and recorded.get("boot_id") == processes.boot_id()  # Linux, as tested
    assert teardown.recorded_processes([recorded])[0] == [me]
    older = {k: v for k, v in recorded.items() if k != "boot_id"}
    fake = tmp_path / "boot_id"
    fake.write_text("5a1c0e8e-0000-4000-8000-000000000001\n")  # the machine rebooted: the same PID and ticks again
    monkeypatch.setattr(processes, "BOOT_ID_PATH", str(fake))
    assert teardown.recorded_processes([recorded]) == ([], [recorded])
    assert ops.launch_problem([recorded])  # never watched as the launch's own process
    assert teardown.recorded_processes([older])[0] == [me]
    monkeypatch.setattr(processes, "BOOT_ID_PATH", str(tmp_path / "none"))  # no boot id here: ticks decide
    assert teardown.recorded_processes([recorded])[0] == [me]


def test_the_shipped_agent_files_are_enough_to_run_the_agent(tmp_path: Path) -> None:
    """A host gets only agent_files(): the agent and its benchmark client must import from those alone (no stray
    orchestrator import)."""
    from orchestrator.hosts.agentlink import agent_files

    for name, data in agent_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    # -S: no site processing, so not the editable install of orch either; psutil's directory is named by hand.
    site = str(Path(psutil.__file__).resolve().parent.parent)
    agent = subprocess.Popen(
        [sys.executable, "-S", str(tmp_path / "orch_agent.py"), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": site},
    )
    assert agent.stdin is not None and agent.stdout is not None
    replies = []
    for i, op in enumerate(({"op": "hello"}, {"op": "find", "args": {"namespace": "none"}})):
        agent.stdin.write(json.dumps({**op, "id": i}) + "\n")
        agent.stdin.flush()
        replies.append(json.loads(agent.stdout.readline()))
    _, err = agent.communicate(timeout=30)
    assert [(r["ok"], r["id"]) for r in replies] == [(True, 0), (True, 1)], err
    # bench_run imports the client (and what it imports) only when a run starts: import it from the same files.
    client = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import orchestrator.client.runner, orchestrator.agent.waits, orchestrator.sim.__main__",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{tmp_path}:{site}"},
        timeout=60,
    )
    assert client.returncode == 0, client.stderr


# ---------------------------------------------------------------- a run's request: its token ids


def test_a_large_requests_token_ids_are_shared_objects_and_a_small_one_decodes_as_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench_run carries a run's prompts as token ids: decoded, each id was an int object of its own (28 bytes
    beside its 8-byte slot); 10 prompts of 1,000,000 tokens took about 360 MB to decode. In a large request the ids
    are one shared object per value, here (the agent) and in the local host's JSON round trip."""
    ids = [1000 + (i * 7919) % 31000 for i in range(200_000)]
    request = {"op": "bench_run", "args": {"bodies": [{"input_ids": ids}, {"input_ids": ids[::-1]}]}}
    decoded = ops.decode_request(json.dumps(request))
    assert decoded == request
    got = [i for body in decoded["args"]["bodies"] for i in body["input_ids"]]
    assert len({id(i) for i in got}) == len(set(ids))  # one object per distinct id, shared by both prompts
    assert ops.decode_request(json.dumps({"n": [10**30, -5, 7]})) == {"n": [10**30, -5, 7]}
    big = json.dumps({"pad": "x" * ops.LARGE_REQUEST_BYTES, "n": [10**30, -5, 70_000]})
    assert ops.decode_request(big)["n"] == [10**30, -5, 70_000]  # outside the table: as json decodes it

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(ops, "dispatch", lambda r: seen.append(r) or {"ok": True, "result": None})
    LocalHost().call("bench_run", bodies=request["args"]["bodies"])
    local = [i for body in seen[0]["args"]["bodies"] for i in body["input_ids"]]  # type: ignore[index]
    assert local == got and len({id(i) for i in local}) == len(set(ids))


def test_a_request_line_read_in_many_pieces_is_one_request(tmp_path: Path) -> None:
    """The agent reads a run's request (tens of MB) 64 KiB at a time into one buffer, finding its end where new data
    landed: the lines come out whole, in order, with what follows them kept."""
    big = json.dumps({"op": "x", "args": {"ids": list(range(100_000))}}).encode()
    stdin = tmp_path / "stdin"
    stdin.write_bytes(big + b"\n" + b'{"op": "y"}\n' + b'{"op": "partial"')
    fd = os.open(stdin, os.O_RDONLY)
    buffer = bytearray()
    try:
        assert ops.read_line(fd, buffer) == big
        assert ops.read_line(fd, buffer) == b'{"op": "y"}'
        assert ops.read_line(fd, buffer) is None and buffer == b'{"op": "partial"'
    finally:
        os.close(fd)
