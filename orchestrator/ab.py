"""A/B experiments: every arm from a fresh, verified launch on the same host in the same session."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import math
import os
import random
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from orchestrator import __version__, server
from orchestrator.bench import BenchConfig, RunResult, host_runner, local_runner, request_items, run_benchmark
from orchestrator.errors import BenchError, HostError, OrchError, ServerError
from orchestrator.hosts import Host, connect_address
from orchestrator.profile import Profile
from orchestrator.redaction import scrub
from orchestrator.stats import (
    DEFAULT_MIN_EFFECT,
    ArmSpread,
    BreakEven,
    RatioEstimate,
    Summary,
    arm_spread,
    blocks_needed,
    launch_value,
    minimal_detectable_effect,
    outliers,
    ratio_ci,
    relative_range,
    schedule,
    slow_first_run,
    spec_from_run,
    summarize,
    verdict,
)
from orchestrator.store import Store


class StrictEnvError(ServerError):
    """--strict-env and the workers did not get the profile's environment (a resume cannot fix that)."""


class NoValidRunsError(BenchError):
    """An arm has no valid timed run, so the experiment has nothing to compare."""


def _has_valid_run(launches: Sequence[LaunchResult], arm_index: int) -> bool:
    mine = [launch for launch in launches if launch.arm_index == arm_index]
    return any(launch.timed_at(level) for launch in mine for level in launch.levels)


@dataclass(frozen=True)
class ABConfig:
    bench: BenchConfig = field(default_factory=BenchConfig)
    simulate: bool = False
    namespace: str = "default"
    ready_timeout_s: float | None = None
    grace_s: float = 10.0
    strict_env: bool = False
    force: bool = False  # kill a foreign port owner when the host's policy allows it
    lock_wait_s: float = 0.0  # how long to queue behind another orch session on the host
    gpu_wait_s: float = 120.0  # after teardown, how long GPU memory may take to return to idle
    target_tps: float | None = None  # for the speculative explanation: what would reaching this take
    blocks: int = 1  # each block launches every arm once
    order: str = "random"  # random | fixed | abba
    order_seed: int | None = None  # None: drawn at random, then recorded with the experiment
    min_effect: float = DEFAULT_MIN_EFFECT  # the smallest relative difference worth calling


@dataclass(frozen=True)
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

    @property
    def levels(self) -> list[int]:
        """Concurrency levels in the order they ran."""
        return list(dict.fromkeys(r.concurrency for r in self.runs if not r.warmup))

    def timed_at(self, concurrency: int | None = None) -> list[RunResult]:
        """Valid timed runs at one level (default: the first level, the headline)."""
        level = concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)
        return [r for r in self.runs if not r.warmup and r.valid and r.concurrency == level]

    def value_at(self, concurrency: int | None = None, metric: str = "tok_s") -> float | None:
        """The launch-level value: the median of its valid timed runs."""
        values = [float(v) for r in self.timed_at(concurrency) if (v := getattr(r, metric)) is not None]
        return launch_value(values) if values else None

    @property
    def invalid_runs(self) -> list[RunResult]:
        return [r for r in self.runs if not r.warmup and not r.valid]


def mean_accept_length(runs: Sequence[RunResult]) -> float | None:
    """Mean accept length over runs, each from that run's own data (never the server's lifetime average)."""
    values = [r.spec_accept_length for r in runs if r.spec_accept_length is not None]
    return sum(values) / len(values) if values else None


def arm_label(names: Sequence[str], index: int) -> str:
    """The profile name, or "name#2" when one profile is two arms (an A/A test)."""
    return f"{names[index]}#{index + 1}" if list(names).count(names[index]) > 1 else names[index]


