"""The chain model of speculative acceptance (stdlib only): the statistics' break-even and the simulator's drafter."""

from __future__ import annotations


def chain_accept_length(alpha: float, steps: int) -> float:
    """Mean tokens per verify cycle under the chain model: τ = (1 − α^(k+1)) / (1 − α), bonus token included."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if alpha == 1.0:
        return float(steps + 1)
    return (1.0 - alpha ** (steps + 1)) / (1.0 - alpha)


def alpha_for_accept_length(tau: float, steps: int) -> float | None:
    """The per-token acceptance α that gives mean accept length τ with k steps; None when τ is out of reach."""
    if tau < 1.0 or tau > steps + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(100):  # τ(α) is increasing in α: bisection converges to machine precision
        mid = (lo + hi) / 2
        if chain_accept_length(mid, steps) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def alpha_needed(tau: float, steps: int) -> float | None:
    """The least per-token acceptance α whose accept length reaches τ: 0 when τ <= 1 (every cycle yields at least the
    verifier's own token, so no acceptance is needed), None when τ > k + 1 (out of reach with k steps)."""
    return 0.0 if tau <= 1.0 else alpha_for_accept_length(tau, steps)
