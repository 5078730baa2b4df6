"""config/traces: a Mooncake JSONL trace read and checked line by line, its schedule, and prompts that share the
prefix blocks their hash ids name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator import engines
from orchestrator.config import arrivals, prompts, traces, workload
from orchestrator.config.workload import BenchConfig, request_items
from orchestrator.errors import PromptFileError


def write(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


ROWS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 400, "input_length": 700, "output_length": 7, "hash_ids": [1, 3]},
    {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [4]},
]


def test_schedule_is_each_timestamp_from_the_first_divided_by_speed(tmp_path: Path) -> None:
    trace = traces.load(write(tmp_path / "t.jsonl", [{**r, "timestamp": r["timestamp"] + 50} for r in ROWS]))
    assert traces.schedule(trace, 1.0) == [0.0, 0.4, 1.0]
    assert traces.schedule(trace, 4.0) == [0.0, 0.1, 0.25]
    assert traces.mean_rate(trace, 4.0) == 12.0  # 3 requests over 0.25 s
    assert traces.load(write(tmp_path / "t.jsonl", ROWS), 2) == traces.load(str(tmp_path / "t.jsonl"))[:2]


def test_prompts_share_the_blocks_of_shared_hash_ids_and_keep_their_lengths(tmp_path: Path) -> None:
    items = list(traces.items(traces.load(write(tmp_path / "t.jsonl", ROWS))))
    ids = [it.input_ids or () for it in items]
    assert [len(i) for i in ids] == [1000, 700, 600]  # 600 > one block: the rest filled with the request's own
    assert [it.output_len for it in items] == [5, 7, 3]
    assert ids[0][:512] == ids[1][:512]  # hash id 1
    assert ids[0][512:700] != ids[1][512:700]  # 2 vs 3
    assert ids[2][:512] != ids[0][:512]
    again = list(traces.items(traces.load(write(tmp_path / "u.jsonl", ROWS[1:2]))))
    assert again[0].input_ids == ids[1]  # a block is a function of its id alone


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "t.jsonl:2: not valid JSON"),
        ("[1]", "t.jsonl:2: expected an object with timestamp, input_length, output_length, hash_ids"),
        ({"input_length": 1, "output_length": 1, "hash_ids": []}, "t.jsonl:2: field 'timestamp' missing"),
        ({"timestamp": 5, "output_length": 1, "hash_ids": []}, "t.jsonl:2: field 'input_length' missing"),
        ({"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}, "field 'timestamp' is -1"),
        ({"timestamp": 5, "input_length": 1, "output_length": 0, "hash_ids": []}, "field 'output_length' is 0"),
        ({"timestamp": 5, "input_length": "9", "output_length": 1, "hash_ids": []}, "field 'input_length' is '9'"),
        ({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}, "field 'hash_ids' is ['a']"),
        # The caps of --input-len and --max-tokens: past them a line would fill memory before anything launched.
        (
            {"timestamp": 5, "input_length": 10**12, "output_length": 1, "hash_ids": []},
            "t.jsonl:2: field 'input_length' is 1000000000000; expected an integer from 1 to 1,000,000 (prompt tokens",
        ),
        (
            {"timestamp": 5, "input_length": 1, "output_length": 1_000_001, "hash_ids": []},
            "t.jsonl:2: field 'output_length' is 1000001; expected an integer from 1 to 1,000,000 (output tokens",
        ),
        (
            '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [' + "9" * 5000 + "]}",
            "t.jsonl:2: not valid JSON",
        ),
        ("[" * 100_000 + "]" * 100_000, "t.jsonl:2: JSON nested too deeply"),
        ('{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [\u0000]}', "t.jsonl:2: a NUL byte"),
    ],
)
def test_a_bad_line_is_refused_naming_file_line_and_field(tmp_path: Path, row: Any, message: str) -> None:
    path = write(tmp_path / "t.jsonl", [ROWS[0], row])
    with pytest.raises(PromptFileError, match=None) as e:
        traces.load(path)
    assert message in str(e.value)


def test_unsorted_timestamps_and_empty_or_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match=r"t.jsonl:2: field 'timestamp' is 100, before the line above's 400"):
        traces.load(write(tmp_path / "t.jsonl", [ROWS[1], {**ROWS[0], "timestamp": 100}]))
    with pytest.raises(PromptFileError, match="no requests in the trace"):
        traces.load(write(tmp_path / "e.jsonl", [""]))
    with pytest.raises(PromptFileError, match="cannot read the trace"):
        traces.load(str(tmp_path / "missing.jsonl"))


def test_the_request_sequence_replays_the_trace_in_every_run(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", ROWS)
    bench = BenchConfig(runs=2, warmup=1, rate=(12.0,), requests_per_level=3, trace=path, speed=4.0)
    items = request_items(bench)
    assert len(items) == 1 + 2 * 3
    assert [it.get("scheduled_s") for it in items] == [None, 0.0, 0.1, 0.25, 0.0, 0.1, 0.25]
    assert [it["output_len"] for it in items[1:4]] == [5, 7, 3]
    assert {"trace", "speed", "trace_sha256"} <= set(bench.to_dict())
    assert "trace" not in BenchConfig().to_dict()  # every other workload's digests stay what they were


def test_a_trace_that_changed_since_it_was_recorded_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", ROWS)
    bench = BenchConfig(runs=1, warmup=0, rate=(12.0,), requests_per_level=3, trace=path, trace_sha256="0" * 64)
    with pytest.raises(PromptFileError, match="differs from the experiment's trace"):
        request_items(bench)


def test_a_line_over_the_byte_cap_is_refused_without_being_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line is read with a limit: one longer than a record may be is refused naming its line after reading that
    much of it (the cap lowered here; a real-size line is in tests/faults/test_prompt_files.py)."""
    monkeypatch.setattr(prompts, "MAX_RECORD_BYTES", 200)
    path = write(tmp_path / "t.jsonl", [ROWS[0], {**ROWS[1], "hash_ids": list(range(100))}])
    read: list[int] = []
    real = prompts.files.open_regular

    def spy(path: str) -> object:
        f = real(path)
        readline = f.readline
        f.readline = lambda limit=-1: read.append(limit) or readline(limit)  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(prompts.files, "open_regular", spy)
    with pytest.raises(PromptFileError, match=r"t\.jsonl:2: a line longer than 0 MiB"):
        traces.load(path)
    assert read and all(0 < limit <= 201 for limit in read)


