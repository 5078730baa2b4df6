"""Experiment results: the model (launches → arms → the A/B result with its comparisons and warnings), apart from
what produces it (the run loop, `experiment/ab`) and from reading it back from the store (`results/load`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from orchestrator import engines
from orchestrator.config.slo import DEFAULT_METRIC, METRICS, SLO, Objective
from orchestrator.results.cache import cache_gap, cache_warnings
from orchestrator.results.capacity import CapacityComparison, SloRecovery
from orchestrator.results.comparison import Comparison
from orchestrator.results.datasource import DataSource
from orchestrator.results.energy import EnergyComparison, EnergyEstimate, energy_estimate
from orchestrator.results.goodput import Attainment, block_values, pooled, run_value
from orchestrator.results.pairing import block_pairs, energy_paired, paired_blocks, spec_paired
from orchestrator.results.run import Level, Rate, level_name
from orchestrator.results.warnings import attached_warnings, gpu_drift_warnings, host_noise_warning
from orchestrator.stats.crossover import (
    Crossover,
    bounded_ratio_end,
    capacity,
    capacity_log_bounds,
    crossover,
    first_crossing,
    recovery,
)
from orchestrator.stats.estimates import (
    DEFAULT_MIN_EFFECT,
    ArmSpread,
    BreakEven,
    RatioEstimate,
    Summary,
    arm_spread,
    blocks_needed,
    breakeven_interval,
    launch_mean,
    launch_value,
    minimal_detectable_effect,
    outliers,
    ratio_ci,
    schedule,
    slow_first_run,
    spec_from_run,
    summarize,
    verdict,
)
from orchestrator.stats.family import FAMILY_ALPHA, Adjustment, excludes_one, holm, t_crit
from orchestrator.stats.sequential import SequentialPlan

if TYPE_CHECKING:
    from orchestrator.results.byprompt import PromptSet

    # Imported where runs are read back (results/load): the results model itself needs none of the run loop.
    from orchestrator.results.run import RunResult


def has_valid_run(launches: Sequence[LaunchResult], arm_index: int) -> bool:
    mine = [launch for launch in launches if launch.arm_index == arm_index]
    return any(launch.timed_at(level) for launch in mine for level in launch.levels)


@dataclass(frozen=True, kw_only=True)
class LaunchResult:
    """One launch of one arm (in one block) and its runs, with what was verified about it."""

    profile: str
    launch_id: str
    runs: tuple[RunResult, ...]
    ready_s: float
    env_report: dict[str, Any]
    teardown: dict[str, Any]
    spec_steps: int | None = None  # draft steps when the arm uses speculative decoding
    block: int = 0
    position: int = 0  # place in its block's launch order
    arm_index: int = 0
    gpus: dict[str, Any] | None = None  # nvidia-smi under load, after the timed runs
    fingerprint: dict[str, Any] | None = None  # fingerprint.collect(): what could make two launches differ

    @property
    def levels(self) -> list[Level]:
        """Levels in the order they ran: concurrency levels, or rates (open loop, results/run.Rate)."""
        return list(dict.fromkeys(r.level for r in self.runs if not r.warmup))

    def timed_at(self, concurrency: Level | None = None) -> list[RunResult]:
        """Valid timed runs at one level (default: the first level, the headline)."""
        level = concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)
        return [r for r in self.runs if not r.warmup and r.valid and r.level == level]

    def value_at(self, concurrency: Level | None = None, metric: str = "tok_s", slo: SLO | None = None) -> float | None:
        """The launch-level value: the median of its valid timed runs (a metric of config/slo.METRICS or a run field;
        `slo` for the goodput metrics)."""
        values = [v for r in self.timed_at(concurrency) if (v := run_value(r, metric, slo)) is not None]
        return launch_value(values) if values else None

    @property
    def invalid_runs(self) -> list[RunResult]:
        return [r for r in self.runs if not r.warmup and not r.valid]

    @property
    def attached(self) -> dict[str, Any] | None:
        """The marker of a session on a server orch did not launch (`--attach`): its URL, not fresh, env not
        verified; None for a launch of orch's own."""
        mark = (self.fingerprint or {}).get("attached") or self.env_report.get("attached")
        return mark if isinstance(mark, dict) else None

    def energy_runs_at(self, concurrency: Level | None = None) -> list[RunResult]:
        """Valid timed runs at one level with an energy figure."""
        return [r for r in self.timed_at(concurrency) if r.j_per_token is not None]

    def energy_at(self, concurrency: Level | None = None) -> float | None:
        """The launch's joules per output token: the median of its measured valid timed runs (like tok/s)."""
        values = [float(r.j_per_token or 0.0) for r in self.energy_runs_at(concurrency)]
        return launch_value(values) if values else None


def mean_accept_length(runs: Sequence[RunResult]) -> float | None:
    """Mean accept length over runs, each from that run's own data (never the server's lifetime average)."""
    values = [r.spec_accept_length for r in runs if r.spec_accept_length is not None]
    return sum(values) / len(values) if values else None


def arm_label(names: Sequence[str], index: int) -> str:
    """The profile name, or "name#2" when one profile is two arms (an A/A test)."""
    return f"{names[index]}#{index + 1}" if list(names).count(names[index]) > 1 else names[index]


