"""`orch ab --rate`: the options refused with a clear line (exit 2), and short simulated open-loop A/Bs end to end:
per-level verdicts, the JSON fields, a bundle round trip, what --resume refuses, and a reproduction that sends the
same schedule."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config.options import RunOptions
from orchestrator.config.slo import parse_slo
from orchestrator.experiment import run as experiment
from orchestrator.results import bundleformat
from orchestrator.ui.progress import PlainReporter
from tests.conftest import FAST_SIM, free_port

Capsys = pytest.CaptureFixture[str]
AB = ["ab", "baseline", "sim-eagle3-fast", "--sim"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "2", "--concurrency", "4"], "--rate (open loop"),
        (["--rate", "2", "--requests-per-stream", "2"], "exclude each other"),
        (["--rate", "2", "--duration", "5", "--requests", "10"], "--duration and --requests exclude each other"),
        (["--duration", "5"], "--duration applies to open-loop levels only"),
        (["--max-concurrency", "4", "--arrivals", "constant"], "--arrivals, --max-concurrency apply to open-loop"),
        (["--rate", "0"], "distinct comma-separated request rates"),
        (["--rate", "2,2"], "'2,2': 2 given twice; expected up to 64 distinct comma-separated request rates"),
        (["--rate", "1,,2"], "'1,,2' has an empty piece between commas; expected"),
        (["--rate", "2,x"], "distinct comma-separated request rates"),
        (["--rate", "inf"], "distinct comma-separated request rates"),
        (["--rate", "20000"], "at most 10000"),
        (["--rate", "2", "--arrivals", "gamma"], "gamma needs its coefficient of variation"),
        (["--rate", "2", "--arrivals", "gamma:0"], "gamma needs its coefficient of variation"),
        (["--rate", "2", "--arrivals", "uniform"], "expected poisson, constant or gamma:CV"),
        (["--rate", "2", "--duration", "0"], "--duration"),
        (["--rate", "2", "--requests", "0"], "--requests"),
        (["--rate", "2", "--max-concurrency", "0"], "--max-concurrency"),
        (["--rate", "10000", "--duration", "86400"], "requests per launch is over the limit"),
    ],
)
def test_bad_open_loop_options_exit_2_with_a_clear_line(
    args: list[str], message: str, capsys: Capsys, tmp_path: Path
) -> None:
    assert main([*AB, "--db", str(tmp_path / "r.db"), *args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err
    assert not (tmp_path / "r.db").exists() or "experiment" not in err  # refused before anything started


def test_bench_fail_on_slower_is_refused_with_rate(capsys: Capsys, tmp_path: Path) -> None:
    assert main(["bench", "baseline", "--sim", "--rate", "2", "--fail-on", "slower", "--db", str(tmp_path / "r")]) == 2
    assert "open-loop level (--rate) does not measure" in " ".join(capsys.readouterr().err.split())


def test_a_claim_refuses_rate(capsys: Capsys) -> None:
    assert main(["reproduce", "baseline", "--claim", "80", "--sim", "--rate", "2"]) == 2
    assert "--rate does not apply" in capsys.readouterr().err


def test_the_plan_line_counts_an_open_loop_level_by_its_schedule(capsys: Capsys, tmp_path: Path) -> None:
    from orchestrator.config import limits
    from orchestrator.config import profile as profiles_mod
    from orchestrator.config.workload import BenchConfig

    profiles = [profiles_mod.load("baseline"), profiles_mod.load("sim-eagle3-fast")]
    lines: list[str] = []
    bench = BenchConfig(runs=2, warmup=1, max_tokens=64, rate=(2.0, 8.0), duration_s=10.0)
    work = limits.checked_plan(bench, profiles, blocks=3, sim=True, show=lines.append)
    # 2 runs x (20 + 80) requests + 1 warmup; at least the schedules (3 blocks x 2 arms x 2 runs x 2 x 10 s)
    assert work.requests_per_launch == 201 and "about 201 requests" in lines[0]
    assert work.seconds > 3 * 2 * 2 * 2 * 10 and work.schedule_s == 240
    real = limits.checked_plan(bench, profiles, blocks=3, sim=False, show=lines.append)
    assert "at least 4 min of arrival schedules" in lines[1] and real.open_loop
    counted = BenchConfig(runs=1, warmup=0, max_tokens=64, rate=(4.0,), requests_per_level=40)
    assert limits.checked_plan(counted, profiles, blocks=1, sim=True).requests_per_launch == 40


# ---------------------------------------------------------------- one short open-loop A/B, shared


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Path]]:
    """baseline vs eagle3 (simulated, fast to load) at 4 and 16 req/s, 2 blocks: (db, experiment id, root)."""
    root = tmp_path_factory.mktemp("openloop")
    common = {"engine": "sglang", "model_path": "/m", "tp_size": 1, "sim": {**FAST_SIM, "load_s": 0.1}}
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    paths = []
    for name, extra in (("baseline", {}), ("eagle3", {"speculative": spec})):
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**common, **extra, "port": free_port()}))
        paths.append(str(path))
    db, work = root / "r.db", root / "work"
    options = RunOptions(
        profiles=tuple(paths),
        sim=True,
        blocks=2,
        runs=1,
        warmup=0,
        max_tokens=16,
        min_run_s=0,
        grace=2,
        gpu_wait=0,
        rate=(4.0, 16.0),
        duration=0.8,
        db=str(db),
        workdir=str(work),
        slo=parse_slo("e2e_p99=30s"),
        metric="e2e_p99",
        given=frozenset({"rate", "duration", "slo", "metric"}),
    )
    import io

    outcome = experiment.run(options, reporter=PlainReporter(io.StringIO()), warn=lambda line: None)
    yield db, outcome.result.experiment_id, root


def _json(capsys: Capsys, *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_each_rate_is_a_level_with_its_comparison_and_json_fields(
    stored: tuple[Path, str, Path], capsys: Capsys
) -> None:
    db, exp_id, _ = stored
    doc = _json(capsys, "show", exp_id, "--db", str(db))
    comparisons = doc["comparisons_by_concurrency"]
    assert [(c["rate"], c["concurrency"]) for c in comparisons] == [(4.0, None), (16.0, None)]
    assert all(c["blocks"] == 2 and c["ci95"] is not None and c["verdict"] for c in comparisons)
    arm = doc["arms"][1]
    levels = arm["by_concurrency"]
    assert [(lv["rate"], lv["concurrency"]) for lv in levels] == [(4.0, None), (16.0, None)]
    ol = levels[1]["open_loop"]
    assert ol["rate"] == 16.0 and ol["runs"] == 2 and ol["requests"] > 0
    assert {"scheduled_rate", "sent_rate", "achieved_rate", "achieved_ratio", "send_lag_p99_s", "held"} <= set(ol)
    assert {"ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "limited", "reason"} <= set(ol)
    run = arm["runs"][0]
    assert run["concurrency"] == 0 and run["rate"] == 4.0 and run["open_loop"]["arrivals"] == "poisson"
    assert [v["rate"] for v in doc["launches"][0]["values"]] == [4.0, 16.0]

    capsys.readouterr()
    assert main(["show", exp_id, "--db", str(db)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "tok/s per stream at 4 req/s (open loop" in text and "tok/s per stream at 16 req/s (open loop" in text
    assert "eagle3 vs baseline @ 4 req/s: " in text and "eagle3 vs baseline @ 16 req/s: " in text
    assert "baseline @ 16 req/s: achieved " in text and " scheduled (16 offered); TTFT p50 " in text


def test_the_markdown_report_names_rate_levels_in_its_headings(stored: tuple[Path, str, Path], capsys: Capsys) -> None:
    db, exp_id, _ = stored
    capsys.readouterr()
    assert main(["export", exp_id, "--format", "md", "--db", str(db)]) == 0
    md = capsys.readouterr().out
    for rate in ("4 req/s", "16 req/s"):
        assert f"### Goodput at {rate}\n" in md and f"### e2e_p99 at {rate}\n" in md
    assert "Rate(" not in md and "at concurrency" not in md


def test_a_level_whose_schedule_strays_from_its_rate_is_said_once(
    stored: tuple[Path, str, Path], capsys: Capsys
) -> None:
    db, exp_id, _ = stored
    doc = _json(capsys, "show", exp_id, "--db", str(db))
    # 0.8 s per run from the default seed: 6 requests due at 4 req/s (a draw at ~7.4 req/s), 17 at 16 (~19.6)
    strays = {lv["rate"]: lv["open_loop"]["scheduled_rate"] / lv["rate"] - 1 for lv in doc["arms"][0]["by_concurrency"]}
    said = [w for w in doc["warnings"] if "the seeded schedule's own rate" in w]
    assert strays[4.0] > 0.2 and said[0].startswith("@ 4 req/s the seeded schedule's own rate was ")
    assert [w.split(" req/s")[0] for w in said] == [f"@ {r:g}" for r, v in strays.items() if abs(v) > 0.2]
    assert f"({strays[4.0]:+.0%}; about " in said[0] and "a longer --duration" in said[0]


def test_every_request_records_when_it_was_due_and_how_late_it_went(
    stored: tuple[Path, str, Path], capsys: Capsys
) -> None:
    db, exp_id, _ = stored
    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT launch_id, run_rate, run_idx, idx, scheduled_s, send_lag_s FROM requests WHERE run_warmup = 0"
    ).fetchall()
    assert rows and all(rate in (4.0, 16.0) and lag is not None and lag >= 0 for _, rate, _, _, _, lag in rows)
    by_launch: dict[str, list[tuple[float, int, int, float]]] = {}
    for launch, rate, run, idx, due, _ in rows:
        by_launch.setdefault(launch, []).append((rate, run, idx, due))
    schedules = [sorted(v) for v in by_launch.values()]
    assert len(schedules) == 4 and all(s == schedules[0] for s in schedules)  # every arm and launch: the same
    capsys.readouterr()
    assert main(["export", exp_id, "--db", str(db), "--format", "jsonl"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["rate"] == 4.0 and first["scheduled_s"] == 0.0 and first["concurrency"] == 0


def test_a_bundle_carries_the_open_loop_fields_and_reads_back_the_same(
    stored: tuple[Path, str, Path], capsys: Capsys, tmp_path: Path
) -> None:
    db, exp_id, _ = stored
    path = tmp_path / "ol.orch.json"
    assert main(["export", exp_id, "--db", str(db), "--format", "bundle", "-o", str(path)]) == 0
    bundle = bundleformat.read_bundle(path)
    bench = bundle["content"]["config"]["bench"]
    assert bench["rate"] == [4.0, 16.0] and bench["duration_s"] == 0.8 and bench["arrivals"] == "poisson"
    run = bundle["content"]["launches"][0]["runs"][0]
    assert run["rate"] == 4.0 and run["concurrency"] == 0
    assert {"scheduled_s", "send_lag_s", "queued_s"} <= set(run["per_request"][0])
    before = _json(capsys, "show", exp_id, "--db", str(db))
    after = _json(capsys, "show", str(path))
    assert after["comparisons_by_concurrency"] == before["comparisons_by_concurrency"]
    other = tmp_path / "other.db"
    assert main(["import", str(path), "--db", str(other)]) == 0
    assert _json(capsys, "show", exp_id, "--db", str(other))["arms"] == before["arms"]

    bad = json.loads(path.read_text())
    bad["content"]["launches"][0]["runs"][0]["concurrency"] = 1  # an open-loop run with a concurrency: not orch's
    bad["digest"] = bundleformat.digest_of(bad)
    broken = tmp_path / "bad.orch.json"
    broken.write_text(json.dumps(bad))
    capsys.readouterr()
    assert main(["show", str(broken)]) == 2
    assert "an open-loop run has concurrency 0" in capsys.readouterr().err


def test_resume_refuses_another_schedule(stored: tuple[Path, str, Path], capsys: Capsys) -> None:
    db, exp_id, _ = stored
    for args, flag in ((["--rate", "4"], "--rate"), (["--arrivals", "constant"], "--arrivals")):
        capsys.readouterr()
        assert main(["ab", "--resume", exp_id, "--db", str(db), *args]) == 2
        assert f"drop {flag}" in capsys.readouterr().err


@pytest.mark.slow
def test_reproducing_the_bundle_sends_the_same_schedule(
    stored: tuple[Path, str, Path], capsys: Capsys, tmp_path: Path
) -> None:
    db, exp_id, root = stored
    path = tmp_path / "ol.orch.json"
    assert main(["export", exp_id, "--db", str(db), "--format", "bundle", "-o", str(path)]) == 0
    new_db = tmp_path / "new.db"
    capsys.readouterr()
    # Its profiles were files, not this machine's profiles of those names: it runs when told to (--trust-bundle).
    code = main(
        ["reproduce", str(path), "--trust-bundle", "--db", str(new_db), "--workdir", str(root / "work2"), "--json"]
    )
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert code in (0, 3, 4), doc  # reproduced or not, it ran: the schedule is what is checked here
    said = "the same requests as recorded (prompts, output lengths and every request's due time): requests_sha256 "
    assert said in out.err, out.err
    # both rates judged, each with its verdict
    assert [lv["rate"] for lv in doc["reproduction"]["levels"]] == [4.0, 16.0], doc["reproduction"]

    def schedule(path: Path) -> list[tuple[float, int, int, float]]:
        rows = (
            sqlite3.connect(path)
            .execute("SELECT run_rate, run_idx, idx, scheduled_s FROM requests WHERE run_warmup = 0")
            .fetchall()
        )
        return sorted(set(rows))

    assert schedule(new_db) == schedule(db)


@pytest.mark.slow
def test_the_bundled_scenario_at_two_rates(capsys: Capsys, tmp_path: Path) -> None:
    """The issue's command, small: sim-eagle3-fast against baseline at 2 and 8 req/s, a verdict line per level."""
    args = [*AB, "--rate", "2,8", "--duration", "2", "--runs", "1", "--warmup", "0", "--max-tokens", "32"]
    args += ["--blocks", "2", "--min-run-s", "0", "--port", str(free_port()), "--db", str(tmp_path / "r.db")]
    args += ["--workdir", str(tmp_path / "w"), "--json"]
    code = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    rates = [(c["arm"], c["rate"], c["verdict"]) for c in doc["comparisons_by_concurrency"]]
    assert [r[:2] for r in rates] == [("sim-eagle3-fast", 2.0), ("sim-eagle3-fast", 8.0)] and all(r[2] for r in rates)