def test_token_ids_are_exactly_the_draws_of_randrange() -> None:
    """The ids are drawn in bulk, a few times faster than randrange one by one, and must be the same ids: recorded
    experiments' request digests depend on them."""
    for seed in ("trace-block:7", "trace-fill:0", "trace-block:-3", "x"):
        for n in (0, 1, 2, 31, 512, 5000):
            rng = random.Random(seed)
            assert traces.token_ids(seed, n) == [rng.randrange(traces.LOW_ID, traces.VOCAB) for _ in range(n)]


def test_prompts_are_generated_as_they_are_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace of many long prompts never has them all in memory: each is generated as it is sent (the digest, the
    check before launch and a run take them one at a time), not the sum of the trace's lengths up front."""
    rows = [{"timestamp": 10 * i, "input_length": 1_000_000, "output_length": 1, "hash_ids": [i]} for i in range(50)]
    path = write(tmp_path / "t.jsonl", rows)
    made: list[int] = []
    real = traces.prompt_ids
    monkeypatch.setattr(traces, "prompt_ids", lambda req, n: made.append(n) or real(req, n))
    trace = traces.load(path)
    first = next(traces.items(trace))
    assert made == [0] and len(first.input_ids or ()) == 1_000_000
    bench = BenchConfig(runs=2, warmup=1, rate=(5.0,), requests_per_level=50, trace=path)
    stream = workload.request_stream(bench)
    assert next(stream)["input_ids"][:4] == list(first.input_ids or ())[:4] and made == [0, 0]
    workload.check_requests(bench)  # what every caller runs before a launch: the lines checked, no prompt made
    assert made == [0, 0]


