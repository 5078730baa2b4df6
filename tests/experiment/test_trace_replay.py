"""`orch ab --trace`: a short simulated replay end to end (each request sent at timestamp/speed with its output
length and prompt length, prompts sharing hash ids sharing a prefix, the trace recorded in the config), and the
options and files refused with a clear line (exit 2)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.design import bench_config_from
from orchestrator.config.workload import request_items
from tests.conftest import free_port

Capsys = pytest.CaptureFixture[str]
AB = ["ab", "baseline", "sim-eagle3-fast", "--sim"]
# (timestamp ms, input_length, output_length, hash_ids): 1.4 s of trace, 0.35 s at --speed 4
ROWS = [(0, 1000, 12, [1, 2]), (200, 700, 6, [1, 3]), (600, 600, 4, [4]), (1400, 1024, 8, [1, 2])]


def write_trace(path: Path) -> Path:
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    path.write_text("".join(json.dumps(dict(zip(keys, row, strict=True))) + "\n" for row in ROWS))
    return path


def test_a_trace_replays_its_schedule_lengths_and_shared_prefixes(capsys: Capsys, tmp_path: Path) -> None:
    trace, db = write_trace(tmp_path / "t.jsonl"), tmp_path / "r.db"
    args = ["--trace", str(trace), "--speed", "4", "--blocks", "2", "--runs", "1", "--warmup", "0"]
    code = main([*AB, *args, "--min-run-s", "0", "--port", str(free_port()), "--db", str(db), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 3), doc  # a verdict either way: the replay is what is checked
    assert [c["rate"] for c in doc["comparisons_by_concurrency"]] == [11.43]  # 4 requests over 0.35 s

    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT launch_id, idx, scheduled_s, tokens, prompt_tokens FROM requests WHERE run_warmup = 0"
    ).fetchall()
    assert len(rows) == 2 * 2 * len(ROWS)  # 2 arms x 2 blocks, one run each
    for _, idx, due, tokens, prompt_tokens in rows:
        at, input_length, output_length, _ = ROWS[idx]
        assert due == pytest.approx(at / 1000 / 4)
        assert tokens == output_length and prompt_tokens == input_length

    config = json.loads(conn.execute("SELECT config_json FROM experiments").fetchone()[0])
    bench = config["bench"]
    assert bench["trace"] == str(trace.resolve()) and bench["speed"] == 4.0 and len(bench["trace_sha256"]) == 64
    assert bench["rate"] == [11.43] and bench["requests_per_level"] == len(ROWS)
    items = request_items(bench_config_from(bench))
    ids = [it["input_ids"] for it in items]
    assert ids[0][:512] == ids[1][:512] == ids[3][:512] and ids[0][:1000] == ids[3][:1000]  # hash ids 1 (and 2)
    assert ids[0][512:700] != ids[1][512:700] and ids[2][:512] != ids[0][:512]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "2"], "--rate excludes it"),
        (["--concurrency", "4"], "--concurrency excludes it"),
        (["--prompts", "random"], "--prompts/--dataset excludes it"),
        (["--dataset", "humaneval"], "--prompts/--dataset excludes it"),
        (["--duration", "5"], "--duration excludes it"),
        (["--speed", "0"], "--speed 0: expected a time scale above 0"),
    ],
)
def test_options_that_clash_with_a_trace_exit_2(args: list[str], message: str, capsys: Capsys, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    assert main([*AB, "--trace", str(trace), *args, "--db", str(tmp_path / "r.db")]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_speed_without_a_trace_and_a_bad_trace_exit_2(capsys: Capsys, tmp_path: Path) -> None:
    assert main([*AB, "--speed", "2", "--db", str(tmp_path / "r.db")]) == 2
    assert "--speed applies to --trace only" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": []}\n')
    assert main([*AB, "--trace", str(bad), "--db", str(tmp_path / "r.db")]) == 2
    assert "bad.jsonl:1: field 'output_length' is 0" in capsys.readouterr().err


def test_resume_and_a_claim_refuse_a_trace(capsys: Capsys, tmp_path: Path) -> None:
    from orchestrator.config.options import RunOptions
    from orchestrator.experiment import resume

    trace = write_trace(tmp_path / "t.jsonl")
    given = RunOptions(trace=str(trace), speed=2.0, given=frozenset({"trace", "speed"}))
    assert resume.fixed_given(given, simulated=True) == ["--trace", "--speed"]  # what --resume and a bundle refuse
    assert main(["reproduce", "baseline", "--claim", "80", "--sim", "--trace", str(trace)]) == 2
    assert "--trace does not apply" in capsys.readouterr().err


def test_a_trace_spanning_centuries_is_refused_before_the_plan_or_a_launch(
    capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay lasts at most what --duration may (a day): a trace whose timestamps span centuries was planned as
    "about 5787037037.0 days" and launched. Refused (exit 2) naming the file, the span and what shortens it."""
    from orchestrator.experiment import run

    launched: list[object] = []
    monkeypatch.setattr(run, "execute", lambda *a, **k: launched.append(a))
    trace = tmp_path / "t.jsonl"
    keys = ("timestamp", "input_length", "output_length", "hash_ids")
    trace.write_text("".join(json.dumps(dict(zip(keys, row, strict=True))) + "\n" for row in ROWS[:1]))
    with trace.open("a") as f:
        f.write(json.dumps({"timestamp": 5e14, "input_length": 5, "output_length": 5, "hash_ids": []}) + "\n")
    assert main([*AB, "--trace", str(trace), "--db", str(tmp_path / "r.db")]) == 2
    out, err = capsys.readouterr()
    text = " ".join(err.split())
    assert f"{trace}: the replay would last 5e+11 s (timestamps 0 to 5e+14 ms, at --speed 1)" in text, text
    assert "a run lasts at most 1d, as --duration: replay its first N requests (--requests N) or faster" in text
    assert "plan:" not in out + err and not launched and "Traceback" not in err


