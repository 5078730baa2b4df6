"""config/traces: a Mooncake JSONL trace read and checked line by line, its schedule, and prompts that share the
prefix blocks their hash ids name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import traces
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
    assert traces.head(trace, 2) == trace[:2] and traces.head(trace, None) == trace


def test_prompts_share_the_blocks_of_shared_hash_ids_and_keep_their_lengths(tmp_path: Path) -> None:
    items = traces.items(traces.load(write(tmp_path / "t.jsonl", ROWS)))
    ids = [it.input_ids or () for it in items]
    assert [len(i) for i in ids] == [1000, 700, 600]  # 600 > one block: the rest filled with the request's own
    assert [it.output_len for it in items] == [5, 7, 3]
    assert ids[0][:512] == ids[1][:512]  # hash id 1
    assert ids[0][512:700] != ids[1][512:700]  # 2 vs 3
    assert ids[2][:512] != ids[0][:512]
    again = traces.items(traces.load(write(tmp_path / "u.jsonl", ROWS[1:2])))
    assert again[0].input_ids == ids[1]  # a block is a function of its id alone


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "t.jsonl:2: not a JSON object"),
        ("[1]", "t.jsonl:2: expected a JSON object"),
        ({"input_length": 1, "output_length": 1, "hash_ids": []}, "t.jsonl:2: field 'timestamp' missing"),
        ({"timestamp": 5, "output_length": 1, "hash_ids": []}, "t.jsonl:2: field 'input_length' missing"),
        ({"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}, "field 'timestamp' is -1"),
        ({"timestamp": 5, "input_length": 1, "output_length": 0, "hash_ids": []}, "field 'output_length' is 0"),
        ({"timestamp": 5, "input_length": "9", "output_length": 1, "hash_ids": []}, "field 'input_length' is '9'"),
        ({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}, "field 'hash_ids' is ['a']"),
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