def test_the_streamed_digest_is_the_digest_of_the_whole_sequence(tmp_path: Path) -> None:
    """Experiments record sha256(json.dumps(request_items)); written one item at a time it must be the same bytes."""
    path = write(tmp_path / "t.jsonl", ROWS)
    for bench in (
        BenchConfig(runs=2, warmup=1, rate=(12.0,), requests_per_level=3, trace=path, speed=4.0),
        BenchConfig(runs=1, warmup=2, concurrency=(1, 2)),
        BenchConfig(runs=2, warmup=1, rate=(4.0,), duration_s=1.0, prompts="random", input_len=8),
        BenchConfig(runs=1, warmup=0),
    ):
        whole = hashlib.sha256(json.dumps(request_items(bench), sort_keys=True).encode()).hexdigest()
        assert workload.requests_digest(bench) == whole
    assert workload.requests_digest(BenchConfig(runs=1, warmup=0, concurrency=(1,), prompts="random", input_len=1))


def test_requests_n_reads_the_first_n_requests_and_no_line_past_them(tmp_path: Path) -> None:
    """--requests 2 of a large trace: the lines past them are not parsed (a bad one there is never met)."""
    path = write(tmp_path / "t.jsonl", [ROWS[0], "", ROWS[1], "{not json", ROWS[2]])
    assert [r.input_length for r in traces.load(path, 2)] == [1000, 700]
    with pytest.raises(PromptFileError, match=r"t\.jsonl:4: not valid JSON"):
        traces.load(path)


