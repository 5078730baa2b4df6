"""llama.cpp under open-loop load: a real `orch ab cpu-baseline cpu-pld --rate ...` sweep on this CPU, and what it
showed the results model must survive (a short run at a saturated rate that receives no token while requests still
arrive)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil
import pytest

from orchestrator.results.comparison import Comparison
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from tests.conftest import finish, run_orch
from tests.engines.test_llamacpp import children_gone, cpu_profiles, real  # noqa: F401 (a fixture)

RATES = (1.0, 16.0)
REQUESTS = 4
TOKENS = 12


@real
@pytest.mark.slow
def test_a_real_open_loop_sweep_of_prompt_lookup_on_this_cpu(
    cpu_profiles: tuple[Path, Path],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Two rates, one the 2-slot server keeps up with and one it cannot, 2 blocks (the crossover needs two), and a
    client cap of 2 in flight (the server's slots): requests due while 2 are in flight wait in the client, which is
    where latency counted from the scheduled time shows. Behaviour only: this CPU's speed decides nothing here."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    base, pld = cpu_profiles
    db = tmp_path / "r.db"
    sweep = ["--rate", ",".join(f"{r:g}" for r in RATES), "--requests", str(REQUESTS), "--max-concurrency", "2"]
    design = ["--blocks", "2", "--runs", "1", "--warmup", "0", "--max-tokens", str(TOKENS), "--min-run-s", "0"]
    args = ["ab", str(base), str(pld), *sweep, *design, "--prompts", "lookup-friendly", "--json", "--db", str(db)]
    proc = run_orch(*args, cwd=tmp_path)
    out, err = finish(proc, 600)  # 3.5 min at load average 10-14 on 2 cores; 25 s quiet
    assert proc.returncode == 0, out + err
    doc = json.loads(out)
    assert doc["simulated"] is False and doc["status"] == "complete" and "SIMULATED" not in out + err

    # Every level has both arms, each run with its offered, scheduled and achieved rate.
    for arm in doc["arms"]:
        assert [lv["rate"] for lv in arm["by_concurrency"]] == list(RATES)
        for lv in arm["by_concurrency"]:
            ol = lv["open_loop"]
            assert ol["rate"] == lv["rate"] and ol["runs"] == 2 and ol["requests"] == 2 * REQUESTS
            assert ol["achieved_rate"] > 0 and ol["scheduled_rate"] > 0 and ol["ttft_p99_s"] >= ol["ttft_p50_s"] > 0
            assert ol["limited"] in (None, "client", "server") and (ol["limited"] is None) == (ol["reason"] is None)
        for run in arm["runs"]:
            assert run["valid"] and run["tokens"] == REQUESTS * TOKENS and run["concurrency"] == 0
            ol = run["open_loop"]
            assert ol["offered_rate"] == run["rate"] and ol["sent"] == ol["completed"] == REQUESTS
            assert ol["achieved_rate"] > 0 and ol["peak_in_flight"] <= 2
    assert doc["arms"][1]["accept_length"] > 1.0  # the lookup arm speculated under load too

    # Latency counts from the scheduled time: a request the cap held has its wait inside its TTFT.
    held = 0
    for launch in Store(db).launches(doc["experiment_id"]):
        for row in Store(db).requests(launch["launch_id"]):
            assert row["ttft_s"] >= row["send_lag_s"] >= row["queued_s"] >= 0 and row["e2e_s"] >= row["ttft_s"]
            held += row["queued_s"] > 0
    assert held > 0, "at 16 req/s with 2 in flight, some request must have waited in the client"

    # Per level, the comparison over both blocks; and the crossover statement over the levels.
    comps = doc["comparisons_by_concurrency"]
    assert [c["rate"] for c in comps] == list(RATES)
    for c in comps:
        assert c["arm"] == "cpu-lookup" and c["blocks"] == 2 and c["ratio"] > 0 and c["ci95"] is not None
        assert c["verdict"] in ("faster", "slower", "no difference", "inconclusive")
    (cross,) = doc["crossovers"]
    assert cross["arm_label"] == "cpu-lookup" and cross["levels"] == list(RATES) and cross["blocks"] == 2
    assert cross["status"] in ("crosses", "pays throughout", "never pays", "undecided")

    # Stored: `orch show` reads the same experiment back and says all of it in text.
    show = run_orch("show", doc["experiment_id"], "--db", str(db), cwd=tmp_path)
    text, err = show.communicate(timeout=60)
    assert show.returncode == 0, text + err
    for label in ("cpu-base", "cpu-lookup"):
        for rate in RATES:
            assert re.search(rf"^  {label} @ {rate:g} req/s: achieved [\d.]+ req/s of [\d.]+ scheduled ", text, re.M)
    for rate in RATES:
        assert f"cpu-lookup vs cpu-base @ {rate:g} req/s: " in text
    said = re.search(r"^  crossover: cpu-lookup vs cpu-base: (.+)$", text, re.M)
    assert said is not None, text
    assert re.match(r"pays (below|above) ~|does not cross in the range measured|no crossing seen", said.group(1))
    children_gone(before)


# ---------------------------------------------------------------- a zero aggregate must not cost the verdict a block


def _launch(arm: int, block: int, tok_s: float, aggregate: float) -> LaunchResult:
    run = RunResult(
        index=0, warmup=False, tokens=64, seconds=1.0, tok_s=tok_s, prompt_tokens=30, ttft_s=0.5, concurrency=0,
        aggregate_tok_s=aggregate, requests=4, rate=16.0,
    )  # fmt: skip
    profile = "cpu-baseline" if arm == 0 else "cpu-pld"
    return LaunchResult(
        profile=profile, launch_id=f"L{block}-{arm}", runs=(run,), ready_s=1.0, env_report={"ok": True},
        teardown={}, block=block, position=arm, arm_index=arm,
    )  # fmt: skip


def _comparisons(launches: list[LaunchResult]) -> list[Comparison]:
    result = ABResult(
        experiment_id="e",
        simulated=False,
        host="local",
        profiles=("cpu-baseline", "cpu-pld"),
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, 2, "fixed", 0),
    )
    return result.comparisons_at(result.levels[0])


def test_a_block_whose_run_got_no_token_while_requests_arrived_still_counts_in_the_verdict() -> None:
    """Seen in the real sweep: at 4 req/s, 4 requests were all due within 0.54 s, before the lookup arm's first token,
    so that run's aggregate tok/s (tokens received while requests were arriving) was 0; the verdict on tok/s per
    stream then fell back to one of its two blocks ('one launch per arm'). The aggregate ratio leaves that block
    out; the verdict keeps it."""
    launches = [
        _launch(0, 0, 20.0, 28.0),
        _launch(1, 0, 10.0, 0.0),
        _launch(0, 1, 20.0, 28.0),
        _launch(1, 1, 25.0, 32.0),
    ]
    (comp,) = _comparisons(launches)
    assert comp.estimate is not None and comp.estimate.blocks == 2
    assert comp.ratio == pytest.approx((0.5 * 1.25) ** 0.5)
    assert comp.aggregate_ratio == pytest.approx(32.0 / 28.0)
    # With no block left for the aggregate, there is no aggregate ratio, and still a verdict.
    launches[3] = _launch(1, 1, 25.0, 0.0)
    (comp,) = _comparisons(launches)
    assert comp.estimate is not None and comp.estimate.blocks == 2 and comp.aggregate_ratio is None
