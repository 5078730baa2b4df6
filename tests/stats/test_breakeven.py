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
