"""The plan, before anything runs: the work and time an experiment's options imply, and the limits it meets."""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config import arrivals, prompts
from orchestrator.config.traces import TraceRequest
from orchestrator.config.workload import BenchConfig, trace_requests

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

# The workload's fields as orch ab's options name them: a refusal of what the user typed names the option
# (`--requests`, never the field `requests_per_level`). A suite's workload and a bundle's config name them otherwise
# (SUITE_NAMES, the fields themselves); their callers pass those.
OPTIONS: dict[str, str] = {
    "runs": "--runs",
    "warmup": "--warmup",
    "max_tokens": "--max-tokens",
    "requests_per_stream": "--requests-per-stream",
    "input_len": "--input-len",
    "concurrency": "--concurrency",
    "min_run_s": "--min-run-s",
    "stall_timeout_s": "--stall-timeout",
    "first_token_timeout_s": "--first-token-timeout",
    "seed": "--seed",
    "endpoint": "--endpoint",
    "client": "--client",
    "prompts": "--prompts",
    "rate": "--rate",
    "arrivals": "--arrivals",
    "duration_s": "--duration",
    "requests_per_level": "--requests",
    "max_concurrency": "--max-concurrency",
    "blocks": "--blocks",
}
SUITE_NAMES: dict[str, str] = {
    "requests_per_level": "requests",
    "duration_s": "duration",
    "stall_timeout_s": "stall_timeout",
    "first_token_timeout_s": "first_token_timeout",
}