def _median(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


# How far a level's scheduled rate may stray from the offered one before the reports say so: a 30 s run at 1 req/s
# (the default duration) strays by up to about 15 % from the default seed, a 10 s one by 25-45 %.
SCHEDULE_STRAY = 0.2


def schedule_drawn(part: Mapping[str, Any]) -> tuple[float, int] | None:
    """An open-loop run's whole schedule: its fitted rate and requests (client.summary.open_loop_summary); a run
    that stopped sending early measured only part of it, and says the whole apart (None where it does not)."""
    if part.get("stopped"):
        whole = part.get("schedule")
        part = whole if isinstance(whole, Mapping) else {}
        rate, requests = part.get("rate"), part.get("requests")
    else:
        rate, requests = part.get("scheduled_rate"), part.get("requests")
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not isinstance(requests, int):
        return None
    return float(rate), requests


@dataclass(frozen=True, kw_only=True)
class RateLevel:
    """One arm at one open-loop level (docs/load.md): medians over its valid timed runs of the rates offered,
    scheduled, sent and achieved, of latency percentiles counted from the scheduled send time, and whether it kept
    up (client.summary.limit_of: None, "client" or "server", with the reason in words)."""

    rate: float  # offered, requests per second
    runs: int
    requests: int  # over those runs
    scheduled_rate: float | None
    sent_rate: float | None
    achieved_rate: float | None
    achieved_ratio: float | None  # achieved / scheduled
    send_lag_p99_s: float | None
    held: int  # requests a --max-concurrency cap held back, over the runs
    peak_in_flight: int | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    limited: str | None
    reason: str | None
    stopped: int = 0  # runs that stopped sending early, over-saturated (docs/load.md#over-saturation)
    # The seeded schedule whole (median rate, mean requests per run): scheduled_rate and requests are those of the
    # requests measured, only part of it in a run that stopped sending early. None: not known (such runs stored before
    # orch kept it).
    schedule_rate: float | None = None
    schedule_requests: float | None = None

    @classmethod
    def of(cls, rate: float, runs: Sequence[RunResult]) -> RateLevel:
        from orchestrator.client.summary import limit_of, limit_reason

        parts = [r.open_loop for r in runs]
        requests = sum(int(p.get("requests") or 0) for p in parts)
        held = sum(int(p.get("held") or 0) for p in parts)
        scheduled = _median([p.get("scheduled_rate") for p in parts])
        sent = _median([p.get("sent_rate") for p in parts])
        ratio = _median([p.get("achieved_ratio") for p in parts])
        lag = _median([(p.get("send_lag") or {}).get("p99") for p in parts])
        peaks = [int(p["peak_in_flight"]) for p in parts if p.get("peak_in_flight") is not None]
        limited = limit_of(ratio, sent / scheduled if sent and scheduled else None, held / requests if requests else 0)
        summary: dict[str, Any] = {
            "limited": limited,
            "achieved_rate": _median([p.get("achieved_rate") for p in parts]),
            "scheduled_rate": scheduled,
            "offered_rate": rate,
            "sent_rate": sent,
            "send_lag": {"p99": lag},
            "held": held,
            "requests": requests,
            "max_concurrency": next((p.get("max_concurrency") for p in parts), None),
            "queue_wait": {"p99": _median([(p.get("queue_wait") or {}).get("p99") for p in parts])},
            "peak_in_flight": max(peaks) if peaks else None,
        }

        def pct(name: str, q: str) -> float | None:
            return _median([(r.metrics.get(name) or {}).get(q) for r in runs])

        stops = [p["stopped"] for p in parts if p.get("stopped")]
        reason = limit_reason(summary)
        if stops:
            # Where the backlog was when sending stopped (runs stored before the client could be it: the server).
            limited = "client" if any(s.get("limited") == "client" for s in stops) else "server"
            reason = (
                f"limited by the {limited}: {len(stops)} of {len(runs)} runs stopped sending early, over-saturated "
                f"(first: {stops[0].get('reason')}, after {stops[0].get('sent')} of {stops[0].get('of')} requests)"
            )

        drawn = [schedule_drawn(p) for p in parts]
        whole = [d for d in drawn if d is not None] if all(d is not None for d in drawn) else []
        return cls(
            rate=rate,
            runs=len(runs),
            requests=requests,
            scheduled_rate=scheduled,
            sent_rate=sent,
            achieved_rate=summary["achieved_rate"],
            achieved_ratio=ratio,
            send_lag_p99_s=lag,
            held=held,
            peak_in_flight=summary["peak_in_flight"],
            ttft_p50_s=pct("ttft", "p50"),
            ttft_p99_s=pct("ttft", "p99"),
            e2e_p50_s=pct("e2e", "p50"),
            e2e_p99_s=pct("e2e", "p99"),
            limited=limited,
            reason=reason,
            stopped=len(stops),
            schedule_rate=_median([r for r, _ in whole]),
            schedule_requests=sum(n for _, n in whole) / len(whole) if whole else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class ArmResult:
    """One arm (profile) across all its launches; the launch, not the run, is the unit of replication."""

    profile: str
    launches: tuple[LaunchResult, ...]
    spec_steps: int | None = None
    label: str = ""  # the profile name, or "name#2" when one profile is two arms (an A/A test)
    slo: SLO | None = None  # what the goodput metrics count against

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.profile)

    @property
    def launch_id(self) -> str | None:
        return self.launches[0].launch_id if self.launches else None

    @property
    def runs(self) -> list[RunResult]:
        return [r for launch in self.launches for r in launch.runs]

    @property
    def levels(self) -> list[Level]:
        return list(dict.fromkeys(level for launch in self.launches for level in launch.levels))

    def _level(self, concurrency: Level | None) -> Level:
        return concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)

    def timed_at(self, concurrency: Level | None = None) -> list[RunResult]:
        level = self._level(concurrency)
        return [r for launch in self.launches for r in launch.timed_at(level)]

    @property
    def timed(self) -> list[RunResult]:
        return self.timed_at()

    def per_launch_at(self, concurrency: Level | None = None, metric: str = "tok_s") -> list[list[float]]:
        """Per launch, its valid timed runs' values of the metric (runs without one left out)."""
        level = self._level(concurrency)
        return [
            [v for r in launch.timed_at(level) if (v := run_value(r, metric, self.slo)) is not None]
            for launch in self.launches
        ]

    def spread_at(self, concurrency: Level | None = None, metric: str = "tok_s") -> ArmSpread | None:
        """Launches, runs, median of launch values, CV within and across launches."""
        per_launch = [v for v in self.per_launch_at(concurrency, metric) if v]
        return arm_spread(per_launch) if per_launch else None

    def summary_at(self, concurrency: Level | None = None) -> Summary | None:
        """Per-stream tok/s over every valid timed run of every launch (for min/max; comparisons use launches)."""
        timed = self.timed_at(concurrency)
        return summarize([r.tok_s for r in timed]) if timed else None

    def aggregate_at(self, concurrency: Level | None = None) -> ArmSpread | None:
        return self.spread_at(concurrency, "aggregate_tok_s")

    def objectives_at(self, concurrency: Level | None = None) -> list[tuple[Objective, float | None, bool | None]]:
        """Each objective of the SLO with a percentile, as the arm met it at one level: the median of its launch
        values of that percentile (seconds) and whether it is within the limit (None: no value)."""
        out: list[tuple[Objective, float | None, bool | None]] = []
        for o in self.slo.objectives if self.slo is not None else ():
            if o.percentile is None:
                continue
            spread = self.spread_at(concurrency, f"{o.quantity}_p{o.percentile}")
            value = spread.median if spread else None
            out.append((o, value, None if value is None else value <= o.limit_s))
        return out

    def attainment_at(self, concurrency: Level | None = None) -> Attainment | None:
        """Every valid timed run's requests at one level under the arm's SLO, pooled: how many met all its limits."""
        return pooled(self.timed_at(concurrency), self.slo) if self.slo is not None else None

    @property
    def summary(self) -> Summary | None:
        return self.summary_at()

    def median_at(self, concurrency: Level | None = None) -> float | None:
        """The arm's headline number: the median of its launch values."""
        spread = self.spread_at(concurrency)
        return spread.median if spread else None

    def accept_length_at(self, concurrency: Level | None = None) -> float | None:
        return mean_accept_length(self.timed_at(concurrency))

    @property
    def accept_length(self) -> float | None:
        return self.accept_length_at()

    def rate_level(self, level: Level | None = None) -> RateLevel | None:
        """This arm at an open-loop level (RateLevel); None at a concurrency level or without a valid timed run."""
        level = self._level(level)
        timed = self.timed_at(level)
        if not isinstance(level, Rate) or not timed:
            return None
        return RateLevel.of(float(level), timed)

    @property
    def env_ok(self) -> bool:
        """No launch's env check found a mismatch (an attached arm's env is unverified, not mismatched)."""
        return all(launch.env_report.get("ok", True) is not False for launch in self.launches)

    @property
    def attached_url(self) -> str | None:
        """The URL of the running server this arm was measured on (`--attach`), or None for launched arms."""
        return next((str(m["url"]) for launch in self.launches if (m := launch.attached)), None)

    def energy_at(self, concurrency: Level | None = None) -> EnergyEstimate | None:
        """Joules per output token at one level over the launches that measured it (`energy_estimate`)."""
        level = self._level(concurrency)
        measured = [launch for launch in self.launches if launch.energy_runs_at(level)]
        if not measured:
            return None
        runs = [r for launch in measured for r in launch.energy_runs_at(level)]
        return energy_estimate([float(launch.energy_at(level) or 0.0) for launch in measured], runs)

    def energy_missing_at(self, concurrency: Level | None = None) -> str | None:
        """Why this arm has no energy figure at one level (its runs' reasons, each once); None when it has one,
        or when its runs never tried (stored before orch measured energy, or on an attached server)."""
        if self.energy_at(concurrency) is not None:
            return None
        entries = [r.energy for r in self.timed_at(concurrency) if r.energy is not None]
        if not entries:
            entries = [r.energy for r in self.runs if not r.warmup and r.energy is not None]
        reasons = list(dict.fromkeys(str(e.get("error") or "no figure") for e in entries))
        return "; ".join(reasons) if reasons else None