def test_a_trace_of_more_requests_than_a_run_sends_is_refused_naming_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrivals, "MAX_REQUESTS", 2)
    path = write(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(
        PromptFileError, match=r"t\.jsonl:3: more than 2 requests; .* replay the first N \(--requests N\)"
    ):
        traces.load(path)
    assert len(traces.load(path, 2)) == 2


def test_a_replay_longer_than_a_run_may_last_is_refused(tmp_path: Path) -> None:
    """A run lasts at most --duration's bound (a day), a replay too: a trace spanning centuries is refused; sped
    up under the bound it is taken."""
    two_days = 2 * 86400 * 1000
    trace = traces.load(write(tmp_path / "t.jsonl", [ROWS[0], {**ROWS[1], "timestamp": two_days}]))
    with pytest.raises(PromptFileError, match=r"t\.jsonl: the replay would last 1\.728e\+05 s .* at most 1d"):
        traces.check_span(str(tmp_path / "t.jsonl"), trace, 1.0)
    traces.check_span(str(tmp_path / "t.jsonl"), trace, 2.0)
    ages = traces.load(write(tmp_path / "a.jsonl", [ROWS[0], {**ROWS[1], "timestamp": 5e17}]))
    with pytest.raises(PromptFileError, match=r"replay its first N requests \(--requests N\) or faster"):
        traces.check_span(str(tmp_path / "a.jsonl"), ages, 1000.0)


def test_each_run_takes_its_prompts_as_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """launch/benchmark sends a run's bodies in one call; the launch's other runs are not built yet: when the warmup
    is sent, one prompt has been made, not every run's."""
    from orchestrator.client.request import Record
    from orchestrator.client.summary import summarize_run
    from orchestrator.launch.benchmark import RunCall, run_benchmark

    made: list[int] = []
    real = traces.prompt_ids
    monkeypatch.setattr(traces, "prompt_ids", lambda req, n: made.append(n) or real(req, n))
    bench = BenchConfig(runs=2, warmup=1, rate=(12.0,), requests_per_level=3, trace=write(tmp_path / "t.jsonl", ROWS))
    seen: list[tuple[int, int]] = []

    def runner(call: RunCall) -> dict[str, object]:
        seen.append((len(call.bodies), len(made)))
        records = [
            Record(index=i, start=0.0, max_tokens=2, first=0.1, end=1.5, tokens=2, prompt_tokens=10)
            for i in range(len(call.bodies))
        ]
        return summarize_run(records, 1.5, call.concurrency, {}, 0.0)

    run_benchmark(runner, bench, model="m", engine=engines.get("sglang"))
    assert seen == [(1, 1), (3, 4), (3, 7)]  # (requests sent, prompts made so far) at each run


# ---------------------------------------------------------------- the plan counts a trace's own lengths


def test_the_plan_counts_the_traces_prompt_and_output_lengths(tmp_path: Path) -> None:
    """The plan said `204800 output tokens` for a trace whose every output_length was 1 (it counted --max-tokens per
    request) and counted none of its prompt tokens: it counts the trace's input_length and output_length (capped by
    --max-tokens) of the requests a launch sends, warmups (the trace's first prompts) included."""
    from orchestrator.config.plan import plan

    rows = [{**r, "output_length": 1} for r in ROWS] + [{**ROWS[0], "timestamp": 2000, "output_length": 9000}]
    path = write(tmp_path / "t.jsonl", rows)
    bench = BenchConfig(runs=3, warmup=2, max_tokens=2048, rate=(2.0,), requests_per_level=4, trace=path)
    work = plan(bench, [], blocks=1, calibrated=False)
    assert work.output_tokens_per_launch == 2 * 64 + 3 * (1 + 1 + 1 + 2048)
    assert work.prompt_token_ids_per_launch == (1000 + 700) + 3 * (1000 + 700 + 600 + 1000)
    assert f"{work.requests_per_launch} requests and {2 * 64 + 3 * 2051} output tokens per launch" in work.line()
    assert work.refusal() is None


def test_a_trace_over_the_prompt_token_limit_is_refused_naming_file_total_and_requests(tmp_path: Path) -> None:
    """A 10-line trace at 1,000,000 tokens a line peaked at 1.1 GB; 100 such lines took a minute before launch: the
    limit on generated prompt tokens per launch counts a trace's input lengths, so it is refused by the plan."""
    from orchestrator.config.plan import MAX_PROMPT_TOKEN_IDS, SUITE_NAMES, plan

    rows = [{"timestamp": i, "input_length": 1_000_000, "output_length": 1, "hash_ids": [i]} for i in range(10)]
    path = write(tmp_path / "big.jsonl", rows)
    bench = BenchConfig(runs=2, warmup=1, rate=(2.0,), requests_per_level=10, trace=path)
    refusal = plan(bench, [], blocks=1, calibrated=False).refusal()
    assert refusal is not None and refusal.startswith(f"{path}: the replay asks for 10,000,000 prompt tokens per run")
    assert f"21,000,000 per launch with the warmups and --runs: over the limit of {MAX_PROMPT_TOKEN_IDS:,}" in refusal
    assert refusal.endswith("replay its first N requests (--requests N) or lower --runs")
    # Named as the caller's fields where it is not orch ab's options.
    named = plan(bench, [], blocks=1, calibrated=False).refusal(SUITE_NAMES)
    assert named is not None and "(requests N) or lower runs" in named
    assert plan(dataclasses.replace(bench, runs=1), [], blocks=1, calibrated=False).refusal() is None


def test_prompt_token_ids_are_shared_objects() -> None:
    """A prompt's list refers to one int object per id (8 bytes a token), not an object of its own per token (36):
    most of what a run of long token-id prompts held."""
    ids = traces.token_ids("trace-block:1", 200_000) + traces.token_ids("trace-fill:7", 200_000)
    assert len({id(i) for i in ids}) <= traces.VOCAB - traces.LOW_ID
