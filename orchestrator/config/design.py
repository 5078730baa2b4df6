"""An A/B experiment's design (ABConfig): the workload, blocks, order and policies every arm is run under."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

from orchestrator.config.slo import DEFAULT_METRIC, SLO
from orchestrator.config.workload import BenchConfig
from orchestrator.stats.estimates import DEFAULT_MIN_EFFECT
from orchestrator.stats.sequential import SequentialPlan


@dataclass(frozen=True, kw_only=True)
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
    auto: SequentialPlan | None = None  # --blocks auto: from auto.min_blocks, one more block per undecided look
    order: str = "random"  # random | fixed | abba
    order_seed: int | None = None  # None: drawn at random, then recorded with the experiment
    min_effect: float = DEFAULT_MIN_EFFECT  # the smallest relative difference worth calling
    allow_mixed: bool = False  # compare arms on servers orch did not launch (attached) with launched ones
    allow_node_mismatch: bool = False  # launch on a group whose nodes differ (recorded in the host facts)
    port: int | None = None  # every launched arm serves here, not on its profile's port (--port, an item's port:)
    slo: SLO | None = None  # --slo: the objectives goodput counts against
    metric: str = DEFAULT_METRIC  # --metric: what the verdicts (and --blocks auto's looks) are on
    cache_measured: bool = False  # --cache-measured: a prefix-cache gap between arms does not hold back a verdict


def new_experiment_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def bench_config_from(stored: dict[str, Any]) -> BenchConfig:
    known = {f.name for f in fields(BenchConfig)}
    data = {k: v for k, v in stored.items() if k in known}
    data["concurrency"] = tuple(data.get("concurrency", (1,)))
    return BenchConfig(**data)
