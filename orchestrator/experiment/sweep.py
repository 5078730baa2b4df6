"""`--sweep auto` run: a probe launch per arm finds its synchronous and saturated request rates; the rates between."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config import arrivals
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import Profile
from orchestrator.config.slo import DEFAULT_METRIC
from orchestrator.config.sweep import METHOD, PROBE_RUNS, Sweep, no_range_reason
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import BenchError
from orchestrator.experiment import ab
from orchestrator.hosts.base import Host
from orchestrator.results.load import load_result
from orchestrator.results.model import ABResult
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from orchestrator.ui.events import Events


@dataclass(frozen=True, kw_only=True)
class Probe:
    """The probe's finding: each arm's synchronous and saturated request rate, and the rates they give."""

    experiment: str
    concurrency: int
    synchronous: dict[str, float]  # arm label → requests/s, one stream
    saturated: dict[str, float]  # arm label → requests/s at `concurrency` streams
    rates: tuple[float, ...]
    no_range: str | None = None  # why the probe found one rate and no range between (config/sweep.no_range_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.experiment,
            "concurrency": self.concurrency,
            "synchronous": self.synchronous,
            "saturated": self.saturated,
            "rates": list(self.rates),
            "no_range": self.no_range,
            "method": METHOD.format(c=self.concurrency, runs=PROBE_RUNS),
        }


def rounded(value: float) -> float:
    """3 significant figures: a rate people can read and type again."""
    return float(f"{value:.3g}")


def rates_between(lo: float, hi: float, n: int) -> tuple[float, ...]:
    """n rates spread evenly from lo to hi (both included), rounded, distinct, within arrivals' limits."""
    lo, hi = max(lo, 1e-3), min(max(hi, lo), arrivals.MAX_RATE)
    if n < 2 or hi <= lo * 1.001:
        return (rounded(lo),)
    values = [rounded(lo + (hi - lo) * i / (n - 1)) for i in range(n)]
    return tuple(sorted({v for v in values if 0 < v <= arrivals.MAX_RATE}))


def _median(values: Sequence[float]) -> float | None:
    present = [v for v in values if v > 0 and math.isfinite(v)]
    return statistics.median(present) if present else None


def synchronous_rate(runs: Sequence[RunResult]) -> float | None:
    """Requests per second of one stream: each request waits for the one before (TTFT and all)."""
    return _median([r.requests / r.seconds for r in runs if r.valid and r.seconds > 0])


def saturated_rate(runs: Sequence[RunResult], tokens_per_request: int) -> float | None:
    """Requests per second the server completes with every stream busy: its steady aggregate output tok/s over the
    tokens each request asks for."""
    return _median([r.aggregate_tok_s / tokens_per_request for r in runs if r.valid])


def finding(result: ABResult, sweep: Sweep, bench: BenchConfig) -> Probe:
    """The rates from a probe experiment; BenchError when an arm measured neither rate."""
    sync: dict[str, float] = {}
    sat: dict[str, float] = {}
    for arm in result.arms:
        s = synchronous_rate(arm.timed_at(1))
        t = saturated_rate(arm.timed_at(sweep.concurrency), bench.max_tokens) if sweep.concurrency > 1 else s
        if s is None or t is None:
            raise BenchError(
                f"the sweep's probe ({result.experiment_id}) measured no valid run of {arm.label} at "
                f"{'concurrency 1' if s is None else f'concurrency {sweep.concurrency}'}: no rates to sweep "
                f"(`orch show {result.experiment_id}` lists each run's reason)"
            )
        sync[arm.label], sat[arm.label] = rounded(s), rounded(max(s, t))
    no_range = no_range_reason(sweep.concurrency, sync, sat)
    # Without a range, a level above an arm's own synchronous rate would only measure its client's limit.
    rates = (min(sync.values()),) if no_range else rates_between(min(sync.values()), max(sat.values()), sweep.levels)
    return Probe(
        experiment=result.experiment_id,
        concurrency=sweep.concurrency,
        synchronous=sync,
        saturated=sat,
        rates=rates,
        no_range=no_range,
    )