@dataclass(frozen=True)
class ArmResult:
    """One arm (profile) across all its launches; the launch, not the run, is the unit of replication."""

    profile: str
    launches: tuple[LaunchResult, ...]
    spec_steps: int | None = None
    label: str = ""  # the profile name, or "name#2" when one profile is two arms (an A/A test)

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
    def levels(self) -> list[int]:
        return list(dict.fromkeys(level for launch in self.launches for level in launch.levels))

    def _level(self, concurrency: int | None) -> int:
        return concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)

    def timed_at(self, concurrency: int | None = None) -> list[RunResult]:
        level = self._level(concurrency)
        return [r for launch in self.launches for r in launch.timed_at(level)]

    @property
    def timed(self) -> list[RunResult]:
        return self.timed_at()

    def per_launch_at(self, concurrency: int | None = None, metric: str = "tok_s") -> list[list[float]]:
        level = self._level(concurrency)
        return [[float(getattr(r, metric)) for r in launch.timed_at(level)] for launch in self.launches]

    def spread_at(self, concurrency: int | None = None, metric: str = "tok_s") -> ArmSpread | None:
        """Launches, runs, median of launch values, CV within and across launches."""
        per_launch = [v for v in self.per_launch_at(concurrency, metric) if v]
        return arm_spread(per_launch) if per_launch else None

    def summary_at(self, concurrency: int | None = None) -> Summary | None:
        """Per-stream tok/s over every valid timed run of every launch (for min/max; comparisons use launches)."""
        timed = self.timed_at(concurrency)
        return summarize([r.tok_s for r in timed]) if timed else None

    def aggregate_at(self, concurrency: int | None = None) -> ArmSpread | None:
        return self.spread_at(concurrency, "aggregate_tok_s")

    @property
    def summary(self) -> Summary | None:
        return self.summary_at()

    def median_at(self, concurrency: int | None = None) -> float | None:
        """The arm's headline number: the median of its launch values."""
        spread = self.spread_at(concurrency)
        return spread.median if spread else None

    def accept_length_at(self, concurrency: int | None = None) -> float | None:
        return mean_accept_length(self.timed_at(concurrency))

    @property
    def accept_length(self) -> float | None:
        return self.accept_length_at()

    @property
    def env_ok(self) -> bool:
        return all(launch.env_report.get("ok", True) for launch in self.launches)