@dataclass(frozen=True, kw_only=True)
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
    schedule_s: float = 0.0  # open loop: seconds of arrival schedules over every launch (known before any speed)
    open_loop: bool = False  # rate levels (--rate), not concurrency levels
    about: bool = False  # the counts are averages (open loop for a --duration: the number of arrivals varies)
    # The trace file the one level replays (--trace): its requests, prompt and output lengths are the trace's, not
    # rate x time and --max-tokens; with its requests and their prompt tokens per timed run.
    trace: str | None = None
    trace_requests: int = 0
    trace_prompt_tokens: int = 0

    def time_text(self) -> str:
        """The estimate as the plan line says it: "about 2 min", or "at least 2 min" without calibration or claim."""
        return f"{'about' if self.calibrated or self.claimed else 'at least'} {_duration(self.seconds)}"

    def _when(self, least: Plan | None) -> str:
        since = f"{_duration(least.seconds)} to " if least is not None else ""
        if self.calibrated:
            return f"{since}{self.time_text()} (simulator calibration)"
        if self.claimed:
            return f"{since}{self.time_text()} (at each profile's expect.tok_s per stream; server loading not counted)"
        if self.open_loop:
            since = f"{_duration(least.schedule_s)} to " if least is not None else ""
            return (
                f"unknown for this engine until it runs: at least {since}{_duration(self.schedule_s)} of arrival "
                "schedules, plus what each run takes to finish its last requests (longer where the server cannot "
                "keep up with the rate) and loading the server for every launch; --sim or the profiles' expect.tok_s "
                "give an estimate"
            )
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
        about = "about " if self.about else ""
        if least is not None:
            return (
                f"plan (--blocks auto): {least.launches} to {self.launches} launches, stopping as soon as every "
                f"comparison is decided; per launch {self.runs_per_launch} runs, {about}{self.requests_per_launch} "
                f"requests and {self.output_tokens_per_launch} output tokens; time {when}"
            )
        warm = f" (+{self.warmups} warmup)" if self.warmups else ""
        return (
            f"plan: {self.launches} launch(es) x {self.runs_per_launch - self.warmups} runs{warm}, "
            f"{about}{self.requests_per_launch} requests and {self.output_tokens_per_launch} output tokens per launch; "
            f"time {when}"
        )

    def refusal(self, names: Mapping[str, str] = OPTIONS) -> str | None:
        """Why this plan is refused (the limit and how to get under it), or None. What to lower is named as `names`
        says (orch ab's options by default; SUITE_NAMES for a suite's workload, {} for a bundle's own fields)."""

        def name(field: str) -> str:
            return names.get(field, field)

        runs = name("runs")
        if self.requests_per_launch > MAX_REQUESTS_PER_LAUNCH and self.trace is not None:
            return (
                f"{self.requests_per_launch} requests per launch is over the limit of {MAX_REQUESTS_PER_LAUNCH} "
                f"(warmups + runs x the trace's requests); lower {runs}, or replay the trace's first N requests "
                f"({name('requests_per_level')} N)"
            )
        if self.requests_per_launch > MAX_REQUESTS_PER_LAUNCH and self.open_loop:
            return (
                f"about {self.requests_per_launch} requests per launch is over the limit of {MAX_REQUESTS_PER_LAUNCH} "
                f"(warmups + runs x the requests of every {name('rate')} level: rate x {name('duration_s')}, or "
                f"{name('requests_per_level')}); lower {runs}, {name('rate')}, {name('duration_s')} or "
                f"{name('requests_per_level')}"
            )
        if self.requests_per_launch > MAX_REQUESTS_PER_LAUNCH:
            return (
                f"{self.requests_per_launch} requests per launch is over the limit of {MAX_REQUESTS_PER_LAUNCH} "
                f"(warmups + runs x sum of {name('concurrency')} levels x {name('requests_per_stream')}); lower "
                f"{runs}, {name('concurrency')} or {name('requests_per_stream')}"
            )
        if self.output_tokens_per_launch > MAX_OUTPUT_TOKENS_PER_LAUNCH:
            return (
                f"{self.output_tokens_per_launch} output tokens per launch is over the limit of "
                f"{MAX_OUTPUT_TOKENS_PER_LAUNCH}; "
                + (
                    f"they are the trace's output_length, capped by {name('max_tokens')}: lower {name('max_tokens')} "
                    f"or {runs}, or replay the trace's first N requests ({name('requests_per_level')} N)"
                    if self.trace is not None
                    else f"lower {name('max_tokens')} or the number of requests"
                )
            )
        if self.prompt_token_ids_per_launch > MAX_PROMPT_TOKEN_IDS and self.trace is not None:
            return (
                f"{self.trace}: the replay asks for {self.trace_prompt_tokens:,} prompt tokens per run (the "
                f"input_length of its {self.trace_requests:,} requests), {self.prompt_token_ids_per_launch:,} per "
                f"launch with the warmups and {runs}: over the limit of {MAX_PROMPT_TOKEN_IDS:,} generated prompt "
                f"tokens per launch; replay its first N requests ({name('requests_per_level')} N) or lower {runs}"
            )
        if self.prompt_token_ids_per_launch > MAX_PROMPT_TOKEN_IDS:
            return (
                f"{self.prompt_token_ids_per_launch} generated prompt token ids per launch is over the limit of "
                f"{MAX_PROMPT_TOKEN_IDS}; lower {name('input_len')} (random) or the lengths in shared-prefix:GxP:S:Q, "
                "or the number of requests"
            )
        return None

    def too_short(self, names: Mapping[str, str] = OPTIONS) -> str | None:
        """Why the simulator's calibration expects every run of an arm to be invalid (shorter than --min-run-s):
        `orch ab` warns before launching, a nightly suite refuses the item (naming its fields: `names`)."""

        def name(field: str) -> str:
            return names.get(field, field)

        if self.calibrated and self.shortest_run_s is not None and self.shortest_run_s < self.min_run_s:
            return (
                f"by the simulator's calibration the quickest arm's runs would last about {self.shortest_run_s:.2f}s, "
                f"under {name('min_run_s')} {self.min_run_s:g}s, so they would be invalid; raise {name('max_tokens')} "
                f"(or {name('requests_per_stream')}) or lower {name('min_run_s')}"
                if not self.open_loop
                else f"by the arrival schedules the shortest level's runs would last about {self.shortest_run_s:.2f}s, "
                f"under {name('min_run_s')} {self.min_run_s:g}s, so they would be invalid; raise "
                f"{name('duration_s')} (or {name('requests_per_level')}) or lower {name('min_run_s')}"
            )
        return None


def plan(
    config: BenchConfig,
    arms: Sequence[ArmSpeed],
    *,
    blocks: int,
    calibrated: bool,
    claimed: bool = False,
    trace: Sequence[TraceRequest] | None = None,
) -> Plan:
    """What `config` asks of each launch, and a time estimate from each arm's speed; arithmetic on the options
    (and, for a trace, its lines: `trace`, else read from config.trace), nothing generated."""
    if config.open_loop:
        return open_loop_plan(config, arms, blocks=blocks, calibrated=calibrated, claimed=claimed, trace=trace)
    timed = sum(config.requests_per_run(c) for c in config.concurrency) * config.runs
    warm = config.warmup * config.requests_per_warmup  # a multi-turn warmup is one session of --turns requests
    requests = warm + timed
    tokens = warm * config.warmup_max_tokens + timed * config.max_tokens
    prompt_ids = requests * prompt_ids_each(config)
    seconds = 0.0
    shortest = float("inf")
    stream_tokens = 0
    for speed, setup_s in arms:
        seconds += setup_s + warm * config.warmup_max_tokens / speed(1)
        stream_tokens += warm * config.warmup_max_tokens
        for c in config.concurrency:
            # The c streams run side by side; each sends requests_per_stream requests one after another.
            per_stream = config.requests_per_run(c) // c  # sessions of --turns requests, one turn after another
            run_s = per_stream * config.max_tokens / speed(c)
            seconds += config.runs * run_s
            stream_tokens += config.runs * per_stream * config.max_tokens
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


