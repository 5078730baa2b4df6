"""The what-if models as pure functions: a speculative cycle's cost per draft step and acceptance per draft position."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.common.acceptance import alpha_for_accept_length, chain_accept_length
from orchestrator.stats.estimates import t_975


@dataclass(frozen=True, kw_only=True)
class ArmPoint:
    """One speculative configuration's measurements (an arm's means, or its launch in one block)."""

    steps: int  # draft steps per cycle (k)
    verified: int  # tokens one verify pass checks (SGLang's num_draft_tokens; k + 1 for a chain)
    cycle_ms: float  # 1000 x accept length / tok/s: one draft + verify cycle as the client saw it
    accept_length: float  # tokens per cycle, bonus token included
    per_position: tuple[float, ...] | None = None  # P(draft i accepted), i = 1..depth, from engine counters

    @property
    def depth(self) -> int:
        """Longest chain of drafts one verify can accept."""
        return max(1, min(self.steps, self.verified - 1))


@dataclass(frozen=True)
class CostModel:
    """cycle(k) = verify_ms + per_step_ms·k (+ per_token_ms·(verified tokens) where the data separate the two)."""

    verify_ms: float  # the cycle's fixed part: the verify pass of the bonus token (and the offset's tokens)
    per_step_ms: float  # one draft step; with a chain it also holds the verify cost of the token it adds
    per_token_ms: float | None = None  # verify cost per verified token, when arms vary it apart from the steps
    offset: int = 1  # verified tokens = steps + offset (1: a chain)

    @property
    def kind(self) -> str:
        return "verify + per-step" if self.per_token_ms is None else "verify + per-step + per-verified-token"

    def cycle_ms(self, steps: int) -> float:
        extra = 0.0 if self.per_token_ms is None else self.per_token_ms * (steps + self.offset)
        return self.verify_ms + self.per_step_ms * steps + extra


@dataclass(frozen=True)
class AcceptModel:
    """Mean accept length per step count: a constant-α chain, or measured per-position acceptance."""

    kind: str  # "chain" | "per-position"
    alpha: float  # the chain's α (per-position: the conditional acceptance used beyond the measured depth)
    per_position: tuple[float, ...] = ()  # P(draft i accepted) for i = 1..len

    def accept_length(self, steps: int) -> float:
        if self.kind == "chain":
            return chain_accept_length(self.alpha, steps)
        probs = list(self.per_position[:steps])
        p = probs[-1] if probs else 1.0
        while len(probs) < steps:  # past the measured depth: each further draft survives with the last conditional
            p *= self.alpha
            probs.append(p)
        return 1.0 + sum(probs)


def solve(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least squares by the normal equations (2 or 3 unknowns, a handful of rows); ValueError when singular."""
    n = len(rows[0])
    a = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * v for r, v in zip(rows, y, strict=True))]
        for i in range(n)
    ]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9 * max(1.0, max(abs(x) for row in a for x in row[:n])):
            raise ValueError("the step counts measured cannot separate the cost terms")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * p for x, p in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit_cost(points: Sequence[ArmPoint]) -> CostModel:
    """Least squares (exact with two step counts) of the cycle time on the step count. When the verified tokens are
    not steps + a constant across the arms (trees, other num_draft_tokens) and three or more configurations were
    measured, the draft and the verify costs are separated."""
    if len({p.steps for p in points}) < 2:
        raise ValueError("the cost model needs two or more step counts")
    offsets = {p.verified - p.steps for p in points}
    y = [p.cycle_ms for p in points]
    if len(offsets) > 1 and len({(p.steps, p.verified) for p in points}) >= 3:
        v, d, t = solve([[1.0, p.steps, p.verified] for p in points], y)
        return CostModel(verify_ms=v, per_step_ms=d, per_token_ms=t, offset=1)
    v, d = solve([[1.0, p.steps] for p in points], y)
    return CostModel(verify_ms=v, per_step_ms=d, offset=min(offsets))


def fit_alpha(points: Sequence[tuple[int, float]]) -> float:
    """The α whose chain accept lengths best match (depth, accept length) pairs in least squares."""

    def loss(alpha: float) -> float:
        return sum((chain_accept_length(alpha, k) - tau) ** 2 for k, tau in points)

    grid = [i / 200 for i in range(201)]  # the loss can be flat near 1: a grid first, then golden section
    best = min(grid, key=loss)
    lo, hi = max(0.0, best - 0.005), min(1.0, best + 0.005)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if loss(a) <= loss(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def fit_accept(points: Sequence[ArmPoint]) -> AcceptModel:
    """Per-position acceptance when every point carries it (pooled by position), else a constant-α chain."""
    if points and all(p.per_position for p in points):
        depth = max(len(p.per_position or ()) for p in points)
        probs = []
        for i in range(depth):
            values = [p.per_position[i] for p in points if p.per_position and len(p.per_position) > i]
            probs.append(statistics.fmean(values))
        last = probs[-1] / probs[-2] if len(probs) > 1 and probs[-2] > 0 else probs[-1]
        return AcceptModel("per-position", min(1.0, max(0.0, last)), tuple(probs))
    return AcceptModel("chain", fit_alpha([(p.depth, p.accept_length) for p in points]))


def alpha_needed(target_tps: float, cycle_ms: float, steps: int) -> float | None:
    """The constant α a chain of `steps` drafts needs for target_tps at this cycle time: 0 when even no accepted
    draft reaches it, None when it would take α > 1 (more than steps + 1 tokens per cycle). The seed's example:
    150 tok/s at a 19 ms cycle with 3 steps needs 2.85 tokens per cycle, α ≈ 0.78."""
    tau = target_tps * cycle_ms / 1000.0
    if tau <= 1.0:
        return 0.0
    return alpha_for_accept_length(tau, steps)


def t_band(point: float, replicates: Sequence[float]) -> tuple[float, float] | None:
    """point ± Student's t (95 %, n − 1 df) × the replicates' standard error; None with fewer than two."""
    if len(replicates) < 2:
        return None
    half = t_975(len(replicates) - 1) * statistics.stdev(replicates) / math.sqrt(len(replicates))
    return point - half, point + half


def t_factor(n: int) -> float | None:
    """The Student t the bands of n blocks use (None for one block: no band)."""
    return t_975(n - 1) if n >= 2 else None
