"""The benchmark client: per-token accounting, validity gates, accept length, workloads and identical sequences."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import engines
from orchestrator.client import metrics as client_metrics
from orchestrator.client import runner as client
from orchestrator.client.request import Record
from orchestrator.client.summary import itl_samples, percentile, summarize_run
from orchestrator.config import prompts
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig, request_items
from orchestrator.errors import BenchError
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.local import LocalHost
from orchestrator.launch.benchmark import RunCall, with_engine_counters
from orchestrator.results.store import Store
from tests.conftest import NAMESPACE
from tests.wires import body, wire

SimProfiles = Callable[..., dict[str, Path]]
REPO = Path(__file__).resolve().parents[2]


def _rec(
    index: int,
    arrivals: list[tuple[float, float]],
    *,
    start: float = 0.0,
    max_tokens: int | None = None,
    verify_ct: int | None = None,
    error: str | None = None,
) -> Record:
    tokens = int(sum(k for _, k in arrivals))
    return Record(
        index=index,
        start=start,
        max_tokens=max_tokens if max_tokens is not None else tokens,
        first=arrivals[0][0] if arrivals else None,
        end=arrivals[-1][0] if arrivals else None,
        tokens=tokens,
        arrivals=arrivals,
        chunks=len(arrivals),
        verify_ct=verify_ct,
        error=error,
    )


# ------------------------------------------------------------------ pure accounting


def test_multi_token_chunk_counts_as_k_tokens_for_itl() -> None:
    # first chunk 1 token at 0.10; then 3 tokens after 0.09 s; then 2 tokens after 0.06 s
    rec = _rec(0, [(0.10, 1), (0.19, 3), (0.25, 2)])
    samples = itl_samples(rec)
    assert len(samples) == 5  # one per token after the first chunk, not one per chunk
    assert samples[:3] == pytest.approx([0.03] * 3) and samples[3:] == pytest.approx([0.03] * 2)
    s = summarize_run([rec], window=0.25, concurrency=1, deltas={}, min_duration_s=0)
    assert s["tokens"] == 6 and s["chunks"] == 3 and s["multi_token_chunks"] == 2
    assert s["itl"]["mean"] == pytest.approx(0.03)
    assert s["tpot"]["mean"] == pytest.approx((0.25 - 0.10) / 5)
    assert s["ttft_s"] == pytest.approx(0.10) and s["tok_s"] == pytest.approx(6 / 0.25)


def test_percentile_known_values() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0


def test_validity_gates_mark_runs_invalid_with_reasons() -> None:
    good = _rec(0, [(0.1, 1), (0.2, 1)], max_tokens=2)
    short = _rec(1, [(0.1, 1)], max_tokens=2)  # EOS despite ignore_eos
    failed = Record(index=2, start=0.0, max_tokens=2, error="HTTP 500: boom")
    s = summarize_run([good, short, failed], window=0.2, concurrency=1, deltas={}, min_duration_s=0)
    assert not s["valid"]
    assert "1 of 3 requests failed (first: HTTP 500: boom)" in s["invalid_reason"]
    why = "1 requests stopped early (1 of 2 tokens, though its engine's request body asks for exactly that many)"
    assert why in s["invalid_reason"]
    brief = summarize_run([good], window=0.2, concurrency=1, deltas={}, min_duration_s=1.0)
    assert not brief["valid"] and "shorter than the minimum 1.00s" in brief["invalid_reason"]
    assert summarize_run([good], window=0.2, concurrency=1, deltas={}, min_duration_s=0)["valid"]


def test_accept_length_comes_from_this_run_and_says_where_from() -> None:
    a = _rec(0, [(0.1, 1), (0.2, 3)], verify_ct=2)
    b = _rec(1, [(0.1, 2), (0.2, 2)], verify_ct=2)
    s = summarize_run([a, b], window=0.2, concurrency=2, deltas={}, min_duration_s=0)
    assert s["spec_accept_length"] == pytest.approx(8 / 4) and s["accept_source"].startswith("meta_info")
    # no per-request meta (OpenAI endpoints): counter deltas across the run, never the lifetime average
    plain = [_rec(0, [(0.1, 1), (0.2, 1)])]
    deltas = {"sglang:generation_tokens_total": 300.0, "sglang:spec_verify_calls_total": 120.0}
    m = summarize_run(plain, window=0.2, concurrency=1, deltas=deltas, min_duration_s=0)
    # The client passes the deltas on; the engine adapter reads its own counters from them (orch side).
    assert m["spec_accept_length"] is None and m["counter_deltas"] == deltas
    runner = with_engine_counters(lambda _call: dict(m), engines.get("sglang"))
    read = runner(RunCall(bodies=[], max_tokens=[], concurrency=1, probe_gpus=False))
    assert read["spec_accept_length"] == pytest.approx(2.5) and read["accept_source"].startswith("metrics")
    none = summarize_run(plain, window=0.2, concurrency=1, deltas={}, min_duration_s=0)
    assert none["spec_accept_length"] is None and none["accept_source"] is None


def test_aggregate_uses_the_steady_window_where_all_streams_decode() -> None:
    # two streams; the second starts late, so [0, 0.1] is ramp-up; steady from 0.1 until the first runs out.
    a = _rec(0, [(0.02, 1), (0.1, 1), (0.2, 1), (0.3, 1)])
    b = _rec(1, [(0.1, 1), (0.2, 1), (0.3, 1)])
    s = summarize_run([a, b], window=0.3, concurrency=2, deltas={}, min_duration_s=0)
    assert s["steady_window_s"] == [0.1, 0.3]
    assert s["aggregate_tok_s"] == pytest.approx(4 / 0.2)  # the 4 tokens after 0.1, over 0.2 s


# ------------------------------------------------------------------ workloads


def test_request_sequence_is_a_pure_function_of_the_config(tmp_path: Path) -> None:
    a = prompts.request_sequence("builtin", 60, seed=7)
    assert a == prompts.request_sequence("builtin", 60, seed=7)
    assert a != prompts.request_sequence("builtin", 60, seed=8)
    # each pass visits every prompt once: the task mix stays balanced
    cats = [p.category for p in a[:30]]
    assert {c: cats.count(c) for c in set(cats)} == {c: 5 for c in prompts.BUILTIN}
    rnd = prompts.request_sequence("random", 3, seed=1, input_len=64)
    assert all(p.input_ids is not None and len(p.input_ids) == 64 for p in rnd)
    with pytest.raises(BenchError, match="--input-len applies to --prompts random only"):
        prompts.request_sequence("builtin", 3, seed=1, input_len=64)
    cfg = BenchConfig(runs=2, warmup=1, concurrency=(1, 4), requests_per_stream=2)
    assert len(request_items(cfg)) == 1 + 2 * 2 + 2 * 8 and request_items(cfg) == request_items(cfg)


def test_jsonl_prompt_file_errors_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello"}\n{"messages": [{"role": "user", "content": "hi"}], "category": "chat"}\n')
    items = prompts.load_jsonl(str(f))
    assert [i.category for i in items] == ["file", "chat"] and items[1].messages is not None
    f.write_text('{"prompt": "ok"}\n{not json}\n')
    with pytest.raises(BenchError, match=r"p\.jsonl:2: not valid JSON"):
        prompts.load_jsonl(str(f))
    f.write_text('{"prompt": "ok"}\n{"text": "wrong key"}\n')
    with pytest.raises(BenchError, match=r"p\.jsonl:2: needs \"prompt\" \(non-empty text\) or \"messages\""):
        prompts.load_jsonl(str(f))
    with pytest.raises(BenchError, match="cannot read the prompt file"):
        prompts.load_jsonl(str(tmp_path / "missing.jsonl"))


def test_bodies_for_each_endpoint() -> None:
    item = {"text": "hi", "input_ids": None, "messages": None}
    gen = body("generate", item, 8, "m")
    assert gen["sampling_params"] == {"max_new_tokens": 8, "ignore_eos": True, "temperature": 0.0} and gen["stream"]
    comp = body("completions", item, 8, "m")
    assert comp["prompt"] == "hi" and comp["ignore_eos"] and comp["stream_options"]["continuous_usage_stats"]
    chat = body("chat", item, 8, "m")
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and chat["max_tokens"] == 8
    ids = body("generate", {"input_ids": [5, 6]}, 8, "m")
    assert ids["input_ids"] == [5, 6] and "text" not in ids


# ------------------------------------------------------------------ against the simulator


@pytest.mark.parametrize("endpoint", ["generate", "completions", "chat"])
def test_ab_over_each_endpoint_with_concurrency_and_speculation(
    endpoint: str, sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    paths = sim_profiles()
    profiles = [load(str(paths["baseline"])), load(str(paths["eagle3"]))]
    store = Store(tmp_path / "r.db")
    bench = BenchConfig(
        runs=1, warmup=1, max_tokens=40, warmup_max_tokens=4, concurrency=(1, 4), endpoint=endpoint, min_run_s=0
    )
    result = run_ab(LocalHost(), profiles, ABConfig(bench=bench, simulate=True, namespace=NAMESPACE, grace_s=2), store)
    _, eagle = result.arms
    for arm in result.arms:
        assert arm.levels == [1, 4]
        for run in (r for r in arm.runs if not r.warmup):
            assert run.valid, run.invalid_reason
            assert run.requests == run.concurrency and run.tokens == 40 * run.concurrency
            assert run.metrics["itl"]["mean"] > 0 and run.aggregate_tok_s > 0
    # speculation: chunks carry several tokens, ITL is still per token
    spec = eagle.timed_at(1)[0]
    assert spec.metrics["multi_token_chunks"] > 0 and spec.metrics["chunks"] < 40
    if endpoint == "generate":
        assert spec.spec_accept_length is not None and spec.accept_source.startswith("meta_info")
    else:
        # per-chunk usage (continuous_usage_stats) counts tokens exactly; without --enable-metrics there is no
        # per-run accept length on OpenAI endpoints, and orch says so rather than using the lifetime average
        assert spec.token_source == "usage (per chunk)"
        assert spec.spec_accept_length is None and spec.accept_source is None
    # the same request sequence reached both arms: per-request prompt sizes match position by position
    prompt_sizes = [[r["prompt_tokens"] for r in store.requests(a.launch_id)] for a in result.arms]
    assert prompt_sizes[0] == prompt_sizes[1]
    assert len(result.comparisons_at(4)) == 1 and result.comparisons_at(4)[0].aggregate_ratio is not None


def test_client_local_mode_and_json_fields(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "bench",
            "baseline",
            "--sim",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--max-tokens",
            "24",
            "--concurrency",
            "1,3",
            "--prompts",
            "random",
            "--input-len",
            "32",
            "--client",
            "local",
            "--grace",
            "2",
            "--min-run-s",
            "0",
            "--json",
            "--db",
            str(tmp_path / "r.db"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (arm,) = doc["arms"]
    assert [r["concurrency"] for r in arm["runs"]] == [1, 3]
    for run in arm["runs"]:
        assert {
            "tokens",
            "seconds",
            "tok_s",
            "prompt_tokens",
            "ttft_s",
            "aggregate_tok_s",
            "itl",
            "tpot",
            "e2e",
            "errors",
            "valid",
            "token_source",
        } <= set(run)
        assert run["prompt_tokens"] == 32 and run["valid"]
        assert set(run["itl"]) == {"mean", "p50", "p90", "p99"}
    assert [b["concurrency"] for b in arm["by_concurrency"]] == [1, 3]
    assert "@ 3 streams" in proc.stderr


def test_bad_workload_options_fail_before_any_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["bench", "baseline", "--sim", "--prompts", str(tmp_path / "nope.jsonl")]) == 2  # invalid input
    assert main(["bench", "baseline", "--sim", "--concurrency", "1,x"]) == 2
    assert main(["bench", "baseline", "--sim", "--input-len", "64"]) == 1
    from orchestrator.agent import ops

    assert ops.op_find(NAMESPACE) == []


def test_ctrl_c_during_a_run_is_never_swallowed_by_asyncio() -> None:
    """From Python 3.11 asyncio turns SIGINT into a task cancellation that asyncio.wait_for can swallow; the client
    keeps Ctrl-C a plain KeyboardInterrupt, raised at once, and restores the handler afterwards."""
    import signal as _signal
    import socket as _socket
    import threading as _threading

    seen: list[object] = []
    srv = _socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            conn, _addr = srv.accept()
            request = conn.recv(65536)
            if request.startswith(b"GET /metrics"):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
                continue
            seen.append(_signal.getsignal(_signal.SIGINT))  # what the client installed for its run
            os.kill(os.getpid(), _signal.SIGINT)  # the user presses Ctrl-C mid-request
            time.sleep(60)
            conn.close()

    thread = _threading.Thread(target=serve, daemon=True)
    thread.start()
    before = _signal.getsignal(_signal.SIGINT)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        client.run("127.0.0.1", port, wire("generate"), [{"text": "x", "stream": True}], [8], 1, timeout=30)
    assert time.monotonic() - started < 30  # raised at once, not after the request (60 s)
    (handler,) = seen
    assert getattr(handler, "__module__", None) == "orchestrator.client.runner"  # ours, not asyncio's
    assert _signal.getsignal(_signal.SIGINT) is before
    srv.close()


def test_llama_cpp_requests_that_drafted_nothing_count_at_accept_length_one() -> None:
    drafting = _rec(0, [(0.1, 1)] * 10)
    drafting.timings, drafting.drafted, drafting.accepted = True, 8, 5
    drafting.verify_ct, drafting.accept_length = 5, 2.0
    idle = _rec(1, [(0.1, 1)] * 10)
    idle.timings = True  # llama-server sent timings without draft_n: nothing was drafted for this request
    s = summarize_run([drafting, idle], window=0.2, concurrency=2, deltas={}, min_duration_s=0)
    assert s["spec_accept_length"] == pytest.approx(20 / 15) and s["spec"]["drafted"] == 8
    assert s["accept_source"].startswith("timings")
    # A server that never drafts (the baseline arm) reports no accept length at all, not 1.0.
    base = _rec(0, [(0.1, 1)] * 10)
    base.timings = True
    assert summarize_run([base], window=0.2, concurrency=1, deltas={}, min_duration_s=0)["spec_accept_length"] is None


def test_metrics_are_read_to_the_end_of_the_answer() -> None:
    async def go() -> dict[str, float] | None:
        reader = asyncio.StreamReader()
        body = b"HTTP/1.1 200 OK\r\n\r\n" + b"".join(f"m_{i}_total {i}\n".encode() for i in range(5000))
        for k in range(0, len(body), 1000):
            reader.feed_data(body[k : k + 1000])
        reader.feed_eof()
        return client_metrics._parse_metrics(await client_metrics._read_to_eof(reader, 1 << 24))

    parsed = asyncio.run(go())
    assert parsed is not None and len(parsed) == 5000  # read to the end, not one buffer's worth
