"""Benchmark runs: the workload (prompts, concurrency, endpoint), where the client runs, and each run's result."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator import progress, prompts
from orchestrator.engines import Engine
from orchestrator.errors import BenchError

if TYPE_CHECKING:  # `orch show` imports this module for its result types: no asyncio client, psutil or simulator
    from orchestrator.hosts.base import Host

CLIENT_PLACES = ("host", "local")
GPU_PROBE_AFTER_S = 0.2  # into the run: the GPUs are busy, and even short test runs last longer
GPU_PROBE_TIMEOUT_S = 90.0  # op_gpus runs nvidia-smi twice, each bounded at 30 s
MAX_RECOVERIES = 3


@dataclass(frozen=True)
class BenchConfig:
    """How to benchmark one server: by default the seed's (2 warmups, 5 timed runs of 2048 tokens, 1 stream)."""

    runs: int = 5
    warmup: int = 2
    max_tokens: int = 2048
    warmup_max_tokens: int = 64
    seed: int = 0
    request_timeout_s: float = 600.0
    concurrency: tuple[int, ...] = (1,)
    requests_per_stream: int = 1  # a run at concurrency c sends c × this many requests
    endpoint: str = "generate"
    prompts: str = "builtin"  # builtin | random | path to a JSONL file
    input_len: int | None = None  # random prompts only
    client: str = "host"  # where the client runs: next to the server, or on the orch machine
    min_run_s: float = 1.0  # a timed run shorter than this is invalid (too short to measure)
    stall_timeout_s: float = 60.0  # a request with no new token for this long fails (the server hangs)
    first_token_timeout_s: float = 180.0  # ... and with no first token within this long

    def requests_per_run(self, concurrency: int) -> int:
        return concurrency * self.requests_per_stream

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "concurrency": list(self.concurrency)}


