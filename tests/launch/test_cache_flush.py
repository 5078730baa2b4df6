"""--flush-cache: each engine's way of emptying the prefix cache, sent before every timed run and never a warmup,
a failed flush stopping the benchmark with what the server said, and end to end on the simulator."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator import engines
from orchestrator.cli import main
from orchestrator.client import cacheflush
from orchestrator.client.cacheflush import flush_cache
from orchestrator.client.request import Record
from orchestrator.client.summary import summarize_run
from orchestrator.config.workload import BenchConfig
from orchestrator.engines.base import Probe
from orchestrator.errors import BenchError, InputError
from orchestrator.launch.benchmark import RunCall, flush_refusal, run_benchmark
from orchestrator.results.store import Store
from tests.conftest import FAST_SIM, WriteProfile, free_port

Capsys = pytest.CaptureFixture[str]


def test_each_engine_says_how_its_cache_is_emptied() -> None:
    sglang, vllm, llama = (engines.get(n).cache_flush for n in ("sglang", "vllm", "llamacpp"))
    assert sglang is not None and sglang.request == Probe("POST", "/flush_cache") and not sglang.body
    assert vllm is not None and vllm.request == Probe("POST", "/reset_prefix_cache")
    assert vllm.enable is not None and "VLLM_SERVER_DEV_MODE=1" in vllm.enable
    assert llama is not None and llama.request is None and dict(llama.body) == {"cache_prompt": False}


class FakeRunner:
    """Records what each run was sent; answers like the client, or with a failed flush."""

    def __init__(self, fail: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[list[dict[str, Any]], Mapping[str, Any] | None]] = []
        self.fail = fail

    def __call__(self, call: RunCall) -> dict[str, Any]:
        bodies, flush = call.bodies, call.flush
        self.calls.append((bodies, flush))
        if flush is not None and self.fail is not None:
            return {"cache_flush_failed": self.fail}
        records = []
        for i in range(len(bodies)):
            r = Record(
                index=i, start=0.0, max_tokens=2, first=0.1, end=1.5, tokens=2, prompt_tokens=10, cached_tokens=0
            )
            r.arrivals = [(0.1, 1), (1.5, 1)]
            records.append(r)
        return summarize_run(records, 1.5, call.concurrency, {}, 0.0)


def test_timed_runs_are_flushed_and_warmups_are_not() -> None:
    config = BenchConfig(runs=2, warmup=1, max_tokens=8, endpoint="completions", flush_cache=True)
    runner = FakeRunner()
    run_benchmark(runner, config, model="m", engine=engines.get("sglang"))
    assert [flush for _, flush in runner.calls] == [None, *[{"method": "POST", "path": "/flush_cache"}] * 2]
    # llama.cpp: no request first; every timed request says not to reuse the slot's cache.
    runner = FakeRunner()
    run_benchmark(runner, config, model="m", engine=engines.get("llamacpp"))
    assert [flush for _, flush in runner.calls] == [None, None, None]
    assert ["cache_prompt" in b for bodies, _ in runner.calls for b in bodies] == [False, True, True]
    assert runner.calls[1][0][0]["cache_prompt"] is False
    # Without --flush-cache nothing changes.
    runner = FakeRunner()
    run_benchmark(
        runner,
        BenchConfig(runs=1, warmup=0, max_tokens=8, endpoint="completions"),
        model="m",
        engine=engines.get("llamacpp"),
    )
    assert runner.calls[0][1] is None and "cache_prompt" not in runner.calls[0][0][0]


class NoFlush(type(engines.get("vllm"))):  # type: ignore[misc]
    """vLLM as if it had no way to empty its prefix cache."""

    cache_flush = None


def test_a_flush_the_server_refuses_stops_the_benchmark_naming_what_enables_it() -> None:
    config = BenchConfig(runs=2, warmup=1, max_tokens=8, endpoint="completions", flush_cache=True)
    said = {"method": "POST", "path": "/reset_prefix_cache", "status": 404, "body": '{"detail":"Not Found"}'}
    with pytest.raises(BenchError) as caught:
        run_benchmark(FakeRunner(said), config, model="m", engine=engines.get("vllm"))
    assert str(caught.value).startswith(
        '--flush-cache: POST /reset_prefix_cache answered 404 before run 1 at concurrency 1 ({"detail":"Not Found"}); '
        "vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1 in its environment"
    )
    with pytest.raises(BenchError, match="no way for orch to empty its prefix cache"):
        run_benchmark(FakeRunner(), config, model="m", engine=NoFlush())


def test_an_engine_without_a_flush_is_refused_before_anything_starts() -> None:
    class Profile:
        source, engine, attach = "p.yaml", "nocache", None

    class NoCache(engines.get("sglang").__class__):  # type: ignore[misc]
        name = "nocache"
        cache_flush = None

    engines.register(NoCache())
    try:
        with pytest.raises(InputError, match=r"p.yaml: engine nocache has no way .* drop --flush-cache"):
            engines.check_use([Profile()], "generate", simulate=True, flush_cache=True)  # type: ignore[list-item]
        engines.check_use([Profile()], "generate", simulate=True)  # type: ignore[list-item]
    finally:
        engines._REGISTRY.pop("nocache")


def test_a_vllm_profile_without_dev_mode_is_refused_before_anything_starts() -> None:
    """vLLM serves /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1: a launch without it would load, warm up
    and then fail its first timed run, so the profile is refused first; an attached server is the user's to start."""

    class Profile:
        source, engine, attach = "v.yaml", "vllm", None
        env: tuple[tuple[str, str], ...] = ()

    bare = Profile()
    with pytest.raises(InputError) as caught:
        engines.check_use([bare], "completions", simulate=True, flush_cache=True)  # type: ignore[list-item]
    assert str(caught.value).startswith("v.yaml: --flush-cache: its env does not set VLLM_SERVER_DEV_MODE=1; ")
    engines.check_use([bare], "completions", simulate=True)  # type: ignore[list-item]
    dev = Profile()
    dev.env = (("VLLM_SERVER_DEV_MODE", "1"),)
    engines.check_use([dev], "completions", simulate=True, flush_cache=True)  # type: ignore[list-item]
    attached = Profile()
    attached.attach = "http://127.0.0.1:8000"
    engines.check_use([attached], "completions", simulate=True, flush_cache=True)  # type: ignore[list-item]