def test_a_trace_longer_than_a_run_names_requests_not_an_internal_field(
    capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace of 100,001 requests without --requests: refused naming --requests (the refusal named the workload's
    field `requests_per_level`), and --requests N replays its first N, reading no line past them."""
    from orchestrator.config.options import RunOptions
    from orchestrator.experiment import run

    monkeypatch.setattr(run, "execute", lambda *a, **k: pytest.fail("launched"))
    trace = tmp_path / "big.jsonl"
    line = '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}\n'
    trace.write_text(line * 100_001 + "{not json\n")
    assert main([*AB, "--trace", str(trace), "--db", str(tmp_path / "r.db")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"{trace}:100001: more than 100,000 requests; a replay sends at most 100,000 per run: replay the first N "
        in err
    )
    assert "(--requests N)" in err and "requests_per_level" not in err
    options = RunOptions(trace=str(trace), requests_per_level=3, given=frozenset({"trace", "requests_per_level"}))
    assert run.open_loop_fields(options)["requests_per_level"] == 3  # line 100,002 is not JSON: never read


def test_a_trace_of_absurd_prompt_lengths_is_refused_before_anything_is_generated(
    capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten lines of 1,000,000 prompt tokens each (52,000,000 generated per launch with the default 5 runs and 2
    warmups; 1.1 GB during the run, and 100 such lines a minute of silence before launch): refused by the plan
    (exit 2) naming the file, the total and --requests N; no prompt is generated, nothing launched."""
    from orchestrator.config import traces
    from orchestrator.experiment import run

    made: list[int] = []
    monkeypatch.setattr(traces, "prompt_ids", lambda req, n: made.append(n) or [])
    monkeypatch.setattr(run, "execute", lambda *a, **k: pytest.fail("launched"))
    trace = tmp_path / "long.jsonl"
    line = '{"timestamp": 0, "input_length": 1000000, "output_length": 1, "hash_ids": [1]}\n'
    trace.write_text(line * 10)
    assert main([*AB, "--trace", str(trace), "--db", str(tmp_path / "r.db")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    said = f"{trace}: the replay asks for 10,000,000 prompt tokens per run (the input_length of its 10 requests), "
    assert said in err
    assert "52,000,000 per launch with the warmups and --runs: over the limit of 20,000,000" in err
    assert "replay its first N requests (--requests N) or lower --runs" in err and not made
