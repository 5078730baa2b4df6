"""An engine owns its protocol: one defined in this file alone — its own request body and path, its own counter
names and metrics page, its own version endpoint and readiness — served by a fake server in this file, runs
`orch ab` end to end (issue 38: nothing outside this file changes to add it)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from orchestrator import engines
from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.client.request import Wire
from orchestrator.engines import Engine
from orchestrator.engines.base import ServerProfile, SpecCounters
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from tests.conftest import NAMESPACE, WriteProfile, free_port
from tests.faults.support import FAST

REPO = Path(__file__).resolve().parents[2]
BODY_PATH = "/api/v2/stream"
RELEASE = "ownserve 7.3.1"
TOKENS_PER_CYCLE = 2  # each verify cycle yields 2 tokens: one drafted token accepted, plus the target's own
CYCLE_S = 0.002


class OwnServe(Engine):
    """A made-up engine that shares nothing with the built-in ones but the OpenAI chunk stream: a body of its own
    at a path of its own, counters named without `_total` on its own page, its version under its own key."""

    name = "ownserve"
    health_path = "/alive"
    env_overrides: Mapping[str, str] = MappingProxyType({})
    packages = ()
    version_package = None
    endpoints = ("completions",)
    info_paths = ("/about",)
    metrics_path = "/stats"
    counters = ("own_drafts", "own_accepted")

    def server_flags(self, profile: ServerProfile) -> list[str]:
        return ["--port", str(profile.port)]

    def launch_argv(self, profile: ServerProfile, python: str, *, simulate: bool) -> list[str]:
        start = f"import sys; sys.path.insert(0, {str(REPO)!r}); from {__name__} import serve; serve()"
        return [python, "-c", start, *self.server_flags(profile)]

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        release = info.get("release")
        return release if isinstance(release, str) else None

    def wire(self, endpoint: str) -> Wire:
        return Wire(path=BODY_PATH, stream="openai", metrics_path=self.metrics_path, counters=self.counters)

    def request_body(self, endpoint: str, item: Mapping[str, Any], max_tokens: int, model: str) -> dict[str, Any]:
        text = item.get("text") or " ".join(str(i) for i in item.get("input_ids") or []) or "hello"
        return {"model_id": model, "input": text, "limits": {"tokens": max_tokens, "exact": True}, "greedy": True}

    def spec_from_counters(self, deltas: Mapping[str, float]) -> SpecCounters | None:
        drafts, accepted = deltas.get("own_drafts"), deltas.get("own_accepted")
        if not drafts or accepted is None:
            return None
        return SpecCounters(
            accept_length=1.0 + accepted / drafts,
            acceptance_rate=None,
            drafted=None,
            accepted=accepted,
            source="metrics (own_drafts / own_accepted across this run)",
            drafts=drafts,
        )


# ------------------------------------------------------------------------------------------- the fake server


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.drafts = 0
        self.accepted = 0


def serve() -> None:
    """The fake server (`python -c ... serve() --port N`): refuses any body but its own (a standard body, with its
    `prompt` and `ignore_eos`, is a 400), streams OpenAI chunks with cumulative usage, counts its drafts."""
    port = int(sys.argv[sys.argv.index("--port") + 1])
    counts = _Counters()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, code: int, doc: object) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/alive":
                self._json(200, {"alive": True})
            elif self.path == "/about":
                self._json(200, {"release": RELEASE, "settings": {"cycle_s": CYCLE_S}})
            elif self.path == "/stats":
                with counts.lock:
                    text = f"# TYPE own_drafts counter\nown_drafts {counts.drafts}\nown_accepted {counts.accepted}\n"
                text += "own_decoy_total 7\n"  # a `_total` counter the engine does not ask for: not kept
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._json(404, {"detail": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            limits = body.get("limits") if isinstance(body, dict) else None
            if (
                self.path != BODY_PATH
                or set(body) != {"model_id", "input", "limits", "greedy"}
                or not isinstance(limits, dict)
                or limits.get("exact") is not True
                or not isinstance(limits.get("tokens"), int)
            ):
                self._json(400, {"detail": f"not this server's request: {self.path} {sorted(body)}"})
                return
            n, prompt = limits["tokens"], len(str(body["input"]).split())
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            done = 0
            while done < n:
                time.sleep(CYCLE_S)
                step = min(TOKENS_PER_CYCLE, n - done)
                done += step
                with counts.lock:
                    counts.drafts += 1
                    counts.accepted += step - 1
                usage = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
                chunk = {"choices": [{"index": 0, "text": " w" * step}], "usage": usage}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


# ------------------------------------------------------------------------------------------------- the test


@pytest.fixture
def own() -> Iterator[Engine]:
    engine = engines.register(OwnServe())
    yield engine
    engines._REGISTRY.pop(OwnServe.name, None)


def test_an_engine_with_its_own_protocol_runs_orch_ab_end_to_end(
    own: Engine, write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_profile("own-a", engine="ownserve", model_path="/m/own", port=free_port())
    other = write_profile("own-b", engine="ownserve", model_path="/m/own", port=free_port())
    db = str(tmp_path / "r.db")
    args = ["--blocks", "2", "--runs", "2", "--concurrency", "2", "--max-tokens", "16", *FAST, "--db", db, "--json"]
    rc = main(["ab", str(base), str(other), *args])
    out = capsys.readouterr().out
    assert rc in (0, 4), out  # a verdict or inconclusive: two launches of one server decide nothing in particular
    doc = json.loads(out)
    assert [a["profile"] for a in doc["arms"]] == ["own-a", "own-b"]
    for arm in doc["arms"]:
        assert arm["launches"] == 2
        runs = arm["runs"]
        assert len(runs) == 4  # 2 blocks x 2 runs, every one valid: a standard body would have been a 400
        for run in runs:
            assert run["valid"] and run["errors"] == 0 and run["tokens"] == 2 * 16, run
            assert run["token_source"] == "usage (per chunk)", run
            # Speculative figures from its own counters (named without _total, on its own page).
            assert run["spec_accept_length"] == pytest.approx(2.0), run
            assert run["accept_source"] == "metrics (own_drafts / own_accepted across this run)", run
    result = load_result(Store(tmp_path / "r.db"), doc["experiment_id"])
    for launch in result.launches:
        software = (launch.fingerprint or {})["software"]
        # The version from its own endpoint, read its own way.
        assert software["engine"] == "ownserve" and software["engine_version"] == RELEASE, software
        assert software["engine_version_source"] == "server_info"
    assert ops.op_find(NAMESPACE) == []


def test_its_counters_are_the_ones_it_names_and_only_those() -> None:
    from orchestrator.client.metrics import counter_deltas

    wire = OwnServe().wire("completions")
    before = {"own_drafts": 1.0, "own_accepted": 2.0, "own_decoy_total": 7.0}
    after = {"own_drafts": 4.0, "own_accepted": 8.0, "own_decoy_total": 9.0}
    assert counter_deltas(before, after, wire) == {"own_drafts": 3.0, "own_accepted": 6.0}
    standard = engines.get("vllm").wire("completions")  # no names given: every `*_total` counter
    assert counter_deltas(before, after, standard) == {"own_decoy_total": 2.0}