@contextmanager
def answering(statuses: list[int], bodies: list[bytes] | None = None) -> Iterator[tuple[int, list[str]]]:
    """A server answering each POST with the next status (the last one repeated) and body (default: "busy", or
    "done" with a 200); yields its port and the paths."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.path)
            status = statuses[min(len(seen), len(statuses)) - 1]
            body = bodies[min(len(seen), len(bodies)) - 1] if bodies else b"busy" if status != 200 else b"done"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_client_asks_again_while_busy_and_never_after_a_404() -> None:
    request = {"method": "POST", "path": "/flush_cache"}
    with answering([400, 400, 200]) as (port, seen):
        assert flush_cache("127.0.0.1", port, request) is None and len(seen) == 3
    with answering([404]) as (port, seen):
        failed = flush_cache("127.0.0.1", port, request)
        assert failed == {"method": "POST", "path": "/flush_cache", "status": 404, "body": "busy"} and len(seen) == 1
    failed = flush_cache("127.0.0.1", free_port(), request)
    assert failed is not None and failed["status"] is None and "ConnectionRefusedError" in failed["body"]


def test_a_200_that_says_the_reset_failed_is_a_failure_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's POST /reset_prefix_cache can answer 200 with {"success": false} (the engine could not reset): the body
    is read, the request asked again while the patience lasts, then the run refused with what the server said."""
    monkeypatch.setattr(cacheflush, "FLUSH_PATIENCE_S", 0.6)
    request = {"method": "POST", "path": "/reset_prefix_cache"}
    with answering([200], [b'{"success": false}', b'{"success": false}', b'{"success": true}']) as (port, seen):
        assert flush_cache("127.0.0.1", port, request) is None and len(seen) == 3
    with answering([200], [b'{"success": false}']) as (port, seen):
        failed = flush_cache("127.0.0.1", port, request)
    assert failed == {"method": "POST", "path": "/reset_prefix_cache", "status": 200, "body": '{"success": false}'}
    assert len(seen) >= 2
    message = flush_refusal(failed, None, "run 1 at 1 stream")
    assert 'answered 200 before run 1 at 1 stream ({"success": false})' in message and "not sent" in message
    # Bodies that say nothing of success (vLLM's empty 200, SGLang's text, a JSON list) are successes.
    for body in (b"", b"Cache flushed.", b"[false]", b'{"success": true}', b'{"ok": false}'):
        with answering([200], [body]) as (port, seen):
            assert flush_cache("127.0.0.1", port, request) is None and len(seen) == 1


