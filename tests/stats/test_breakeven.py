"""The speculative break-even: the chain model, its inverse, the seed's numbers and `orch breakeven`."""

from __future__ import annotations

import pytest


def test_chain_model_and_its_inverse() -> None:
    from orchestrator.common.acceptance import alpha_for_accept_length, chain_accept_length

    assert chain_accept_length(0.0, 3) == 1.0  # only the bonus token
    assert chain_accept_length(1.0, 3) == 4.0
    assert chain_accept_length(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    for alpha in (0.1, 0.5436890126920764, 0.9):
        assert alpha_for_accept_length(chain_accept_length(alpha, 3), 3) == pytest.approx(alpha, abs=1e-9)
    assert alpha_for_accept_length(4.5, 3) is None and alpha_for_accept_length(0.5, 3) is None
    with pytest.raises(ValueError):
        chain_accept_length(1.5, 3)


def test_breakeven_reproduces_the_seed() -> None:
    from orchestrator.stats.estimates import breakeven, spec_from_run

    be = breakeven(82.2, 30.0, 3, target_tps=150)
    assert be.baseline_token_ms == pytest.approx(12.165, abs=1e-3)
    assert be.breakeven_tau == pytest.approx(2.466, abs=1e-3)  # the seed's 30 / 12.2 ≈ 2.46
    assert be.breakeven_alpha is not None and 0.6 < be.breakeven_alpha < 0.7
    assert be.target_tau == pytest.approx(4.5) and be.target_alpha is None  # > k + 1 = 4: not reachable
    # measured: 60 tok/s at accept length 2.0 means a 33.3 ms cycle, so break-even rises to 2.74
    run = spec_from_run(82.2, 60.0, 2.0, 3)
    assert run.cycle_ms == pytest.approx(33.33, abs=0.01) and run.breakeven_tau == pytest.approx(2.74, abs=0.01)
    assert run.measured_alpha == pytest.approx(0.5437, abs=1e-3)


def test_breakeven_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["breakeven", "--baseline-tps", "82.2", "--cycle-ms", "30", "--steps", "3", "--target-tps", "150"]) == 0
    out = capsys.readouterr().out
    assert "break-even accept length: 30.0 / 12.17 = 2.466 tokens per cycle" in out
    assert "for 150 tok/s: accept length 4.50; NOT reachable with 3 draft steps" in out
    assert main(["breakeven", "--baseline-tps", "0", "--cycle-ms", "30", "--steps", "3"]) == 2


# ------------------------------------------------------------------ below one token per cycle (issue 35, item 1)


