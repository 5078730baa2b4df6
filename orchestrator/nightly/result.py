"""A night's results: each series' verdict, each item's report, the night's report and its exit code, and how one
series is judged against its history (the model, apart from the runner in `nightly`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.launch.fingerprint import environment_diff, stable_environment
from orchestrator.nightly import changepoint, history

EXIT_OK, EXIT_ERROR, EXIT_REGRESSION, EXIT_INTERRUPTED = 0, 1, 3, 130
# How a night's items can end, worst first (the order of the summary's verdicts).
# "fail_on": tonight's A/B verdict is one the item's `fail_on` pages on (no history involved), told apart from a
# regression against history.
ITEM_STATUSES = (
    "regression", "fail_on", "failed", "timeout", "interrupted", "skipped", "environment", "improvement", "building",
    "ok",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SeriesVerdict:
    """One series of an item tonight: its value, what history says about it, and why."""

    value: history.SeriesValue
    assessment: changepoint.Assessment
    status: str  # ok | regression | improvement | environment | building
    note: str = ""  # a confirmation re-run, an environment step's differences
    changes: tuple[tuple[str, str], ...] = ()  # an environment step: (arm, one difference) each

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


@dataclass(frozen=True, kw_only=True)
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

    @property
    def fail_on_hit(self) -> tuple[str, ...]:
        """The `fail_on` modes tonight's A/B failed (each once, in the suite's order): what pages as FAIL-ON."""
        checks = (self.fail_on or {}).get("checks") or []
        return tuple(dict.fromkeys(str(c["mode"]) for c in checks if c.get("exit_code") == EXIT_REGRESSION))

    def fail_on_text(self) -> str | None:
        """`slower: eagle3-3step is slower than baseline (ratio 0.730, 95% CI …)`, each failed check; None if none."""
        checks = [c for c in (self.fail_on or {}).get("checks") or [] if c.get("exit_code") == EXIT_REGRESSION]
        return "; ".join(f"{c['mode']}: {c['reason']}" for c in checks) or None

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
            "fail_on_hit": list(self.fail_on_hit),
            "series": [s.to_dict() for s in self.series],
            "seconds": round(self.seconds, 1),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, kw_only=True)
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
    """130 interrupted; else 3 if anything regressed or hit its fail_on (even if another item failed: the summary
    says both); else 1 if an item could not run (failed, timed out, or skipped at the deadline); else 0."""
    if status == "interrupted":
        return EXIT_INTERRUPTED
    if status in ("busy", "failed"):
        return EXIT_ERROR
    if "regression" in item_statuses or "fail_on" in item_statuses:
        return EXIT_REGRESSION
    if any(s in ("failed", "timeout", "skipped") for s in item_statuses):
        return EXIT_ERROR
    return EXIT_OK


def item_status(series: Sequence[SeriesVerdict], relative_failed: bool) -> str:
    """The worst of its series; a regression against history outranks tonight's A/B under fail_on (the line says
    both), which outranks the rest."""
    statuses = {s.status for s in series}
    if "regression" in statuses:
        return "regression"
    if relative_failed:
        return "fail_on"
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


SHOWN_CHANGES = 3


def env_changes(before: history.ItemNight, after: history.ItemNight, arms: Sequence[str]) -> list[tuple[str, str]]:
    """(arm, one difference) for each difference of each arm's environment between two nights, most likely cause
    first."""
    out = []
    envs_before, envs_after = night_envs(before), night_envs(after)
    for arm in arms:
        # Only what both nights could read: a field one of them could not read says nothing.
        out += [
            (arm, d.describe())
            for d in environment_diff(envs_before.get(arm, {}), envs_after.get(arm, {}))
            if d.before is not None and d.after is not None
        ]
    return out


def describe_changes(changes: Sequence[tuple[str, str]], arms: Sequence[str]) -> str:
    """Each distinct difference once, with the arms that had it when not all of them (an engine upgrade changes
    every arm: said once, not once per arm and series): `engine version: 0.5.9 -> 0.5.10 (both arms); profile
    speculative.num_steps: 3 -> 2 (eagle3 only)`."""
    by_text: dict[str, list[str]] = {}
    for arm, text in changes:
        if arm not in by_text.setdefault(text, []):
            by_text[text].append(arm)
    every = list(dict.fromkeys(arms))
    parts = []
    for text, had in list(by_text.items())[:SHOWN_CHANGES]:
        if len(every) < 2:
            parts.append(text)
        elif set(every) <= set(had):
            parts.append(f"{text} ({'both' if len(every) == 2 else f'all {len(every)}'} arms)")
        else:
            parts.append(f"{text} ({', '.join(had)} only)" if len(had) == 1 else f"{text} ({', '.join(had)})")
    if len(by_text) > SHOWN_CHANGES:
        parts.append(f"and {len(by_text) - SHOWN_CHANGES} more (orch compare shows them all)")
    return "; ".join(parts) if parts else "environment changed"


def judge(
    value: history.SeriesValue, past: Sequence[history.ItemNight], tonight: history.ItemNight, min_history: int
) -> SeriesVerdict:
    """Tonight's value of a series against the nights before it (each with the environment it ran in). A crossover
    or max_rate_slo series is judged on the nights that crossed in the range measured (censored_verdict)."""
    points = [(n, v) for n in past if n.status == "complete" and (v := n.value(value.series)) is not None]
    envs = [history.series_environment(night_envs(n), value.env_arms) for n, _ in points]
    ids = history.environment_ids([*envs, history.series_environment(night_envs(tonight), value.env_arms)])
    censored = [v for _, v in points if v.censored is not None]
    if value.censored is not None or censored:
        # Only crossings that pay on the same side are one series of numbers; a censored night is no number. Its
        # environment still counts: a step a censored night already said is not said again.
        kept = [
            i for i, (_, v) in enumerate(points) if v.censored is None and v.higher_is_better == value.higher_is_better
        ]
        if points and ids[len(points) - 1] == ids[-1]:
            kept = [i for i in kept if ids[i] == ids[-1]]
        points, ids = [points[i] for i in kept], [ids[i] for i in kept] + [ids[-1]]
    values = [v.value for _, v in points] + [value.value]
    nights = [changepoint.Night(x, env) for x, env in zip(values, ids, strict=True)]
    a = changepoint.assess(
        nights, threshold=value.threshold, higher_is_better=value.higher_is_better, min_history=min_history
    )
    if a.status == "environment" and points:
        changes = env_changes(points[-1][0], tonight, value.env_arms)
        return SeriesVerdict(
            value=value,
            assessment=a,
            status=a.status,
            note=describe_changes(changes, value.env_arms),
            changes=tuple(changes),
        )
    if value.censored is not None:
        return censored_verdict(value, a)
    if censored and past and (last := past[-1].value(value.series)) is not None and last.censored is not None:
        return SeriesVerdict(
            value=value,
            assessment=a,
            status=a.status,
            note=f"crosses in the range again (the night before: {censored_text(last)})",
        )
    return SeriesVerdict(value=value, assessment=a, status=a.status)


def censored_text(v: history.SeriesValue) -> str:
    """What a night that does not cross in the range measured says instead of a number."""
    slo = v.metric.partition("@")[0] == "max_rate_slo"
    lo = f"{v.lo:.3g}" if v.lo is not None else "the lowest level"
    hi = f"{v.hi:.3g}" if v.hi is not None else "the highest level"
    if slo:
        if v.censored == "above":
            return f"within the SLO at every level measured, up to {v.value:.3g}"
        if v.censored == "below":
            return f"outside the SLO at every level measured, down to {v.value:.3g}"
        return f"undecided: within the SLO throughout is not excluded, nor leaving it between {lo} and {hi}"
    if v.censored == "above":
        return f"does not cross up to {v.value:.3g}: better at every level measured"
    if v.censored == "below":
        return f"does not cross down to {v.value:.3g}: worse at every level measured"
    return f"undecided: no crossing seen, but one may lie between {lo} and {hi}"


def censored_verdict(value: history.SeriesValue, a: changepoint.Assessment) -> SeriesVerdict:
    """A night that does not cross in the range measured. Its value is the range's end on its side, a bound the
    truth lies beyond, and it is assessed against the nights that crossed: worse at every level ("below") can be a
    regression, since the true change is at least the bound's; better at every level ("above") at most an
    improvement. Undecided is never judged. Nothing else is said as a change: a censored night's status is ok."""
    note = censored_text(value)
    if value.censored == "below" and a.status == "regression":
        return SeriesVerdict(value=value, assessment=a, status="regression", note=f"{note}: {pct(a.change)} or worse")
    if value.censored == "above" and a.status == "improvement":
        return SeriesVerdict(value=value, assessment=a, status="improvement", note=note)
    return SeriesVerdict(
        value=value, assessment=a, status="ok", note=note + ("; not judged" if value.censored == "undecided" else "")
    )


