"""A night's results: each series' verdict, each item's report, the night's report and its exit code, and how one
series is judged against its history (the model, apart from the runner in `nightly`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import changepoint, history
from orchestrator.fingerprint import environment_diff, stable_environment

EXIT_OK, EXIT_ERROR, EXIT_REGRESSION, EXIT_INTERRUPTED = 0, 1, 3, 130
# How a night's items can end, worst first (the order of the summary's verdicts).
ITEM_STATUSES = (
    "regression", "failed", "timeout", "interrupted", "skipped", "environment", "improvement", "building", "ok",
)  # fmt: skip


@dataclass(frozen=True)
class SeriesVerdict:
    """One series of an item tonight: its value, what history says about it, and why."""

    value: history.SeriesValue
    assessment: changepoint.Assessment
    status: str  # ok | regression | improvement | environment | building
    note: str = ""  # a confirmation re-run, an environment step's differences

    @property
    def too_noisy(self) -> bool:
        """The series' night-to-night noise is above half its threshold: beyond that the detector's false-alarm
        rate exceeds 1 per 100 nights (benchmarks/nightly_study.py)."""
        noise = self.assessment.noise
        return self.status != "building" and noise is not None and noise > self.value.threshold / 2

    def decision(self) -> dict[str, Any]:
        """What the night decided, as stored for `orch history`."""
        return {"status": self.status, "note": self.note or None, "change": self.assessment.change}

    def to_dict(self) -> dict[str, Any]:
        a = self.assessment
        return {
            **self.value.to_dict(),
            "status": self.status,
            "baseline": a.baseline,
            "change": a.change,
            "noise": a.noise,
            "nights": a.nights,
            "needed": a.needed,
            "step": dataclasses.asdict(a.new) if a.new else None,
            "note": self.note or None,
            "too_noisy": self.too_noisy,
        }


@dataclass(frozen=True)
class ItemReport:
    """One item's night: what ran, what it measured, and the verdicts."""

    item: str
    host: str
    kind: str
    simulated: bool
    status: str  # one of ITEM_STATUSES
    experiments: tuple[str, ...] = ()
    error: str | None = None
    series: tuple[SeriesVerdict, ...] = ()
    comparisons: tuple[dict[str, Any], ...] = ()  # tonight's A/B verdicts, each with its CI
    fail_on: dict[str, Any] | None = None
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()  # what to know before trusting its numbers (nodes that differ)

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "host": self.host,
            "kind": self.kind,
            "simulated": self.simulated,
            "status": self.status,
            "experiments": list(self.experiments),
            "error": self.error,
            "comparisons": list(self.comparisons),
            "fail_on": self.fail_on,
            "series": [s.to_dict() for s in self.series],
            "seconds": round(self.seconds, 1),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class NightReport:
    night_id: str
    suite: str
    suite_path: str
    night_at: float
    started_at: float
    finished_at: float
    status: str  # complete | deadline | interrupted | failed (orch itself) | busy (another night held the machine)
    items: tuple[ItemReport, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def exit_code(self) -> int:
        return night_exit_code(self.status, [i.status for i in self.items])

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(1 for i in self.items if i.status == s) for s in ITEM_STATUSES}
        return {
            "night_id": self.night_id,
            "suite": self.suite,
            "suite_path": self.suite_path,
            "night_at": self.night_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "status": self.status,
            "exit_code": self.exit_code,
            "simulated": any(i.simulated for i in self.items),
            "counts": {k: v for k, v in counts.items() if v},
            "items": [i.to_dict() for i in self.items],
            "error": self.error,
        }


def night_exit_code(status: str, item_statuses: Sequence[str]) -> int:
    """130 interrupted; else 3 if anything regressed (even if another item failed: the summary says both); else 1 if
    an item could not run (failed, timed out, or skipped at the deadline); else 0."""
    if status == "interrupted":
        return EXIT_INTERRUPTED
    if status in ("busy", "failed"):
        return EXIT_ERROR
    if "regression" in item_statuses:
        return EXIT_REGRESSION
    if any(s in ("failed", "timeout", "skipped") for s in item_statuses):
        return EXIT_ERROR
    return EXIT_OK


def item_status(series: Sequence[SeriesVerdict], relative_failed: bool) -> str:
    statuses = {s.status for s in series}
    if "regression" in statuses or relative_failed:
        return "regression"
    for s in ("environment", "improvement", "building"):
        if s in statuses:
            return s
    return "ok"


# ---------------------------------------------------------------- judging one item


def night_envs(night: history.ItemNight) -> dict[str, dict[str, Any]]:
    """A night's environments by arm as they compare now: a night stored before the values chosen anew for every
    launch or allocation were left out (fingerprint.stable_environment) compares equal to one stored after."""
    return {arm: stable_environment(env) for arm, env in night.envs.items()}


def series_env_ids(points: Sequence[tuple[history.ItemNight, history.SeriesValue]]) -> list[str]:
    """Per night of one series (oldest first), a label that changes exactly where its environment did, grouped as
    `judge` groups them (history.environment_ids: a field one night lacks, such as a fingerprint field renamed
    since, is no change); a night stored without its environments by the digest stored with its value."""
    envs = [
        history.series_environment(night_envs(night), value.env_arms)
        if any(arm in night.envs for arm in value.env_arms)
        else {"stored environment digest": value.env}
        for night, value in points
    ]
    return history.environment_ids(envs)


def _describe_env_step(before: history.ItemNight, after: history.ItemNight, arms: Sequence[str]) -> str:
    parts = []
    envs_before, envs_after = night_envs(before), night_envs(after)
    for arm in arms:
        # Only what both nights could read: a field one of them could not read says nothing.
        diffs = [
            d
            for d in environment_diff(envs_before.get(arm, {}), envs_after.get(arm, {}))
            if d.before is not None and d.after is not None
        ]
        prefix = f"{arm}: " if len(arms) > 1 else ""
        parts += [prefix + d.describe() for d in diffs[:3]]
        if len(diffs) > 3:
            parts.append(f"{prefix}and {len(diffs) - 3} more")
    return "; ".join(parts) if parts else "environment changed"


def judge(
    value: history.SeriesValue, past: Sequence[history.ItemNight], tonight: history.ItemNight, min_history: int
) -> SeriesVerdict:
    """Tonight's value of a series against the nights before it (each with the environment it ran in)."""
    points = [(n, v) for n in past if n.status == "complete" and (v := n.value(value.series)) is not None]
    envs = [history.series_environment(night_envs(n), value.env_arms) for n, _ in points]
    ids = history.environment_ids([*envs, history.series_environment(night_envs(tonight), value.env_arms)])
    values = [v.value for _, v in points] + [value.value]
    nights = [changepoint.Night(x, env) for x, env in zip(values, ids, strict=True)]
    a = changepoint.assess(
        nights, threshold=value.threshold, higher_is_better=value.higher_is_better, min_history=min_history
    )
    note = ""
    if a.status == "environment" and points:
        note = _describe_env_step(points[-1][0], tonight, value.env_arms)
    return SeriesVerdict(value, a, a.status, note)
