"""`orch compare` of experiments whose arms have other names: the refusal names both sides' arms and the --map line,
--map pairs them, a bad --map is refused naming the arm; and a recording too uncertain to be reproduced says so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import InputError
from orchestrator.report.compare import compare_text
from orchestrator.results.compare import compare
from orchestrator.results.model import ABResult
from orchestrator.results.store import Store
from orchestrator.stats.estimates import Z_80, RatioEstimate, t_975
from orchestrator.stats.reproduction import ArmEstimate, reproduction_verdict, t_95
from tests.results.test_compare import SPEEDS, _result


def store(path: Path, result: ABResult) -> None:
    """The experiment as `orch ab` stores it, finished."""
    s = Store(path)
    s.create_experiment(result.experiment_id, kind="ab", simulated=True, host="local", arms=list(result.profiles),
                        config={"host_facts": {}}, orch_version="t", design=result.design.to_dict())  # fmt: skip
    for la in result.launches:
        s.add_launch(la.launch_id, experiment_id=result.experiment_id, arm_index=la.arm_index, block=la.block,
                     profile=la.profile, profile_dict={"name": la.profile}, argv=[], env={}, pid=1,
                     started_at=0.0)  # fmt: skip
        for r in la.runs:
            s.add_run(la.launch_id, r.to_dict())
        s.update_launch(la.launch_id, status="complete", env_report_json={"ok": True})
    s.finish_experiment(result.experiment_id, "complete")
    s.close()


RECORDED = "20261201-000000-aaaaaa"
NEW = "20261201-000001-bbbbbb"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A recorded baseline/eagle3-3step A/B and a new one of the same speeds under other names (base, eagle)."""
    path = tmp_path / "r.db"
    store(path, _result(RECORDED, SPEEDS))
    store(path, _result(NEW, {"base": SPEEDS["baseline"], "eagle": SPEEDS["eagle3-3step"]}))
    return path


