"""Speculative what-if: from arms of one drafter at two or more step counts, predict every step count and pick one."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.common.acceptance import alpha_for_accept_length
from orchestrator.errors import InputError
from orchestrator.results.model import ABResult
from orchestrator.stats.estimates import breakeven
from orchestrator.whatif.arms import (
    SpecArm,
    WhatIfError,
    baseline_of,
    family,
    mean_point,
    profiles_of,
    select_arms,
    unfinished,
)
from orchestrator.whatif.fit import AcceptModel, ArmPoint, CostModel, alpha_needed, fit_accept, fit_cost, t_band
from orchestrator.whatif.text import recommendation, warnings_for

__all__ = ["DEFAULT_STEPS", "WhatIf", "WhatIfError", "analyse", "recommendation_line"]

DEFAULT_STEPS = tuple(range(1, 9))
Band = tuple[float, float] | None


@dataclass(frozen=True)
class Fit:
    cost: CostModel
    accept: AcceptModel

    def predict(self, steps: int) -> tuple[float, float, float | None]:
        """(accept length, cycle ms, tok/s; None when the fitted cycle is not positive) at `steps`."""
        tau, cycle = self.accept.accept_length(steps), self.cost.cycle_ms(steps)
        return tau, cycle, (1000.0 * tau / cycle if cycle > 0 else None)


def fit_points(points: Sequence[ArmPoint]) -> Fit:
    return Fit(fit_cost(points), fit_accept(points))


@dataclass(frozen=True, kw_only=True)
class Row:
    """One step count: predicted from the fit, and measured where an arm ran it."""

    steps: int
    source: str  # measured | predicted
    accept_length: float
    accept_length_ci95: Band
    cycle_ms: float
    cycle_ms_ci95: Band
    tok_s: float | None  # the headline: measured mean where measured, else predicted
    tok_s_ci95: Band
    fit_tok_s: float | None  # the model's value (also where measured: the residual shows the fit)
    fit_tok_s_ci95: Band
    vs_baseline: float | None = None
    vs_baseline_ci95: Band = None
    breakeven_accept_length: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True, kw_only=True)
class TargetRow:
    steps: int
    cycle_ms: float
    accept_length_needed: float
    alpha_needed: float | None  # None: not reachable (α would exceed 1)
    alpha_needed_range: tuple[float | None, float | None] | None  # at the cycle band's ends

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "alpha_needed_range"},
            "alpha_needed_range": list(self.alpha_needed_range) if self.alpha_needed_range else None,
            "reachable": self.alpha_needed is not None,
        }


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """The fitted models, one row per step count, the best one and what a target would need."""

    experiment_id: str
    simulated: bool
    concurrency: int
    family: tuple[Any, ...]
    arms: tuple[SpecArm, ...]
    blocks: tuple[int, ...]
    fit: Fit
    rows: tuple[Row, ...]
    best: Row
    indistinguishable: tuple[int, ...]  # other step counts whose band reaches the best's
    baseline: tuple[str, float, Band] | None  # label, mean tok/s, band
    alpha_by_arm: Mapping[str, float | None]
    alpha_ci95: Band
    target_tps: float | None = None
    target: tuple[TargetRow, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @property
    def measured_steps(self) -> list[int]:
        return sorted({a.steps for a in self.arms})


def _measured(arms: Sequence[SpecArm], steps: int, blocks: Sequence[int]) -> list[ArmPoint] | None:
    """Per block, the arms run at `steps` (averaged when several arms share it); None when none did."""
    same = [a for a in arms if a.steps == steps]
    if not same:
        return None
    return [mean_point([a.per_block[b] for a in same]) for b in blocks]


def analyse(
    result: ABResult,
    profiles: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    steps: Sequence[int] = DEFAULT_STEPS,
    target_tps: float | None = None,
    arms: Sequence[str] | None = None,
) -> WhatIf:
    """Fit the cost and acceptance models on the experiment's arms of one drafter and predict every step count.
    The band is Student's t (95 %) over per-block refits: each block's launches are fitted on their own, like the
    block log-ratios of `orch ab`, so launch-to-launch noise and the correlation within a block are carried."""
    if result.open_loop:
        raise WhatIfError(
            f"experiment {result.experiment_id} ran open-loop rate levels (--rate); the what-if fits speed at a "
            "concurrency level: run the arms with --concurrency"
        )
    level = int(result.levels[0]) if result.levels else 1
    profiles = profiles_of(result) if profiles is None else profiles
    chosen = select_arms(result, profiles, arms, level)
    blocks = sorted(set.intersection(*(set(a.per_block) for a in chosen)))
    if not blocks:
        raise WhatIfError(
            f"no block of experiment {result.experiment_id} has valid runs of every arm fitted "
            f"({', '.join(a.arm.label for a in chosen)}){unfinished(result)}"
        )
    pooled = fit_points([mean_point([a.per_block[b] for b in blocks]) for a in chosen])
    per_block = [fit_points([a.per_block[b] for a in chosen]) for b in blocks]
    base = baseline_of(result, profiles, chosen[0].profile, level)
    base_mean = statistics.fmean(base[1].values()) if base else None
    rows = []
    for k in steps:
        rows.append(_row(k, pooled, per_block, chosen, blocks, base, base_mean))
    best = max((r for r in rows if r.tok_s is not None), key=lambda r: r.tok_s or 0.0, default=None)
    if best is None:
        raise WhatIfError(
            "the fitted cycle time is not positive at any step count asked: the measurements are too "
            "noisy for the cost model (more blocks, or more tokens per run)"
        )
    lo = best.tok_s_ci95[0] if best.tok_s_ci95 else None
    close = tuple(r.steps for r in rows if r is not best and r.tok_s_ci95 and lo is not None and r.tok_s_ci95[1] >= lo)
    means = {a.arm.label: mean_point([a.per_block[b] for b in blocks]) for a in chosen}
    alpha_by_arm = {label: alpha_for_accept_length(p.accept_length, p.depth) for label, p in means.items()}
    alpha_band = t_band(pooled.accept.alpha, [f.accept.alpha for f in per_block])
    target = tuple(_target_row(k, target_tps, pooled, per_block) for k in steps) if target_tps else ()
    out = WhatIf(
        experiment_id=result.experiment_id,
        simulated=result.simulated,
        concurrency=level,
        family=family(chosen[0].profile),
        arms=tuple(chosen),
        blocks=tuple(blocks),
        fit=pooled,
        rows=tuple(rows),
        best=best,
        indistinguishable=close,
        baseline=(base[0], base_mean, t_band(base_mean, list(base[1].values()))) if base and base_mean else None,
        alpha_by_arm=alpha_by_arm,
        alpha_ci95=alpha_band,
        target_tps=target_tps,
        target=target,
    )
    return dataclasses.replace(out, warnings=tuple(warnings_for(out, per_block)))


def _row(
    k: int,
    pooled: Fit,
    per_block: Sequence[Fit],
    arms: Sequence[SpecArm],
    blocks: Sequence[int],
    base: tuple[str, dict[int, float]] | None,
    base_mean: float | None,
) -> Row:
    tau, cycle, tps = pooled.predict(k)
    reps = [f.predict(k) for f in per_block]
    rep_tps = [t for _, _, t in reps if t is not None]
    fit_band = t_band(tps, rep_tps) if tps is not None and len(rep_tps) == len(reps) else None
    measured = _measured(arms, k, blocks)
    head: float | None
    if measured is not None:
        m = mean_point(measured)
        per_tps = [1000.0 * p.accept_length / p.cycle_ms for p in measured]
        head, head_reps = statistics.fmean(per_tps), per_tps
        tau_row, tau_reps = m.accept_length, [p.accept_length for p in measured]
        cyc_row, cyc_reps = m.cycle_ms, [p.cycle_ms for p in measured]
        head_band = t_band(head, head_reps)
    else:
        head, head_reps, head_band = tps, rep_tps, fit_band
        tau_row, tau_reps = tau, [r[0] for r in reps]
        cyc_row, cyc_reps = cycle, [r[1] for r in reps]
    ratio = ratio_band = None
    if base and base_mean and head is not None:
        ratio = head / base_mean
        complete = len(head_reps) == len(blocks) and all(b in base[1] for b in blocks)
        pairs = zip(head_reps, blocks, strict=True) if complete else ()
        ratio_band = t_band(ratio, [h / base[1][b] for h, b in pairs]) if complete else None
    return Row(
        steps=k,
        source="measured" if measured is not None else "predicted",
        accept_length=tau_row,
        accept_length_ci95=t_band(tau_row, tau_reps),
        cycle_ms=cyc_row,
        cycle_ms_ci95=t_band(cyc_row, cyc_reps),
        tok_s=head,
        tok_s_ci95=head_band,
        fit_tok_s=tps,
        fit_tok_s_ci95=fit_band,
        vs_baseline=ratio,
        vs_baseline_ci95=ratio_band,
        breakeven_accept_length=breakeven(base_mean, cyc_row, k).breakeven_tau if base_mean and cyc_row > 0 else None,
    )


def _target_row(k: int, target_tps: float, pooled: Fit, per_block: Sequence[Fit]) -> TargetRow:
    cycle = pooled.cost.cycle_ms(k)
    band = t_band(cycle, [f.cost.cycle_ms(k) for f in per_block])
    rng = (alpha_needed(target_tps, band[0], k), alpha_needed(target_tps, band[1], k)) if band else None
    return TargetRow(
        steps=k,
        cycle_ms=cycle,
        accept_length_needed=target_tps * cycle / 1000.0,
        alpha_needed=alpha_needed(target_tps, cycle, k),
        alpha_needed_range=rng,
    )


def recommendation_line(result: ABResult, profiles: Sequence[Mapping[str, Any] | None] | None = None) -> str | None:
    """The A/B report's one line when the experiment has two or more step counts of one drafter; None otherwise.
    Never raises: a report must not fail because a what-if cannot be fitted."""
    try:
        w = analyse(result, profiles)
    except (InputError, ValueError, ArithmeticError, LookupError, TypeError):  # also malformed stored profiles
        return None
    return recommendation(w)