def rerun_note(first: SeriesVerdict, rerun: SeriesVerdict | None) -> tuple[str, str]:
    """A confirmation re-run's outcome for a series the first measurement called a regression: (status, note),
    the note saying what the re-run alone measured and which rule of changepoint.assess decided it."""
    first_change = pct(first.assessment.change)
    if rerun is None:
        return "ok", f"not confirmed: the first measurement was {first_change}, the re-run measured no value"
    a, threshold = rerun.assessment, rerun.value.threshold
    said = f"the first measurement was {first_change}, a re-run from fresh state {pct(a.change)}"
    if rerun.status == "regression":
        return "regression", f"confirmed by a re-run: {first_change}, then {pct(a.change)}"
    if a.change is None:
        why = f"the re-run says {rerun.status}"
    elif abs(a.change) < threshold:
        why = f"that is within the {threshold * 100:g} % threshold"
    elif (a.change < 0) != rerun.value.higher_is_better:
        why = "that is no loss"  # the re-run moved the other way
    else:
        # One night as a new level must also be Z_ONE noise units off the level before it (changepoint's gate).
        noise = max(a.noise or 0.0, threshold * changepoint.SIGMA_FLOOR)
        before = max(1, min(a.nights - 1, changepoint.LEVEL_NIGHTS))
        bound = changepoint.Z_ONE * noise * math.sqrt(1 / before + 1)
        needed = math.expm1(-bound if rerun.value.higher_is_better else bound)
        why = (
            f"beyond the {threshold * 100:g} % threshold but not significant: a single night counts only "
            f"{changepoint.Z_ONE:g} noise units off the level ({noise * 100:.1f} % night to night here, so about "
            f"{pct(needed)})"
        )
    return "ok", f"not confirmed: {said}, {why}; both are kept"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} %"
