"""Sequential stopping (pure): α-spending boundaries, Student-t quantiles, blocks needed, repeated CIs."""

from __future__ import annotations

import json
import math
import random
from statistics import NormalDist

import numpy as np
import pytest

from orchestrator.results.autostop import auto_look, auto_notes
from orchestrator.results.comparison import why_undecided
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.stats.estimates import T_975, RatioEstimate, blocks_needed, open_question, schedule
from orchestrator.stats.sequential import (
    SequentialPlan,
    boundaries,
    boundaries_for_spending,
    spent,
    t_boundaries,
    t_quantile,
)


def _run(i: int, tok_s: float) -> RunResult:
    return RunResult(
        index=i,
        warmup=False,
        tokens=256,
        seconds=256 / tok_s,
        tok_s=tok_s,
        prompt_tokens=20,
        ttft_s=0.02,
        aggregate_tok_s=tok_s,
    )


def _launch(arm: int, block: int, values: list[float]) -> LaunchResult:
    runs = tuple(_run(i, v) for i, v in enumerate(values))
    return LaunchResult(
        profile="b" if arm == 0 else "c",
        launch_id=f"L{block}-{arm}",
        runs=runs,
        ready_s=1.0,
        env_report={"ok": True},
        teardown={},
        spec_steps=None,
        block=block,
        position=arm,
        arm_index=arm,
    )


def _auto_result(pairs: list[tuple[float, float]], max_blocks: int = 8) -> ABResult:
    launches = [la for b, (x, y) in enumerate(pairs) for la in (_launch(0, b, [x] * 3), _launch(1, b, [y] * 3))]
    design = Design.make(2, len(pairs), "random", 5, SequentialPlan(3, max_blocks))
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("b", "c"),
        launches=tuple(launches),
        host_facts={},
        design=design,
    )


def test_pocock_like_spending_matches_published_boundaries() -> None:
    # Lan–DeMets Pocock-type spending, K = 5 equal looks, two-sided α = 0.05 (Jennison & Turnbull 2000; gsDesign).
    got = boundaries(tuple(k / 5 for k in range(1, 6)), 0.05, "pocock")
    assert [round(c, 3) for c in got] == [2.438, 2.427, 2.410, 2.397, 2.386]


def test_obf_like_spending_matches_published_boundaries() -> None:
    # ldbounds/gsDesign's O'Brien–Fleming-type spending at α = 0.025 per side, K = 5: 4.877, 3.357, 2.680, 2.290,
    # 2.031 (symmetric two-sided: twice the one-sided spending).
    fractions = [k / 5 for k in range(1, 6)]
    z = NormalDist().inv_cdf(1 - 0.025 / 2)
    cumulative = [2 * (2 - 2 * NormalDist().cdf(z / math.sqrt(t))) for t in fractions]
    assert [round(c, 3) for c in boundaries_for_spending(fractions, cumulative)] == [4.877, 3.357, 2.680, 2.290, 2.031]
    # The reference's two-sided form spends exactly α(t) at a single look: c = z_{1 − α(t)/2}.
    (only,) = boundaries((0.5,), 0.05, "obf")
    assert 2 * (1 - NormalDist().cdf(only)) == pytest.approx(spent(0.5, 0.05, "obf"))
    assert spent(1.0, 0.05, "obf") == pytest.approx(0.05) and spent(1.0, 0.05, "pocock") == pytest.approx(0.05)


def test_student_t_quantiles_match_the_table() -> None:
    for df, want in enumerate(T_975, start=1):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=6e-4)
    assert t_quantile(0.999, 2) == pytest.approx(22.327, abs=1e-3)


def test_t_boundaries_spend_alpha_over_the_looks() -> None:
    plan = SequentialPlan(3, 8)
    bounds = t_boundaries(plan)
    assert len(bounds) == len(plan.looks) == 6
    # The first look is Student's t at the α spent by then; later ones are wider than a fixed 95 % CI's t.
    assert bounds[0] == pytest.approx(t_quantile(1 - spent(3 / 8, 0.05, "pocock") / 2, 2))
    assert all(b > T_975[n - 2] for b, n in zip(bounds, plan.looks, strict=True))
    # A fresh simulation of A/A sequences (another seed) crosses some boundary about 5 % of the time.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40_000, 8))
    crossed = np.zeros(len(x), dtype=bool)
    for n, bound in zip(plan.looks, bounds, strict=True):
        mean = x[:, :n].mean(axis=1)
        t = np.abs(mean) / (x[:, :n].std(axis=1, ddof=1) / math.sqrt(n))
        crossed |= t >= bound
    assert 0.043 < crossed.mean() < 0.057
    with pytest.raises(ValueError, match="min blocks"):
        SequentialPlan(5, 4)


