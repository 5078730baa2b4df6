"""Host-side waits (shipped with the agent; stdlib + psutil): a launched server ready, the GPUs idle again.

Polling next to the server is cheap (a refused connect, a `/proc` read), so the agent polls every few tens of
milliseconds and orch hears once: ready, exited (with the log's tail) or timed out. Meanwhile progress — the state
and the log's last lines — goes to `report`, which the agent turns into heartbeats for orch's live view.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil

from orchestrator.agent.facts import op_gpus
from orchestrator.common.printable import visible

Report = Callable[[dict[str, Any]], None]

MAX_ANSWER_BYTES = 1 << 20  # a 1-token answer is a few hundred bytes; never read an unbounded body
LOG_TAIL_BYTES = 8192
FIRST_LOG_S = 0.2


def log_tail(path: str, lines: int = 40, max_bytes: int = 65536) -> str:
    """The last `lines` lines of a log (at most max_bytes read), or why there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError as e:
        return f"(no log at {path}: {e.strerror})"
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def alive(pid: int) -> dict[str, Any]:
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return {"alive": False, "status": "gone"}
    return {"alive": status != psutil.STATUS_ZOMBIE, "status": status}


def _request(
    address: str, port: int, method: str, path: str, body: Mapping[str, Any] | None, timeout: float
) -> tuple[int, bytes]:
    import http.client  # ~12 ms (email, ssl): only a wait for readiness needs it

    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_ANSWER_BYTES)
    finally:
        conn.close()


