"""Benchmark runs on a launched server: the runner (client on the host, or local) and the warmup/timed-run loop."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator.client.metrics import counted_prefix_cache
from orchestrator.client.request import Wire, with_markers
from orchestrator.config.workload import BenchConfig, request_stream
from orchestrator.engines import CacheFlush, Engine
from orchestrator.errors import BenchError
from orchestrator.results.run import RunResult
from orchestrator.ui.events import QUIET, Events

if TYPE_CHECKING:  # `orch show` imports this module for its result types: no asyncio client, psutil or simulator
    from orchestrator.hosts.base import Host


GPU_PROBE_AFTER_S = 0.2  # into the run: the GPUs are busy, and even short test runs last longer
GPU_PROBE_TIMEOUT_S = 90.0  # op_gpus runs nvidia-smi twice, each bounded at 30 s
# Power sampling around a run on the host (`bench_run`'s power_smi): nvidia-smi's start and first sample before
# the run, its last sample and stop after; bounded in agent/power.
POWER_CALL_EXTRA_S = 30.0
MAX_RECOVERIES = 3
# Why a run has no energy figure where none is sampled at all (the run's "energy" entry; reports give the reason).
NO_ENERGY_MULTINODE = (
    "a multi-node launch: power is sampled on the node that runs the client, which would leave out the others' GPUs"
)
NO_ENERGY_REMOTE_LOCAL_CLIENT = (
    "--client local with a remote host: power is sampled by the host's agent inside the call that carries a run, "
    "and a local client makes no such call (use --client host)"
)


@dataclass(frozen=True, kw_only=True)
class RunCall:
    """One run asked of a runner: the request bodies, their max tokens, the concurrency (0 for open loop). With
    `probe_gpus` the runner also reads the GPUs' state during the run (summary["gpus"]; None if the run was too
    short). `open_loop`, for an open-loop run, is client.runner.run's (the schedule, rate, arrivals, cap); None for
    closed loop. `flush` ({"method", "path"}: --flush-cache) is sent to the server first, in the same call; when it
    fails, nothing is sent and the answer is {"cache_flush_failed": ...}."""

    bodies: list[dict[str, Any]]
    max_tokens: list[int]
    concurrency: int
    probe_gpus: bool
    open_loop: dict[str, Any] | None = None
    flush: Mapping[str, Any] | None = None


# Sends one run's requests and returns client.summarize_run's dict (the wrappers below add to it).
Runner = Callable[[RunCall], dict[str, Any]]


def host_runner(
    host: Host,
    address: str,
    port: int,
    config: BenchConfig,
    watch: list[dict[str, Any]] | None = None,
    power: bool = False,
    *,
    wire: Wire,
) -> Runner:
    """The client runs on the host, through the host-side agent: no laptop network jitter in the numbers.
    `wire`: how the engine is spoken to on config.endpoint (engines/base.Engine.wire).
    `watch` (the launch's recorded processes) is checked there once a second: a run stops the moment one exits.
    With `power`, the agent samples the GPUs' power during every run, in the same call (summary["energy"])."""

    def run(call: RunCall) -> dict[str, Any]:
        if call.open_loop is None:
            wait = config.request_timeout_s * -(-len(call.bodies) // call.concurrency)
        else:
            # The schedule, then the requests a cap holds back, one round of request timeouts per cap's worth.
            cap = call.open_loop.get("max_concurrency") or len(call.bodies)
            wait = max(call.open_loop["schedule"], default=0.0) + config.request_timeout_s * -(-len(call.bodies) // cap)
        extra: dict[str, Any] = {"open_loop": call.open_loop} if call.open_loop is not None else {}
        if power:
            extra["power_smi"] = host.config.nvidia_smi
        if call.flush is not None:
            extra["flush"] = dict(call.flush)
        result: dict[str, Any] = host.call(
            "bench_run",
            call_timeout=60 + wait + (POWER_CALL_EXTRA_S if power else 0.0),
            address=address,
            port=port,
            endpoint=wire.to_dict(),
            bodies=call.bodies,
            max_tokens=call.max_tokens,
            concurrency=call.concurrency,
            timeout_s=config.request_timeout_s,
            gpu_probe=host.config.nvidia_smi if call.probe_gpus else None,
            stall_s=config.stall_timeout_s,
            first_token_s=config.first_token_timeout_s,
            watch=watch,
            **extra,
        )
        return result

    return run


def local_runner(
    base_url: str,
    config: BenchConfig,
    host: Host | None = None,
    watch: list[dict[str, Any]] | None = None,
    power: bool = False,
    *,
    relayed: bool = False,
    wire: Wire,
) -> Runner:
    """The client runs in this process against base_url (for a remote host: the SSH tunnel's local end).
    GPU probes and the liveness checks of `watch` go to `host` from other threads (the agent is idle meanwhile).
    With `power`: the GPUs' power is sampled here during every run when `host` is this machine (the same sampler
    the agent runs); for a remote host the run's energy says why it was not. `relayed`: base_url is a relay of this
    process to a remote host, whose descriptors each request takes here too (client.headroom.RELAYED_FDS)."""
    parts = urlsplit(base_url)
    if parts.hostname is None or parts.port is None:
        raise BenchError(f"cannot benchmark {base_url!r}: expected http://HOST:PORT")
    address, port, gpu_host = parts.hostname, parts.port, host

    def run(call: RunCall) -> dict[str, Any]:
        from orchestrator.client import runner as client
        from orchestrator.client.cacheflush import flush_cache
        from orchestrator.client.headroom import RELAYED_FDS

        if call.flush is not None:
            # Before the power sampler and the GPU probe start, as on the host: emptying the cache is no part of it.
            failed = flush_cache(address, port, call.flush)
            if failed is not None:
                return {"cache_flush_failed": failed}
        sampler = None
        if power and gpu_host is not None and gpu_host.config.is_local:
            from orchestrator.agent.power import RunEnergy

            sampler = RunEnergy(gpu_host.config.nvidia_smi, watch, client.live)
            try:
                sampler.begin()  # nvidia-smi's first sample is in before the run starts (and the probe's timer)
            except BaseException:
                sampler.finish(None)
                raise
        reading: list[dict[str, Any]] = []
        probe = None
        if call.probe_gpus and gpu_host is not None:
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
            result = client.run(
                address,
                port,
                wire,
                call.bodies,
                call.max_tokens,
                call.concurrency,
                config.request_timeout_s,
                stall_s=config.stall_timeout_s,
                first_token_s=config.first_token_timeout_s,
                watchdog=watchdog,
                open_loop=call.open_loop,
                descriptors_each=RELAYED_FDS if relayed else 1,
            )
        except BaseException:
            if sampler is not None:
                sampler.finish(None)  # nvidia-smi stops whatever happened to the run
            raise
        finally:
            if probe is not None:
                probe.cancel()
                probe.join(timeout=GPU_PROBE_TIMEOUT_S)
        result["gpus"] = reading[0] if reading else None
        if sampler is not None:
            result["energy"] = sampler.finish(result)
        elif power:
            result["energy"] = {"source": "nvidia-smi", "error": NO_ENERGY_REMOTE_LOCAL_CLIENT}
        return result

    return run


def _without_energy(runner: Runner, why: str) -> Runner:
    def run(call: RunCall) -> dict[str, Any]:
        result = runner(call)
        return {**result, "energy": {"source": "nvidia-smi", "error": why}}

    return run


def with_engine_counters(runner: Runner, engine: Engine) -> Runner:
    """A runner whose runs take their speculative statistics and prefix-cache use from the engine's own /metrics
    counters when the responses carried none (vLLM reports them only there; SGLang there too without per-request
    meta_info)."""

    def run(call: RunCall) -> dict[str, Any]:
        summary = runner(call)
        if summary.get("prefix_cache") is None and engine.cache_counters is not None:
            cache = counted_prefix_cache(summary.get("counter_deltas") or {}, *engine.cache_counters)
            if cache is not None:
                summary["prefix_cache"] = cache
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
    GPUs (an attached server's GPUs are not known to be the ones --host can see), power included. Every run of a
    launch orch made samples the GPUs' power (summary["energy"]), on one node only: a multi-node launch says why
    it has none."""
    multinode = len(host.members()) > 1
    power = probe_gpus and not multinode
    wire = engine.wire(config.endpoint)
    inner = (
        host_runner(host, address, port, config, watch, power, wire=wire)
        if config.client == "host"
        else local_runner(
            base_url,
            config,
            host if probe_gpus or watch else None,
            watch,
            power,
            relayed=not host.config.is_local,
            wire=wire,
        )
    )
    if probe_gpus and multinode:
        inner = _without_energy(inner, NO_ENERGY_MULTINODE)
    counted = with_engine_counters(inner, engine)
    if probe_gpus:
        return counted

    def unprobed(call: RunCall) -> dict[str, Any]:
        return counted(dataclasses.replace(call, probe_gpus=False))

    return unprobed


def run_benchmark(
    runner: Runner,
    config: BenchConfig,
    *,
    model: str,
    on_run: Callable[[RunResult], None] | None = None,
    recover: Callable[[str], bool] | None = None,
    events: Events = QUIET,
    engine: Engine,
) -> list[RunResult]:
    """Warmups, then timed runs at each concurrency level, or at each rate (open loop: each run sends its requests
    at the times its schedule gives); `on_run` sees each run the moment it finishes, `events` each one's start (a
    phase).

    A run with failed requests calls `recover` (reconnect, check the server); if the server is whole and healthy the
    run is repeated from the start (never stitched together), at most MAX_RECOVERIES times per benchmark, after
    which it is recorded as invalid. If the server is gone or unhealthy, BenchError (recorded as an invalid run
    first, so it is stored). A run whose failed requests the server all refused with a client error (HTTP 4xx but
    RETRYABLE_4XX: a prompt longer than its context) is recorded as invalid at once, with the server's answer: the
    same requests would be refused again.

    With config.flush_cache every timed run (never a warmup) starts from an empty prefix cache, the engine's way
    (its `cache_flush`: a request sent first in the run's own call, or fields in every timed request); a flush that
    fails is a BenchError naming what the server said (and, for a 404, what enables the route). Request bodies are
    the engine's own (Engine.request_body).
    """
    # Each run takes its requests from the sequence as it starts: a run's bodies are built then, never the whole
    # launch's at once (a trace's long prompts are generated as they are taken).
    items = request_stream(config)
    cache_flush = engine.cache_flush
    flushing = cache_flush if config.flush_cache else None
    if config.flush_cache and cache_flush is None:
        raise BenchError("--flush-cache: this server's engine has no way for orch to empty its prefix cache")
    results: list[RunResult] = []
    recoveries = 0
    first_level = config.rate[0] if config.open_loop else config.concurrency[0]

    def finished(run: RunResult) -> None:
        results.append(run)
        if on_run is not None:
            on_run(run)

    def one(index: int, warm: bool, concurrency: int, n: int, max_tokens: int, rate: float | None = None) -> None:
        nonlocal recoveries
        chunk = list(itertools.islice(items, n))
        # A dataset's own output length (`output_len`) in timed runs, capped by --max-tokens; warmups stay short.
        lengths = [max_tokens if warm else min(max_tokens, int(it.get("output_len") or max_tokens)) for it in chunk]
        keep = config.check_outputs and not warm
        bodies = [
            with_markers(engine.request_body(config.endpoint, it, k, model), it, keep_output=keep)
            for it, k in zip(chunk, lengths, strict=True)
        ]
        bodies, flush_request = with_flush(bodies, None if warm else flushing)
        # Open loop: when each request is due, from the request sequence itself (its digest covers the schedule).
        open_loop = (
            None
            if rate is None
            else {
                "schedule": [float(it["scheduled_s"]) for it in chunk],
                "rate": rate,
                "arrivals": config.arrivals,
                "max_concurrency": config.max_concurrency,
                **({"stop_oversaturated": True} if config.stop_oversaturated else {}),
            }
        )
        at = f"concurrency {concurrency}" if rate is None else f"{rate:g} req/s"
        while True:
            # The GPUs are read once per launch, at the same point of every launch so launches compare like for like:
            # during the last warmup (busy GPUs, and nvidia-smi never disturbs a measured run), or without warmups
            # during the first timed run.
            probe = (warm and index == config.warmup - 1) or (
                config.warmup == 0 and not warm and index == 0 and (rate or concurrency) == first_level
            )
            events.phase(
                "warmup" if warm else "run",
                index=index,
                of=config.warmup if warm else config.runs,
                concurrency=concurrency,
                **({"rate": rate} if rate is not None else {}),
            )
            summary = runner(
                RunCall(
                    bodies=bodies,
                    max_tokens=lengths,
                    concurrency=concurrency,
                    probe_gpus=probe,
                    open_loop=open_loop,
                    flush=flush_request,
                )
            )
            if summary.get("cache_flush_failed"):
                raise BenchError(flush_refusal(summary["cache_flush_failed"], flushing, f"run {index + 1} at {at}"))
            if summary.get("aborted"):
                # The watchdog saw the launch break (a process exited): nothing to check or repeat.
                finished(RunResult.from_summary(index, warm, summary))
                raise BenchError(
                    f"the launch broke during run {index + 1} at {at}: {summary['aborted']}; "
                    "the run was stopped at once and not repeated. The server's log is named above"
                )
            if not summary["errors"] or recover is None or client_full(summary):
                # A run that filled its client is not the server's failure: checking the server and repeating the
                # run would only fill the client again.
                break
            first = next(r["error"] for r in summary["per_request"] if r["error"])
            refused = refused_by_server(summary)
            left = recoveries < MAX_RECOVERIES and not refused
            what = failed_line(
                f"{run_label(config, index, warm)} at {at}", summary, first, None if refused else recoveries
            )
            if refused:
                # The server answered, and said no to these requests (a prompt longer than its context): the same
                # requests would be refused again, so the run is kept as it is, invalid with the server's answer.
                events.line(what)
                break
            # The server is checked either way: a dead one ends the launch now instead of failing every later run.
            if not recover(what):
                finished(RunResult.from_summary(index, warm, summary))  # stored too: the evidence of what happened
                raise BenchError(
                    f"the server failed during run {index + 1} at {at} ({first}); "
                    "the launch was torn down and the run not repeated. Its log is named above"
                )
            if not left:
                break
            recoveries += 1
        if not warm and summary["window_s"] < config.min_run_s and summary["valid"]:
            longer = "raise --max-tokens" if rate is None else "raise --duration or --requests"
            summary = {
                **summary,
                "valid": False,
                "invalid_reason": f"run lasted {summary['window_s']:.2f}s, shorter than the minimum "
                f"{config.min_run_s:.2f}s ({longer} or lower --min-run-s)",
            }
        finished(RunResult.from_summary(index, warm, summary))

    for i in range(config.warmup):
        one(i, True, 1, config.requests_per_warmup, config.warmup_max_tokens)
    if flushing is not None and flushing.means:
        events.line(f"  --flush-cache: {flushing.means}")
    if config.open_loop:
        for rate in config.rate:
            for i in range(config.runs):
                one(i, False, 0, len(config.schedule(rate, i)), config.max_tokens, rate)
        return results
    for c in config.concurrency:
        for i in range(config.runs):
            one(i, False, c, config.requests_per_run(c), config.max_tokens)
    return results


def run_label(config: BenchConfig, index: int, warm: bool) -> str:
    """A run as the progress lines name it: `warmup 1/2`, `run 3/5`."""
    return f"warmup {index + 1}/{config.warmup}" if warm else f"run {index + 1}/{config.runs}"


def failed_line(run: str, summary: Mapping[str, Any], first: str, recoveries: int | None) -> str:
    """What is done about a run with failed requests: repeated if the server is fine (`recoveries`: the repeats so
    far in this launch), kept invalid once none are left, or (None) kept invalid at once: the server refused them."""
    failed = f"{run}: {summary['errors']} of {summary['requests']} requests failed (first: {first})"
    if recoveries is None:
        return (
            f"{failed}: the server refused them (an HTTP 4xx client error, which a repeat would not change); keeping "
            "the run, invalid, without repeating it"
        )
    if recoveries < MAX_RECOVERIES:
        return (
            f"{failed}; checking the connection and the server, then repeating the run if both are fine (repeat "
            f"{recoveries + 1} of at most {MAX_RECOVERIES} in this launch)"
        )
    return (
        f"{failed}; checking the connection and the server, then keeping the run, invalid: no repeats left "
        f"({MAX_RECOVERIES} per launch)"
    )


# A client error (4xx) that a repeat may not get again: the server timed out waiting for the request, or asked the
# client to slow down. Every other 4xx is the server's answer to the request itself.
RETRYABLE_4XX = (408, 429)
_HTTP_STATUS = re.compile(r"HTTP (\d{3})\b")


def refused_by_server(summary: Mapping[str, Any]) -> bool:
    """Every failed request of the run was answered with a client error (HTTP 4xx other than RETRYABLE_4XX, as the
    client words it: `HTTP 400 Bad Request: …`): the requests themselves were refused, and a repeat sends the same."""
    errors = [str(r["error"]) for r in summary.get("per_request") or [] if r.get("error")]
    statuses = [m.group(1) if (m := _HTTP_STATUS.match(e)) else None for e in errors]
    return bool(errors) and all(s is not None and s.startswith("4") and int(s) not in RETRYABLE_4XX for s in statuses)


def client_full(summary: Mapping[str, Any]) -> bool:
    """A run its client could not hold (client-limited): an open-loop run stopped at the requests in flight it could
    hold, or a closed-loop level of more streams than it can hold, never sent."""
    stopped = (summary.get("open_loop") or {}).get("stopped") or {}
    return bool(stopped.get("capacity")) or bool(summary.get("client_limited"))


def with_flush(
    bodies: list[dict[str, Any]], flush: CacheFlush | None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A timed run's bodies and the request to send before it, under --flush-cache (`flush`; None: unchanged)."""
    if flush is None:
        return bodies, None
    if flush.body:
        bodies = [{**b, **flush.body} for b in bodies]
    request = {"method": flush.request.method, "path": flush.request.path} if flush.request is not None else None
    return bodies, request


def flush_refusal(failed: Mapping[str, Any], flush: CacheFlush | None, where: str) -> str:
    """Why --flush-cache stopped the benchmark: the request, the server's answer, and for a 404 what enables it."""
    status = failed.get("status")
    said = f"answered {status}" if status is not None else "got no answer"
    body = str(failed.get("body") or "").strip()
    text = f"--flush-cache: {failed.get('method')} {failed.get('path')} {said} before {where}"
    text += f" ({body})" if body else ""
    if status == 404 and flush is not None and flush.enable:
        text += f"; {flush.enable}"
    return (
        text + "; the run was not sent (the prefix cache could not be emptied, so it would not measure what was asked)"
    )