def test_blocks_needed_answers_the_question_the_comparison_asks() -> None:
    # A 24 % gap left inconclusive by 2 noisy blocks: a few blocks show it is real; ±2 % is not the question.
    gap = RatioEstimate(ratio=0.76, lo=0.5, hi=1.1, blocks=2, method="t", log_sd=0.06)
    assert open_question(gap, 0.02) == "sign"
    assert blocks_needed(gap, 0.02) is not None and blocks_needed(gap, 0.02) <= 4
    # A small observed effect asks whether it lies within ±2 %: that takes many blocks at the same noise.
    small = RatioEstimate(ratio=1.005, lo=0.9, hi=1.1, blocks=2, method="t", log_sd=0.06)
    assert open_question(small, 0.02) == "within"
    assert blocks_needed(small, 0.02) > 50  # type: ignore[operator]


def test_auto_design_round_trips_and_extends_the_same_schedule() -> None:
    design = Design.make(3, 3, "random", 11, SequentialPlan(3, 6))
    assert Design.from_dict(json.loads(json.dumps(design.to_dict()))) == design
    longer = design.extended(5)
    assert longer.schedule[:3] == design.schedule and [list(b) for b in longer.schedule] == schedule(3, 5, "random", 11)
    assert longer.auto == design.auto and longer.blocks == 5
    assert "auto" not in Design.make(2, 3, "fixed", 0).to_dict()  # a fixed design is stored as before


def test_auto_uses_repeated_cis_and_says_why_it_stopped() -> None:
    rng = random.Random(3)
    big = _auto_result([(82 * math.exp(rng.gauss(0, 0.01)), 62 * math.exp(rng.gauss(0, 0.01))) for _ in range(3)])
    (c,) = big.comparisons
    assert c.verdict == "slower" and c.sequential is not None and c.sequential["look_blocks"] == 3
    assert "repeated 95% CI" in (c.estimate.method if c.estimate else "")
    assert auto_look(big) == (True, "look after block 3: every comparison is decided; stopping (--blocks auto)")
    assert any("stopped after 3 blocks: every comparison is decided" in n for n in auto_notes(big))
    # The repeated CI is wider than the fixed design's 95 % CI on the same blocks.
    fixed = ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("b", "c"),
        launches=big.launches,
        host_facts={},
        design=Design.make(2, 3, "random", 5),
    )
    (f,) = fixed.comparisons
    assert c.estimate and f.estimate and c.estimate.hi - c.estimate.lo > f.estimate.hi - f.estimate.lo

    same = _auto_result([(82 * math.exp(rng.gauss(0, 0.02)), 82 * math.exp(rng.gauss(0, 0.02))) for _ in range(3)], 4)
    stop, line = auto_look(same)
    assert not stop and "adding block 4 of at most 4" in line
    at_max = _auto_result([(82 * math.exp(rng.gauss(0, 0.02)), 82 * math.exp(rng.gauss(0, 0.02))) for _ in range(4)], 4)
    stop, line = auto_look(at_max)
    assert stop and "undecided at the maximum" in line
    (c,) = at_max.undecided()
    why = why_undecided(c)
    assert why.startswith("c vs b @ 1: ") and "the CI reaches beyond ±2.0%" in why and "blocks" in why
    assert any("with 1 comparison(s) inconclusive: c vs b @ 1" in n for n in auto_notes(at_max))


def test_the_default_plans_known_boundaries_are_the_simulated_ones() -> None:
    from orchestrator.stats.sequential import KNOWN_T_BOUNDARIES, simulate_t_boundaries

    # `orch show` uses the table instead of importing numpy and simulating: it must be what the simulation gives.
    assert SequentialPlan() in KNOWN_T_BOUNDARIES
    for plan, known in KNOWN_T_BOUNDARIES.items():
        assert simulate_t_boundaries(plan) == pytest.approx(known, rel=1e-12)
        assert t_boundaries(plan) == known