def _foreign_listener(port: int, pid: int) -> dict[str, Any] | None:
    """The process listening on the port when it is neither the launch's main process nor one of its descendants;
    None when the launch owns it (or the owner cannot be told: then the probe's answer stands)."""
    try:
        ours = {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
        owners = {
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid is not None
        }
    except (psutil.Error, OSError):
        return None
    if not owners or owners & ours:
        return None
    other = min(owners)
    try:
        cmdline = visible(" ".join(psutil.Process(other).cmdline())[:300])  # anyone's argv: one field
    except psutil.Error:
        cmdline = "?"
    return {"pid": other, "cmdline": cmdline}


def server_info(address: str, port: int, paths: Sequence[str], timeout_s: float = 5.0) -> dict[str, Any]:
    """The first of the engine's info paths (engines/base.Engine.info_paths) that answers a JSON object, GET; {}
    when none does."""
    import http.client

    for path in paths:
        try:
            status, data = _request(address, port, "GET", path, None, timeout_s)
            doc = json.loads(data) if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            continue
        if isinstance(doc, dict):
            return doc
    return {}


def _message(data: bytes) -> str:
    """The error message in a JSON answer ({"error": {"message": ...}}, {"error": "..."}, {"detail": ...})."""
    try:
        doc = json.loads(data)
    except ValueError:
        return ""
    if not isinstance(doc, dict):
        return ""
    err = doc.get("error") or doc.get("detail")
    raw = err.get("message") if isinstance(err, dict) else err
    # The server's words, in a state that orch prints in a line of its own: one field (whitespace runs as one
    # space; an escape sequence or a bidi override shown, not obeyed).
    return visible(" ".join(str(raw).split())[:160]) if raw else ""


def _answer_state(status: int, data: bytes) -> str:
    if status == 503:
        return "warming up"
    message = _message(data)
    return f"HTTP {status}" + (f": {message}" if message else "")


def probe_once(address: str, port: int, probe: Mapping[str, Any], timeout_s: float) -> tuple[bool, str]:
    """(ready, state): one try of the engine's probe. State: loading (refused), warming up (503), HTTP N..."""
    import http.client

    try:
        gate = probe.get("gate")
        if gate:
            status, data = _request(address, port, "GET", str(gate), None, timeout_s)
            if status != 200:
                return False, _answer_state(status, data)
        body = probe.get("body")
        status, data = _request(address, port, str(probe["method"]), str(probe["path"]), body, timeout_s)
    except TimeoutError:
        return False, f"no answer within {timeout_s:g}s"
    except (OSError, http.client.HTTPException):
        return False, "loading"  # refused (not listening yet) or cut off
    if status != 200:
        return False, _answer_state(status, data)
    if body is not None:
        # A generation answers with a JSON object; an `error` in it is no generation.
        try:
            doc = json.loads(data)
        except ValueError:
            return False, "HTTP 200 but no JSON answer"
        if not isinstance(doc, dict) or doc.get("error"):
            return False, f"HTTP 200 but an error: {_message(data) or 'not a JSON object'}"
    return True, "ready"


def wait(
    pid: int,
    port: int,
    probe: Mapping[str, Any],
    log_path: str,
    timeout_s: float,
    *,
    address: str = "127.0.0.1",
    poll_s: float = 0.02,
    log_every_s: float = 1.0,
    probe_timeout_s: float = 10.0,
    report: Report | None = None,
) -> dict[str, Any]:
    """Until the probe succeeds (ready), the server's process exits, or timeout_s passes.

    report gets {"state", "log", "elapsed", "changed"} when the state changes and every log_every_s (with the log's
    last line; 0: never read the log for progress)."""
    t0 = time.monotonic()
    # The first look at the log comes early: a fast start should still show what the server said.
    state, next_log, log = "loading", t0 + min(FIRST_LOG_S, log_every_s), ""
    while True:
        if not alive(pid)["alive"]:
            return {"ready": False, "why": "exited", "state": state, "elapsed": time.monotonic() - t0,
                    "log_tail": log_tail(log_path, 30)}  # fmt: skip
        ready, new = probe_once(address, port, probe, probe_timeout_s)
        now = time.monotonic()
        if ready and (stranger := _foreign_listener(port, pid)) is not None:
            # Someone else took the port between preflight and our server's bind (ours then fails to bind): their
            # answer is not our server's. Seen with two orch sessions of different namespaces on one port.
            return {"ready": False, "why": "port_taken", "state": new, "elapsed": now - t0, "owner": stranger,
                    "log_tail": log_tail(log_path, 30)}  # fmt: skip
        if ready:
            return {"ready": True, "state": "ready", "elapsed": now - t0}
        changed, state = new != state, new
        tick = log_every_s > 0 and now >= next_log
        if tick:
            log = log_tail(log_path, 3, LOG_TAIL_BYTES)
            # Until the server has written something, look again soon: its first line may come just after start-up.
            next_log = now + (log_every_s if log.strip() else min(FIRST_LOG_S, log_every_s))
        if report is not None and (changed or tick):
            report({"state": state, "log": log, "elapsed": round(now - t0, 3), "changed": changed})
        if now - t0 > timeout_s:
            return {"ready": False, "why": "timeout", "state": state, "elapsed": now - t0,
                    "log_tail": log_tail(log_path, 30)}  # fmt: skip
        time.sleep(poll_s)


GPU_WAIT_POLL_S = 0.5


def gpu_problems(state: dict[str, Any], idle_mib: int, expected: int | None) -> list[str]:
    """Why the GPUs (op_gpus' state) are not idle: a compute process, more than idle_mib in use, another count."""
    problems = []
    if expected is not None and len(state["gpus"]) != expected:
        problems.append(f"expected {expected} GPUs, nvidia-smi shows {len(state['gpus'])}")
    for app in state["apps"]:
        problems.append(
            f"GPU {app.get('gpu_index')} is used by PID {app['pid']} ({app.get('cmdline', '?')}, "
            f"{app.get('used_memory')} MiB)" + (f", launch {app['launch_id']}" if app.get("launch_id") else "")
        )
    for gpu in state["gpus"]:
        used = gpu.get("memory.used")
        if isinstance(used, int | float) and used > idle_mib:
            problems.append(f"GPU {gpu['index']} has {used} MiB in use (idle means <= {idle_mib} MiB)")
    return problems


def gpus_idle(nvidia_smi: str, idle_mib: int, timeout_s: float, *, report: Report | None = None) -> dict[str, Any]:
    """After teardown: GPU teardown can lag the process exit, so wait (bounded) for memory to come back."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    waiting = False
    while True:
        state = op_gpus(nvidia_smi)
        if not state["available"]:
            return {"idle": None, "waited_s": 0.0, "error": state["error"]}
        problems = gpu_problems(state, idle_mib, None)
        if not problems or time.monotonic() >= deadline:
            return {"idle": not problems, "problems": problems, "waited_s": round(time.monotonic() - t0, 2)}
        if not waiting and report is not None:
            waiting = True
            report({"step": "gpu wait", "problems": problems})
        time.sleep(GPU_WAIT_POLL_S)