def test_a_break_even_below_one_token_per_cycle_is_always_reached(capsys: pytest.CaptureFixture[str]) -> None:
    """Every cycle yields at least the verifier's own token: a break-even of 0.894 is reached at any accept length
    (α* = 0), never "NOT reachable" (a real llama.cpp A/B printed that beside "measured 1.27 (above break-even)")."""
    import json

    from orchestrator.cli import main
    from orchestrator.common.acceptance import alpha_needed
    from orchestrator.report.lines import breakeven_lines
    from orchestrator.stats.estimates import breakeven

    assert alpha_needed(0.894, 8) == 0.0 and alpha_needed(1.0, 8) == 0.0 and alpha_needed(9.5, 8) is None
    assert alpha_needed(2.0, 3) == pytest.approx(0.5437, abs=1e-3)
    be = breakeven(6.1, 146.6, 8, measured_tau=1.27, target_tps=5.0)
    assert be.breakeven_tau == pytest.approx(0.894, abs=1e-3)
    assert be.breakeven_alpha == 0.0 and be.reach == "always" and be.position == "above"
    assert be.target_alpha == 0.0  # 5 tok/s at a 146.6 ms cycle needs 0.73 tokens per cycle: also always reached
    text = "\n".join(breakeven_lines(be))
    assert "NOT reachable" not in text
    assert "= 0.894 tokens per cycle; always reached: a cycle yields at least one token" in text
    assert "speculation pays at any accept length (α* = 0)" in text
    assert "measured accept length: 1.27 (above break-even" in text

    assert main(["breakeven", "--baseline-tps", "6.1", "--cycle-ms", "146.6", "--steps", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["breakeven_alpha"] == 0.0 and doc["breakeven_reach"] == "always"
    assert main(["breakeven", "--baseline-tps", "6.1", "--cycle-ms", "146.6", "--steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "always reached" in out and "NOT reachable" not in out


def test_the_break_even_interval_is_the_ratio_of_cycle_to_token_time_over_blocks() -> None:
    """breakeven_interval: per run, cycle = 1000 · accept / tok/s over the baseline's 1000 / tok/s; the verdict's
    ratio_ci over blocks gives the geometric mean and a CI that widens with block-to-block noise."""
    from orchestrator.stats.estimates import breakeven_interval

    # Quiet blocks: baseline 80 tok/s, arm 60 tok/s at accept length 2.4 -> cycle 40 ms, token 12.5 ms, τ* = 3.2.
    quiet = breakeven_interval([[80.0, 80.2, 79.9]] * 4, [[(60.0, 2.4), (60.1, 2.41), (59.9, 2.39)]] * 4)
    assert quiet.ratio == pytest.approx(3.2, rel=1e-3) and quiet.blocks == 4
    assert quiet.lo <= quiet.ratio <= quiet.hi and quiet.hi / quiet.lo < 1.02
    # Restarts that swing the arm's speed 3x: the same point, an interval too wide to call reachable or not.
    noisy = breakeven_interval([[80.0]] * 4, [[(20.0, 2.4)], [(180.0, 2.4)], [(20.0, 2.4)], [(180.0, 2.4)]])
    assert noisy.lo < 1.0 < 9.0 < noisy.hi


def test_the_explanation_says_cannot_tell_where_its_intervals_do_not_decide() -> None:
    """With intervals (from an A/B) the break-even's reach and the measured accept length's side are judged on them:
    "cannot tell" where they straddle, and each estimate is printed with its CI."""
    from orchestrator.report.lines import breakeven_lines
    from orchestrator.stats.estimates import RatioEstimate, spec_from_run

    wide = RatioEstimate(ratio=0.648, lo=0.080, hi=5.227, blocks=3, method="bootstrap over blocks", log_sd=1.2)
    # The real A/B's numbers: a point break-even of 10.45 > 9 tokens with 8 steps, but an interval reaching 1.3.
    be = spec_from_run(6.1, 0.7417, 1.27, 8, breakeven_ci95=(1.3, 84.0), measured_ci95=(1.1, 1.45), margin=wide)
    assert be.breakeven_tau == pytest.approx(10.45, abs=0.01)
    assert be.reach == "cannot tell" and be.position == "cannot tell"
    text = "\n".join(breakeven_lines(be))
    assert "NOT reachable" not in text and "(above break-even" not in text and "(below break-even" not in text
    assert "= 10.445 tokens per cycle, 95% CI [1.300, 84.000] over blocks; cannot tell whether it is reachable" in text
    assert "measured accept length: 1.27, 95% CI [1.10, 1.45] over launches (cannot tell whether above or below" in text
    assert "the tok/s ratio 0.648x, CI [0.080, 5.227] contains 1" in text
    doc = be.to_dict()
    assert doc["breakeven_reach"] == "cannot tell" and doc["measured_vs_breakeven"] == "cannot tell"
    assert doc["breakeven_tau_ci95"] == (1.3, 84.0) and doc["measured_over_breakeven"]["ci95"] == [0.080, 5.227]
    # Even the low end beyond 9 tokens: not reachable; a CI above 1: above break-even.
    sure = RatioEstimate(ratio=1.4, lo=1.2, hi=1.6, blocks=3, method="bootstrap over blocks", log_sd=0.05)
    far = spec_from_run(6.1, 0.7417, 1.27, 8, breakeven_ci95=(9.5, 12.0), margin=sure)
    assert far.reach == "never" and far.position == "above"
    assert "NOT reachable with 8 draft steps" in "\n".join(breakeven_lines(far))
    # The whole interval at or below one token per cycle: always reached; straddling 1: α* from 0 to its high end.
    low = spec_from_run(6.1, 8.0, 1.2, 8, breakeven_ci95=(0.7, 0.99), margin=sure)
    assert low.reach == "always" and "always reached" in "\n".join(breakeven_lines(low))
    edge = spec_from_run(6.1, 8.0, 1.2, 8, breakeven_ci95=(0.7, 1.5), margin=sure)
    assert edge.reach == "reachable" and edge.alpha_range is not None and edge.alpha_range[0] == 0.0
    assert "not across its interval; α* 95% CI [0.000, " in "\n".join(breakeven_lines(edge))
    # One block: no side can be told, whatever its bootstrap over runs says.
    one = RatioEstimate(ratio=1.4, lo=1.2, hi=1.6, blocks=1, method="bootstrap over blocks", log_sd=None)
    assert spec_from_run(6.1, 8.0, 1.2, 8, margin=one).position == "cannot tell"