@dataclass(frozen=True)
class Design:
    """How the launches of an experiment are arranged: every block launches every arm once, in a recorded order."""

    blocks: int = 1
    order: str = "fixed"
    seed: int = 0
    schedule: tuple[tuple[int, ...], ...] = ((0,),)

    @classmethod
    def make(cls, arms: int, blocks: int, order: str, seed: int) -> Design:
        return cls(blocks, order, seed, tuple(tuple(b) for b in schedule(arms, blocks, order, seed)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "order": self.order,
            "seed": self.seed,
            "schedule": [list(b) for b in self.schedule],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Design:
        return cls(
            int(d["blocks"]), str(d["order"]), int(d["seed"]), tuple(tuple(int(i) for i in b) for b in d["schedule"])
        )

    def slots(self) -> list[tuple[int, int, int]]:
        """(block, position, arm index) for every launch, in execution order."""
        return [(b, pos, arm) for b, order in enumerate(self.schedule) for pos, arm in enumerate(order)]


@dataclass(frozen=True)
class Comparison:
    arm: str  # profile names (the JSON contract); labels tell two arms of one profile apart
    vs: str
    ratio: float | None  # geometric mean over blocks of the launch-value ratios
    concurrency: int = 1
    aggregate_ratio: float | None = None
    estimate: RatioEstimate | None = None
    verdict: str | None = None  # faster | slower | no difference | inconclusive; None without paired launches
    mde: float | None = None
    blocks_needed: int | None = None
    min_effect: float = DEFAULT_MIN_EFFECT
    arm_label: str = ""
    vs_label: str = ""
    arm_index: int = 1

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "arm": self.arm,
            "vs": self.vs,
            "arm_label": self.arm_label or self.arm,
            "vs_label": self.vs_label or self.vs,
            "arm_index": self.arm_index,
            "concurrency": self.concurrency,
            "ratio": self.ratio,
            "aggregate_ratio": self.aggregate_ratio,
            "blocks": est.blocks if est else 0,
            # One block's interval holds only run-to-run noise: publishing it would invite the very mistake
            # (trusting one launch per arm) that orch exists to prevent.
            "ci95": [est.lo, est.hi] if est and est.blocks >= 2 else None,
            "ci_method": est.method if est else None,
            "verdict": self.verdict,
            "min_effect": self.min_effect,
            "mde": self.mde,
            "blocks_needed": self.blocks_needed,
        }


@dataclass(frozen=True)
class CutShort:
    """A launch that started but did not complete: kept in the store, left out of the statistics."""

    block: int
    arm_index: int
    status: str  # interrupted | failed | running (an older orch killed mid-launch)


Paired = dict[str, tuple[list[list[float]], list[list[float]]]]


def _paired(base: ArmResult, arm: ArmResult, level: int, metrics: Sequence[str]) -> Paired:
    """Per metric, the run values of the two arms' launches block by block, over the same blocks for every metric:
    those where both launches have valid runs with positive values."""
    base_by_block = {launch.block: launch for launch in base.launches}
    arm_by_block = {launch.block: launch for launch in arm.launches}
    out: Paired = {m: ([], []) for m in metrics}
    for block in sorted(set(base_by_block) & set(arm_by_block)):
        b_timed, a_timed = base_by_block[block].timed_at(level), arm_by_block[block].timed_at(level)
        values = {
            m: ([float(getattr(r, m)) for r in b_timed], [float(getattr(r, m)) for r in a_timed]) for m in metrics
        }
        if b_timed and a_timed and all(v > 0 for b, a in values.values() for v in b + a):
            for m, (b, a) in values.items():
                out[m][0].append(b)
                out[m][1].append(a)
    return out


@dataclass(frozen=True)
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

    @cached_property
    def arms(self) -> tuple[ArmResult, ...]:
        out = []
        for i, name in enumerate(self.profiles):
            mine = tuple(launch for launch in self.launches if launch.arm_index == i)
            steps = next((launch.spec_steps for launch in mine), None)
            out.append(ArmResult(name, mine, steps, arm_label(self.profiles, i)))
        return tuple(out)

    @property
    def blocks(self) -> int:
        """Blocks in which every arm has a launch."""
        per_arm = [{launch.block for launch in arm.launches} for arm in self.arms]
        return len(set.intersection(*per_arm)) if per_arm else 0

    @property
    def levels(self) -> list[int]:
        """Concurrency levels in the order they ran, over every launch (a partial experiment may lack an arm)."""
        return list(dict.fromkeys(level for launch in self.launches for level in launch.levels))

    def comparisons_at(self, concurrency: int | None = None) -> list[Comparison]:
        base = self.arms[0]
        level = concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)
        out = []
        for index, arm in enumerate(self.arms[1:], start=1):
            names: dict[str, Any] = {"arm_label": arm.label, "vs_label": base.label, "arm_index": index}
            paired = _paired(base, arm, level, ("tok_s", "aggregate_tok_s"))
            b_runs, a_runs = paired["tok_s"]
            if not b_runs:
                out.append(Comparison(arm.profile, base.profile, None, level, min_effect=self.min_effect, **names))
                continue
            est = ratio_ci(b_runs, a_runs, seed=self.design.seed)
            b_agg, a_agg = paired["aggregate_tok_s"]
            agg = math.exp(
                statistics.fmean(math.log(launch_value(a) / launch_value(b)) for b, a in zip(b_agg, a_agg, strict=True))
            )
            out.append(
                Comparison(
                    arm=arm.profile,
                    vs=base.profile,
                    ratio=est.ratio,
                    concurrency=level,
                    aggregate_ratio=agg,
                    estimate=est,
                    verdict=verdict(est, self.min_effect),
                    mde=minimal_detectable_effect(est),
                    blocks_needed=blocks_needed(est, self.min_effect),
                    min_effect=self.min_effect,
                    **names,
                )
            )
        return out

    @property
    def comparisons(self) -> list[Comparison]:
        """Each arm against the first, at the first concurrency level (the headline)."""
        return self.comparisons_at()

    def speculation(self) -> list[tuple[ArmResult, BreakEven]]:
        """For each speculative arm compared with a non-speculative baseline: the break-even arithmetic."""
        base = self.arms[0]
        base_tps = base.median_at()
        if base_tps is None or base.spec_steps is not None:
            return []
        out = []
        for arm in self.arms[1:]:
            tps, tau = arm.median_at(), arm.accept_length
            if arm.spec_steps is None or tps is None or tau is None:
                continue
            out.append((arm, spec_from_run(base_tps, tps, tau, arm.spec_steps, self.target_tps)))
        return out

    def warnings(self) -> list[str]:
        """What a careful reader should know before trusting the numbers; printed, never raised."""
        out: list[str] = []
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
                at = f" @ {level}" if len(self.levels) > 1 else ""
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
                            if level == 1
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
                        + (f" @ {level}" if len(self.levels) > 1 else "")
                        + f": {values[i]:.1f} tok/s vs the arm's median launch {statistics.median(values):.1f}; "
                        "something differed in that launch (host state, another job?)"
                    )
        out += gpu_drift_warnings(self.launches, [arm.label for arm in self.arms])
        bad_env = [arm.label for arm in self.arms if not arm.env_ok]
        if bad_env:
            out.append(f"environment mismatches in {', '.join(bad_env)} (see the env check lines)")
        return out


