"""Waiting on the host: the probe's answers, the wait's three endings, progress events through the agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator import engines
from orchestrator.agent import ops, waits
from orchestrator.config.profile import load
from orchestrator.hosts.local import LocalHost
from tests.conftest import WriteProfile, free_port

GENERATE = {"method": "POST", "path": "/generate", "body": {"input_ids": [0]}, "gate": None}


class Stub:
    """An HTTP server answering each path from a script: (status, body) per request, the last one repeated."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[int, Any]]] = {}
        self.seen: list[tuple[str, str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.seen.append((self.command, self.path, body))
                answers = stub.script.get(self.path) or [(404, {"error": {"message": "no such route"}})]
                status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
                if payload == "hang":
                    time.sleep(2)
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def test_probe_answers_are_named(stub: Stub) -> None:
    assert waits.probe_once("127.0.0.1", free_port(), GENERATE, 1.0) == (False, "loading")
    stub.script["/generate"] = [(503, {"error": "starting"})]
    assert waits.probe_once("127.0.0.1", stub.port, GENERATE, 1.0) == (False, "warming up")
    stub.script["/generate"] = [(404, {"error": {"message": "The model `m` does not exist."}})]
    assert waits.probe_once("127.0.0.1", stub.port, GENERATE, 1.0) == (
        False,
        "HTTP 404: The model `m` does not exist.",
    )
    stub.script["/generate"] = [(200, {"error": "out of memory"})]
    oom = (False, "HTTP 200 but an error: out of memory")
    assert waits.probe_once("127.0.0.1", stub.port, GENERATE, 1.0) == oom
    stub.script["/generate"] = [(200, b"not json")]
    assert waits.probe_once("127.0.0.1", stub.port, GENERATE, 1.0) == (False, "HTTP 200 but no JSON answer")
    stub.script["/generate"] = [(200, "hang")]
    assert waits.probe_once("127.0.0.1", stub.port, GENERATE, 0.3) == (False, "no answer within 0.3s")
    stub.script["/generate"] = [(200, {"text": "x", "meta_info": {"completion_tokens": 1}})]
    assert waits.probe_once("127.0.0.1", stub.port, GENERATE, 1.0) == (True, "ready")
    assert stub.seen[-1] == ("POST", "/generate", {"input_ids": [0]})


def test_a_gate_is_polled_before_any_generation(stub: Stub) -> None:
    probe = {"method": "POST", "path": "/completion", "body": {"n_predict": 1}, "gate": "/health"}
    stub.script["/health"] = [(503, {"error": {"message": "Loading model"}}), (200, {"status": "ok"})]
    stub.script["/completion"] = [(200, {"content": "x", "tokens_predicted": 1})]
    assert waits.probe_once("127.0.0.1", stub.port, probe, 1.0) == (False, "warming up")
    assert [p for _, p, _ in stub.seen] == ["/health"]  # no generation while the model loads
    assert waits.probe_once("127.0.0.1", stub.port, probe, 1.0) == (True, "ready")
    assert [p for _, p, _ in stub.seen] == ["/health", "/health", "/completion"]


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_the_wait_ends_ready_exited_or_timed_out_and_reports_changes(stub: Stub, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("Load weight begin\nLoad weight end\n")
    proc = _sleeper(30)
    try:
        stub.script["/generate"] = [(503, {}), (503, {}), (200, {"text": "x"})]
        events: list[dict[str, Any]] = []
        t0 = time.monotonic()
        # The stub listens in this process: for the ownership check at ready, this process is the server.
        me = os.getpid()
        result = waits.wait(me, stub.port, GENERATE, str(log), 10, report=events.append, log_every_s=0.01)
        assert result["ready"] and time.monotonic() - t0 < 8.0  # ready at the third probe, not the 10 s timeout
        assert events[0]["state"] == "warming up" and events[0]["changed"]
        assert any(e["log"].endswith("Load weight end") for e in events)  # the log's last lines, while waiting
        assert result["elapsed"] >= 0.03  # three probes, 20 ms apart

        stub.script["/generate"] = [(503, {})]
        result = waits.wait(me, stub.port, GENERATE, str(log), 0.2)
        assert not result["ready"] and result["why"] == "timeout" and result["state"] == "warming up"
        assert result["log_tail"] == "Load weight begin\nLoad weight end"
    finally:
        proc.kill()
        proc.wait()
    result = waits.wait(proc.pid, stub.port, GENERATE, str(tmp_path / "missing.log"), 10)
    assert not result["ready"] and result["why"] == "exited" and "no log at" in result["log_tail"]


def test_an_answer_from_a_port_someone_else_took_is_not_ready(stub: Stub, tmp_path: Path) -> None:
    """Our server has not bound its port (it will fail to: someone else took it after preflight); the stranger's
    200 must not count as our server being ready."""
    stub.script["/generate"] = [(200, {"text": "x"})]
    proc = _sleeper(30)  # our launch: alive, listening nowhere
    try:
        result = waits.wait(proc.pid, stub.port, GENERATE, str(tmp_path / "x.log"), 10)
    finally:
        proc.kill()
        proc.wait()
    assert not result["ready"] and result["why"] == "port_taken"
    assert result["owner"]["pid"] == os.getpid() and "python" in result["owner"]["cmdline"]


def test_engines_declare_a_real_generation_as_their_readiness(write_profile: WriteProfile) -> None:
    common = {"model_path": "/m/x", "port": 30000}
    sglang = load(str(write_profile("s", engine="sglang", tp_size=1, **common)))
    vllm = load(str(write_profile("v", engine="vllm", tp_size=1, served_model_name="served", **common)))
    llama = load(str(write_profile("l", engine="llamacpp", **common)))
    got = {p.engine: engines.get(p.engine).ready_probe(p) for p in (sglang, vllm, llama)}
    assert got["sglang"].path == "/generate" and got["sglang"].body["sampling_params"]["max_new_tokens"] == 1
    assert got["vllm"].path == "/v1/completions" and got["vllm"].body["model"] == "served"
    assert got["vllm"].body["max_tokens"] == 1
    assert got["llamacpp"].path == "/completion" and got["llamacpp"].body["n_predict"] == 1
    assert got["llamacpp"].gate == "/health"
    # Health checks (attached servers, before a repeat): SGLang's costs no second; the others keep /health.
    assert engines.get("sglang").health_probe(sglang).path == "/generate"
    assert engines.get("vllm").health_probe(vllm).label == "/health"


def test_the_agent_sends_progress_events_before_its_answer(stub: Stub, tmp_path: Path) -> None:
    stub.script["/generate"] = [(503, {}), (503, {}), (404, {"error": "nope"}), (200, {"text": "x"})]
    proc = _sleeper(30)
    agent = subprocess.Popen(
        [sys.executable, ops.__file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdin is not None and agent.stdout is not None
        args = {
            "pid": os.getpid(),
            "port": stub.port,
            "probe": GENERATE,
            "log_path": str(tmp_path / "x"),
            "timeout_s": 9,
        }
        args["log_every_s"] = 0  # state changes only
        agent.stdin.write(json.dumps({"op": "wait_ready", "args": args, "id": 7}) + "\n")
        agent.stdin.flush()
        lines = []
        while not lines or lines[-1].get("heartbeat"):
            lines.append(json.loads(agent.stdout.readline()))
        states = [x["event"]["state"] for x in lines[:-1] if "event" in x]
        assert states == ["warming up", "HTTP 404: nope"]
        assert all(x["id"] == 7 for x in lines) and lines[-1]["ok"] and lines[-1]["result"]["ready"]
    finally:
        agent.kill()
        agent.wait()
        proc.kill()
        proc.wait()


def test_local_progress_reaches_the_caller_as_json(stub: Stub, tmp_path: Path) -> None:
    stub.script["/generate"] = [(503, {}), (200, {"text": "x"})]
    proc = _sleeper(30)
    try:
        heard: list[dict[str, Any]] = []
        args = {
            "pid": os.getpid(),
            "port": stub.port,
            "probe": GENERATE,
            "log_path": str(tmp_path / "x"),
            "timeout_s": 9,
        }
        args["log_every_s"] = 0  # state changes only
        host = LocalHost()
        assert host.call("wait_ready", on_progress=heard.append, **args)["ready"]
        assert [h["state"] for h in heard] == ["warming up"] and host.stats.calls == 1
    finally:
        proc.kill()
        proc.wait()


def test_the_cpu_probe_comes_with_the_ready_answer_and_its_failure_never_fails_the_wait(
    stub: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "server.log"
    log.write_text("ready\n")
    stub.script["/generate"] = [(200, {"text": "x"})]
    me = os.getpid()  # the stub listens in this process
    result = ops.op_wait_ready(me, stub.port, GENERATE, str(log), 10, then={"cpu_speed": True})
    assert result["ready"] and result["cpu_speed"]["probe_ms"] > 0 and result["cpu_speed_s"] > 0

    def broken(**_: Any) -> dict[str, Any]:
        raise MemoryError("no room for the copy")

    monkeypatch.setattr(ops.cpu, "op_cpu_speed", broken)
    result = ops.op_wait_ready(me, stub.port, GENERATE, str(log), 10, then={"cpu_speed": True})
    assert result["ready"] and "cpu_speed" not in result  # orch asks again and records why it could not
