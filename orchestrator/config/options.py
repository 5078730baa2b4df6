"""`RunOptions`: what `orch ab`, `orch bench` or `orch reproduce` was asked to do, built once from its options."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.slo import DEFAULT_METRIC, SLO, check_metric
from orchestrator.errors import InputError
from orchestrator.stats.sequential import DEFAULT_MAX_BLOCKS, SequentialPlan


class OptionError(InputError):
    """Options that cannot run together (or with the experiment they name): the CLI shows it as a usage error
    (exit 2, with click's usage line); any other caller gets an InputError."""


# The open-loop options (field → flag): meaningful only with --rate.
OPEN_LOOP_OPTIONS = {
    "rate": "--rate",
    "arrivals": "--arrivals",
    "duration": "--duration",
    "requests_per_level": "--requests",
    "max_concurrency": "--max-concurrency",
}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Every option of a run command, typed. The defaults are `orch ab`'s, so a test builds one with the few fields
    it cares about. `given` names the options the user gave (not left at their defaults): `--resume` and a bundle
    refuse some of them, and take the experiment's own value for others only when not given."""

    command: str = "ab"  # ab | bench | reproduce: what --fail-on is judged against, which refusals apply
    profiles: tuple[str, ...] = ()
    resume: str | None = None
    # where, and how the servers are run
    host_spec: str = "local"
    inventory: str | None = None
    accept_new_host_key: bool = False
    workdir: str | None = None
    db: str | None = None
    sim: bool = False
    attach: tuple[str, ...] = ()  # ARM=URL for orch ab, one URL for orch bench
    allow_mixed: bool = False
    allow_node_mismatch: bool = False
    strict_env: bool = False
    port: int | None = None
    force: bool = False
    ready_timeout: float | None = None
    grace: float = 10.0
    gpu_wait: float = 120.0
    lock_wait: float = 0.0
    # the workload
    runs: int = 5
    warmup: int = 2
    max_tokens: int = 2048
    seed: int = 0
    concurrency: tuple[int, ...] = (1,)
    requests_per_stream: int = 1
    endpoint: str | None = None
    prompt_source: str = "builtin"
    input_len: int | None = None
    client_place: str = "host"
    min_run_s: float = 1.0
    stall_timeout: float = 60.0
    first_token_timeout: float = 180.0
    # open loop (--rate): requests sent at scheduled times instead of streams kept busy
    rate: tuple[float, ...] = ()
    arrivals: str = "poisson"
    duration: float | None = None
    requests_per_level: int | None = None
    max_concurrency: int | None = None
    sweep: int | None = None  # --sweep auto[:N]: N rate levels found by a probe (experiment/sweep)
    stop_oversaturated: bool = False  # --stop-oversaturated (always on for --sweep auto's levels)
    trace: str | None = None  # --trace FILE: one open-loop level replaying a Mooncake JSONL trace (config/traces)
    speed: float = 1.0  # --speed X: the trace replayed X times as fast
    # the design and its judgement
    blocks: int | str | None = "auto"  # auto, N, or None (orch reproduce: the bundle's own / a claim's default)
    max_blocks: int | None = DEFAULT_MAX_BLOCKS  # None where the command has no --blocks auto
    order: str = "random"
    order_seed: int | None = None
    min_effect: float = 0.02
    target_tps: float | None = None
    fail_on: tuple[str, ...] = ()
    slo: SLO | None = None  # --slo
    metric: str = DEFAULT_METRIC  # --metric
    # output
    as_json: bool = False
    quiet: bool = False
    verbose: bool = False
    check_outputs: bool = False  # orch ab --check-outputs: compare each prompt's output across the arms
    turns: int | None = None  # --turns N: multi-turn sessions of N turns (config/sessions)
    flush_cache: bool = False  # --flush-cache: an empty prefix cache before every timed run (BenchConfig.flush_cache)
    cache_measured: bool = False  # orch ab --cache-measured: a cache gap between arms does not hold back verdicts
    # orch reproduce BUNDLE: run what it would run unasked, or without asking when a key this file lists signed it
    trust_bundle: bool = False
    allowed_signers: str | None = None
    given: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_params(cls, command: str, params: Mapping[str, Any], given: Iterable[str] = ()) -> RunOptions:
        """From a command's parsed parameters (click's `ctx.params`); parameters that are not run options (orch
        reproduce's target and claim) are the caller's. An option a command does not have keeps its default, except
        --max-blocks, which only `orch ab` has."""
        known = {f.name for f in dataclasses.fields(cls)} - {"command", "given"}
        values = {k: v for k, v in params.items() if k in known}
        if "profile" in params:  # orch bench's one PROFILE
            values["profiles"] = (params["profile"],)
        attach = values.get("attach")
        values["attach"] = (attach,) if isinstance(attach, str) else tuple(attach or ())
        values.setdefault("max_blocks", None)
        for name in ("profiles", "concurrency", "fail_on", "rate"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(command=command, given=frozenset(given) & frozenset(params), **values)

    def gave(self, name: str) -> bool:
        """Whether the user gave this option (rather than leaving it at its default)."""
        return name in self.given

    def check_verbosity(self) -> None:
        if self.quiet and self.verbose:
            raise OptionError("-q (verdict only) and -v (every request) exclude each other")

    def check_metric(self) -> None:
        """--metric goodput needs --slo; orch bench's --fail-on judges tok/s against the profile's expect.tok_s."""
        try:
            check_metric(self.metric, self.slo)
        except InputError as e:
            raise OptionError(str(e)) from None
        judged = [m for m in self.fail_on if m in ("slower", "different")]
        if self.command == "bench" and judged and self.metric != DEFAULT_METRIC:
            raise OptionError(
                f"orch bench --fail-on {judged[0]} judges single-stream tok/s against the profile's expect.tok_s; "
                f"--metric {self.metric} has no expected value to judge against (compare two profiles with orch ab)"
            )

    def check_open_loop(self) -> None:
        """--rate (open loop) excludes the closed-loop options, and the open-loop options need it (docs/load.md)."""
        if self.turns is not None and (self.rate or self.sweep is not None or self.trace is not None):
            flag = "--trace" if self.trace is not None else "--sweep" if self.sweep is not None else "--rate"
            raise OptionError(
                f"--turns runs multi-turn sessions on closed-loop streams (each turn waits for the reply it feeds "
                f"back); {flag} (open loop) excludes it: leave one out, and use --concurrency with --turns"
            )
        self.check_trace()
        if self.trace is not None:
            return
        if self.sweep is not None:
            for name, flag in (
                ("rate", "--rate"),
                ("concurrency", "--concurrency"),
                ("requests_per_stream", "--requests-per-stream"),
            ):
                if self.gave(name):
                    raise OptionError(
                        f"--sweep auto finds its own rate levels (a probe, then rates between); {flag} excludes it: "
                        "give one of them"
                    )
        elif not self.rate:
            given = [flag for name, flag in OPEN_LOOP_OPTIONS.items() if name != "rate" and self.gave(name)]
            given += ["--stop-oversaturated"] if self.stop_oversaturated else []
            if given:
                raise OptionError(
                    f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to open-loop levels only: give "
                    "--rate R[,R...] (requests per second) or --sweep auto, or leave them out for closed loop "
                    "(--concurrency)"
                )
            return
        for name, flag in (("concurrency", "--concurrency"), ("requests_per_stream", "--requests-per-stream")):
            if self.gave(name):
                raise OptionError(
                    f"--rate (open loop: requests sent at scheduled times) and {flag} (closed loop: streams kept "
                    "busy) exclude each other; give one of them"
                )
        if self.gave("duration") and self.gave("requests_per_level"):
            raise OptionError(
                "--duration and --requests exclude each other: an open-loop run at each rate lasts a time or a "
                "number of requests; give one of them"
            )

    def check_trace(self) -> None:
        """--trace is its own schedule, prompts and output lengths: the options that would give them exclude it."""
        if self.trace is None:
            if self.gave("speed"):
                raise OptionError("--speed applies to --trace only (the replay's time scale)")
            return
        for name, flag in (
            ("rate", "--rate"),
            ("sweep", "--sweep"),
            ("arrivals", "--arrivals"),
            ("duration", "--duration"),
            ("concurrency", "--concurrency"),
            ("requests_per_stream", "--requests-per-stream"),
            ("prompt_source", "--prompts/--dataset"),
            ("input_len", "--input-len"),
        ):
            if self.gave(name):
                raise OptionError(
                    f"--trace gives the schedule, prompts and output lengths itself; {flag} excludes it "
                    "(--requests N replays the first N requests, --speed X scales time)"
                )
        if not (math.isfinite(self.speed) and 0 < self.speed <= 1000):
            raise OptionError(f"--speed {self.speed:g}: expected a time scale above 0 and at most 1000")

    def sequential_plan(self) -> SequentialPlan | None:
        """--blocks auto's plan, or None for a fixed number of blocks (where --max-blocks has no meaning)."""
        if self.blocks != "auto":
            if self.gave("max_blocks"):
                raise OptionError(f"--max-blocks applies to --blocks auto, not to --blocks {self.blocks}")
            return None
        return SequentialPlan(max_blocks=self.max_blocks if self.max_blocks is not None else DEFAULT_MAX_BLOCKS)

    def replace(self, **changes: Any) -> RunOptions:
        return dataclasses.replace(self, **changes)