def gpu_drift_warnings(
    launches: Sequence[LaunchResult], labels: Sequence[str], clock_rel: float = 0.05, temp_c: float = 10.0
) -> list[str]:
    """GPU SM clocks or temperatures under load that moved between launches: throttling makes launches unequal."""
    per_gpu: dict[Any, list[tuple[str, float | None, float | None]]] = {}
    for launch in launches:
        state = launch.gpus or {}
        # Only the GPUs this launch used (an idle GPU's clock says nothing): by its processes when nvidia-smi can name
        # them (in a container it reports host PIDs), else the GPUs that were busy at the reading.
        used = {a.get("gpu_index") for a in state.get("apps") or [] if a.get("launch_id") == launch.launch_id}
        for g in state.get("gpus") or []:
            util = g.get("utilization.gpu")
            if (used and g.get("index") not in used) or (not used and isinstance(util, (int, float)) and util <= 0):
                continue
            clock, temp = g.get("clocks.sm"), g.get("temperature.gpu")
            per_gpu.setdefault(g.get("index"), []).append(
                (
                    f"{labels[launch.arm_index]}/block {launch.block + 1}",
                    float(clock) if isinstance(clock, (int, float)) else None,
                    float(temp) if isinstance(temp, (int, float)) else None,
                )
            )
    out = []
    for index, readings in sorted(per_gpu.items(), key=lambda kv: str(kv[0])):
        clocks = [c for _, c, _ in readings if c is not None]
        temps = [t for _, _, t in readings if t is not None]
        if clocks and relative_range(clocks) > clock_rel:
            detail = ", ".join(f"{w} {c:.0f}" for w, c, _ in readings if c is not None)
            out.append(f"GPU {index} SM clock under load changed between launches (MHz: {detail})")
        if temps and max(temps) - min(temps) > temp_c:
            detail = ", ".join(f"{w} {t:.0f}" for w, _, t in readings if t is not None)
            out.append(f"GPU {index} temperature under load changed between launches (°C: {detail})")
    return out


# Names this orch process in the host lock, so after a silent network drop it can take its own lock back.
SESSION = uuid.uuid4().hex


def new_experiment_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def comparable_profile(profile: Profile, redaction_key: bytes | None = None) -> dict[str, Any]:
    """What must not change between the sessions of one resumed experiment (where the file lives may)."""
    d = profile.to_dict(redaction_key=redaction_key)
    for key in ("source", "description"):
        d.pop(key, None)
    return d


def requests_digest(bench: BenchConfig) -> str:
    """A fingerprint of every request the workload sends (an edited prompts file changes it)."""
    return hashlib.sha256(json.dumps(request_items(bench), sort_keys=True).encode()).hexdigest()


def experiment_config(
    profiles: Sequence[Profile],
    config: ABConfig,
    facts: dict[str, Any],
    provenance: dict[str, Any] | None = None,
    redaction_key: bytes | None = None,
) -> dict[str, Any]:
    """Everything a resume (and later `orch reproduce`) needs to run the same experiment again."""
    return {
        "bench": config.bench.to_dict(),
        "requests_sha256": requests_digest(config.bench),
        "host_facts": facts,
        "strict_env": config.strict_env,
        "ports": sorted({p.port for p in profiles}),
        "profiles": [comparable_profile(p, redaction_key) for p in profiles],
        "profile_sources": [str(Path(p.source).resolve()) for p in profiles],  # a resume may run from elsewhere
        "min_effect": config.min_effect,
        "target_tps": config.target_tps,
        **(provenance or {}),
    }


def bench_config_from(stored: dict[str, Any]) -> BenchConfig:
    known = {f.name for f in fields(BenchConfig)}
    data = {k: v for k, v in stored.items() if k in known}
    data["concurrency"] = tuple(data.get("concurrency", (1,)))
    return BenchConfig(**data)


def check_resumable(
    exp: dict[str, Any],
    profiles: Sequence[Profile],
    bench: BenchConfig | None = None,
    *,
    redaction_key: bytes | None = None,
) -> None:
    """Refuse to resume what cannot be continued as the same experiment."""
    if exp["status"] == "complete":
        raise OrchError(f"experiment {exp['id']} is already complete (`orch show {exp['id']}` prints it)")
    if exp["kind"] != "ab" or not exp.get("design_json"):
        raise OrchError(f"experiment {exp['id']} was stored by an older orch without a design; it cannot be resumed")
    config = json.loads(exp["config_json"])
    stored = config.get("profiles") or []
    if len(stored) != len(profiles):
        raise OrchError(f"experiment {exp['id']} has {len(stored)} arms, not {len(profiles)}")
    for want, prof in zip(stored, profiles, strict=True):
        now = comparable_profile(prof, redaction_key)
        changed = sorted(k for k in set(want) | set(now) if want.get(k) != now.get(k))
        if changed:
            raise OrchError(
                f"profile {prof.name!r} changed since experiment {exp['id']} started (fields: {', '.join(changed)}); "
                "a resumed experiment must run the same configuration: restore the profile or start a new experiment"
            )
    if bench is not None and config.get("requests_sha256") not in (None, requests_digest(bench)):
        raise OrchError(
            f"the requests of experiment {exp['id']} changed since it started (was the prompts file "
            f"{bench.prompts!r} edited?); a resumed experiment must send the same requests"
        )


