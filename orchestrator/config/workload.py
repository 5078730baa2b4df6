"""A benchmark workload: how each launch is measured (BenchConfig), and the request sequence it sends."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.config import arrivals, datasets, sessions, traces
from orchestrator.config.prompts import PromptItem
from orchestrator.errors import PromptFileError

CLIENT_PLACES = ("host", "local")
# An open-loop level given neither --duration nor --requests lasts this long per run.
DEFAULT_DURATION_S = 30.0
# The open-loop fields: left out of to_dict() for a closed-loop workload, so that its stored config and digests stay
# what they were before open loop existed (a resumed experiment, a nightly history).
OPEN_LOOP_FIELDS = ("rate", "arrivals", "duration_s", "requests_per_level", "max_concurrency")


@dataclass(frozen=True, kw_only=True)
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
    # Open loop (docs/load.md): rate levels in requests/s instead of concurrency levels; each run sends its requests
    # at the times config/arrivals.schedule gives, for duration_s or requests_per_level, at most max_concurrency at
    # once.
    rate: tuple[float, ...] = ()
    arrivals: str = "poisson"
    duration_s: float | None = None
    requests_per_level: int | None = None
    max_concurrency: int | None = None
    # A run stops sending once the server is over-saturated (client/openloop.oversaturation): --sweep auto's levels.
    stop_oversaturated: bool = False
    # orch ab --check-outputs: the client keeps each request's generated output (results/outputs compares the arms).
    check_outputs: bool = False
    # Trace replay (config/traces, docs/data.md#trace-replay): the one level's schedule, prompts and output lengths
    # come from this Mooncake JSONL file (its first requests_per_level requests), replayed `speed` times as fast; its
    # sha256 is kept so that a reproduction replays the same trace. `rate` is the replay's mean rate, its name.
    trace: str | None = None
    speed: float = 1.0
    trace_sha256: str | None = None
    # Multi-turn sessions (config/sessions, docs/data.md#multi-turn-sessions): each of the dataset's conversations
    # with at least `turns` user turns is a session of its first `turns` turns, each turn sent with the conversation
    # so far and the server's own replies; a stream runs a session's turns in order, `requests_per_stream` sessions
    # per stream. None: one request per prompt, as before.
    turns: int | None = None
    # --flush-cache: the prefix cache emptied before every timed run (engines/base.CacheFlush, per engine), so no run
    # finds prompts an earlier one left; it changes what the requests measure, so it is part of the workload.
    flush_cache: bool = False
    # A dataset's runs each send prompts.covering_order (config/datasets.covering_sequence): every category a run has
    # requests for, the whole dataset in a run of as many requests. False: the one seeded sequence of passes over
    # the dataset that experiments stored before it followed (their digests and breakdowns stay what they were).
    cover: bool = False

    def __post_init__(self) -> None:
        # Read back from JSON (a stored config, a bundle) the levels are a list; as a tuple the config stays hashable.
        if not isinstance(self.rate, tuple):
            object.__setattr__(self, "rate", tuple(self.rate))

    @property
    def open_loop(self) -> bool:
        return bool(self.rate)

    def requests_per_run(self, concurrency: int) -> int:
        return concurrency * self.requests_per_stream * (self.turns or 1)

    @property
    def requests_per_warmup(self) -> int:
        """A warmup run sends one request, or one session of `turns` requests."""
        return self.turns or 1

    def schedule(self, rate: float, run: int) -> list[float]:
        """When each request of timed run `run` at `rate` is due (seconds from the run's start): the same for every
        arm and launch (config/arrivals.schedule)."""
        if self.trace is not None:
            return traces.schedule(trace_requests(self), self.speed)
        return arrivals.schedule(
            rate, self.arrivals, seed=self.seed, run=run, duration_s=self.duration_s, requests=self.requests_per_level
        )

    def to_dict(self) -> dict[str, Any]:
        d = {**self.__dict__, "concurrency": list(self.concurrency), "rate": list(self.rate)}
        if not self.stop_oversaturated:
            del d["stop_oversaturated"]  # digests and stored configs stay what they were before it existed
        if not self.check_outputs:
            del d["check_outputs"]
        if not self.flush_cache:
            del d["flush_cache"]
        if not self.cover:
            del d["cover"]
        if self.trace is None:
            for name in ("trace", "speed", "trace_sha256"):
                del d[name]
        if self.turns is None:
            del d["turns"]
        return d if self.open_loop else {k: v for k, v in d.items() if k not in OPEN_LOOP_FIELDS}


def request_items(config: BenchConfig) -> list[dict[str, Any]]:
    """Every input the benchmark will send, in order: identical for every arm (a pure function of the config). An
    open-loop run's items carry `scheduled_s`, when each is due, so the digests of the sequence cover the schedule.
    The whole list at once: request_stream gives them one at a time, requests_digest digests them so."""
    return list(request_stream(config))


def request_stream(config: BenchConfig) -> Iterator[dict[str, Any]]:
    """request_items one at a time: a trace's prompts are generated as they are taken (a replay of many long
    prompts is never held whole; the rest is built as before, bounded by the plan's limits)."""
    if not config.open_loop:
        total = config.warmup * config.requests_per_warmup + sum(
            config.runs * config.requests_per_run(c) for c in config.concurrency
        )
        if config.turns is not None:
            if config.input_len is not None:
                raise PromptFileError("--input-len applies to --prompts random only, not to --turns sessions")
            yield from sessions.sequence(config.prompts, total // config.turns, config.turns, seed=config.seed)
            return
        if covered(config):
            sizes = [(run, config.requests_per_run(c)) for c in config.concurrency for run in range(config.runs)]
            yield from (it.to_dict() for it in _covering(config, sizes))
            return
        for it in datasets.request_sequence(config.prompts, total, seed=config.seed, input_len=config.input_len):
            yield it.to_dict()
        return
    schedules = [config.schedule(rate, run) for rate in config.rate for run in range(config.runs)]
    if config.trace is not None:
        replay = trace_requests(config)
        # Warmups send the trace's first prompts; every timed run replays the trace from its start.
        for i in range(config.warmup):
            yield traces.item(replay, i % len(replay)).to_dict()
        for times in schedules:
            for it, at in zip(traces.items(replay), times, strict=True):
                yield {**it.to_dict(), "scheduled_s": at}
        return
    if covered(config):
        runs = [run for _ in config.rate for run in range(config.runs)]
        items = _covering(config, [(run, len(times)) for run, times in zip(runs, schedules, strict=True)])
    else:
        items = datasets.request_sequence(
            config.prompts, config.warmup + sum(len(s) for s in schedules), seed=config.seed, input_len=config.input_len
        )
    yield from (it.to_dict() for it in items[: config.warmup])
    position = config.warmup
    for times in schedules:
        for at in times:
            yield {**items[position].to_dict(), "scheduled_s": at}
            position += 1


# The run index a dataset's warmups draw their covering order with (timed runs: 0, 1, ...).
WARMUP_RUN = -1


def covered(config: BenchConfig) -> bool:
    """Whether each run of this workload sends a category-covering order of its dataset (BenchConfig.cover)."""
    return config.cover and config.turns is None and config.trace is None and datasets.covers(config.prompts)


def _covering(config: BenchConfig, runs: list[tuple[int, int]]) -> list[PromptItem]:
    """The warmups' inputs, then each timed run's (run index, requests): datasets.covering_sequence."""
    warm = [(WARMUP_RUN, config.warmup * config.requests_per_warmup)]
    return datasets.covering_sequence(config.prompts, warm + runs, seed=config.seed, input_len=config.input_len)


def check_requests(config: BenchConfig) -> None:
    """The request sequence built and dropped: a bad prompt file or option fails here, before any server starts. A
    trace's lines are read and checked; its prompts, generated from them, cannot fail, so they are not made."""
    if config.open_loop and config.trace is not None:
        trace_requests(config)
        return
    for _ in request_stream(config):
        pass


def requests_digest(config: BenchConfig) -> str:
    """sha256 of the request sequence as JSON, `json.dumps(request_items(config), sort_keys=True)`, the digest every
    experiment records: the same bytes, written one item at a time, so a long sequence is never held whole."""
    digest = hashlib.sha256(b"[")
    for i, item in enumerate(request_stream(config)):
        digest.update((", " if i else "").encode() + json.dumps(item, sort_keys=True).encode())
    digest.update(b"]")
    return digest.hexdigest()


T = TypeVar("T")

# A timed run, as its requests' categories are looked up: (concurrency, rate or 0.0, run index), as RunResult says.
RunSlot = tuple[int, float, int]


def run_categories(config: BenchConfig) -> dict[RunSlot, tuple[str, ...]]:
    """Each timed run's requests' categories in request order, from the request sequence as launch/benchmark sends
    it (warmups first, then each level's runs in turn): a per-request row's `index` is its place in the run."""
    return run_values(config, lambda it: str(it.get("category", "")))


def run_values(config: BenchConfig, of: Callable[[dict[str, Any]], T]) -> dict[RunSlot, tuple[T, ...]]:
    """Each timed run's requests, each as `of` reads its input (request_items' dict), in request order: what
    run_categories gives for categories, results/byprompt for each request's prompt."""
    items = request_stream(config)
    out: dict[RunSlot, tuple[T, ...]] = {}
    for _ in itertools.islice(items, config.warmup * config.requests_per_warmup):
        pass
    if config.open_loop:
        sizes = [((0, rate, i), len(config.schedule(rate, i))) for rate in config.rate for i in range(config.runs)]
    else:
        sizes = [((c, 0.0, i), config.requests_per_run(c)) for c in config.concurrency for i in range(config.runs)]
    for slot, n in sizes:
        out[slot] = tuple(of(it) for it in itertools.islice(items, n))
    return out


def trace_requests(config: BenchConfig) -> list[traces.TraceRequest]:
    """The requests a trace workload replays in every run (config.trace's first requests_per_level), read once per
    process; with the experiment's trace_sha256, only from that same file."""
    if config.trace is None:
        raise ValueError("trace_requests: the workload replays no trace")
    return _trace(config.trace, config.requests_per_level, config.trace_sha256)


@functools.lru_cache(maxsize=4)
def _trace(path: str, requests: int | None, sha256: str | None) -> list[traces.TraceRequest]:
    """A trace's requests replayed in a run, read once per process (every run and digest asks for them); with the
    sha256 an experiment recorded, only from that same file (a resume or reproduction replays what was replayed)."""
    if sha256 is None:
        return traces.load(path, requests)
    try:
        found = datasets.file_sha256(path)
    except PromptFileError as e:
        raise PromptFileError(
            f"{e}; the experiment replayed the trace with sha256 {sha256[:16]}…: put that same file there to resume or "
            "reproduce it"
        ) from None
    if found != sha256:
        raise PromptFileError(
            f"{path}: sha256 {found[:16]}… differs from the experiment's trace ({sha256[:16]}…); a replay needs the "
            "same trace file (trace_sha256 in the experiment's config)"
        )
    return traces.load(path, requests)