def asked(config: ABConfig, sweep: Sweep) -> dict[str, Any]:
    """What the sweep was asked for, stored with its probe (`sweep_probe` in its config): `--resume PROBE` runs the
    rate levels from it once the probe is complete (the probe's own workload and design are not the levels')."""
    return {
        "levels": sweep.levels,
        "arrivals": sweep.arrivals,
        "duration_s": sweep.duration_s,
        "requests_per_level": sweep.requests_per_level,
        "max_concurrency": sweep.max_concurrency,
        "bench": config.bench.to_dict(),
        "blocks": "auto" if config.auto is not None else config.blocks,
        "max_blocks": config.auto.max_blocks if config.auto is not None else None,
        "order": config.order,
        "order_seed": config.order_seed,
        **({"slo": config.slo.to_dict()} if config.slo is not None else {}),
        "metric": config.metric,
        "min_effect": config.min_effect,
        "target_tps": config.target_tps,
        "cache_measured": config.cache_measured,
    }


def levels_of(store: Store, probe_id: str) -> str | None:
    """The experiment of the rate levels a sweep's probe led to (the one whose `sweep.probe` names it), or None
    while none was started."""
    for row in store.query("SELECT id, config_json FROM experiments WHERE config_json LIKE ?", (f"%{probe_id}%",)):
        found = json.loads(row["config_json"]).get("sweep")
        if isinstance(found, dict) and found.get("probe") == probe_id:
            return str(row["id"])
    return None


@contextlib.contextmanager
def resumable_from(store: Store, probe_id: str, events: Events) -> Iterator[None]:
    """Ctrl-C after the probe and before the rate levels' experiment exists: say which id continues the sweep
    (once that experiment exists, it says so itself)."""
    try:
        yield
    except KeyboardInterrupt:
        if levels_of(store, probe_id) is None:
            events.line(
                f"sweep interrupted after its probe ({probe_id}), before its rate levels began; continue it with: "
                f"orch ab --resume {probe_id}"
            )
        raise


def probe(
    host: Host,
    profiles: Sequence[Profile],
    config: ABConfig,
    sweep: Sweep,
    store: Store,
    *,
    events: Events,
    on_run: Callable[[str, RunResult], None],
    provenance: dict[str, Any] | None = None,
    resume: str | None = None,
) -> Probe:
    """Run the probe (a stored experiment of its own: one block, tok/s, no --blocks auto) and return its finding.
    `resume`: the probe of an interrupted sweep, finished if it was cut short (its finding read back if not)."""
    bench = sweep.probe_bench(config.bench)
    probe_config = dataclasses.replace(
        config, bench=bench, blocks=1, auto=None, slo=None, metric=DEFAULT_METRIC, target_tps=None
    )
    at = (
        f"concurrency 1 and {sweep.concurrency}"
        if sweep.concurrency > 1
        else "concurrency 1 (--max-concurrency 1: its rate is also the highest)"
    )
    if resume is not None and store.find_experiment(resume)["status"] == "complete":
        events.line(f"sweep: its probe {resume} is complete: the rates from its runs, then the rate levels")
        result = load_result(store, resume)
    else:
        events.line(
            f"sweep: probing each arm at {at} ({PROBE_RUNS} runs each) for the rates to sweep"
            + (f" (resuming the probe {resume}, then the rate levels)" if resume is not None else "")
        )
        result = ab.run_ab(
            host,
            profiles,
            probe_config,
            store,
            events=events,
            on_run=on_run,
            resume=resume,
            provenance={**(provenance or {}), "sweep_probe": asked(config, sweep)},
        )
    return finding(result, sweep, config.bench)


def found_line(found: Probe) -> str:
    """The probe's finding, for people: each arm's two rates and the rates to sweep."""
    said = "; ".join(
        f"{label} {found.synchronous[label]:g} req/s synchronous, {found.saturated[label]:g} saturated"
        for label in found.synchronous
    )
    if found.no_range is not None:
        return f"sweep: {said}; {found.no_range}"
    return f"sweep: {said}; rates {', '.join(f'{r:g}' for r in found.rates)} req/s"