def check_same_machine(exp_id: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """A resume must run where the experiment started: launches on two machines are not one experiment."""

    def gpu_ids(facts: dict[str, Any]) -> list[Any]:
        return [g.get("uuid") for g in facts.get("gpus") or []]

    if gpu_ids(before):
        # GPU UUIDs identify the machine even where hostnames do not (a container gets a new one per run).
        if gpu_ids(before) != gpu_ids(after):
            now = gpu_ids(after) or f"none readable ({after.get('gpu_error') or 'nvidia-smi gave no GPUs'})"
            raise OrchError(
                f"experiment {exp_id} ran on GPUs {gpu_ids(before)}; this host has {now}. "
                "A resumed experiment must run on the same GPUs"
            )
    elif before.get("hostname") and before.get("hostname") != after.get("hostname"):
        raise OrchError(
            f"experiment {exp_id} ran on machine {before['hostname']!r}; this host is {after.get('hostname')!r}. "
            "A resumed experiment must run on the same machine"
        )


def run_ab(
    host: Host,
    profiles: Sequence[Profile],
    config: ABConfig,
    store: Store,
    *,
    on_event: Callable[[str], None] = lambda _: None,
    on_run: Callable[[str, RunResult], None] = lambda _p, _r: None,
    resume: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> ABResult:
    """Run every launch of the design from fresh state; persist as we go; tear down whatever happens.

    With `resume`, continue that stored experiment: its completed launches stand, the rest of its schedule runs
    (same seed, same order); launches cut short earlier are kept in the store but left out of the statistics.
    `provenance` (how it was started: the --host given, the workdir) is stored with a new experiment.
    """
    if not profiles:
        raise OrchError("an A/B needs at least one profile")
    # Secret values are stored as digests keyed per store; errors and printed log tails are scrubbed of them.
    key = store.redaction_key
    secrets = [v for p in profiles for v in server.profile_secrets(p)]
    on_event = _scrubbing(on_event, secrets)
    facts = host.call("facts", nvidia_smi=host.config.nvidia_smi)
    exp_id = store.find_experiment(resume)["id"] if resume is not None else new_experiment_id()
    lock_path = host.lock_path
    # The host lock comes before any write: a session that cannot have the host changes nothing in the store.
    acquire_host_lock(host, lock_path, exp_id, config.lock_wait_s, on_event)
    try:
        notes: list[str] = []
        launches: list[LaunchResult] = []
        if resume is not None:
            exp = store.find_experiment(exp_id)  # read again under the lock: another session may have resumed it
            check_resumable(exp, profiles, config.bench, redaction_key=key)
            stored = json.loads(exp["config_json"])
            check_same_machine(exp_id, stored.get("host_facts") or {}, facts)
            design = Design.from_dict(json.loads(exp["design_json"]))
            changed = facts_changed(stored.get("host_facts") or {}, facts)
            if changed:
                notes.append(f"host facts changed since the experiment started: {', '.join(changed)}")
                on_event(f"NOTE: {notes[-1]}")
            if stored.get("namespace") not in (None, config.namespace):
                # Cleanup before each launch only sees its own namespace: leftovers of the other would be "foreign".
                notes.append(f"started in namespace {stored['namespace']!r}, resumed in {config.namespace!r}")
                on_event(f"NOTE: {notes[-1]}")
            launches, cut = stored_launches(store, exp_id)
            if cut:
                discarded = len(cut)
                notes.append(f"{discarded} launch(es) cut short are kept in the store but left out of the statistics")
            store.reopen_experiment(exp_id)
        else:
            seed = config.order_seed if config.order_seed is not None else random.SystemRandom().randrange(2**31)
            design = Design.make(len(profiles), config.blocks, config.order, seed)
            store.create_experiment(
                exp_id,
                kind="ab",
                simulated=config.simulate,
                host=host.name,
                arms=[p.name for p in profiles],
                config=experiment_config(profiles, config, facts, provenance, redaction_key=key),
                orch_version=__version__,
                design=design.to_dict(),
            )
        names = [p.name for p in profiles]
        try:  # from here on the stored experiment ends interrupted, failed or complete, whatever happens
            on_event(
                f"experiment {exp_id} on {host.name}: {' vs '.join(names)}, {design.blocks} block(s), order "
                f"{design.order} (seed {design.seed})" + (" (SIMULATED server)" if config.simulate else "")
            )
            if design.blocks < 2 and len(profiles) > 1:
                on_event(
                    "NOTE: one launch per arm cannot separate restart noise from a real difference; use --blocks 3+"
                )
            if resume is not None:
                on_event(f"resuming {exp_id}: {len(launches)} of {len(design.slots())} launches already complete")
            done = {(launch.block, launch.arm_index) for launch in launches}
            todo = [slot for slot in design.slots() if (slot[0], slot[2]) not in done]
            for n, (block, position, arm) in enumerate(todo, start=len(done) + 1):
                on_event(
                    f"launch {n}/{len(design.slots())}: block {block + 1}/{design.blocks}, {arm_label(names, arm)}"
                )
                launches.append(
                    _run_launch(host, profiles[arm], arm, block, position, exp_id, config, store, on_event, on_run, key)
                )
            empty = [arm_label(names, i) for i in range(len(profiles)) if not _has_valid_run(launches, i)]
            if empty:
                raise NoValidRunsError(
                    f"no valid timed run in {', '.join(empty)}: every run was invalid (`orch show {exp_id}` lists "
                    "each run's reason); nothing can be compared"
                )
        except KeyboardInterrupt:
            store.finish_experiment(exp_id, "interrupted", "interrupted by the user")
            if len(profiles) > 1:
                on_event(f"experiment {exp_id} interrupted; continue it with: orch ab --resume {exp_id}")
            raise
        except BaseException as e:
            store.finish_experiment(exp_id, "failed", scrub(str(e), secrets) or type(e).__name__)
            if len(profiles) > 1 and not isinstance(e, (StrictEnvError, NoValidRunsError)):
                on_event(
                    f"experiment {exp_id} failed; after fixing the cause, continue it with: orch ab --resume {exp_id}"
                )
            raise
        store.finish_experiment(exp_id, "complete")
    finally:
        # Never let a failed unlock hide why we are here; the lock also goes when the agent's connection closes.
        with contextlib.suppress(Exception):
            host.call("unlock", path=lock_path)
    return ABResult(
        exp_id,
        config.simulate,
        host.name,
        tuple(names),
        tuple(launches),
        facts,
        config.target_tps,
        design,
        config.min_effect,
        notes=tuple(notes),
    )


def _scrubbing(on_event: Callable[[str], None], secrets: list[str]) -> Callable[[str], None]:
    """on_event, printing no secret: events can carry a server's log tail (which has its args in clear)."""
    return lambda msg: on_event(scrub(msg, secrets))


# Host facts that legitimately differ between two sessions on the same host.
_VOLATILE_FACTS = {"time", "uptime_s", "load", "loadavg", "mem_available_bytes", "disk_free_bytes", "pid"}


def facts_changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if k not in _VOLATILE_FACTS and before.get(k) != after.get(k))


def _spec_steps(profile_dict: dict[str, Any]) -> int | None:
    spec = profile_dict.get("speculative")
    if not spec:
        return None
    return int(spec.get("num_steps") or 3)  # SGLang picks (3, 1, 4) when num_steps is unset


def stored_launches(store: Store, exp_id: str) -> tuple[list[LaunchResult], list[CutShort]]:
    """The experiment's completed launches (in execution order), and those that were cut short."""
    out: list[LaunchResult] = []
    discarded: list[CutShort] = []
    for row in store.launches(exp_id):
        if row["status"] != "complete":
            discarded.append(CutShort(int(row.get("block") or 0), int(row["arm_index"]), str(row["status"])))
            continue
        out.append(
            LaunchResult(
                profile=row["profile"],
                launch_id=row["launch_id"],
                runs=tuple(RunResult.from_row(r) for r in store.runs(row["launch_id"])),
                ready_s=float(row["ready_s"] or 0.0),
                env_report=json.loads(row["env_report_json"] or "{}"),
                teardown=json.loads(row["teardown_json"] or "{}"),
                spec_steps=_spec_steps(json.loads(row["profile_json"])),
                block=int(row.get("block") or 0),
                position=int(row["position"] if row.get("position") is not None else row["arm_index"]),
                arm_index=int(row["arm_index"]),
                gpus=json.loads(row["gpus_json"]) if row.get("gpus_json") else None,
            )
        )
    return out, discarded


def _resumable(exp: dict[str, Any]) -> bool:
    """Whether `orch ab --resume` could continue a stored, unfinished experiment (so whether to suggest it)."""
    error = exp.get("error") or ""
    return (
        bool(exp.get("design_json"))
        and len(json.loads(exp["arms_json"])) > 1
        and "--strict-env" not in error
        and "no valid timed run" not in error
    )


def load_result(
    store: Store, ref: str, *, min_effect: float | None = None, target_tps: float | None = None
) -> ABResult:
    """A stored experiment, finished or not, as the same ABResult a live run returns (for show/export)."""
    exp = store.find_experiment(ref)
    config = json.loads(exp["config_json"])
    launches, cut = stored_launches(store, exp["id"])
    design = (
        Design.from_dict(json.loads(exp["design_json"]))
        if exp.get("design_json")
        else Design(1, "fixed", 0, (tuple(range(len(json.loads(exp["arms_json"])))),))
    )
    notes = []
    if exp["status"] != "complete":
        total = len(design.slots())
        notes.append(
            f"experiment {exp['status']} after {len(launches)} of {total} launches"
            + (f" ({exp['error']})" if exp.get("error") and exp["status"] != "interrupted" else "")
            + (f"; continue it with: orch ab --resume {exp['id']}" if _resumable(exp) else "")
        )
    if cut:
        notes.append(f"{len(cut)} launch(es) cut short are stored but left out of the statistics")
    return ABResult(
        experiment_id=exp["id"],
        simulated=bool(exp["simulated"]),
        host=exp["host"],
        profiles=tuple(json.loads(exp["arms_json"])),
        launches=tuple(launches),
        host_facts=config.get("host_facts") or {},
        target_tps=target_tps if target_tps is not None else config.get("target_tps"),
        design=design,
        min_effect=min_effect if min_effect is not None else float(config.get("min_effect", DEFAULT_MIN_EFFECT)),
        status=exp["status"],
        notes=tuple(notes),
        cut_short=tuple(cut),
    )


def acquire_host_lock(
    host: Host, path: str, exp_id: str, wait_s: float, on_event: Callable[[str], None], *, purpose: str = "run"
) -> None:
    """One orch session per host: two sessions launching on one box would measure each other (or, for `orch down`,
    stop each other's servers)."""
    holder = {
        "session": SESSION,
        "user": getpass.getuser(),
        "machine": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "experiment_id": exp_id,
        "command": " ".join(sys.argv[:12]),
    }
    got = host.call("lock", path=path, holder=holder, wait_s=0)
    if not got["acquired"] and wait_s > 0:
        on_event(f"{host.name} is busy ({describe_holder(got['holder'])}); waiting up to {wait_s:.0f}s")
        got = host.call("lock", path=path, holder=holder, wait_s=wait_s)
    if not got["acquired"]:
        if purpose == "orch down":
            raise HostError(
                f"{host.name} is in use by a live orch session ({describe_holder(got['holder'])}); orch down "
                "leaves its servers alone. Wait for it to finish, or pass --force to stop its servers anyway."
            )
        raise HostError(
            f"{host.name} is busy: another orch session holds it ({describe_holder(got['holder'])}). "
            "Use --wait SECONDS to queue behind it. (The lock goes away by itself when that session ends or "
            "its connection drops.)"
        )


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (
        f"{holder.get('user', '?')}@{holder.get('machine', '?')} pid {holder.get('pid', '?')} since "
        f"{holder.get('since', '?')}, experiment {holder.get('experiment_id', '?')}"
    )


def _run_launch(
    host: Host,
    profile: Profile,
    index: int,
    block: int,
    position: int,
    exp_id: str,
    config: ABConfig,
    store: Store,
    on_event: Callable[[str], None],
    on_run: Callable[[str, RunResult], None],
    redaction_key: bytes | None = None,
) -> LaunchResult:
    runs: list[RunResult] = []
    state: dict[str, Any] = {}

    def launched(launch: server.Launch) -> None:
        state["launch"] = launch
        store.add_launch(
            launch.launch_id,
            experiment_id=exp_id,
            arm_index=index,
            block=block,
            position=position,
            profile=profile.name,
            profile_dict=profile.to_dict(redaction_key=redaction_key),
            argv=list(launch.argv),
            env=launch.env,
            pid=launch.pid,
            started_at=launch.started_at,
        )

    def torn_down(srv: server.RunningServer) -> None:
        state["teardown"] = srv.teardown or {}
        store.update_launch(srv.launch.launch_id, teardown_json=srv.teardown)

    def record(run: RunResult) -> None:
        runs.append(run)
        store.add_run(state["launch"].launch_id, run.to_dict())
        on_run(profile.name, run)

    try:
        with server.running(
            host,
            profile,
            simulate=config.simulate,
            namespace=config.namespace,
            ready_timeout_s=config.ready_timeout_s,
            grace_s=config.grace_s,
            gpu_wait_s=config.gpu_wait_s,
            force=config.force,
            on_event=on_event,
            on_launch=launched,
            on_teardown=torn_down,
            redaction_key=redaction_key,
        ) as srv:
            env = srv.env_report
            assert env is not None
            store.update_launch(
                srv.launch.launch_id,
                ready_s=srv.ready_s,
                preflight_json=srv.preflight,
                env_report_json=env.to_dict(),
            )
            for line in describe_env(env):
                on_event(f"{profile.name}: {line}")
            if config.strict_env and not env.ok:
                raise StrictEnvError(
                    f"{profile.name}: environment check failed (--strict-env); see above. Fix the profile or the "
                    "host's environment and start a new experiment"
                )

            def recover(err: str) -> bool:
                on_event(f"{profile.name}: {err}; checking the connection and the server before repeating the run")
                host.ensure_connected()
                problem = server_problem(host, srv, profile)
                if problem is not None:
                    tail = host.call("log_tail", path=srv.launch.log_path, lines=20)
                    on_event(f"{profile.name}: {problem}; not repeating the run. Last lines of its log:\n{tail}")
                    return False
                return True

            bench = config.bench
            runner = (
                host_runner(host, connect_address(profile.host), srv.launch.port, bench, srv.processes)
                if bench.client == "host"
                else local_runner(srv.base_url, bench, host, srv.processes)
            )
            model = profile.served_model_name or profile.model_path
            run_benchmark(runner, bench, model=model, on_run=record, recover=recover)
            ready_s = srv.ready_s
            # Read during the first timed run: clocks and temperatures that drift between launches make them unequal.
            gpus = next((r.gpus for r in runs if r.gpus and r.gpus.get("available")), None)
            store.update_launch(srv.launch.launch_id, gpus_json=gpus)
    except BaseException as e:
        if "launch" in state:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            error = scrub(str(e), server.profile_secrets(profile)) or type(e).__name__
            store.update_launch(state["launch"].launch_id, status=status, error=error)
        raise
    store.update_launch(state["launch"].launch_id, status="complete")
    return LaunchResult(
        profile.name,
        state["launch"].launch_id,
        tuple(runs),
        ready_s,
        env.to_dict(),
        state.get("teardown", {}),
        spec_steps=_spec_steps(profile.to_dict()),
        block=block,
        position=position,
        arm_index=index,
        gpus=gpus,
    )


def server_problem(host: Host, srv: server.RunningServer, profile: Profile) -> str | None:
    """Why a server that failed requests should not be used again, or None if it is whole and answers its health
    check. A run is only ever repeated against a healthy server: repeating it against a hung one only waits again."""
    # A crashing server closes its port a moment before its processes are gone: give it that moment, so a crash is
    # reported as one, not retried as if the network had dropped.
    for _ in range(15):
        problem = srv.problem(host)
        if problem is None and not host.call("alive", pid=srv.launch.pid)["alive"]:
            problem = f"the server process {srv.launch.pid} exited"
        if problem is not None:
            return problem
        time.sleep(0.2)
    return server.health_problem(srv.base_url, profile, timeout_s=HEALTH_TIMEOUT_S)


HEALTH_TIMEOUT_S = 5.0


def describe_env(report: server.EnvReport) -> list[str]:
    """Human lines for an env check: one per differing variable, grouping the processes it differs in."""
    if report.ok:
        lines = [f"env check ok: every profile variable reached all {report.processes} processes"]
    else:
        groups: dict[tuple[str, str, str | None, str], list[int]] = {}
        for m in report.mismatches:
            groups.setdefault((m.var, m.expected, m.actual, m.note), []).append(m.pid)
        lines = [f"ENV MISMATCH in {len({m.pid for m in report.mismatches})} of {report.processes} processes:"]
        for (var, want, got, note), pids in sorted(groups.items()):
            actual = "missing" if got is None else f"={got}"
            pid_list = ", ".join(str(p) for p in pids)
            lines.append(
                f"  {var}: profile says {want!r}, PID {pid_list} has {actual}" + (f" ({note})" if note else "")
            )
    if report.inherited:
        inherited = ", ".join(f"{k}={v}" for k, v in sorted(report.inherited.items()))
        lines.append(f"note: inherited from the launching environment, not set by the profile: {inherited}")
    return lines
