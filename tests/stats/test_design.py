"""Blocked designs and the A/B analysis on synthetic launches: schedules, per-arm spread, verdicts, warnings, the
JSON/CSV/Markdown outputs and the store round trip (migrations included). No servers: these are pure."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import StoreError
from orchestrator.hosts.lock import host_lock_path
from orchestrator.report.csvrows import ab_csv
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.load import load_result, stored_launches
from orchestrator.results.model import ABResult, CutShort, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.results.schema import MIGRATIONS, SCHEMA_VERSION
from orchestrator.results.store import Store
from orchestrator.stats.estimates import arm_spread, outliers, relative_range, schedule, slow_first_run
from orchestrator.ui.events import Lines

# ------------------------------------------------------------------ pure helpers


def test_schedule_orders() -> None:
    assert schedule(2, 4, "fixed", 0) == [[0, 1]] * 4
    assert schedule(2, 4, "abba", 0) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert schedule(3, 2, "abba", 0) == [[0, 1, 2], [2, 1, 0]]
    rnd = schedule(3, 50, "random", 7)
    assert rnd == schedule(3, 50, "random", 7)  # seeded: a resume gets the same order
    assert rnd != schedule(3, 50, "random", 8)
    assert all(sorted(b) == [0, 1, 2] for b in rnd)  # every block launches every arm once
    assert len({tuple(b) for b in rnd}) == 6  # and all orders occur
    with pytest.raises(ValueError, match="order must be one of random, fixed, abba"):
        schedule(2, 1, "zigzag", 0)
    with pytest.raises(ValueError):
        schedule(2, 0, "fixed", 0)


def test_arm_spread_separates_within_from_across() -> None:
    # Two launches, each perfectly steady, 10 % apart: all the noise is between launches.
    s = arm_spread([[80.0, 80.0, 80.0], [88.0, 88.0, 88.0]])
    assert (s.launches, s.runs, s.median) == (2, 6, 84.0)
    assert (s.launch_min, s.launch_max) == (80.0, 88.0)
    assert s.cv_within == 0.0
    assert s.cv_across == pytest.approx(math.sqrt(32) / 84.0)
    one = arm_spread([[81.0, 83.0]])
    assert one.cv_across is None and one.cv_within == pytest.approx(math.sqrt(2) / 82.0)
    assert arm_spread([[], [82.0]]).launches == 1  # a launch without valid runs is not a launch value
    with pytest.raises(ValueError):
        arm_spread([[]])


def test_outliers_need_enough_values_and_a_real_distance() -> None:
    assert outliers([82.2, 82.1, 82.3, 82.2, 75.0]) == [4]
    assert outliers([82.2, 82.1, 75.0]) == []  # three values: MAD too crude
    assert outliers([82.20, 82.21, 82.19, 82.20, 82.30]) == []  # huge z, but 0.1 % is not worth a warning
    assert outliers([82.0, 82.1, 85.5], min_rel=0.03, min_n=3) == [2]  # launches: 3 are enough, 3 % apart


def test_slow_first_run() -> None:
    assert slow_first_run([70.0, 82.1, 82.3, 82.2])
    assert not slow_first_run([82.0, 82.1, 82.3, 82.2])
    assert not slow_first_run([70.0, 82.1, 82.3])  # too few runs to tell
    assert not slow_first_run([60.0, 55.0, 66.0, 62.0])  # ordinary spread of a speculative arm
    assert not slow_first_run([90.0, 82.1, 82.3, 82.2])  # fast is not slow


def test_relative_range() -> None:
    assert relative_range([1410, 1410]) == 0.0
    assert relative_range([2430, 1980]) == pytest.approx(2430 / 1980 - 1)
    assert relative_range([5.0]) == 0.0


# ------------------------------------------------------------------ ABResult on synthetic launches


def _run(i: int, tok_s: float, level: int = 1, warmup: bool = False, accept: float | None = None) -> RunResult:
    return RunResult(
        index=i,
        warmup=warmup,
        tokens=2048,
        seconds=2048 / tok_s,
        tok_s=tok_s,
        prompt_tokens=30,
        ttft_s=0.02,
        spec_accept_length=accept,
        concurrency=level,
        aggregate_tok_s=tok_s * level,
        metrics={"itl": {"p50": 1 / tok_s, "p99": 1.2 / tok_s}},
    )


def _launch(
    arm: int, block: int, values: list[float], *, name: str | None = None, gpus: dict[str, Any] | None = None
) -> LaunchResult:
    runs = (_run(0, 10.0, warmup=True), *(_run(i, v) for i, v in enumerate(values)))
    return LaunchResult(
        profile=name or ("baseline" if arm == 0 else "candidate"),
        launch_id=f"L{block}-{arm}",
        runs=runs,
        ready_s=4.0,
        env_report={"ok": True},
        teardown={},
        block=block,
        position=arm,
        arm_index=arm,
        gpus=gpus,
    )


def _result(blocks: list[tuple[list[float], list[float]]], **kw: Any) -> ABResult:
    launches = []
    for b, (base, cand) in enumerate(blocks):
        launches += [_launch(0, b, base), _launch(1, b, cand)]
    design = Design.make(2, len(blocks), "fixed", 0)
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("baseline", "candidate"),
        launches=tuple(launches),
        host_facts={},
        design=design,
        **kw,
    )


def _noisy(rng: random.Random, mean: float, restart_sd: float, n: int = 5) -> list[float]:
    factor = math.exp(rng.gauss(0, restart_sd))
    return [mean * factor * math.exp(rng.gauss(0, 0.001)) for _ in range(n)]


def test_clear_effect_is_called_with_a_ci_and_mde() -> None:
    rng = random.Random(1)
    result = _result([(_noisy(rng, 82.0, 0.005), _noisy(rng, 61.0, 0.005)) for _ in range(4)])
    (cmp,) = result.comparisons
    assert cmp.verdict == "slower"
    assert cmp.estimate is not None and cmp.estimate.blocks == 4
    assert cmp.estimate.lo < cmp.ratio < cmp.estimate.hi < 1.0
    assert cmp.ratio == pytest.approx(61 / 82, rel=0.02)
    assert cmp.mde is not None and 0 < cmp.mde < 0.05
    doc = ab_json(result)
    assert doc["blocks"] == 4 and len(doc["launches"]) == 8
    c = doc["comparisons"][0]
    assert {"arm", "vs", "ratio", "ci95", "verdict", "mde"} <= set(c)
    assert c["verdict"] == "slower" and c["ci95"][0] < c["ratio"] < c["ci95"][1]
    assert doc["arms"][0]["launches"] == 4 and len(doc["arms"][0]["runs"]) == 20
    assert doc["arms"][0]["spread"]["cv_across"] is not None
    text = ab_text(result)
    assert "candidate vs baseline @ 1: " in text and "over 4 blocks -> SLOWER by" in text


def test_identical_arms_are_no_difference_and_noisy_ones_inconclusive() -> None:
    rng = random.Random(2)
    same = _result([(_noisy(rng, 82.0, 0.002), _noisy(rng, 82.0, 0.002)) for _ in range(5)])
    assert same.comparisons[0].verdict == "no difference"
    noisy = _result([(_noisy(rng, 82.0, 0.05), _noisy(rng, 82.0, 0.05)) for _ in range(3)])
    cmp = noisy.comparisons[0]
    assert cmp.verdict == "inconclusive"
    assert cmp.blocks_needed is not None and cmp.blocks_needed > 3
    assert cmp.advice is not None and f"about {cmp.blocks_needed} blocks would likely show whether" in cmp.advice
    assert cmp.advice in ab_text(noisy)
    # A looser minimum effect of interest turns the same data into "no difference" once the CI fits inside it.
    loose = _result([(_noisy(rng, 82.0, 0.002), _noisy(rng, 82.0, 0.002)) for _ in range(3)], min_effect=0.2)
    assert loose.comparisons[0].verdict == "no difference"


def test_one_block_is_never_a_verdict_and_says_why() -> None:
    result = _result([([82.1, 82.2, 82.3], [94.0, 94.1, 94.2])])
    cmp = result.comparisons[0]
    assert cmp.verdict == "inconclusive" and cmp.ratio == pytest.approx(94.1 / 82.2)
    assert any("one launch per arm" in w for w in result.warnings())
    assert "one launch per arm cannot separate restart noise" in ab_text(result)
    assert ab_json(result)["comparisons"][0]["ci95"] is None  # one block's interval holds only run noise


def test_only_complete_blocks_are_paired() -> None:
    base_only = _launch(0, 2, [82.0] * 3)
    result = _result([([82.0] * 3, [80.0] * 3), ([82.5] * 3, [80.4] * 3)])
    partial = ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=result.profiles,
        launches=(*result.launches, base_only),
        host_facts={},
        design=Design.make(2, 3, "fixed", 0),
    )
    assert partial.blocks == 2
    assert partial.comparisons[0].estimate is not None and partial.comparisons[0].estimate.blocks == 2
    assert "block 3: baseline 82.0, candidate not run" in ab_text(partial)


def test_warnings_outlier_slow_first_far_launch_gpu_drift() -> None:
    blocks = [
        ([70.0, 82.1, 82.3, 82.2, 82.2], [82.0, 82.1, 82.0, 82.1, 82.0]),  # slow first run in baseline block 1
        ([82.0, 82.1, 82.2, 82.1, 75.0], [82.0, 82.1, 82.0, 82.1, 82.0]),  # outlier run 5
        ([82.0, 82.1, 82.2, 82.1, 82.0], [90.0, 90.1, 90.0, 90.1, 90.0]),  # a far launch of the candidate
    ]
    result = _result(blocks)
    warnings = "\n".join(result.warnings())
    assert "slow first run: baseline (block 1): run 1 gave 70.0 tok/s" in warnings
    assert "outlier run: baseline (block 2) run 5: 75.0 tok/s" in warnings
    assert "far launch: candidate block 3: 90.0 tok/s vs the arm's median launch 82.0" in warnings
    assert "GPU" not in warnings

    def gpus(clock: int, temp: int) -> dict[str, Any]:
        return {"available": True, "gpus": [{"index": 0, "clocks.sm": clock, "temperature.gpu": temp}]}

    steady = [_launch(i % 2, i // 2, [82.0] * 3, gpus=gpus(2430, 61)) for i in range(4)]
    drift = [*steady[:3], _launch(1, 1, [82.0] * 3, gpus=gpus(1980, 83))]
    ok = ABResult(
        experiment_id="e",
        simulated=True,
        host="h",
        profiles=("baseline", "candidate"),
        launches=tuple(steady),
        host_facts={},
        design=Design.make(2, 2, "fixed", 0),
    )
    bad = ABResult(
        experiment_id="e",
        simulated=True,
        host="h",
        profiles=("baseline", "candidate"),
        launches=tuple(drift),
        host_facts={},
        design=Design.make(2, 2, "fixed", 0),
    )
    assert not [w for w in ok.warnings() if "GPU" in w]
    text = "\n".join(bad.warnings())
    assert "GPU 0 SM clock under load changed between launches (MHz: baseline/block 1 2430" in text
    assert "candidate/block 2 1980" in text
    assert "GPU 0 temperature under load changed" in text

    # Only the GPUs a launch used count: by its processes, else by utilization at the reading.
    def on_gpu1(launch: LaunchResult, clock0: int) -> LaunchResult:
        state = {
            "available": True,
            "gpus": [{"index": 0, "clocks.sm": clock0, "utilization.gpu": 0}, {"index": 1, "clocks.sm": 2430}],
            "apps": [{"gpu_index": 1, "launch_id": launch.launch_id}],
        }
        return dataclasses.replace(launch, gpus=state)

    idle_gpu_moves = tuple(on_gpu1(la, 1410 if i else 210) for i, la in enumerate(steady))
    assert not [
        w
        for w in ABResult(
            experiment_id="e",
            simulated=True,
            host="h",
            profiles=ok.profiles,
            launches=idle_gpu_moves,
            host_facts={},
            design=ok.design,
        ).warnings()
        if "GPU" in w
    ]
    no_apps = tuple(dataclasses.replace(la, gpus={**(la.gpus or {}), "apps": []}) for la in idle_gpu_moves)
    assert not [
        w
        for w in ABResult(
            experiment_id="e",
            simulated=True,
            host="h",
            profiles=ok.profiles,
            launches=no_apps,
            host_facts={},
            design=ok.design,
        ).warnings()
        if "GPU" in w
    ]


def test_csv_and_markdown_exports() -> None:
    result = _result([([82.0, 82.1], [61.0, 60.0]), ([82.2, 82.3], [60.5, 61.5])])
    rows = list(csv.DictReader(io.StringIO(ab_csv(result))))
    assert len(rows) == 8  # timed runs only; warmups are not data
    assert rows[0]["profile"] == "baseline" and rows[0]["block"] == "1" and rows[0]["run"] == "1"
    assert rows[0]["label"] == "baseline" and rows[-1]["arm_index"] == "1"
    assert float(rows[-1]["tok_s"]) == 61.5
    md = ab_markdown(result)
    assert md.startswith("# A/B exp on local")
    assert "**SIMULATED" in md
    assert "| baseline | 2 | 4 |" in md
    assert "- candidate vs baseline @ 1: " in md


# ------------------------------------------------------------------ the store: design, launches, migration


def _store_experiment(store: Store, exp_id: str, values: dict[tuple[int, int], list[float]], status: str) -> None:
    design = Design.make(2, 2, "random", 5)
    store.create_experiment(
        exp_id,
        kind="ab",
        simulated=True,
        host="local",
        arms=["baseline", "candidate"],
        config={"bench": {"runs": 2}, "host_facts": {}, "profiles": [], "min_effect": 0.05},
        orch_version="t",
        design=design.to_dict(),
    )
    for (block, arm), vals in values.items():
        lid = f"{exp_id}-{block}-{arm}"
        store.add_launch(
            lid,
            experiment_id=exp_id,
            arm_index=arm,
            block=block,
            position=design.schedule[block].index(arm),
            profile=["baseline", "candidate"][arm],
            profile_dict={"speculative": {"num_steps": 2}} if arm else {"speculative": None},
            argv=[],
            env={},
            pid=1,
            started_at=float(block * 2 + arm),
        )
        for i, v in enumerate(vals):
            store.add_run(lid, _run(i, v).to_dict())
        store.update_launch(lid, status="complete" if vals else "interrupted", env_report_json={"ok": True})
    store.finish_experiment(exp_id, status)


def test_load_result_round_trips_and_reports_partial_experiments(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    _store_experiment(
        store,
        "20261129-1",
        {(0, 0): [82.0, 82.1], (0, 1): [60.0, 61.0], (1, 0): [81.0, 81.5], (1, 1): []},
        "interrupted",
    )
    result = load_result(store, "20261129")  # a unique prefix is enough
    assert result.status == "interrupted" and result.min_effect == 0.05
    assert result.design == Design.make(2, 2, "random", 5)
    assert [(launch.block, launch.arm_index) for launch in result.launches] == [(0, 0), (0, 1), (1, 0)]
    assert result.arms[1].spec_steps == 2 and result.arms[0].spec_steps is None
    assert result.blocks == 1
    assert any(
        "interrupted after 3 of 4 launches; continue it with: orch ab --resume 20261129-1" in n for n in result.notes
    )
    assert any("1 launch(es) cut short" in n for n in result.notes)
    launches, discarded = stored_launches(store, "20261129-1")
    assert discarded == [CutShort(1, 1, "interrupted")] and launches[1].runs[1].tok_s == 61.0
    _store_experiment(store, "20261129-2", {(0, 0): [82.0], (0, 1): [60.0]}, "complete")
    with pytest.raises(StoreError, match="matches several experiments"):
        store.find_experiment("20261129")
    with pytest.raises(StoreError, match="no experiment 'nope'"):
        store.find_experiment("nope")
    assert store.find_experiment("last")["id"] == "20261129-2"
    listed = store.experiments()
    assert [e["launches_complete"] for e in listed] == [2, 3]
    store.close()


def test_migration_from_version_2_keeps_old_experiments_readable(tmp_path: Path) -> None:
    db = tmp_path / "v2.db"
    c = sqlite3.connect(db)
    for i, script in enumerate(MIGRATIONS[:2]):
        c.executescript(script + f"; PRAGMA user_version = {i + 1};")
    c.execute(
        "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json, orch_version)"
        " VALUES ('old', 'ab', 0, 'complete', 1, 'local', '[\"a\", \"b\"]', '{}', '0.1')"
    )
    for arm in (0, 1):
        c.execute(
            "INSERT INTO launches (launch_id, experiment_id, arm_index, profile, profile_json, argv_json, env_json,"
            " started_at, status) VALUES (?, 'old', ?, ?, '{}', '[]', '{}', ?, 'complete')",
            (f"l{arm}", arm, "ab"[arm], float(arm)),
        )
        c.execute(
            "INSERT INTO runs (launch_id, idx, warmup, concurrency, tokens, seconds, tok_s, prompt_tokens, valid,"
            " finished_at) VALUES (?, 0, 0, 1, 100, 1.0, ?, 10, 1, 0)",
            (f"l{arm}", 80.0 + arm),
        )
    c.commit()
    c.close()
    store = Store(db)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    result = load_result(store, "old")
    assert [(launch.block, launch.position) for launch in result.launches] == [(0, 0), (0, 1)]
    assert result.comparisons[0].ratio == pytest.approx(81 / 80)
    assert not any("resume" in n for n in result.notes)  # complete, and an old one cannot be resumed anyway
    assert json.loads(json.dumps(ab_json(result)))["blocks"] == 1
    store.close()


def test_resume_refuses_changed_profiles_and_finished_experiments(tmp_path: Path, write_profile: Any) -> None:
    from orchestrator.config.design import ABConfig, bench_config_from
    from orchestrator.config.profile import load
    from orchestrator.config.workload import BenchConfig
    from orchestrator.errors import OrchError
    from orchestrator.experiment.ab import experiment_config
    from orchestrator.experiment.host import facts_changed
    from orchestrator.experiment.resume import check_resumable

    path = write_profile("arm", engine="sglang", model_path="/m", tp_size=1, port=8123, env={"NCCL_PROTO": "LL"})
    prof = load(str(path))
    bench = BenchConfig(runs=3, concurrency=(1, 8), prompts="random", input_len=64)
    config = experiment_config([prof], ABConfig(bench=bench), {"python": "3.12"}, {"host_spec": "local"})
    assert config["host_spec"] == "local" and config["profile_sources"] == [str(path.resolve())]
    assert bench_config_from(config["bench"]) == bench  # the workload survives the JSON round trip exactly
    exp = {
        "id": "e",
        "kind": "ab",
        "status": "interrupted",
        "design_json": json.dumps(Design.make(1, 2, "random", 1).to_dict()),
        "config_json": json.dumps(config),
    }
    check_resumable(exp, [prof])  # unchanged: fine
    path.write_text(path.read_text().replace("LL", "Simple"))
    with pytest.raises(OrchError, match=r"profile 'arm' changed since experiment e started \(fields: env\)"):
        check_resumable(exp, [load(str(path))])
    with pytest.raises(OrchError, match="already complete"):
        check_resumable({**exp, "status": "complete"}, [prof])
    with pytest.raises(OrchError, match="older orch without a design"):
        check_resumable({**exp, "design_json": None}, [prof])
    assert facts_changed({"python": "3.12", "boot_time": 1}, {"python": "3.13", "boot_time": 1}) == ["python"]
    # boot_time moves with a wall-clock step; the kernel's boot_id says whether the machine rebooted
    booted = {"boot_id": "b-1", "boot_time": 1}
    assert facts_changed(booted, {**booted, "boot_time": 3601}) == []
    assert facts_changed(booted, {"boot_id": "b-2", "boot_time": 3601}) == ["boot_id"]  # a reboot
    assert facts_changed({"boot_time": 1}, {"boot_time": 3601}) == ["boot_time"]  # no boot_id: as before
    check_resumable(exp, [prof], bench)  # same requests
    with pytest.raises(OrchError, match="the requests of experiment e changed"):
        check_resumable(exp, [prof], BenchConfig(runs=3, concurrency=(1, 8), prompts="random", input_len=65))


def test_resume_must_run_on_the_same_machine() -> None:
    from orchestrator.errors import OrchError
    from orchestrator.experiment.resume import check_same_machine

    box = {"hostname": "gpu-box", "gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]}
    check_same_machine("e", box, {**box, "boot_time": 5})
    check_same_machine("e", box, {**box, "hostname": "container-2"})  # the GPUs say it is the same machine
    with pytest.raises(OrchError, match="must run on the same GPUs"):
        check_same_machine("e", box, {**box, "gpus": [{"uuid": "GPU-c"}, {"uuid": "GPU-b"}]})
    with pytest.raises(OrchError, match=r"this host has none readable \(nvidia-smi not found\)"):
        check_same_machine("e", box, {"hostname": "gpu-box", "gpus": [], "gpu_error": "nvidia-smi not found"})
    cpu = {"hostname": "laptop", "gpus": []}
    check_same_machine("e", cpu, {**cpu})
    with pytest.raises(OrchError, match="ran on machine 'laptop'; this host is 'other'"):
        check_same_machine("e", cpu, {**cpu, "hostname": "other"})


def test_levels_keep_their_run_order_and_partial_experiments_say_so(tmp_path: Path) -> None:
    def launch(arm: int, block: int, levels: tuple[int, ...]) -> LaunchResult:
        runs = tuple(_run(i, 50.0 * c if c > 1 else 80.0 + i, level=c) for c in levels for i in range(2))
        return LaunchResult(
            profile=f"p{arm}",
            launch_id=f"L{block}{arm}",
            runs=runs,
            ready_s=1.0,
            env_report={"ok": True},
            teardown={},
            block=block,
            arm_index=arm,
        )

    # Interrupted after one launch, which was the second arm's: the levels still come from what ran.
    partial = ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("p0", "p1"),
        launches=(launch(1, 0, (8, 1)),),
        host_facts={},
        design=Design.make(2, 3, "random", 0),
    )
    assert partial.levels == [8, 1]
    assert any(
        "only 0 of 3 blocks complete: no verdict until at least two are (orch ab --resume exp)" in w
        for w in partial.warnings()
    )
    assert not any("use --blocks 3" in w for w in partial.warnings())
    text = ab_text(partial)
    assert "tok/s per stream at concurrency 8" in text
    # The store hands runs back in the order they ran, so a stored result has the live result's headline level.
    store = Store(tmp_path / "r.db")
    store.create_experiment("e", kind="ab", simulated=True, host="local", arms=["p0"], config={}, orch_version="t")
    store.add_launch(
        "l", experiment_id="e", arm_index=0, profile="p0", profile_dict={}, argv=[], env={}, pid=1, started_at=0.0
    )
    for r in launch(0, 0, (8, 1)).runs:
        store.add_run("l", r.to_dict())
    store.update_launch("l", status="complete")
    assert load_result(store, "e").levels == [8, 1]
    store.close()


def test_interrupt_right_after_the_experiment_is_stored_still_marks_it(tmp_path: Path, write_profile: Any) -> None:
    """No window in which Ctrl-C leaves an experiment `running` for ever (nothing is launched here)."""
    from orchestrator.config.design import ABConfig
    from orchestrator.config.profile import load
    from orchestrator.experiment.ab import run_ab
    from orchestrator.hosts.local import LocalHost

    prof = load(str(write_profile("arm", engine="sglang", model_path="/m", tp_size=1, port=8123)))
    store = Store(tmp_path / "r.db")

    def interrupt(msg: str) -> None:
        if msg.startswith("experiment "):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_ab(LocalHost(), [prof, prof], ABConfig(simulate=True), store, events=Lines(interrupt))
    (exp,) = store.experiments()
    assert exp["status"] == "interrupted"
    host = LocalHost()
    assert host.call("lock", path=host_lock_path(), holder={"session": "other"}, wait_s=0)["acquired"]  # released
    host.call("unlock", path=host_lock_path())
    store.close()