def _cache_profiles(write_profile: WriteProfile) -> tuple[str, str]:
    common: dict[str, Any] = {"engine": "sglang", "model_path": "/models/m", "tp_size": 2, "ready_timeout_s": 30}
    knobs = {**FAST_SIM, "prefix_cache_entries": 64}
    base = write_profile("cbase", **common, port=free_port(), sim=knobs)
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    other = write_profile("cspec", **common, port=free_port(), sim=knobs, speculative=spec)
    return str(base), str(other)


@pytest.mark.slow
def test_on_the_simulator_a_flush_empties_the_cache_every_run_left_warm(
    write_profile: WriteProfile, tmp_path: Path, capsys: Capsys
) -> None:
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"prompt": "Summarise the history of the printing press in Europe in a few lines."}))
    args = ["ab", *_cache_profiles(write_profile), "--sim", "--dataset", str(one), "--blocks", "1", "--runs", "2"]
    args += ["--warmup", "1", "--max-tokens", "16", "--min-run-s", "0", "--json", "--db", str(tmp_path / "r.db")]
    rates = {}
    for flush in (False, True):
        # The flush goes in the call that carries the run: the agent's bench_run, or here with --client local.
        assert main([*args, *(["--flush-cache", "--client", "local"] if flush else [])]) == 0
        doc = json.loads(capsys.readouterr().out)
        rates[flush] = [arm["prefix_cache"]["hit_rate"] for arm in doc["arms"]]
    # The one prompt, sent by the warmup and every run: from the cache each time, unless each run starts empty.
    assert all(rate > 0.9 for rate in rates[False]) and rates[True] == [0.0, 0.0]
    stored = Store(str(tmp_path / "r.db")).find_experiment("last")
    assert json.loads(stored["config_json"])["bench"]["flush_cache"] is True  # recorded with the workload


@pytest.mark.slow
def test_on_the_simulator_a_cache_gap_holds_back_the_verdict_unless_measured(
    write_profile: WriteProfile, tmp_path: Path, capsys: Capsys
) -> None:
    base, _ = _cache_profiles(write_profile)
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    common: dict[str, Any] = {"engine": "sglang", "model_path": "/models/m", "tp_size": 2, "ready_timeout_s": 30}
    cold = write_profile("cold", **common, port=free_port(), sim=dict(FAST_SIM), speculative=spec)
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"prompt": "Summarise the history of the printing press in Europe in a few lines."}))
    db = str(tmp_path / "r.db")
    args = ["ab", base, str(cold), "--sim", "--dataset", str(one), "--blocks", "2", "--runs", "1", "--warmup", "1"]
    args += ["--max-tokens", "16", "--min-run-s", "0", "--json", "--db", db]
    assert main([*args, "--fail-on", "slower"]) == 4
    (held,) = json.loads(capsys.readouterr().out)["comparisons"]
    assert held["verdict"] == "inconclusive" and held["held_back"] and held["cache_gap"]["arm_hit_rate"] == 0.0
    assert main([*args, "--cache-measured"]) == 0
    (kept,) = json.loads(capsys.readouterr().out)["comparisons"]
    assert not kept["held_back"] and kept["cache_gap"]["measured"] and kept["ci_verdict"] is None
    # Recorded with the experiment: read back, it judges the same way; a resume may not change it.
    assert main(["show", "last", "--json", "--db", db]) == 0
    assert json.loads(capsys.readouterr().out)["comparisons"][0]["cache_gap"]["measured"] is True
    assert main(["ab", "--resume", "last", "--flush-cache", "--db", db]) == 2
    assert "drop --flush-cache" in capsys.readouterr().err