def open_loop_plan(
    config: BenchConfig,
    arms: Sequence[ArmSpeed],
    *,
    blocks: int,
    calibrated: bool,
    claimed: bool = False,
    trace: Sequence[TraceRequest] | None = None,
) -> Plan:
    """plan() for rate levels: each run lasts its arrival schedule (--duration, or --requests / rate) plus the time
    its last requests take, or longer where the arm cannot serve the rate (open_loop_run_s). A trace's level sends
    the trace's requests with their own prompt and output lengths (`trace`: its lines, read from config.trace when
    not given): those are counted, not --max-tokens per request."""
    per_level = [arrivals.expected_requests(r, config.duration_s, config.requests_per_level) for r in config.rate]
    spans = [arrivals.span_s(r, config.duration_s, config.requests_per_level) for r in config.rate]
    timed = config.runs * sum(per_level)
    warm_prompt = config.warmup * prompt_ids_each(config)
    run_prompt = sum(per_level) * prompt_ids_each(config)
    run_output = sum(per_level) * config.max_tokens
    replay: Sequence[TraceRequest] = ()
    if config.trace is not None:
        replay = trace if trace is not None else trace_requests(config)
        # Warmups send the trace's first prompts (config/workload.request_stream), each for warmup_max_tokens.
        warm_prompt = sum(replay[i % len(replay)].input_length for i in range(config.warmup))
        run_prompt = sum(r.input_length for r in replay)
        run_output = sum(min(r.output_length, config.max_tokens) for r in replay)
    # One request's output tokens, for the time a run's last requests take.
    each = run_output / max(1, sum(per_level))
    seconds = 0.0
    stream_tokens = 0.0
    for speed, setup_s in arms:
        seconds += setup_s + config.warmup * config.warmup_max_tokens / speed(1)
        stream_tokens += config.warmup * config.warmup_max_tokens + config.runs * len(config.rate) * each
        for rate, n, span in zip(config.rate, per_level, spans, strict=True):
            seconds += config.runs * open_loop_run_s(rate, n, span, each, speed, config.max_concurrency)
    return Plan(
        launches=len(arms) * blocks,
        runs_per_launch=config.warmup + config.runs * len(config.rate),
        requests_per_launch=config.warmup + timed,
        output_tokens_per_launch=config.warmup * config.warmup_max_tokens + config.runs * run_output,
        prompt_token_ids_per_launch=warm_prompt + config.runs * run_prompt,
        seconds=seconds * blocks,
        calibrated=calibrated,
        shortest_run_s=min(spans) if arms and config.runs else None,
        min_run_s=config.min_run_s,
        warmups=config.warmup,
        stream_tokens=round(stream_tokens * blocks),
        claimed=claimed and not calibrated,
        schedule_s=len(arms) * blocks * config.runs * sum(spans),
        open_loop=True,
        about=config.duration_s is not None,
        trace=config.trace,
        trace_requests=len(replay),
        trace_prompt_tokens=run_prompt if config.trace is not None else 0,
    )


def open_loop_run_s(
    rate: float, n: int, span: float, max_tokens: float, speed: Callable[[int], float], cap: int | None
) -> float:
    """One open-loop run's seconds at an arm's speed: the requests in flight c settle where c = rate x latency(c)
    (Little's law, latency = max_tokens / speed(c), at most the cap or n); if c requests at a time complete fewer
    than `rate` per second, the run lasts until the backlog is served, else its schedule, plus one request's time."""
    most = max(1, min(n, cap if cap is not None else n))
    c = min(most, max(1, math.ceil(rate * max_tokens / speed(1))))
    for _ in range(8):
        c = min(most, max(1, math.ceil(rate * max_tokens / speed(c))))
    latency = max_tokens / speed(c)
    capacity = c * speed(c) / max_tokens  # requests per second
    return max(span, n / capacity) + latency


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


def prompt_ids_each(config: BenchConfig) -> int:
    """Token ids each request's prompt holds in memory when orch generates them (random, shared-prefix), else 0."""
    if config.prompts == "random":
        return config.input_len or 128
    shared = prompts.SharedPrefix.parse(config.prompts)
    return shared.prompt_len if shared is not None else 0
