"""The A/B report's speculative explanation carries its inputs' uncertainty (issue 35, items 1 and 2): the break-even
with its CI over blocks, the accept length with its CI over launches, and "cannot tell" where they do not decide."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.report import html, jsondoc, markdown, text
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult


def _run(k: int, tok_s: float, accept: float | None) -> RunResult:
    return RunResult(
        index=k,
        warmup=False,
        tokens=128,
        seconds=128 / tok_s,
        tok_s=tok_s,
        prompt_tokens=30,
        ttft_s=0.2,
        spec_accept_length=accept,
        aggregate_tok_s=tok_s,
    )


def _result(base: list[float], spec: list[float], accept: list[float]) -> ABResult:
    """A llama.cpp-like A/B: a plain baseline and an 8-step speculative arm, one launch each per block, three runs a
    launch (±1 %), at the given per-block tok/s and accept lengths."""
    launches = []
    for b, (bv, sv, av) in enumerate(zip(base, spec, accept, strict=True)):
        jitter = (0.99, 1.0, 1.01)
        b_runs = tuple(_run(k, bv * j, None) for k, j in enumerate(jitter))
        s_runs = tuple(_run(k, sv * j, av * j) for k, j in enumerate(jitter))
        launches += [
            LaunchResult(
                profile="plain",
                launch_id=f"L{b}-0",
                runs=b_runs,
                ready_s=4.0,
                env_report={"ok": True},
                teardown={},
                block=b,
                position=0,
                arm_index=0,
            ),
            LaunchResult(
                profile="lookup",
                launch_id=f"L{b}-1",
                runs=s_runs,
                ready_s=4.0,
                env_report={"ok": True},
                teardown={},
                spec_steps=8,
                block=b,
                position=1,
                arm_index=1,
            ),
        ]
    design = Design.make(2, len(base), "fixed", 0)
    return ABResult(
        experiment_id="E",
        simulated=False,
        host="local",
        profiles=("plain", "lookup"),
        launches=tuple(launches),
        host_facts={},
        design=design,
    )


def _every_format(result: ABResult) -> tuple[str, str, str, dict[str, Any]]:
    doc = json.loads(json.dumps(jsondoc.ab_json(result)))
    return text.ab_text(result), markdown.ab_markdown(result), html.ab_html(result), doc


def test_a_noisy_ab_says_cannot_tell_instead_of_not_reachable() -> None:
    """The real A/B's shape: restarts swing the speculative arm's speed (ratio CI far across 1), so the point
    break-even (about 10.5 tokens, beyond 8 steps' 9) is noise: its interval reaches well below 9 tokens."""
    result = _result([6.1, 6.0, 6.2], [0.5, 0.74, 9.0], [1.25, 1.27, 1.29])
    (cmp,) = result.comparisons
    assert cmp.verdict == "inconclusive"
    ((_, be),) = result.speculation()
    assert be.breakeven_tau > 9.0  # the point alone: what the report called "NOT reachable"
    assert be.breakeven_tau_ci95 is not None and be.breakeven_tau_ci95[0] < 9.0 < be.breakeven_tau_ci95[1]
    assert be.margin is not None and be.margin.lo < 1.0 < be.margin.hi
    said, md, page, doc = _every_format(result)
    for rendered in (said, md, page):
        assert "NOT reachable" not in rendered and "(above break-even" not in rendered
        assert "(below break-even" not in rendered
        assert "cannot tell whether it is reachable with 8 draft steps" in rendered
        assert "cannot tell whether above or below break-even" in rendered
        assert "tokens per cycle, 95% CI [" in rendered and "over launches (cannot tell" in rendered
    (spec,) = doc["speculation"]
    assert spec["breakeven_reach"] == "cannot tell" and spec["measured_vs_breakeven"] == "cannot tell"
    assert len(spec["breakeven_tau_ci95"]) == 2 and len(spec["measured_tau_ci95"]) == 2
    # measured / break-even is the tok/s ratio: the same number and CI as the verdict's comparison
    assert spec["measured_over_breakeven"]["ratio"] == cmp.ratio
    assert cmp.estimate is not None and spec["measured_over_breakeven"]["ci95"] == [cmp.estimate.lo, cmp.estimate.hi]


def test_a_quiet_ab_below_one_token_per_cycle_is_always_reached_and_above() -> None:
    """A speculative arm faster than its baseline at an accept length near 1 (a break-even below one token per
    cycle): always reached, and the measured accept length is above break-even with a CI that says so."""
    result = _result([6.1, 6.0, 6.2], [8.4, 8.5, 8.6], [1.26, 1.27, 1.28])
    ((_, be),) = result.speculation()
    assert be.breakeven_tau < 1.0 and be.breakeven_tau_ci95 is not None and be.breakeven_tau_ci95[1] < 1.0
    said, md, page, doc = _every_format(result)
    for rendered in (said, md, page):
        assert "NOT reachable" not in rendered
        assert "always reached: a cycle yields at least one token, so speculation pays at any accept length" in rendered
        assert "(above break-even: measured / break-even = the tok/s ratio" in rendered
    (spec,) = doc["speculation"]
    assert spec["breakeven_alpha"] == 0.0 and spec["breakeven_reach"] == "always"
    assert spec["measured_vs_breakeven"] == "above"
