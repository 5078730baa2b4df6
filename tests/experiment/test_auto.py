"""`--blocks auto` end to end: a simulated `orch ab` that stops early on a big effect, and an auto experiment
interrupted and resumed (its statistics: tests/stats/test_sequential.py)."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.agent import ops
from tests.conftest import NAMESPACE, run_orch, wait_for_line

SimProfiles = Callable[..., dict[str, Path]]

# ------------------------------------------------------------------ boundaries: known values


# ------------------------------------------------------------------ advice about the question asked


# ------------------------------------------------------------------ a simulated `orch ab --blocks auto`

COMMON = ("--runs", "2", "--warmup", "1", "--max-tokens", "40", "--grace", "2", "--min-run-s", "0")


def test_auto_stops_early_on_a_big_simulated_effect(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = str(tmp_path / "r.db")
    proc = run_orch("ab", "baseline", "eagle3", "--sim", *COMMON, "--json", "--db", db, cwd=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "plan (--blocks auto): 6 to 16 launches" in err
    doc = json.loads(out)
    # A ~26 % gap is decided long before the maximum of 8, usually at the first look (3 blocks); the simulated
    # EAGLE arm's launch-to-launch spread (acceptance is random) sometimes needs a look or two more (seen: 5).
    n = doc["blocks"]
    assert 3 <= n <= 6 and doc["design"]["blocks"] == n and doc["design"]["auto"]["max_blocks"] == 8
    assert f"look after block {n}: every comparison is decided; stopping (--blocks auto)" in err
    (c,) = doc["comparisons"]
    assert c["verdict"] == "slower" and c["sequential"]["look_blocks"] == n and "repeated 95% CI" in c["ci_method"]
    assert any(f"stopped after {n} blocks: every comparison is decided" in note for note in doc["notes"])
    assert ops.op_find(NAMESPACE) == []


@pytest.mark.slow
def test_auto_experiment_interrupted_then_resumed_continues_its_design(
    sim_profiles: SimProfiles, tmp_path: Path
) -> None:
    """An A/A stays undecided at 3 blocks, so auto schedules block 4 (its maximum here); Ctrl-C in block 4, then
    `--resume` finishes that block and stops at the maximum, saying why the comparison stayed inconclusive."""
    sim_profiles(sim={"launch_noise": 0.02})
    # --min-effect 0.5%: three launches of 2 % noise cannot show "no difference" within ±0.5 % (at ±2 % a quiet
    # draw sometimes did). An A/A still gets a false faster/slower at the first look now and then — the alpha that
    # look spends, by design — and then stops at 3 blocks: that experiment is set aside and a new one started.
    for attempt in range(4):
        db = str(tmp_path / f"r{attempt}.db")
        args = ("--sim", "--max-blocks", "4", "--min-effect", "0.5%", *COMMON, "--db", db)
        proc = run_orch("ab", "baseline", "baseline", *args, cwd=tmp_path)
        seen: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "adding block 4 of at most 4" in line or "look after block 3: every comparison is decided" in line:
                break
        if "adding block 4 of at most 4" in seen[-1]:
            break
        proc.communicate(timeout=60)
    else:
        raise AssertionError("four A/A experiments in a row were decided at 3 blocks:\n" + "".join(seen))
    wait_for_line(proc, "launch 7/8: block 4/4 (at most 4)", seen)
    wait_for_line(proc, "Run 1/2", seen)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + out + err
    c = sqlite3.connect(db)
    exp_id, design = c.execute("SELECT id, design_json FROM experiments").fetchone()
    assert json.loads(design)["blocks"] == 4 and json.loads(design)["auto"]["max_blocks"] == 4

    proc = run_orch("ab", "--resume", exp_id, "--max-blocks", "6", "--db", db, cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "drop --max-blocks" in err, err

    proc = run_orch("ab", "--resume", exp_id, "--grace", "2", "--json", "--db", db, cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"resuming {exp_id}: 6 of 8 launches already complete" in err
    doc = json.loads(out)
    assert doc["status"] == "complete" and doc["blocks"] == 4 and doc["design"]["auto"]["min_blocks"] == 3
    (cmp,) = doc["comparisons"]
    if "look after block 4: every comparison is decided" in err:
        # The A/A's false call at the last look: the alpha that look spends, by design (rare; it still stopped at 4).
        assert cmp["verdict"] in ("faster", "slower"), err
    else:
        assert "undecided at the maximum" in err
        assert cmp["verdict"] == "inconclusive" and cmp["advice"]
        assert any("stopped after 4 blocks with 1 comparison(s) inconclusive" in n for n in doc["notes"])
    assert ops.op_find(NAMESPACE) == []


def test_max_blocks_needs_blocks_auto(tmp_path: Path) -> None:
    proc = run_orch("ab", "baseline", "eagle3-3step", "--sim", "--blocks", "3", "--max-blocks", "5", cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--max-blocks applies to --blocks auto, not to --blocks 3" in err
    proc = run_orch("ab", "a", "b", "--blocks", "lots", cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "expected auto or a whole number of blocks" in err