def test_no_arm_in_common_lists_both_sides_and_the_map_line(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", RECORDED, NEW, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"no arm of B ({NEW}: base, eagle) has the name of an arm of A ({RECORDED}: baseline, eagle3-3step)" in err
    assert "--map base=baseline --map eagle=eagle3-3step" in err


def test_map_pairs_the_arms_and_a_verdict_comes_out(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["compare", RECORDED, NEW, "--db", str(db), "--map", "base=baseline", "--map", "eagle=eagle3-3step"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("REPRODUCED: all 3 values agree within ±3.0%"), out
    assert "baseline (B: base)" in out and "eagle3-3step / baseline (B: eagle / base)" in out
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arm_map"] == {"base": "baseline", "eagle": "eagle3-3step"}
    assert [(r["label"], r["b_label"]) for r in doc["arms"]] == [("baseline", "base"), ("eagle3-3step", "eagle")]
    assert [r["b_name"] for r in doc["ratios"]] == ["eagle / base"]


def test_a_map_of_one_arm_leaves_the_other_on_one_side_and_says_how_to_pair_it(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", RECORDED, NEW, "--db", str(db), "--map", "base=baseline"]) == 4
    out = capsys.readouterr().out
    assert "only in A: eagle3-3step" in out and "only in B: eagle" in out
    assert "if they are the same arms under other names, pair them: --map eagle=eagle3-3step" in out


@pytest.mark.parametrize(
    ("maps", "message"),
    [
        (["nope=baseline"], "--map nope=baseline: B has no arm 'nope' (B's arms: base, eagle)"),
        (["base=nope"], "--map base=nope: A has no arm 'nope' (A's arms: baseline, eagle3-3step)"),
        (["base=baseline", "eagle=baseline"], "--map pairs more than one arm of B with baseline of A"),
        (["base"], "'base': expected B_ARM=A_ARM"),
        (["base=baseline", "base=eagle3-3step"], "B's arm 'base' is already mapped to 'baseline'"),
    ],
)
def test_a_bad_map_exits_2_naming_it(
    db: Path, capsys: pytest.CaptureFixture[str], maps: list[str], message: str
) -> None:
    args = [a for m in maps for a in ("--map", m)]
    assert main(["compare", RECORDED, NEW, "--db", str(db), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_a_map_that_would_leave_a_name_compared_twice_is_refused() -> None:
    a = _result("A", SPEEDS)
    b = _result("B", {"baseline": 83.0, "eagle": 60.8})
    with pytest.raises(InputError, match="nothing to compare: no arm of B"):
        compare(a, _result("C", {"x": 1.0}))
    with pytest.raises(InputError, match=r"B's own arm 'baseline' would be compared with A's 'baseline' too"):
        compare(a, b, arm_map={"eagle": "baseline"})


# ---------------------------------------------------------------- a recording too uncertain to be reproduced


def _est(value: float, lo: float, hi: float, n: int) -> ArmEstimate:
    se = math.log(hi / lo) / (2 * t_975(n - 1))
    return ArmEstimate(value=value, lo=lo, hi=hi, launches=n, method="t", log_sd=se * math.sqrt(n))


# docs/reproduce.md's walk-through, on the simulator: 3 blocks recorded, 3 re-run.
REC_EAGLE, NEW_EAGLE = _est(60.2, 51.6, 70.2, 3), _est(60.1, 56.7, 65.2, 3)


def test_the_recording_too_uncertain_says_so_and_how_many_blocks_it_needs() -> None:
    v = reproduction_verdict(REC_EAGLE, NEW_EAGLE, 0.03)
    assert v.status == "inconclusive" and v.blocks_needed is None
    n = v.recording_blocks_needed
    assert n == 37
    assert (
        "the recorded value is too uncertain to be reproduced: its own 95% CI spans -14.3% to +16.6% over 3 "
        "launches, and more blocks of the new side cannot narrow it; ask for a recording of at least 37 blocks "
        "(and re-run it with as many)"
    ) in v.reason
    # N is honest: a recording and a re-run of N blocks each at these spreads would likely decide (the 90% CI of
    # the observed difference, at 80% power, within ±3%), and of N-1 would not.
    sd_rec, sd_new = REC_EAGLE.log_sd or 0.0, NEW_EAGLE.log_sd or 0.0
    d, band = math.log(v.ratio), math.log(1.03)

    def decidable(k: int) -> bool:
        se = math.hypot(sd_rec, sd_new) / math.sqrt(k)
        df = math.floor(round((sd_rec**2 + sd_new**2) ** 2 / ((sd_rec**4 + sd_new**4) / (k - 1)), 9))
        return abs(d) + (t_95(df) + Z_80) * se <= band

    assert decidable(n) and not decidable(n - 1)
    # A re-run of N blocks of a recording of N blocks, both at the spreads and values seen, reproduces.

    def half(sd: float) -> float:
        return t_975(n - 1) * sd / math.sqrt(n)

    rec = ArmEstimate(
        value=60.2,
        lo=60.2 * math.exp(-half(sd_rec)),
        hi=60.2 * math.exp(half(sd_rec)),
        launches=n,
        method="t",
        log_sd=sd_rec,
    )
    new = ArmEstimate(
        value=60.1,
        lo=60.1 * math.exp(-half(sd_new)),
        hi=60.1 * math.exp(half(sd_new)),
        launches=n,
        method="t",
        log_sd=sd_new,
    )
    assert reproduction_verdict(rec, new, 0.03).status == "reproduced"
    # More blocks of the new side alone never get there: the recorded side's own interval is wider than ±3%.
    many = ArmEstimate(
        value=60.1,
        lo=60.1 * math.exp(-half(sd_new) / 10),
        hi=60.1 * math.exp(half(sd_new) / 10),
        launches=1000,
        method="t",
        log_sd=0.0,
    )
    assert reproduction_verdict(REC_EAGLE, many, 0.03).status == "inconclusive"


def test_a_claim_close_to_the_tolerance_is_not_blamed_on_the_recording() -> None:
    # A claim has no interval: nothing recorded is uncertain, the difference is just at the edge of ±3%.
    v = reproduction_verdict(100.0, _est(102.95, 100.0, 106.0, 3), 0.03)
    assert v.status == "inconclusive" and v.recording_blocks_needed is None
    assert "too uncertain" not in v.reason and "this close to ±3.0%" in v.reason


def test_the_overall_verdict_asks_for_a_longer_recording() -> None:
    rec = RatioEstimate(ratio=0.732, lo=0.626, hi=0.855, blocks=3, method="t", log_sd=None)
    new = RatioEstimate(ratio=0.739, lo=0.705, hi=0.801, blocks=3, method="t", log_sd=None)
    assert reproduction_verdict(rec, new, 0.03).recording_blocks_needed == 71
    # Through compare: a noisy 3-block recording of a noisy arm against a steadier re-run.
    noisy = _result("A", SPEEDS, blocks=3, factors=(1.0, 0.93, 1.08))
    steady = _result("B", SPEEDS, blocks=3, factors=(1.0, 0.99, 1.01))
    c = compare(noisy, steady, tolerance=0.03)
    assert c.status == "inconclusive"
    assert "the recording is too uncertain to reproduce" in c.reason and "ask for a recording of at least" in c.reason
    assert "too uncertain to be reproduced" in compare_text(c)