@dataclass(frozen=True)
class RunResult:
    """One run (warmups included, never in statistics). At concurrency 1 the first six fields are the seed's."""

    index: int
    warmup: bool
    tokens: int
    seconds: float
    tok_s: float  # output tokens per second per stream (tokens / end-to-end time, averaged over requests)
    prompt_tokens: int
    ttft_s: float | None  # median time to first token
    spec_accept_length: float | None = None
    spec_verify_ct: int | None = None
    valid: bool = True
    invalid_reason: str | None = None
    concurrency: int = 1
    aggregate_tok_s: float = 0.0  # output tokens per second, all streams, while all were busy
    requests: int = 1
    errors: int = 0
    accept_source: str | None = None
    token_source: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # ttft/itl/tpot/e2e distributions, chunk counts
    per_request: tuple[dict[str, Any], ...] = ()
    gpus: dict[str, Any] | None = None  # nvidia-smi read during this run, when it was probed

    @classmethod
    def from_summary(cls, index: int, warmup: bool, s: dict[str, Any]) -> RunResult:
        return cls(
            index=index,
            warmup=warmup,
            tokens=int(s["tokens"]),
            seconds=float(s["seconds"]),
            tok_s=float(s["tok_s"]),
            prompt_tokens=int(s["prompt_tokens"]),
            ttft_s=s["ttft_s"],
            spec_accept_length=s["spec_accept_length"],
            spec_verify_ct=s["spec_verify_ct"],
            valid=bool(s["valid"]),
            invalid_reason=s["invalid_reason"],
            concurrency=int(s["concurrency"]),
            aggregate_tok_s=float(s["aggregate_tok_s"]),
            requests=int(s["requests"]),
            errors=int(s["errors"]),
            accept_source=s["accept_source"],
            token_source=s["token_source"],
            metrics={
                k: s[k]
                for k in ("ttft", "itl", "tpot", "e2e", "window_s", "chunks", "multi_token_chunks", "spec")
                if k in s
            },
            per_request=tuple(s["per_request"]),
            gpus=s.get("gpus"),
        )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunResult:
        """A run as the store keeps it (older rows may lack the later columns)."""
        metrics = json.loads(row.get("metrics_json") or "{}")
        return cls(
            index=int(row["idx"]),
            warmup=bool(row["warmup"]),
            tokens=int(row["tokens"]),
            seconds=float(row["seconds"]),
            tok_s=float(row["tok_s"]),
            prompt_tokens=int(row["prompt_tokens"]),
            ttft_s=row["ttft_s"],
            spec_accept_length=row["spec_accept_length"],
            spec_verify_ct=row["spec_verify_ct"],
            valid=bool(row["valid"]),
            invalid_reason=row["invalid_reason"],
            concurrency=int(row.get("concurrency") or 1),
            aggregate_tok_s=float(row["aggregate_tok_s"] if row.get("aggregate_tok_s") is not None else row["tok_s"]),
            requests=int(row.get("requests") or 1),
            errors=int(row.get("errors") or 0),
            accept_source=row.get("accept_source"),
            token_source=row.get("token_source"),
            metrics=metrics,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["per_request"] = list(self.per_request)
        return d


# A runner sends one run's requests (bodies, their max tokens, the concurrency) and returns client.summarize_run's dict.
# With probe_gpus=True it also reads the GPUs' state during the run (summary["gpus"]; None if the run was too short).
Runner = Callable[[list[dict[str, Any]], list[int], int, bool], dict[str, Any]]


def host_runner(
    host: Host, address: str, port: int, config: BenchConfig, watch: list[dict[str, Any]] | None = None
) -> Runner:
    """The client runs on the host, through the host-side agent: no laptop network jitter in the numbers.
    `watch` (the launch's recorded processes) is checked there once a second: a run stops the moment one exits."""

    def run(bodies: list[dict[str, Any]], max_tokens: list[int], concurrency: int, probe_gpus: bool) -> dict[str, Any]:
        rounds = -(-len(bodies) // concurrency)
        result: dict[str, Any] = host.call(
            "bench_run",
            call_timeout=60 + config.request_timeout_s * rounds,
            address=address,
            port=port,
            endpoint=config.endpoint,
            bodies=bodies,
            max_tokens=max_tokens,
            concurrency=concurrency,
            timeout_s=config.request_timeout_s,
            min_duration_s=0.0,
            gpu_probe=host.config.nvidia_smi if probe_gpus else None,
            stall_s=config.stall_timeout_s,
            first_token_s=config.first_token_timeout_s,
            watch=watch,
        )
        return result

    return run


def local_runner(
    base_url: str, config: BenchConfig, host: Host | None = None, watch: list[dict[str, Any]] | None = None
) -> Runner:
    """The client runs in this process against base_url (for a remote host: the SSH tunnel's local end).
    GPU probes and the liveness checks of `watch` go to `host` from other threads (the agent is idle meanwhile)."""
    parts = urlsplit(base_url)
    if parts.hostname is None or parts.port is None:
        raise BenchError(f"cannot benchmark {base_url!r}: expected http://HOST:PORT")
    address, port, gpu_host = parts.hostname, parts.port, host

    def run(bodies: list[dict[str, Any]], max_tokens: list[int], concurrency: int, probe_gpus: bool) -> dict[str, Any]:
        reading: list[dict[str, Any]] = []
        probe = None
        if probe_gpus and gpu_host is not None:
            target = gpu_host

            def read() -> None:
                # A probe is a nicety: it never fails a run, and never prints a thread traceback into one.
                with contextlib.suppress(Exception):
                    smi = target.config.nvidia_smi
                    reading.append(target.call("gpus", call_timeout=GPU_PROBE_TIMEOUT_S, nvidia_smi=smi))

            probe = threading.Timer(GPU_PROBE_AFTER_S, read)
            probe.daemon = True
            probe.start()
        watchdog = None
        if watch and gpu_host is not None:
            checked = gpu_host

            def watchdog() -> str | None:
                state: dict[str, Any] = checked.call("launch_health", procs=watch)
                return None if state["ok"] else str(state["problem"])

        try:
            from orchestrator import client

            result = client.run(
                address,
                port,
                config.endpoint,
                bodies,
                max_tokens,
                concurrency,
                config.request_timeout_s,
                stall_s=config.stall_timeout_s,
                first_token_s=config.first_token_timeout_s,
                watchdog=watchdog,
            )
        finally:
            if probe is not None:
                probe.cancel()
                probe.join(timeout=GPU_PROBE_TIMEOUT_S)
        result["gpus"] = reading[0] if reading else None
        return result

    return run


def with_engine_counters(runner: Runner, engine: Engine) -> Runner:
    """A runner whose runs take their speculative statistics from the engine's own /metrics counters when the
    responses carried none (vLLM reports them only there; SGLang there too without per-request meta_info)."""

    def run(bodies: list[dict[str, Any]], max_tokens: list[int], concurrency: int, probe_gpus: bool) -> dict[str, Any]:
        summary = runner(bodies, max_tokens, concurrency, probe_gpus)
        if summary.get("spec_accept_length") is None:
            counted = engine.spec_from_counters(summary.get("counter_deltas") or {})
            if counted is not None:
                summary["spec_accept_length"] = counted.accept_length
                summary["accept_source"] = counted.source
                summary["spec"] = {
                    "drafted": counted.drafted,
                    "accepted": counted.accepted,
                    "acceptance_rate": counted.acceptance_rate,
                }
                if counted.per_position and counted.drafts:
                    # Accepted tokens at draft position 1, 2, … and the drafts behind them: orch whatif's acceptance
                    # per position.
                    summary["spec"]["per_position"] = list(counted.per_position)
                    summary["spec"]["drafts"] = counted.drafts
        return summary

    return run


def runner_for(
    host: Host,
    address: str,
    port: int,
    base_url: str,
    config: BenchConfig,
    engine: Engine,
    *,
    watch: list[dict[str, Any]] | None = None,
    probe_gpus: bool = True,
) -> Runner:
    """The runner for config.client (on the host through the agent, or here against base_url) whose runs take the
    engine's own counters where the responses carried no speculative statistics. probe_gpus=False: never read the
    GPUs (an attached server's GPUs are not known to be the ones --host can see)."""
    inner = (
        host_runner(host, address, port, config, watch)
        if config.client == "host"
        else local_runner(base_url, config, host if probe_gpus or watch else None, watch)
    )
    counted = with_engine_counters(inner, engine)
    if probe_gpus:
        return counted
    return lambda bodies, max_tokens, concurrency, _probe: counted(bodies, max_tokens, concurrency, False)


def request_items(config: BenchConfig) -> list[dict[str, Any]]:
    """Every input the benchmark will send, in order: identical for every arm (a pure function of the config)."""
    total = config.warmup + sum(config.runs * config.requests_per_run(c) for c in config.concurrency)
    return [
        it.to_dict()
        for it in prompts.request_sequence(config.prompts, total, seed=config.seed, input_len=config.input_len)
    ]


def run_benchmark(
    runner: Runner,
    config: BenchConfig,
    *,
    model: str,
    on_run: Callable[[RunResult], None] | None = None,
    recover: Callable[[str], bool] | None = None,
) -> list[RunResult]:
    """Warmups, then timed runs at each concurrency level; `on_run` sees each run the moment it finishes.

    A run with failed requests calls `recover` (reconnect, check the server); if the server is whole and healthy the
    run is repeated from the start (never stitched together), at most MAX_RECOVERIES times per benchmark, after
    which it is recorded as invalid. If the server is gone or unhealthy, BenchError (recorded as an invalid run
    first, so it is stored).
    """
    from orchestrator import client

    items = request_items(config)
    position = 0
    results: list[RunResult] = []
    recoveries = 0

    def one(index: int, warm: bool, concurrency: int, n: int, max_tokens: int) -> None:
        nonlocal position, recoveries
        chunk = items[position : position + n]
        position += n
        bodies = [client.build_body(config.endpoint, it, max_tokens, model) for it in chunk]
        while True:
            # The GPUs are read once per launch, at the same point of every launch so launches compare like for like:
            # during the last warmup (busy GPUs, and nvidia-smi never disturbs a measured run), or without warmups
            # during the first timed run.
            probe = (warm and index == config.warmup - 1) or (
                config.warmup == 0 and not warm and index == 0 and concurrency == config.concurrency[0]
            )
            progress.phase(
                "warmup" if warm else "run",
                index=index,
                of=config.warmup if warm else config.runs,
                concurrency=concurrency,
            )
            summary = runner(bodies, [max_tokens] * n, concurrency, probe)
            if summary.get("aborted"):
                # The watchdog saw the launch break (a process exited): nothing to check or repeat.
                stopped = RunResult.from_summary(index, warm, summary)
                results.append(stopped)
                if on_run is not None:
                    on_run(stopped)
                raise BenchError(
                    f"the launch broke during run {index + 1} at concurrency {concurrency}: {summary['aborted']}; "
                    "the run was stopped at once and not repeated. The server's log is named above"
                )
            if not summary["errors"] or recover is None:
                break
            first = next(r["error"] for r in summary["per_request"] if r["error"])
            which = f"{'warmup' if warm else 'run'} {index + 1}/{config.warmup if warm else config.runs}"
            left = recoveries < MAX_RECOVERIES
            what = (
                f"{which} at concurrency {concurrency}: {summary['errors']} of {summary['requests']} requests failed "
                f"(first: {first}); checking the connection and the server, then "
                + (
                    f"repeating the run if both are fine (repeat {recoveries + 1} of at most {MAX_RECOVERIES} in "
                    "this launch)"
                    if left
                    else f"keeping the run, invalid: no repeats left ({MAX_RECOVERIES} per launch)"
                )
            )
            # The server is checked either way: a dead one ends the launch now instead of failing every later run.
            if not recover(what):
                failed = RunResult.from_summary(index, warm, summary)
                results.append(failed)
                if on_run is not None:
                    on_run(failed)  # the failed run is stored too: it is the evidence of what happened
                raise BenchError(
                    f"the server failed during run {index + 1} at concurrency {concurrency} ({first}); "
                    "the launch was torn down and the run not repeated. Its log is named above"
                )
            if not left:
                break
            recoveries += 1
        if not warm and summary["window_s"] < config.min_run_s and summary["valid"]:
            summary = {
                **summary,
                "valid": False,
                "invalid_reason": f"run lasted {summary['window_s']:.2f}s, shorter than the minimum "
                f"{config.min_run_s:.2f}s (raise --max-tokens or lower --min-run-s)",
            }
        run = RunResult.from_summary(index, warm, summary)
        results.append(run)
        if on_run is not None:
            on_run(run)

    for i in range(config.warmup):
        one(i, True, 1, 1, config.warmup_max_tokens)
    for c in config.concurrency:
        for i in range(config.runs):
            one(i, False, c, config.requests_per_run(c), config.max_tokens)
    return results


# ---------------------------------------------------------------- the plan, before anything runs

# Limits on one launch's workload. Beyond them a benchmark is a typo (or days of GPU time), and merely building
# its request sequence pins a CPU and fills memory with no output.
MAX_REQUESTS_PER_LAUNCH = 100_000
MAX_OUTPUT_TOKENS_PER_LAUNCH = 100_000_000
MAX_PROMPT_TOKEN_IDS = 20_000_000  # --prompts random holds requests x input_len token ids in memory
# Without calibration the time is a lower bound: few real servers decode one stream faster than this.
ASSUMED_MAX_STREAM_TPS = 1000.0
# Without calibration or a claim the plan line shows the time at these per-stream speeds (a 2-core CPU decodes a
# small model at tens of tok/s; a GPU server a few hundred): the user knows which is closer to their engine.
EXAMPLE_STREAM_TPS = (30.0, 300.0)

# Per-stream output tok/s at a concurrency level, and the fixed seconds of one launch (loading, warmup).
ArmSpeed = tuple[Callable[[int], float], float]


@dataclass(frozen=True)
class Plan:
    """The work an experiment will do, computed from the options alone (nothing generated, nothing launched)."""

    launches: int
    runs_per_launch: int
    requests_per_launch: int
    output_tokens_per_launch: int
    prompt_token_ids_per_launch: int
    seconds: float
    calibrated: bool
    shortest_run_s: float | None = None  # the quickest timed run by the simulator's calibration (None: unknown)
    min_run_s: float = 0.0
    warmups: int = 0  # of runs_per_launch
    stream_tokens: int = 0  # output tokens each stream decodes one after another, over every launch
    claimed: bool = False  # the speeds are the profiles' claims (expect.tok_s), not the simulator's calibration

    def time_text(self) -> str:
        """The estimate as the plan line says it: "about 2 min", or "at least 2 min" without calibration or claim."""
        return f"{'about' if self.calibrated or self.claimed else 'at least'} {_duration(self.seconds)}"

    def _when(self, least: Plan | None) -> str:
        since = f"{_duration(least.seconds)} to " if least is not None else ""
        if self.calibrated:
            return f"{since}{self.time_text()} (simulator calibration)"
        if self.claimed:
            return f"{since}{self.time_text()} (at each profile's expect.tok_s per stream; server loading not counted)"
        low = f"{least.stream_tokens} to " if least is not None else ""

        def span(tps: float) -> str:
            low = f"{_duration(least.stream_tokens / tps)} to " if least is not None else ""
            return f"{low}{_duration(self.stream_tokens / tps)}"

        slow, fast = EXAMPLE_STREAM_TPS
        return (
            f"unknown for this engine until it runs: {low}{self.stream_tokens} output tokens decoded one after "
            f"another per stream (about {span(slow)} at {slow:.0f} tok/s per stream, {span(fast)} at {fast:.0f}) "
            "plus loading the server for every launch; --sim or the profiles' expect.tok_s give an estimate"
        )

    def line(self, least: Plan | None = None) -> str:
        """The plan in one line; with `least` (--blocks auto's minimum), the range from it to this maximum."""
        when = self._when(least)
        if least is not None:
            return (
                f"plan (--blocks auto): {least.launches} to {self.launches} launches, stopping as soon as every "
                f"comparison is decided; per launch {self.runs_per_launch} runs, {self.requests_per_launch} requests "
                f"and {self.output_tokens_per_launch} output tokens; time {when}"
            )
        warm = f" (+{self.warmups} warmup)" if self.warmups else ""
        return (
            f"plan: {self.launches} launch(es) x {self.runs_per_launch - self.warmups} runs{warm}, "
            f"{self.requests_per_launch} requests and {self.output_tokens_per_launch} output tokens per launch; "
            f"time {when}"
        )

    def refusal(self) -> str | None:
        """Why this plan is refused (the limit and how to get under it), or None."""
        if self.requests_per_launch > MAX_REQUESTS_PER_LAUNCH:
            return (
                f"{self.requests_per_launch} requests per launch is over the limit of {MAX_REQUESTS_PER_LAUNCH} "
                "(warmups + runs x sum of --concurrency levels x --requests-per-stream); lower --runs, "
                "--concurrency or --requests-per-stream"
            )
        if self.output_tokens_per_launch > MAX_OUTPUT_TOKENS_PER_LAUNCH:
            return (
                f"{self.output_tokens_per_launch} output tokens per launch is over the limit of "
                f"{MAX_OUTPUT_TOKENS_PER_LAUNCH}; lower --max-tokens or the number of requests"
            )
        if self.prompt_token_ids_per_launch > MAX_PROMPT_TOKEN_IDS:
            return (
                f"{self.prompt_token_ids_per_launch} random prompt tokens per launch is over the limit of "
                f"{MAX_PROMPT_TOKEN_IDS}; lower --input-len or the number of requests"
            )
        return None

    def too_short(self) -> str | None:
        """Why the simulator's calibration expects every run of an arm to be invalid (shorter than --min-run-s):
        `orch ab` warns before launching, a nightly suite refuses the item."""
        if self.calibrated and self.shortest_run_s is not None and self.shortest_run_s < self.min_run_s:
            return (
                f"by the simulator's calibration the quickest arm's runs would last about {self.shortest_run_s:.2f}s, "
                f"under --min-run-s {self.min_run_s:g}s, so they would be invalid; raise --max-tokens (or "
                "--requests-per-stream) or lower --min-run-s"
            )
        return None


def plan(
    config: BenchConfig, arms: Sequence[ArmSpeed], *, blocks: int, calibrated: bool, claimed: bool = False
) -> Plan:
    """What `config` asks of each launch, and a time estimate from each arm's speed; pure arithmetic."""
    timed = sum(config.requests_per_run(c) for c in config.concurrency) * config.runs
    requests = config.warmup + timed
    tokens = config.warmup * config.warmup_max_tokens + timed * config.max_tokens
    prompt_ids = requests * (config.input_len or 128) if config.prompts == "random" else 0
    seconds = 0.0
    shortest = float("inf")
    stream_tokens = 0
    for speed, setup_s in arms:
        seconds += setup_s + config.warmup * config.warmup_max_tokens / speed(1)
        stream_tokens += config.warmup * config.warmup_max_tokens
        for c in config.concurrency:
            # The c streams run side by side; each sends requests_per_stream requests one after another.
            run_s = config.requests_per_stream * config.max_tokens / speed(c)
            seconds += config.runs * run_s
            stream_tokens += config.runs * config.requests_per_stream * config.max_tokens
            shortest = min(shortest, run_s)
    return Plan(
        launches=len(arms) * blocks,
        runs_per_launch=config.warmup + config.runs * len(config.concurrency),
        requests_per_launch=requests,
        output_tokens_per_launch=tokens,
        prompt_token_ids_per_launch=prompt_ids,
        seconds=seconds * blocks,
        calibrated=calibrated,
        shortest_run_s=shortest if arms and config.runs else None,
        min_run_s=config.min_run_s,
        warmups=config.warmup,
        stream_tokens=stream_tokens * blocks,
        claimed=claimed and not calibrated,
    )


def assumed_speed() -> ArmSpeed:
    return (lambda c: ASSUMED_MAX_STREAM_TPS), 0.0


def claimed_speed(tok_s: float) -> ArmSpeed:
    """A profile's claimed single-stream tok/s (expect.tok_s) as its speed at every level, loading not counted."""
    return (lambda c: tok_s), 0.0


def sim_speed(env: Mapping[str, str], server_flags: Sequence[str]) -> ArmSpeed | None:
    """The simulator's calibrated speed for a launch with this env and these flags (None: it would not start)."""
    from orchestrator.sim.args import SimArgError
    from orchestrator.sim.knobs import knob_float, read_knobs
    from orchestrator.sim.timing import TimingModel
    from orchestrator.sim.vllm_args import parse_launch_args

    try:
        # argparse reports a bad flag on stderr and exits; the launch itself will say so properly.
        with contextlib.redirect_stderr(io.StringIO()):
            cfg = parse_launch_args(list(server_flags))
        knobs = read_knobs(env)
    except (SimArgError, ValueError, SystemExit):
        return None
    model = TimingModel.from_knobs(knobs, cfg.spec, 1.0, cfg.chunked_prefill_size)
    return model.steady_tokens_per_s, knob_float(knobs, "load_s") + knob_float(knobs, "warmup_s")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