@dataclass(frozen=True, kw_only=True)
class Design:
    """How the launches of an experiment are arranged: every block launches every arm once, in a recorded order.
    With `auto` (`--blocks auto`) `blocks` is how many are scheduled so far: one more after each undecided look."""

    blocks: int = 1
    order: str = "fixed"
    seed: int = 0
    schedule: tuple[tuple[int, ...], ...] = ((0,),)
    auto: SequentialPlan | None = None

    @classmethod
    def make(cls, arms: int, blocks: int, order: str, seed: int, auto: SequentialPlan | None = None) -> Design:
        return cls(
            blocks=blocks,
            order=order,
            seed=seed,
            schedule=tuple(tuple(b) for b in schedule(arms, blocks, order, seed)),
            auto=auto,
        )

    def extended(self, blocks: int) -> Design:
        """The same design with more blocks: the seeded schedule of the longer design starts with this one's."""
        return Design.make(len(self.schedule[0]), blocks, self.order, self.seed, self.auto)

    def to_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "order": self.order,
            "seed": self.seed,
            "schedule": [list(b) for b in self.schedule],
            **({"auto": self.auto.to_dict()} if self.auto is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Design:
        return cls(
            blocks=int(d["blocks"]),
            order=str(d["order"]),
            seed=int(d["seed"]),
            schedule=tuple(tuple(int(i) for i in b) for b in d["schedule"]),
            auto=SequentialPlan.from_dict(d["auto"]) if d.get("auto") else None,
        )

    def slots(self) -> list[tuple[int, int, int]]:
        """(block, position, arm index) for every launch, in execution order."""
        return [(b, pos, arm) for b, order in enumerate(self.schedule) for pos, arm in enumerate(order)]


@dataclass(frozen=True)
class CutShort:
    """A launch that started but did not complete: kept in the store, left out of the statistics."""

    block: int
    arm_index: int
    status: str  # interrupted | failed | running (an older orch killed mid-launch)


@dataclass(frozen=True, kw_only=True)
class ABResult:
    experiment_id: str
    simulated: bool
    host: str
    profiles: tuple[str, ...]
    launches: tuple[LaunchResult, ...]  # in execution order
    host_facts: dict[str, Any]
    target_tps: float | None = None
    design: Design = field(default_factory=Design)
    min_effect: float = DEFAULT_MIN_EFFECT
    status: str = "complete"
    notes: tuple[str, ...] = ()  # things worth saying that are not about the numbers (e.g. discarded launches)
    cut_short: tuple[CutShort, ...] = ()  # launches that started but did not complete (not in the statistics)
    slo: SLO | None = None  # --slo: what goodput counts against
    metric: str = DEFAULT_METRIC  # --metric: what the comparisons' ratios and verdicts are on
    sweep: dict[str, Any] | None = None  # --sweep auto: the probe's finding (experiment/sweep.Probe.to_dict)
    # Each timed run's request categories (config/workload.run_categories) when the workload is a dataset: what
    # results/categories breaks the results down by; None for orch's own prompt sets.
    categories: Mapping[tuple[int, float, int], Sequence[str]] | None = None
    # The dataset's prompts per category (results/categories.dataset_counts): what `categories not sent` is said
    # against. None for orch's own prompt sets, or a dataset that can no longer be read as it was.
    dataset_categories: Mapping[str, int] | None = None
    # Each timed run's requests as their prompts (results/byprompt.workload_prompts) when the prompt set is small
    # (at most 20 prompts) and no breakdown by category covers it: what results/byprompt breaks the results down by.
    prompts: PromptSet | None = None
    # What the requests were drawn from, by name and sha256 (results/datasource): `orch compare` and the nightly
    # history treat a change of it as an environment step. None where it is not known.
    dataset: DataSource | None = None
    # --cache-measured: arms whose prefix-cache hit rates differ keep their verdicts (results/cache.cache_gap).
    cache_measured: bool = False

    @cached_property
    def arms(self) -> tuple[ArmResult, ...]:
        out = []
        for i, name in enumerate(self.profiles):
            mine = tuple(launch for launch in self.launches if launch.arm_index == i)
            steps = next((launch.spec_steps for launch in mine), None)
            out.append(
                ArmResult(
                    profile=name, launches=mine, spec_steps=steps, label=arm_label(self.profiles, i), slo=self.slo
                )
            )
        return tuple(out)

    @property
    def blocks(self) -> int:
        """Blocks in which every arm has a launch."""
        per_arm = [{launch.block for launch in arm.launches} for arm in self.arms]
        return len(set.intersection(*per_arm)) if per_arm else 0

    @property
    def levels(self) -> list[Level]:
        """Levels in the order they ran, over every launch (a partial experiment may lack an arm): concurrency
        levels, or rates (open loop)."""
        return list(dict.fromkeys(level for launch in self.launches for level in launch.levels))

    @cached_property
    def derived(self) -> dict[str, Any]:
        """What other modules compute from this result and keep once computed (results/categories: the breakdown by
        category of every level, one family of verdicts); as safe as _comparisons, for the same reasons."""
        return {}

    @cached_property
    def _comparisons(self) -> dict[tuple[str, Level], tuple[Comparison, ...]]:
        """Each level's comparisons, once computed: the report's tables, verdict lines, advice and `--blocks auto`
        notes all ask for them, and every one is a bootstrap. Safe to keep: the result is frozen, and
        dataclasses.replace (another min_effect or design) makes a new result with an empty cache."""
        return {}

    def with_notes(self, *notes: str) -> ABResult:
        """The same result with more notes; notes change no number, so the comparisons computed so far are kept."""
        out = dataclasses.replace(self, notes=(*self.notes, *notes))
        out.__dict__["_comparisons"] = self._comparisons
        return out

    def comparisons_at(self, concurrency: Level | None = None, metric: str | None = None) -> list[Comparison]:
        """Each arm against the first at one level, on `metric` (default: the experiment's, --metric). The
        comparisons of every level and arm are one family of verdicts (printed together): computed together, their
        CIs at Holm's levels (stats/family)."""
        level = concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)
        key = (metric or self.metric, level)
        if key not in self._comparisons:
            levels = self.levels if level in self.levels else [level]
            for lv, found in zip(levels, self._compare_family(levels, key[0]), strict=True):
                self._comparisons[(key[0], lv)] = tuple(found)
        return list(self._comparisons[key])

    def _compare_family(self, levels: Sequence[Level], metric: str) -> list[list[Comparison]]:
        """Each level's comparisons on `metric`, the CIs of those with two or more blocks (the ones that can give a
        verdict) stepped down together by Holm over all of them; a family of one is the plain 95 % comparison."""
        base = self.arms[0]
        plan = self.design.auto
        family = plan.alpha if plan is not None else FAMILY_ALPHA
        out: list[list[Comparison]] = []
        members: list[tuple[int, int, Callable[[float], tuple[RatioEstimate, dict[str, Any] | None, float | None]]]]
        members = []
        for level in levels:
            mine: list[Comparison] = []
            for index, arm in enumerate(self.arms[1:], start=1):
                names: dict[str, Any] = {"arm_label": arm.label, "vs_label": base.label, "arm_index": index}
                names |= {"metric": metric, "note": self.comparison_note(base, arm, level, metric)}
                paired, shared = paired_blocks(base, arm, level, (metric,), self.slo)
                b_runs, a_runs = paired[metric]
                if b_runs and len(b_runs) >= 2:
                    members.append((len(out), len(mine), self._estimator(b_runs, a_runs, shared)))
                # Paired apart from the verdict's metric: a short open-loop run can receive no token while requests
                # are still arriving (aggregate 0), and that must not drop its block from the verdict.
                agg = None
                if b_runs:
                    b_agg, a_agg = paired_blocks(base, arm, level, ("aggregate_tok_s",), self.slo)[0]["aggregate_tok_s"]
                    logs = [math.log(launch_value(a) / launch_value(b)) for b, a in zip(b_agg, a_agg, strict=True)]
                    agg = math.exp(statistics.fmean(logs)) if logs else None
                comparison = Comparison(
                    arm=arm.profile,
                    vs=base.profile,
                    ratio=None,
                    concurrency=level,
                    aggregate_ratio=agg,
                    min_effect=self.min_effect,
                    **names,
                )
                if b_runs and len(b_runs) < 2:
                    # One block: no CI that could carry a verdict, so no member of the family.
                    est, sequential, crit = self._estimator(b_runs, a_runs, shared)(family)
                    comparison = self._judged(comparison, est, sequential, crit, None)
                mine.append(comparison)
            out.append(mine)
        if members:
            stepped = holm([m[2] for m in members], lambda found: excludes_one(found[0]), family)
            over = self._family_name(members, out)
            for (i, j, _), ((est, sequential, crit), alpha) in zip(members, stepped, strict=True):
                adjustment = None if len(members) == 1 else Adjustment(size=len(members), alpha=alpha, over=over)
                out[i][j] = self._judged(out[i][j], est, sequential, crit, adjustment)
        for level, mine in zip(levels, out, strict=True):
            for j, c in enumerate(mine):
                gap = cache_gap(base, self.arms[c.arm_index], level, measured=self.cache_measured)
                if gap is not None and c.estimate is not None:
                    # One rule (results/cache): arms the cache treated differently get no verdict, unless measured.
                    kept = c.verdict
                    mine[j] = dataclasses.replace(
                        c,
                        cache_gap=gap,
                        verdict=kept if gap.measured else "inconclusive",
                        ci_verdict=None if gap.measured else kept,
                    )
        return out

    def _estimator(
        self, b_runs: list[list[float]], a_runs: list[list[float]], shared: bool
    ) -> Callable[[float], tuple[RatioEstimate, dict[str, Any] | None, float | None]]:
        """The comparison's estimate with its CI at a two-sided level 1 − alpha (the family's step), the sequential
        look it belongs to (--blocks auto) and the critical value its MDE uses (None: the 95 % table's)."""
        plan, n = self.design.auto, len(b_runs)

        def at(alpha: float) -> tuple[RatioEstimate, dict[str, Any] | None, float | None]:
            if plan is None:
                crit = None if alpha == FAMILY_ALPHA or n < 2 else t_crit(alpha, n - 1)
                return (
                    ratio_ci(b_runs, a_runs, seed=self.design.seed, paired=shared, alpha=alpha, t_crit=crit),
                    None,
                    crit,
                )
            # The interval the stopping rule used: a repeated CI at this look's nominal level, never a plain 95 %;
            # in a family, the repeated CI of the plan spending the member's Holm level instead of the whole alpha.
            look = plan if alpha == plan.alpha else dataclasses.replace(plan, alpha=alpha)
            crit = look.t_crit(n)
            est = ratio_ci(
                b_runs, a_runs, seed=self.design.seed, alpha=look.nominal_alpha(n), t_crit=crit, paired=shared
            )
            est = dataclasses.replace(est, method=f"{look.describe()}; look at {n} blocks: {est.method}")
            return est, {**look.to_dict(), "look_blocks": n, "nominal_alpha": look.nominal_alpha(n), "t": crit}, crit

        return at

    def _judged(
        self,
        c: Comparison,
        est: RatioEstimate,
        sequential: dict[str, Any] | None,
        crit: float | None,
        adjustment: Adjustment | None,
    ) -> Comparison:
        """The comparison with its estimate, verdict, MDE and blocks needed."""
        return dataclasses.replace(
            c,
            ratio=est.ratio,
            estimate=est,
            verdict=verdict(est, self.min_effect, higher_is_better=METRICS[c.metric].higher_is_better),
            mde=minimal_detectable_effect(est, crit),
            blocks_needed=blocks_needed(est, self.min_effect),
            sequential=sequential,
            adjustment=adjustment,
        )

    def _family_name(self, members: Sequence[tuple[int, int, object]], out: Sequence[Sequence[Comparison]]) -> str:
        """What the family of comparisons is over: "3 levels", "2 arms", "6 comparisons (2 arms × 3 levels)"."""
        levels = {i for i, _, _ in members}
        arms = {out[i][j].arm_index for i, j, _ in members}
        if len(arms) == 1:
            return f"{len(members)} levels"
        if len(levels) == 1:
            return f"{len(members)} arms"
        return f"{len(members)} comparisons ({len(arms)} arms × {len(levels)} levels)"

    @cached_property
    def _crossings(self) -> dict[str, list[tuple[ArmResult, Crossover]]]:
        """Crossovers and SLO capacities, once computed (by kind and metric): every format of a report asks."""
        return {}

    def crossovers(self, metric: str | None = None) -> list[tuple[ArmResult, Crossover]]:
        """Each arm against the first across the levels (two or more measured): where its ratio on `metric` crosses
        1, oriented so that above 1 is better (stats/crossover). Arms without two complete blocks are left out."""
        key = f"crossover:{metric or self.metric}"
        if key not in self._crossings:
            self._crossings[key] = self._crossovers(metric or self.metric)
        return list(self._crossings[key])

    def _crossovers(self, metric: str) -> list[tuple[ArmResult, Crossover]]:
        if len(self.levels) < 2 or len(self.arms) < 2:
            return []
        flip = not METRICS[metric].higher_is_better
        base, out = self.arms[0], []
        for arm in self.arms[1:]:
            pairs = block_pairs(base, arm)
            ratios: list[list[float | None]] = []
            for level in self.levels:
                row: list[float | None] = []
                for b_launch, a_launch in pairs:
                    b_runs = sorted(b_launch.timed_at(level), key=lambda r: r.index)
                    a_runs = sorted(a_launch.timed_at(level), key=lambda r: r.index)
                    values = block_values(b_runs, a_runs, metric, self.slo) if b_runs and a_runs else None
                    if values is None or not values[0] or not values[1]:
                        row.append(None)
                        continue
                    ratio = launch_value(values[1]) / launch_value(values[0])
                    row.append(1 / ratio if flip and ratio > 0 else ratio)
                ratios.append(row)
            with contextlib.suppress(ValueError):  # fewer than two blocks complete at every level: nothing to say
                out.append((arm, crossover([float(v) for v in self.levels], ratios)))
        return out

    def max_within_slo(self) -> list[tuple[ArmResult, Crossover]]:
        """Each arm's highest load within every percentile objective of the SLO, over the levels measured (two or
        more): per block, where its launch's margin — limit / its pNN, the tightest objective — first falls to 1
        going up the levels (the per-block capacity capacity_comparisons takes its ratios of), and their geometric
        mean with a Student-t CI over the blocks (stats/crossover.capacity). Empty without such an objective."""
        if "slo" not in self._crossings:
            self._crossings["slo"] = self._max_within_slo()
        return list(self._crossings["slo"])

    def _max_within_slo(self) -> list[tuple[ArmResult, Crossover]]:
        objectives = [o for o in (self.slo.objectives if self.slo is not None else ()) if o.percentile is not None]
        if not objectives or len(self.levels) < 2:
            return []
        out = []
        for arm in self.arms:
            margins = self.slo_margins(arm)
            with contextlib.suppress(ValueError):  # fewer than two blocks with every level: nothing to say
                out.append((arm, capacity([float(v) for v in self.levels], [margins[b] for b in sorted(margins)])))
        return out

    def slo_recoveries(self) -> list[SloRecovery]:
        """Each block, of every arm, whose margin curve missed the SLO at one level and met it again at a higher one
        (stats/crossover.recovery): its capacity is the first miss, which is worth saying beside the estimate."""
        if len(self.levels) < 2:
            return []
        levels, rates = [float(v) for v in self.levels], isinstance(self.levels[0], Rate)
        out = []
        for arm in self.arms:
            for block, row in sorted(self.slo_margins(arm).items()):
                if (found := recovery(levels, row)) is not None:
                    out.append(
                        SloRecovery(arm=arm.label, block=block, missed_at=found[0], met_again_at=found[1], rates=rates)
                    )
        return out

    def slo_margins(self, arm: ArmResult) -> dict[int, list[float | None]]:
        """Per block of `arm`: at each level, its launch's margin to the SLO's percentile objectives (limit / pNN of
        the tightest one; above 1 within them), or None where the launch has no such value. {} without such an
        objective."""
        objectives = [o for o in (self.slo.objectives if self.slo is not None else ()) if o.percentile is not None]
        if not objectives:
            return {}
        out: dict[int, list[float | None]] = {}
        for launch in arm.launches:
            row: list[float | None] = []
            for level in self.levels:
                values = [launch.value_at(level, f"{o.quantity}_p{o.percentile}", self.slo) for o in objectives]
                margins = [o.limit_s / v for o, v in zip(objectives, values, strict=True) if v]
                row.append(min(margins) if len(margins) == len(objectives) else None)
            out[launch.block] = row
        return out

    def capacity_comparisons(self) -> list[CapacityComparison]:
        """Each arm's highest load within the SLO against the first arm's: per block, where each launch's margin
        curve first falls to 1 (stats/crossover.first_crossing, as max_within_slo takes it), the ratio of the two,
        and its geometric mean with a Student-t CI over the blocks where both crossed within the range measured (the
        others are counted as censored: past the last level, or over the SLO already at the first). Where blocks are
        censored, each block's ratio is also bounded with the censored capacity at the range's edge; when one end of
        the CI over all blocks decides (beyond 1 by the minimum effect), that end is the answer
        (`CapacityComparison.bound`)."""
        if len(self.levels) < 2 or len(self.arms) < 2:
            return []
        levels = [float(v) for v in self.levels]
        base = self.arms[0]
        base_margins = self.slo_margins(base)
        if not base_margins:
            return []
        out = []
        for arm in self.arms[1:]:
            margins = self.slo_margins(arm)
            logs, censored = [], 0
            lows, highs = [], []  # every block's log ratio as bounds (equal where both crossed within the range)
            for block in sorted(set(base_margins) & set(margins)):
                found = first_crossing(levels, base_margins[block]), first_crossing(levels, margins[block])
                if "missing" in (found[0][0], found[1][0]):
                    continue
                (b_lo, b_hi), (x_lo, x_hi) = (capacity_log_bounds(levels, f) for f in found)
                lows.append(x_lo - b_hi)
                highs.append(x_hi - b_lo)
                if found[0][1] is None or found[1][1] is None:
                    censored += 1
                    continue
                logs.append(x_lo - b_lo)
            decided = None
            if censored:  # a bound over every block says more than the blocks that crossed alone, when it decides
                # The verdict rule of every comparison on the one end known: past 1 by at least the minimum effect
                # (the ratio lies beyond its end, so it is at least that far from 1 too).
                upper, lower = bounded_ratio_end(highs, "upper"), bounded_ratio_end(lows, "lower")
                if upper is not None and upper <= 1 - self.min_effect:
                    decided = CapacityComparison.bounded(arm.label, base.label, "upper", upper, len(highs), censored)
                elif lower is not None and lower >= 1 + self.min_effect:
                    decided = CapacityComparison.bounded(arm.label, base.label, "lower", lower, len(lows), censored)
            out.append(decided or CapacityComparison.of(arm.label, base.label, logs, censored, self.min_effect))
        return out

    @property
    def comparisons(self) -> list[Comparison]:
        """Each arm against the first, at the first concurrency level (the headline)."""
        return self.comparisons_at()

    def comparison_note(self, base: ArmResult, arm: ArmResult, level: Level, metric: str) -> str | None:
        """What the numbers of a comparison on `metric` cannot show by themselves: a goodput without an SLO or the
        per-request rows it is counted from, or no request of either arm within the SLO."""
        if not METRICS[metric].needs_slo:
            return None
        if self.slo is None:
            return f"{metric} needs an SLO (--slo)"
        got = [base.attainment_at(level), arm.attainment_at(level)]
        if any(a is None for a in got):
            return f"{metric} is counted from per-request rows, which these runs do not have"
        if not any(a.good for a in got if a is not None):
            return f"no request of either arm met the SLO ({self.slo.describe()}): both goodputs are 0"
        zero = [who.label for who, a in zip((base, arm), got, strict=True) if a is not None and not a.good]
        if zero:
            return (
                f"no request of {zero[0]} met the SLO: its goodput is 0, and the ratio counts half a request more in "
                "every run of both arms (a continuity correction), so it is not 0 and the loss shown is understated"
                if zero[0] == arm.label
                else f"no request of {zero[0]} met the SLO: its goodput is 0, and the ratio counts half a request "
                "more in every run of both arms (a continuity correction), so it is finite and the gain understated"
            )
        return None

    def undecided(self) -> list[Comparison]:
        """Comparisons (each arm against the first, at every level) that are not faster, slower or no difference."""
        levels = self.levels or [1]
        return [c for level in levels for c in self.comparisons_at(level) if c.verdict in (None, "inconclusive")]

    def energy_comparisons_at(self, concurrency: Level | None = None) -> list[EnergyComparison]:
        """Each arm's joules per output token against the first arm's at one level: the geometric mean of the
        per-block ratios with the same bootstrap CI as tok/s, over the blocks where both launches measured energy."""
        level = concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)
        base = self.arms[0]
        out = []
        for index, arm in enumerate(self.arms[1:], start=1):
            b_runs, a_runs, paired = energy_paired(base, arm, level)
            est = ratio_ci(b_runs, a_runs, seed=self.design.seed, paired=paired) if b_runs else None
            out.append(
                EnergyComparison(
                    arm_label=arm.label,
                    vs_label=base.label,
                    concurrency=level,
                    arm_index=index,
                    estimate=est,
                    min_effect=self.min_effect,
                )
            )
        return [c for c in out if c.estimate is not None]

    def speculation(self) -> list[tuple[ArmResult, BreakEven]]:
        """For each speculative arm compared with a non-speculative baseline: the break-even arithmetic at the first
        level, with its inputs' uncertainty: the break-even's CI over blocks, the accept length's over launches, and
        measured / break-even, which is the arm's tok/s over the baseline's, with the tok/s comparison's CI."""
        base = self.arms[0]
        base_tps = base.median_at()
        if base_tps is None or base.spec_steps is not None:
            return []
        level = self.levels[0] if self.levels else 1
        by_arm = {c.arm_index: c for c in self.comparisons_at(level, "tok_s")}
        out = []
        for index, arm in enumerate(self.arms[1:], start=1):
            tps, tau = arm.median_at(), arm.accept_length
            if arm.spec_steps is None or tps is None or tau is None:
                continue
            b_runs, a_runs, paired = spec_paired(base, arm, level)
            interval = breakeven_interval(b_runs, a_runs, seed=self.design.seed, paired=paired) if b_runs else None
            accepts = [a for launch in arm.launches if (a := mean_accept_length(launch.timed_at(level))) is not None]
            measured = launch_mean(accepts) if accepts else None
            cmp = by_arm.get(index)
            be = spec_from_run(
                base_tps,
                tps,
                tau,
                arm.spec_steps,
                self.target_tps,
                breakeven_ci95=(interval.lo, interval.hi) if interval is not None and interval.blocks >= 2 else None,
                measured_ci95=(measured.lo, measured.hi)
                if measured and measured.lo is not None and measured.hi is not None
                else None,
                margin=cmp.estimate if cmp is not None and cmp.estimate is not None else None,
            )
            out.append((arm, be))
        return out

    @property
    def nodes(self) -> list[str]:
        """The nodes of a multi-node host (an inventory group, a multi-node Slurm allocation) in rank order; []
        for one host."""
        nodes = self.host_facts.get("nodes")
        return list(nodes) if isinstance(nodes, dict) else []

    @property
    def host_label(self) -> str:
        """The host as reports name it: a multi-node host with its nodes."""
        nodes = self.nodes
        return f"{self.host} (nodes {', '.join(nodes)})" if len(nodes) > 1 else self.host

    def node_mismatch(self) -> str | None:
        """The nodes of the multi-node group differed (launched with --allow-node-mismatch), or None."""
        mismatches = self.host_facts.get("node_mismatches") or []
        if not mismatches:
            return None
        return f"the nodes of {self.host} differ (launched anyway with --allow-node-mismatch): {'; '.join(mismatches)}"

    def host_noise_warnings(self) -> list[str]:
        """Arms whose launches vary far more than a quiet host's (stats.noisy_host), at each level."""
        out = []
        for arm in self.arms:
            for level in arm.levels:
                spread = arm.spread_at(level)
                line = (
                    host_noise_warning(arm.label + (f" @ {level_name(level)}" if len(self.levels) > 1 else ""), spread)
                    if spread
                    else None
                )
                if line:
                    out.append(line)
        return out

    @property
    def open_loop(self) -> bool:
        """Whether the levels are request rates (`--rate`) rather than concurrency levels."""
        return any(isinstance(level, Rate) for level in self.levels)

    def rate_warnings(self) -> list[str]:
        """Open-loop levels an arm did not serve at their rate (client.summary.SHORTFALL), and who held it back."""
        out = []
        for arm in self.arms:
            for level in arm.levels:
                rl = arm.rate_level(level)
                if rl is not None and rl.limited is not None:
                    out.append(
                        f"{arm.label} @ {level_name(level)} fell short of its rate: {rl.reason}; its latencies are "
                        "those of a "
                        + ("client that could not send on time" if rl.limited == "client" else "saturated server")
                    )
        out += self.schedule_warnings()
        return out

    def schedule_warnings(self) -> list[str]:
        """Levels whose seeded schedule's own rate strays from the rate offered by more than SCHEDULE_STRAY: a short
        run's Poisson (or gamma) draw, the same for every arm, named by the offered rate everywhere."""
        if not self.arms:
            return []
        out = []
        for level in self.arms[0].levels:
            rl = self.arms[0].rate_level(level)
            # Of the whole schedule: a run that stopped sending early sent only its first requests.
            drawn = rl.schedule_rate if rl is not None else None
            if rl is None or not drawn or abs(drawn / rl.rate - 1) <= SCHEDULE_STRAY:
                continue
            out.append(
                f"@ {level_name(level)} the seeded schedule's own rate was {drawn:.3g} req/s "
                f"({drawn / rl.rate - 1:+.0%}; about {rl.schedule_requests or 0:.0f} requests per run), the same draw "
                "for every arm: the level, the crossover and the SLO capacities are named by the rate offered; a "
                "longer --duration (or more --requests) holds a run's draw closer to it"
            )
        return out

    def warnings(self) -> list[str]:
        """What a careful reader should know before trusting the numbers; printed, never raised."""
        node = self.node_mismatch()
        out: list[str] = ([node] if node else []) + attached_warnings(self.arms)
        if self.blocks < 2 and len(self.arms) > 1:
            if self.design.blocks < 2:
                out.append(
                    "one launch per arm: restart-to-restart noise (the kind that once turned 82 tok/s into 89) is "
                    "not estimated, so no verdict is possible; use --blocks 3 or more"
                )
            else:
                out.append(
                    f"only {self.blocks} of {self.design.blocks} blocks complete: no verdict until at least two are "
                    f"(orch ab --resume {self.experiment_id})"
                )
        for launch in self.launches:
            where = f"{self.arms[launch.arm_index].label} (block {launch.block + 1})"
            for level in launch.levels:
                timed = launch.timed_at(level)
                values = [r.tok_s for r in timed]
                at = f" @ {level_name(level)}" if len(self.levels) > 1 else ""
                med = statistics.median(values) if values else 0.0
                for i in outliers(values):
                    out.append(
                        f"outlier run: {where} run {timed[i].index + 1}{at}: {values[i]:.1f} tok/s vs the launch's "
                        f"median {med:.1f} (median-absolute-deviation z > 3.5); kept in the statistics"
                    )
                ordered = sorted(timed, key=lambda r: r.index)
                in_order = [r.tok_s for r in ordered]
                if slow_first_run(in_order):
                    out.append(
                        f"slow first run: {where}{at}: run {ordered[0].index + 1} gave {in_order[0]:.1f} tok/s, the "
                        f"others {statistics.median(in_order[1:]):.1f}: "
                        + (
                            "warmup may be too short (raise --warmup)"
                            if level == 1 and not isinstance(level, Rate)
                            else "the level's first run warms it up (warmups run at concurrency 1)"
                        )
                    )
        for arm in self.arms:
            for level in arm.levels:
                launches = [launch for launch in arm.launches if launch.timed_at(level)]
                values = [launch.value_at(level) or 0.0 for launch in launches]
                # 5 %: with three launches the MAD is crude, and 2-3 % restart noise is ordinary on a busy host.
                for i in outliers(values, min_rel=0.05, min_n=3):
                    out.append(
                        f"far launch: {arm.label} block {launches[i].block + 1}"
                        + (f" @ {level_name(level)}" if len(self.levels) > 1 else "")
                        + f": {values[i]:.1f} tok/s vs the arm's median launch {statistics.median(values):.1f}; "
                        "something differed in that launch (host state, another job?)"
                    )
        out += self.host_noise_warnings()
        out += self.rate_warnings()
        out += gpu_drift_warnings(self.launches, [arm.label for arm in self.arms])
        out += cache_warnings(self)
        bad_env = [arm.label for arm in self.arms if not arm.env_ok]
        if bad_env:
            out.append(f"environment mismatches in {', '.join(bad_env)} (see the env check lines)")
        return out


def spec_steps(profile_dict: dict[str, Any]) -> int | None:
    spec = profile_dict.get("speculative")
    if not spec:
        return None
    name = profile_dict.get("engine")
    # An engine this orch no longer knows (an old bundle) falls back to SGLang's default of 3 steps.
    return engines.get(name).spec_steps(spec) if name in engines.names() else int(spec.get("num_steps") or 3)
